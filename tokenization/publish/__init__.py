"""What makes a stage's output trustworthy: its records, typed (``records``), where they sit in an output folder
(``manifest``), the fenced attempts that place files and write them last (``attempts``), and the run folder a
build claims (``runs``).
"""
