# The Airflow image of the scaled-out deployment: Airflow 3.3 with the corpus-tokenization package baked in.
FROM apache/airflow:3.3.2-python3.11
COPY --chown=airflow:root pyproject.toml README.md /opt/corpus-tokenization/
COPY --chown=airflow:root tokenization /opt/corpus-tokenization/tokenization
RUN pip install --no-cache-dir /opt/corpus-tokenization
# The C helper of the byte checks, built where the image has a compiler (else the numpy path runs, with the same values)
RUN python -m tokenization.formats.native
