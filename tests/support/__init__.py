"""What the tests share, by topic; no test file imports another one, only these (and conftest's fixtures).

``paths``: the repository, the bundled sample and ``../shared/data``. ``tokenizers``: the sample's EOS, a
vocabulary past uint16, the real tokenizer files ``make tokenizer-files`` fetches. ``corpus``: input files written
and read. ``stages``: each stage run in this process, and what its token files hold. ``builds``: a whole build in
this process. ``references``: datatrove's own pipeline and the trainers' readers, each in a process of its own.
``processes``: the command line in a subprocess, and waiting on one. ``s3``: moto's S3 server. ``dag_runs``: the
Airflow settings the tests use and whole DAG runs. ``browser``: screenshots of the pages.
"""
