"""Input files as records: JSON lines and parquet, whole or a part that ranks share, each record naming its file
and line, its text rendered (``rendering``). ``formats`` tells a file's format by its name, ``local`` a local file
by its ``stat``, ``listing`` lists a build's files and shares them among ranks, ``content`` tells whether a file's
bytes are the planned ones, ``lines`` and ``parts`` read a file's lines or a part of it, ``reader`` its documents.
Imports ``rendering``, ``storage``, ``records``, ``wording`` and ``errors`` only.
"""
