"""The Airflow the tests run (tests/conftest.py points Airflow at it before anything imports Airflow): the admin's
password, the merge pool, the conf of a whole run; and whole DAG runs with ``dag.test()``."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

# SimpleAuthManager keeps its generated passwords in the test home; an existing entry is kept, so the tests know it.
ADMIN_PASSWORD = "corpus-admin"
MERGE_POOL = "tokenization_merge"
DAG_CONF: dict[str, Any] = {
    "num_ranks": 3,
    "seed": 1234,
    "context_window": 1025,
    "num_context_shards": 2,
    "merge_max_tokens_per_file": 20_000,
    "save_loss": True,
}


def run_dag(dag, conf: dict):
    """One whole run with ``dag.test()``: the run, its task instances by (task, map index), and success."""
    from airflow.sdk import DagRunState

    saved = {task.task_id: copy.deepcopy(task.params) for task in dag.tasks}
    try:
        run = dag.test(run_conf=conf)
    finally:  # dag.test writes the run's conf into the tasks' params: the next run must start from the defaults
        for task in dag.tasks:
            task.params = saved[task.task_id]
    tis = {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}
    return run, tis, run.state == DagRunState.SUCCESS


def build_of(run) -> tuple[Path, dict]:
    """A run's folder and its build manifest."""
    from tokenization.output.runs import folder_for

    folder = Path(folder_for(os.environ["TOKENIZATION_OUTPUT"], run.run_id))
    return folder, json.loads((folder / "_BUILD.json").read_text())
