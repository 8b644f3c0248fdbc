"""Capacity plan of a tokenize_corpus build: what a corpus of T tokens costs, stage by stage, on N workers.

The projection is arithmetic on measured per-task rates (bench/RESULTS.md, a 2-core VM) and on a few stated
assumptions about S3 and Airflow; it runs no pipeline code and loops over no documents. It prints a Markdown
report (task counts; per-task time, RAM and local disk; S3 requests and bytes; Airflow load; wall time for several
worker counts; the limits, closest first) and writes it with ``--out``. Into a file that holds the two markers
``BEGIN`` and ``END`` only the text between them is written, so a document can keep its prose around the numbers.

    .venv/bin/python -m bench.scale_plan                        # the 15 T-token plan, printed
    .venv/bin/python -m bench.scale_plan --out docs/scaling.md  # regenerate the plan's numbers in place
    .venv/bin/python -m bench.scale_plan --tokens 2e12 --ranks 1024 --buckets 256 --workers 32

Every input is a field of ``Scenario`` and a flag of the same name (``tokenize_mb_s``: ``--tokenize-mb-s 36``).
``model`` holds the stages and their costs, ``limits`` what the plan is held against, ``report`` the Markdown.
"""
