"""The ground every layer stands on: storage (fsspec, atomic writes, conditional puts), the project's errors, the
locations a deployment allows, the options that configs, flags and DAG Params are made from, and progress.
"""
