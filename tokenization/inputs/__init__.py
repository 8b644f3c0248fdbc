"""Input files as records: JSON lines and parquet, whole or a part that ranks share (``sources``, ``parts``), each
record naming its file and line, its text rendered (``rendering``). Imports ``rendering``, ``storage``, ``records``
and ``errors`` only.
"""
