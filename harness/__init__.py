"""The deployment the distributed tests and the scale benchmark run on (``harness.cluster``): a real Airflow on
this machine. Not part of the library: the wheel ships only ``tokenization``, which never imports this package."""
