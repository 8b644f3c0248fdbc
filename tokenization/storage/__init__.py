"""Where bytes live: a ``Folder`` (``folder``: a URL bound to the options that open it, the one door to a folder's
files), the fsspec functions under it (``files``: atomic writes, conditional puts, listings, concurrent reads), the
file checksums records give (``checksums``) and the locations a deployment allows (``locations``). Imports only
``errors``.
"""
