"""The nightly schedule, proven: with ``TOKENIZATION_SCHEDULE`` set to every minute, unpausing the DAG makes the
scheduler start a run by itself, and that run builds with the deployment's defaults (the default input and output)
on the real topology (Celery, PostgreSQL, Redis, S3 behind the 503 proxy).

What unpausing does (docs/airflow.md says it, this test asserts it): the scheduler at once creates the run of the
slot the DAG's page shows as its next run, the latest slot at or before the moment the scheduler last planned it
(when the DAG was deployed, or after its last run); its data interval is that instant (a cron trigger
timetable's runs have no length). After that run, catchup being off, the next is the latest slot at the time:
the slots missed meanwhile are never run."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import fsspec
import pytest

from harness.cluster import ROOT, Cluster, services_missing
from tokenization.output.runs import folder_for
from tokenization.records import BuildRecord

reason = services_missing()
pytestmark = [pytest.mark.skipif(reason is not None, reason=f"distributed test: {reason}"), pytest.mark.long]

DAG = "tokenize_corpus"
EVERY_MINUTE = "* * * * *"


def test_unpausing_with_a_schedule_starts_a_run_that_builds_the_defaults(tmp_path, monkeypatch) -> None:
    settings = {"TOKENIZATION_SCHEDULE": EVERY_MINUTE, "TOKENIZATION_MAX_ACTIVE_RUNS": "1"}
    with Cluster(tmp_path / "cluster", fail_ranks="", settings=settings) as cluster:
        endpoint = json.loads(cluster.env()["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"]
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = fsspec.filesystem(
            "s3", key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
        )
        s3.mkdir("corpus")  # the default output's bucket
        cluster.wait_for(lambda: cluster.api("GET", f"/dags/{DAG}").get("next_dagrun_logical_date"), 60, "the DAG")
        planned = cluster.api("GET", f"/dags/{DAG}")  # what the UI shows as the DAG's next run
        unpaused = datetime.now(timezone.utc)
        cluster.api("PATCH", f"/dags/{DAG}?update_mask=is_paused", {"is_paused": False})

        def scheduled() -> list[dict]:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns?run_type=scheduled&order_by=logical_date")["dag_runs"]

        cluster.wait_for(scheduled, 60, "the scheduler to create a run of the unpaused DAG")
        first = scheduled()[0]
        slot = datetime.fromisoformat(planned["next_dagrun_logical_date"])
        logical, queued = (datetime.fromisoformat(first[k]) for k in ("logical_date", "queued_at"))
        # the slot read, or a later past one: the DAG processor plans the DAG again as it parses it (every ~30 s),
        # and a minute may turn between the read and the scheduler's next loop; never the next slot, waited for
        assert slot <= unpaused and slot <= logical <= queued, (first, planned, unpaused)
        assert datetime.fromisoformat(first["data_interval_start"]) == logical
        assert datetime.fromisoformat(first["data_interval_end"]) == logical  # a cron trigger's run is an instant
        assert queued - unpaused < timedelta(seconds=30)  # at once
        assert first["conf"] in ({}, None)

        def finished() -> bool:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns/{first['dag_run_id']}")["state"] in ("success", "failed")

        cluster.wait_for(finished, 600, f"the scheduled run {first['dag_run_id']} to finish")
        done = cluster.api("GET", f"/dags/{DAG}/dagRuns/{first['dag_run_id']}")
        states = {(t["task_id"], t["map_index"]): t["state"] for t in cluster.task_instances(DAG, first["dag_run_id"])}
        assert done["state"] == "success", states
        print(f"scheduled run {first['dag_run_id']}: queued {first['queued_at']}, finished {done['end_date']}")

        run_dir = folder_for("s3://corpus/builds", first["dag_run_id"])
        build = BuildRecord.loads(s3.cat_file(f"{run_dir}/_BUILD.json"), f"{run_dir}/_BUILD.json")
        recorded = build.params.to_json()
        assert recorded["input"] == str(ROOT / "sample" / "corpus")  # the deployment's defaults
        assert recorded["output"] == "s3://corpus/builds"
        assert build.verify.ok and build.conservation.holds
        assert s3.cat_file("corpus/builds/LATEST").decode() == f"{run_dir.rsplit('/', 1)[1]}\n"

        # Then the latest slot only: the minutes missed while the first run ran are never run (catchup is off).
        cluster.wait_for(lambda: len(scheduled()) > 1, 120, "the next scheduled run")
        later = [datetime.fromisoformat(r["logical_date"]) for r in scheduled()[1:]]
        ended = datetime.fromisoformat(done["end_date"]).replace(second=0, microsecond=0)
        assert min(later) >= ended - timedelta(minutes=1), (later, done["end_date"])
