"""A whole corpus build: its params and plan (``config``, ``plan``), its start (``start``), its steps
(``run.Build``) and the processes they run in (``workers``), its books (``accounting``), its report (``report``,
``pages``), its publication (``complete``) and ``{output}/LATEST`` (``latest``).
"""
