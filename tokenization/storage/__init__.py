"""Where bytes live: a ``Folder`` (``folder``: a URL bound to the options that open it, the one door to a folder's
files; a file is a folder and a name), the concurrency the layers above share (``concurrent``: many small reads at
once, files moved several at a time), the file checksums records give (``checksums``) and the locations a
deployment allows (``locations``). The fsspec functions under ``Folder`` (``files``: atomic writes, listings,
concurrent reads; ``conditions``: puts and removals under a condition; ``disk``: fsspec's local calls on ``os``, so
that a local path imports no fsspec) are private to this package. Imports only ``errors``.
"""
