"""The deployment's settings, read from the environment of every Airflow component: default locations, the
locations builds may use, the merge's queue and pool, the workers' local working folders. The DAG, its tasks and
the builds page read them here."""

from __future__ import annotations

import os
from pathlib import Path

from tokenization.locations import AllowedLocations

SAMPLE = Path(__file__).resolve().parents[2] / "sample"
DEFAULT_INPUT = os.environ.get("TOKENIZATION_INPUT", str(SAMPLE / "corpus"))
DEFAULT_OUTPUT = os.environ.get("TOKENIZATION_OUTPUT", str(Path.cwd() / "tokenization-builds"))
DEFAULT_TOKENIZER = os.environ.get("TOKENIZATION_TOKENIZER", str(SAMPLE / "tokenizer.json"))
MERGE_POOL = "tokenization_merge"
MERGE_QUEUE = os.environ.get("TOKENIZATION_MERGE_QUEUE", "large_disk")
WORKDIR = os.environ.get("TOKENIZATION_WORKDIR")  # where ranks and context shards stage (default: system temp)
MERGE_WORKDIR = os.environ.get("TOKENIZATION_MERGE_WORKDIR")  # the large-disk worker's disk, for the merge


def _keep_builds(value: str | None) -> int | None:
    """``TOKENIZATION_KEEP_BUILDS``: complete builds kept under the output once a build is published (unset: all)."""
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TOKENIZATION_KEEP_BUILDS={value!r}: give a whole number of builds, at least 1, or unset it")
    return int(value)


KEEP_BUILDS = _keep_builds(os.environ.get("TOKENIZATION_KEEP_BUILDS"))
# When the nightly build runs: a cron expression in UTC, or "none" for triggered runs only.
SCHEDULE = os.environ.get("TOKENIZATION_SCHEDULE", "0 2 * * *")


def allowed_locations() -> AllowedLocations:
    """``TOKENIZATION_ALLOWED_LOCATIONS``, or, unset, the default input, the default output and the default
    tokenizer's folder."""
    tokenizer_folder = DEFAULT_TOKENIZER.rsplit("/", 1)[0] if DEFAULT_TOKENIZER.endswith(".json") else DEFAULT_TOKENIZER
    return AllowedLocations.from_env([DEFAULT_INPUT, DEFAULT_OUTPUT, tokenizer_folder])
