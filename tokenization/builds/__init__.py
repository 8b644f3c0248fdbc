"""A whole corpus build: its params and plan (``config``, ``plan``), its steps (``run.Build``), its books
(``accounting``), its report (``report``, ``pages``), its publication (``complete``) and ``{output}/LATEST``
(``latest``).
"""
