"""Where bytes live: fsspec file systems (``files``: atomic writes, conditional puts, listings, concurrent reads)
and the locations a deployment allows (``locations``). Imports only ``errors``.
"""
