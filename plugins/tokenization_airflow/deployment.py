"""The deployment's settings, read from the environment of every Airflow component: default locations, the
locations builds may use, the merge's queue and pool, the workers' local working folders, the schedule, retries,
how many builds to keep and to run at once, and the connection to Airflow's own REST API. ``deployment()`` gives
the DAG, its tasks, the builds page and the pool check one ``Deployment`` to read them from."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from tokenization.builds.config import ALLOWED_LOCATIONS_SETTING, AllowedLocations, allowed_locations, tokenizer_folder

SAMPLE = Path(__file__).resolve().parents[2] / "sample"
MERGE_POOL = "tokenization_merge"
SETTINGS = (  # every variable Deployment.from_env reads
    "TOKENIZATION_INPUT",
    "TOKENIZATION_OUTPUT",
    "TOKENIZATION_TOKENIZER",
    "TOKENIZATION_MERGE_QUEUE",
    "TOKENIZATION_WORKDIR",
    "TOKENIZATION_MERGE_WORKDIR",
    "TOKENIZATION_KEEP_BUILDS",
    "TOKENIZATION_SCHEDULE",
    "TOKENIZATION_AIRFLOW_API_CONN",
    "TOKENIZATION_TASK_RETRIES",
    "TOKENIZATION_RETRY_DELAY_SECONDS",
    "TOKENIZATION_MAX_ACTIVE_RUNS",
    ALLOWED_LOCATIONS_SETTING,
)


@dataclass(frozen=True)
class Deployment:
    """What one deployment decides for every build, whatever the run's params."""

    default_input: str
    default_output: str
    default_tokenizer: str
    merge_pool: str
    merge_queue: str
    workdir: str | None  # where ranks and context shards stage (None: the system's temporary folder)
    merge_workdir: str | None  # the large-disk worker's disk, where the merge stages
    keep_builds: int | None  # complete builds kept under the output once a build is published (None: all)
    schedule: str | None  # a cron expression in UTC; None (unset, the default): triggered runs only
    allowed_locations: AllowedLocations
    api_conn_id: str  # the connection to Airflow's REST API, where the pool check cannot read the database
    task_retries: int  # of a task that fails for a reason a later try may not meet (never of a data error)
    retry_delay: timedelta
    max_active_runs: int  # builds of the DAG at once

    @classmethod
    def from_env(cls) -> Deployment:
        """The ``TOKENIZATION_*`` settings; unset, the bundled sample's input and tokenizer, an output in the
        working folder, only those three locations allowed, and no schedule: a production deployment asks for its
        nightly run (docker-compose.yaml sets ``TOKENIZATION_SCHEDULE``), while a local one (``make airflow``) runs
        only what is triggered, so that unpausing (which Airflow's trigger form does by default) starts nothing."""
        env = os.environ
        default_input = env.get("TOKENIZATION_INPUT", str(SAMPLE / "corpus"))
        default_output = env.get("TOKENIZATION_OUTPUT", str(Path.cwd() / "tokenization-builds"))
        default_tokenizer = env.get("TOKENIZATION_TOKENIZER", str(SAMPLE / "tokenizer.json"))
        schedule = env.get("TOKENIZATION_SCHEDULE", "").strip()
        return cls(
            default_input=default_input,
            default_output=default_output,
            default_tokenizer=default_tokenizer,
            merge_pool=MERGE_POOL,
            merge_queue=env.get("TOKENIZATION_MERGE_QUEUE", "large_disk"),
            workdir=env.get("TOKENIZATION_WORKDIR"),
            merge_workdir=env.get("TOKENIZATION_MERGE_WORKDIR"),
            keep_builds=_keep_builds(env.get("TOKENIZATION_KEEP_BUILDS")),
            schedule=None if schedule.lower() in ("", "none") else schedule,
            allowed_locations=allowed_locations([default_input, default_output, tokenizer_folder(default_tokenizer)]),
            api_conn_id=env.get("TOKENIZATION_AIRFLOW_API_CONN", "airflow_api"),
            task_retries=int(env.get("TOKENIZATION_TASK_RETRIES", "2")),
            retry_delay=timedelta(seconds=float(env.get("TOKENIZATION_RETRY_DELAY_SECONDS", "60"))),
            max_active_runs=int(env.get("TOKENIZATION_MAX_ACTIVE_RUNS", "1")),
        )


def _keep_builds(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TOKENIZATION_KEEP_BUILDS={value!r}: give a whole number of builds, at least 1, or unset it")
    return int(value)


def deployment() -> Deployment:
    """The deployment this process runs in, read once. An Airflow component's environment never changes while it
    runs, but a test's may: a changed setting gives a new ``Deployment``."""
    return _deployment_of(tuple(os.environ.get(name) for name in SETTINGS))


@functools.cache
def _deployment_of(settings: tuple[str | None, ...]) -> Deployment:
    """``settings`` (the values of ``SETTINGS``) is only the cache's key: the same environment, the same instance."""
    return Deployment.from_env()
