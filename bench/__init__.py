"""Benchmarks and the capacity plan of this project: run as modules from the repository root (``python -m
bench.run``, ``python -m bench.scale_plan``, ``python -m bench.scale``). Not part of the library: the wheel ships
only ``tokenization``."""
