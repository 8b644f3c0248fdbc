"""What each task of the ``tokenize_corpus`` DAG does: build a stage config from the params, call the library.

The return values are small (paths, counts) because they travel as XCom.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

from tokenization.build import (
    BUILD_FORMAT,
    DATASET_NAME,
    Layout,
    conservation,
    dataset_digest,
    rank_manifests,
    write_build_manifest,
)
from tokenization.context import ContextShuffleConfig, context_shuffle
from tokenization.encoding import Encoder
from tokenization.merge import MergeConfig, merge
from tokenization.report import REPORT_HTML, REPORT_JSON, write_report
from tokenization.sources import list_input_files
from tokenization.storage import join, list_names, open_fs
from tokenization.tokenize import TokenizeConfig, tokenize_rank
from tokenization.verify import verify
from tokenization_airflow.pools import pool_exists
from tokenization_airflow.storage import use_connection

log = logging.getLogger(__name__)

MERGE_POOL = "tokenization_merge"
MERGE_QUEUE = os.environ.get("TOKENIZATION_MERGE_QUEUE", "large_disk")
# Test-only fault switch: ranks listed here (comma separated) fail on their first attempt.
FAIL_RANKS_ENV = "TOKENIZATION_TEST_FAIL_RANKS"


class PlanError(RuntimeError):
    """The run cannot start: a param, the input, the tokenizer or the deployment is wrong."""


def run_folder(output: str, run_id: str) -> str:
    """Each run writes under its own folder, named after its run id (stable across retries and clears)."""
    return f"{output.rstrip('/')}/{re.sub(r'[^A-Za-z0-9._-]+', '-', run_id).strip('-')}"


def resolve_seed(seed: int | None, run_id: str) -> int:
    """The param's seed, or one derived from the run id: one seed per run, whatever is retried."""
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


def plan(params: dict, run_id: str) -> dict:
    """Check everything that can be checked before any work: inputs, tokenizer and EOS, the merge pool."""
    use_connection(params["aws_conn_id"])
    if params["output_format"] == "megatron" and params["save_loss"]:
        raise PlanError("params save_loss and output_format=megatron conflict: Megatron files have no loss mask")
    files = list_input_files([params["input"]])
    encoder = Encoder(params["tokenizer"], params["eos_token"])
    merges = params["output_format"] == "ds"
    found = pool_exists(MERGE_POOL) if merges else None
    log.info("merge pool %r: %s", MERGE_POOL, {True: "exists", False: "MISSING", None: "could not be checked"}[found])
    if found is False:
        raise PlanError(
            f"pool {MERGE_POOL!r} does not exist, so the merge would wait forever: "
            f"create it with `airflow pools set {MERGE_POOL} 1 'corpus-tokenization merge'`"
        )
    spec = {
        "run_dir": run_folder(params["output"], run_id),
        "seed": resolve_seed(params["seed"], run_id),
        "num_ranks": params["num_ranks"],
        "ranks": list(range(params["num_ranks"])),
        "input_files": len(files),
        "input_bytes": sum(f.size for f in files),
        "tokenizer_sha256": encoder.sha256,
        "merges": merges,
    }
    log.info("plan: %s", spec | {"ranks": f"0..{params['num_ranks'] - 1}"})
    return spec


def tokenize(spec: dict, rank: int, params: dict, try_number: int) -> dict:
    use_connection(params["aws_conn_id"])
    if try_number == 1 and str(rank) in os.environ.get(FAIL_RANKS_ENV, "").split(","):
        raise RuntimeError(f"rank {rank}: failing on purpose ({FAIL_RANKS_ENV}, a test-only switch)")
    config = TokenizeConfig(
        inputs=[params["input"]],
        output=Layout(spec["run_dir"]).ranks,
        tokenizer=params["tokenizer"],
        text_key=params["text_key"],
        id_key=params["id_key"],
        eos_token=params["eos_token"],
        seed=spec["seed"],
        rank=rank,
        world_size=spec["num_ranks"],
        shuffle_documents=params["shuffle_documents"],
        shuffle_chunk_size=params["shuffle_chunk_size"],
        max_tokens_per_file=params["max_tokens_per_file"],
        save_loss=params["save_loss"],
        max_rejects=params["max_rejects"],
        output_format=params["output_format"],
        engine=params["engine"],
        threads=params["threads"],
        local_working_dir=os.environ.get("TOKENIZATION_WORKDIR"),
    )
    result = tokenize_rank(config, progress=params["progress_seconds"])
    return {"rank": rank, "counts": result["counts"], "files": [o["name"] for o in result["outputs"]]}


def merge_ranks(spec: dict, params: dict) -> dict:
    use_connection(params["aws_conn_id"])
    layout = Layout(spec["run_dir"])
    config = MergeConfig(
        input=layout.ranks,
        output=layout.merged,
        save_filename=DATASET_NAME,
        seed=spec["seed"],
        mode=params["merge_mode"],
        max_tokens_per_file=params["merge_max_tokens_per_file"],
        save_loss=params["save_loss"],
        local_working_dir=os.environ.get("TOKENIZATION_MERGE_WORKDIR"),
    )
    result = merge(config, progress=params["progress_seconds"])
    files = [o["name"] for o in result["outputs"]]
    shards = min(params["num_context_shards"], len(files)) if params["context_window"] else 0
    return {"counts": result["counts"], "files": files, "context_shards": list(range(shards))}


def shuffle_context(spec: dict, shard: int, num_shards: int, params: dict) -> dict:
    use_connection(params["aws_conn_id"])
    layout = Layout(spec["run_dir"])
    config = ContextShuffleConfig(
        input=layout.merged,
        output=layout.context,
        window_size=params["context_window"],
        seed=spec["seed"],
        shard=shard,
        num_shards=num_shards,
        local_working_dir=os.environ.get("TOKENIZATION_WORKDIR"),
    )
    return {"shard": shard, "counts": context_shuffle(config, progress=params["progress_seconds"])["counts"]}


def publish(spec: dict, params: dict, run_id: str, merged: dict | None, contexts: list[dict]) -> dict:
    """Verify the final dataset, check that every document is accounted for, then declare the build complete."""
    use_connection(params["aws_conn_id"])
    layout = Layout(spec["run_dir"])
    dataset = layout.ranks if not spec["merges"] else layout.context if contexts else layout.merged
    checked = verify(dataset, params["tokenizer"], params["eos_token"])
    for line in checked.problems[:50] + checked.notes:
        log.warning("verify: %s", line)
    if not checked.ok:
        raise RuntimeError(f"verify found {len(checked.problems)} problems in {dataset}; the build is not published")
    ranks = rank_manifests(layout.ranks, spec["num_ranks"])
    balance = conservation(ranks)
    if not balance["holds"]:
        raise RuntimeError(f"documents are not conserved: {balance}")
    context_counts: dict = {}
    for shard in contexts:
        for key, value in shard["counts"].items():
            context_counts[key] = context_counts.get(key, 0) + value
    record = {
        "run_id": run_id,
        "dataset": dataset,
        "seed": spec["seed"],
        "tokenizer": {"name": params["tokenizer"], "sha256": spec["tokenizer_sha256"]},
        "params": params,
        "conservation": balance,
        "tokens": checked.tokens,
        "digest": dataset_digest(dataset),
        "files": sorted(name for name in list_names(*open_fs(dataset)) if name.endswith((".ds", ".bin"))),
        "stages": {
            "tokenize": {"ranks": spec["num_ranks"], "input_files": spec["input_files"], **balance},
            "merge": merged["counts"] if merged else None,
            "context_shuffle": context_counts or None,
        },
        "verify": {"ok": checked.ok, "files": checked.files, "tokens": checked.tokens, "notes": checked.notes},
    }
    report = write_report(layout.run_dir, {"format": BUILD_FORMAT, **record})  # before the marker of completion
    log.info("report: %s", join(layout.run_dir, REPORT_HTML))
    build = write_build_manifest(layout, record | {"report": {"html": REPORT_HTML, "json": REPORT_JSON}})
    log.info("published: %d tokens, %d files, %s", report["tokens"], len(report["files"]), build["dataset"])
    return build
