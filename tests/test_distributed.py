"""The DAG on a real distributed deployment: CeleryExecutor with PostgreSQL and Redis, two workers, S3 (moto)
behind a proxy that injects 503s. Driven through the REST API v2, as an operator would.

Skips with the reason when PostgreSQL, Redis or the Celery provider are not available.
"""

from __future__ import annotations

import json
from datetime import datetime

import fsspec
import pytest

from harness.cluster import Cluster, services_missing
from tests.conftest import EOS
from tests.test_context import shuffled
from tests.test_merge import merged
from tests.test_tokenize import file_bytes, run
from tokenization.io.storage import using
from tokenization.stages.verify import verify

reason = services_missing()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"distributed test: {reason}")

DAG = "tokenize_corpus"
SEED = 99
CONF = {
    "input": "s3://corpus/input",
    "num_ranks": 4,
    "seed": SEED,
    "context_window": 1025,
    "num_context_shards": 2,
    "merge_max_tokens_per_file": 20_000,
    "save_loss": True,
    "sensor_timeout": 900,
}
DATA_FILES = (".ds", ".ds.index", ".ds.loss", ".ds.metadata")


def local_reference(folder, corpus, tokenizer) -> dict[str, bytes]:
    """The same params through the library on local files (test_dag shows this equals a dag.test run)."""
    for rank in range(4):
        run([corpus], folder / "ranks", tokenizer, rank=rank, world_size=4, seed=SEED, save_loss=True)
    merged(
        folder / "ranks",
        folder / "merged",
        save_filename="corpus",
        seed=SEED,
        save_loss=True,
        merge_max_tokens_per_file=20_000,
    )
    for shard in range(2):
        shuffled(folder / "merged", folder / "context", seed=SEED, context_window=1025, shard=shard, num_shards=2)
    return file_bytes(folder / "context")


def test_celery_deployment_with_s3_a_cleared_rank_and_one_merge_at_a_time(
    tmp_path, monkeypatch, sample_corpus, sample_tokenizer
) -> None:
    with Cluster(tmp_path / "cluster") as cluster:
        endpoint = {"endpoint_url": json.loads(cluster.env()["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"]}
        retries = {"retries": {"max_attempts": 10}}
        options = {"key": "testing", "secret": "testing", "client_kwargs": endpoint, "config_kwargs": retries}
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        s3.mkdir("corpus")
        for path in sorted(sample_corpus.glob("*.jsonl.gz")):
            s3.put_file(str(path), f"corpus/input/{path.name}")

        def states(run_id: str) -> dict:
            return {(t["task_id"], t["map_index"]): t for t in cluster.task_instances(DAG, run_id)}

        def run_state(run_id: str) -> str:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"]

        def waiting_on_failed_rank(run_id: str) -> bool:
            ti = states(run_id)
            sensor = ti.get(("wait_for_shards", -1), {}).get("state")
            return ti.get(("tokenize", 1), {}).get("state") == "failed" and sensor in ("up_for_reschedule", "running")

        cluster.api("PATCH", f"/dags/{DAG}?update_mask=is_paused", {"is_paused": False})  # no schedule here
        runs = ("run_a", "run_b")
        for run_id in runs:  # two runs at once: only the pool keeps their merges apart
            cluster.api("POST", f"/dags/{DAG}/dagRuns", {"logical_date": None, "dag_run_id": run_id, "conf": CONF})
        for run_id in runs:
            cluster.wait_for(lambda r=run_id: waiting_on_failed_rank(r), 400, f"{run_id}: rank 1 to fail")
            assert run_state(run_id) == "running"  # the sensor waits for the failed rank
            clear = {"dry_run": False, "dag_run_id": run_id, "task_ids": [["tokenize", 1]], "only_failed": False}
            cleared = cluster.api("POST", f"/dags/{DAG}/clearTaskInstances", clear)
            assert [(t["task_id"], t["map_index"]) for t in cleared["task_instances"]] == [("tokenize", 1)]
        for run_id in runs:
            cluster.wait_for(lambda r=run_id: run_state(r) in ("success", "failed"), 600, f"{run_id} to finish")
            assert run_state(run_id) == "success", {k: v["state"] for k, v in states(run_id).items()}

        merges = []
        for run_id in runs:
            ti = states(run_id)
            for rank in range(4):
                t = ti[("tokenize", rank)]
                assert (t["hostname"], t["queue"], t["try_number"]) == ("default-worker", "default", 1 + (rank == 1))
            m = ti[("merge", 0)]
            assert (m["hostname"], m["queue"], m["pool"]) == ("large-disk-worker", "large_disk", "tokenization_merge")
            merges.append((datetime.fromisoformat(m["start_date"]), datetime.fromisoformat(m["end_date"])))
        first, second = sorted(merges)
        assert first[1] <= second[0], f"two merges ran at once: {merges}"
        assert cluster.proxy.injected > 0, "no 503 was injected"

        built = {}
        for run_id in runs:
            dataset = f"s3://corpus/builds/{run_id}/context"
            with using({"s3": options}):
                assert verify(dataset, str(sample_tokenizer), EOS).ok
            s3.invalidate_cache()
            built[run_id] = {
                p.rsplit("/", 1)[1]: s3.cat_file(p) for p in s3.find(dataset[5:]) if p.endswith(DATA_FILES)
            }
        injected = cluster.proxy.injected
    reference = local_reference(tmp_path / "local", sample_corpus, sample_tokenizer)
    assert built["run_a"] == built["run_b"] == reference and len(reference) == 16
    print(f"absorbed {injected} injected 503s")
