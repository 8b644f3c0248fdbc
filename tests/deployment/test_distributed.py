"""The DAG on a real distributed deployment: CeleryExecutor with PostgreSQL and Redis, two workers, S3 (SeaweedFS,
or moto without ``weed``) behind a proxy that injects 503s. Driven through the REST API v2, as an operator would:
last night's build (made by the library, on the same storage), then tonight's corpus (a file rewritten with its
size kept, one added, one deleted) built by two runs at once, one with the tokenization cache, which tokenizes only
the rewritten and the added file, and one without: the same bytes. The large-disk worker is killed mid-merge, its
machine lost; once Airflow has failed the merge for its missing heartbeats, the operator clears it, and it resumes
after the file the dead attempt published: the same bytes again.

Skips with the reason when PostgreSQL, Redis or the Celery provider are not available.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec
import pytest

from harness.cluster import Cluster, services_missing
from tests.support.builds import in_process
from tests.support.corpus import write_jsonl
from tests.support.stages import cache_of, file_bytes, merged, run, shuffled
from tests.support.tokenizers import EOS
from tokenization.builds.accounting import stage_counts
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.records import MergeCounts, RankManifest
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

reason = services_missing()
pytestmark = [pytest.mark.skipif(reason is not None, reason=f"distributed test: {reason}"), pytest.mark.long]

DAG = "tokenize_corpus"
SEED = 99
CONF: dict[str, Any] = {
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


def next_night(corpus: Path, folder: Path) -> Path:
    """The corpus as it is the next night: part-00001 rewritten with its size kept (its gzip header's time), a new
    part-00004, part-00003 gone."""
    shutil.copytree(corpus, folder)
    rewritten = bytearray((folder / "part-00001.jsonl.gz").read_bytes())
    rewritten[4:8] = (1_764_547_200).to_bytes(4, "little")  # gzip's MTIME: other bytes, the same documents
    (folder / "part-00001.jsonl.gz").write_bytes(bytes(rewritten))
    write_jsonl(folder / "part-00004.jsonl.gz", [{"id": "new-1", "text": "A document that arrived today."}])
    (folder / "part-00003.jsonl.gz").unlink()
    return folder


def local_reference(folder, corpus, tokenizer) -> dict[str, bytes]:
    """The same params through the library on local files, without a cache (test_dag shows this equals a dag.test
    run)."""
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


def test_celery_deployment_with_s3_a_cleared_rank_a_killed_merge_worker_and_one_merge_at_a_time(
    tmp_path, monkeypatch, sample_corpus, sample_tokenizer
) -> None:
    # Airflow fails a dead worker's task after 30 s without heartbeats here (compose: 90 s), to keep the suite short
    quick = {"AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30"}
    with Cluster(tmp_path / "cluster", stall_merge=True, settings=quick) as cluster:
        endpoint = {"endpoint_url": json.loads(cluster.env()["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"]}
        retries = {"retries": {"max_attempts": 10}}
        options = {"key": "testing", "secret": "testing", "client_kwargs": endpoint, "config_kwargs": retries}
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        s3.mkdir("corpus")
        upload(s3, sample_corpus)
        params = {k: v for k, v in CONF.items() if k != "sensor_timeout"}  # the DAG's own params, an Airflow one aside
        where: dict[str, Any] = {
            "output": "s3://corpus/builds",
            "tokenizer": str(sample_tokenizer),
            "storage_options": {"s3": options},
        }
        last_night = BuildConfig(**where, **params)
        in_process(Build.start(last_night, "last_night"))  # what tonight's runs find in the cache
        tonight = next_night(sample_corpus, tmp_path / "tonight")
        upload(s3, tonight)

        def states(run_id: str) -> dict:
            return {(t["task_id"], t["map_index"]): t for t in cluster.task_instances(DAG, run_id)}

        def run_state(run_id: str) -> str:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"]

        def waiting_on_failed_rank(run_id: str) -> bool:
            ti = states(run_id)
            sensor = ti.get(("wait_for_shards", -1), {}).get("state")
            return ti.get(("tokenize", 1), {}).get("state") == "failed" and sensor == "deferred"

        cluster.api("PATCH", f"/dags/{DAG}?update_mask=is_paused", {"is_paused": False})  # no schedule here
        runs = {"run_a": CONF, "run_b": CONF | {"cache": "off"}}
        for run_id, conf in runs.items():  # two runs at once: only the pool keeps their merges apart
            cluster.api("POST", f"/dags/{DAG}/dagRuns", {"logical_date": None, "dag_run_id": run_id, "conf": conf})
        for run_id in runs:
            cluster.wait_for(lambda r=run_id: waiting_on_failed_rank(r), 400, f"{run_id}: rank 1 to fail")
            assert run_state(run_id) == "running"  # the sensor waits for the failed rank
            clear = {"dry_run": False, "dag_run_id": run_id, "task_ids": [["tokenize", 1]], "only_failed": False}
            if run_id == "run_b":  # as the Grid's Clear dialog sends it: the sensor too, refused were it running
                clear |= {"include_downstream": True, "prevent_running_task": True}
            answer = cluster.api("POST", f"/dags/{DAG}/clearTaskInstances", clear)
            cleared = {(t["task_id"], t["map_index"]) for t in answer["task_instances"]}
            assert {k for k in cleared if k[0] == "tokenize"} == {("tokenize", 1)}, cleared  # not the other ranks
            assert (("wait_for_shards", -1) in cleared) == (run_id == "run_b"), cleared

        cluster.wait_for((tmp_path / "cluster" / "merge-stalled").exists, 600, "a merge to publish its first file")
        merging = [r for r in runs if states(r).get(("merge", 0), {}).get("state") == "running"]
        (killed,) = merging  # one pool slot: one merge (the other waits for the slot, or its sensor is not done)
        cluster.kill_and_restart("large-disk-worker")
        # the run failed too: the scheduler has then marked what follows the merge upstream_failed, which it does in a
        # later loop than the merge's failure; a clear sent between the two left them so, and the run failed again
        dead = lambda: states(killed)[("merge", 0)]["state"] == "failed" and run_state(killed) == "failed"  # noqa: E731
        cluster.wait_for(dead, 300, f"{killed}: Airflow to fail the merge of the dead worker, and its run")
        clear = {"dry_run": False, "dag_run_id": killed, "task_ids": [["merge", 0]], "only_failed": False}
        cluster.api("POST", f"/dags/{DAG}/clearTaskInstances", clear | {"include_downstream": True})
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
            assert m["try_number"] == 1 + (run_id == killed)
            merges.append((datetime.fromisoformat(m["start_date"]), datetime.fromisoformat(m["end_date"])))
        first, second = sorted(merges)
        assert first[1] <= second[0], f"two merges ran at once: {merges}"
        assert cluster.proxy is not None and cluster.proxy.injected > 0, "no 503 was injected"

        s3.invalidate_cache()
        served = {
            f.url.rsplit("/", 1)[1]: f.hit
            for p in s3.find("corpus/builds/run_a/ranks/_manifests")
            for f in cache_of(RankManifest.loads(s3.cat_file(p), p)).files
        }
        assert sorted(name for name, hit in served.items() if not hit) == ["part-00001.jsonl.gz", "part-00004.jsonl.gz"]
        assert len(served) == 4
        # the retry kept the dead attempt's file, and its records describe no mix
        merged = Folder(f"s3://corpus/builds/{killed}/merged", {"s3": options})
        counts = stage_counts(merged, MergeCounts)
        assert counts is not None and counts.resumed_files == 1
        records_alone = verify(merged, str(sample_tokenizer), EOS)  # its files went once published
        assert records_alone.ok and records_alone.files == 0
        s3.invalidate_cache()
        for run_id in runs:  # one copy of the dataset on S3: the intermediate token files removed, records kept
            for stage in ("ranks", "merged"):
                held = s3.find(f"corpus/builds/{run_id}/{stage}")
                assert [p for p in held if p.endswith(DATA_FILES)] == [] and any("/_manifests/" in p for p in held)
        built = {}
        for run_id in runs:
            dataset = f"s3://corpus/builds/{run_id}/context"
            assert verify(Folder(dataset, {"s3": options}), str(sample_tokenizer), EOS).ok
            s3.invalidate_cache()
            built[run_id] = {
                p.rsplit("/", 1)[1]: s3.cat_file(p) for p in s3.find(dataset[5:]) if p.endswith(DATA_FILES)
            }
        assert cluster.proxy is not None
        injected = cluster.proxy.injected
    reference = local_reference(tmp_path / "local", tonight, sample_tokenizer)
    assert built["run_a"] == built["run_b"] == reference and len(reference) >= 8
    print(f"absorbed {injected} injected 503s")


def upload(s3, corpus: Path) -> None:
    """The corpus as the input, in place of the one before."""
    if s3.exists("corpus/input"):
        s3.rm("corpus/input", recursive=True)
    for path in sorted(corpus.glob("*.jsonl.gz")):
        s3.put_file(str(path), f"corpus/input/{path.name}")
    s3.invalidate_cache()
