"""The output protocol: where records sit in an output folder (``manifest``), the fenced attempts that place a
stage's files and write its completion marker last (``attempts``), the lease that fences them (``leases``), the
tokenization cache (``cache``) and the run folder a build claims (``runs``). Imports the layers below it, never the
tokenizer or a stage.
"""
