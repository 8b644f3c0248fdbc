"""Airflow glue for the ``tokenization`` package: thin adapters from DAG params to library calls.

Nothing here holds pipeline logic; every stage is a ``tokenization`` function that the CLI calls the same way.
"""
