"""What each task of the ``tokenize_corpus`` DAG does: check the run's params, build a stage config, call the
library. The return values are small (paths, counts) because they travel as XCom.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os

from tokenization.build import (
    BUILD_FORMAT,
    DATASET_NAME,
    Layout,
    claim_run_folder,
    conservation,
    dataset_digest,
    rank_manifests,
    run_folder,
    stage_counts,
    token_flow,
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
from tokenization_airflow.deployment import MERGE_POOL, allowed_locations
from tokenization_airflow.pools import pool_exists
from tokenization_airflow.storage import use_connection

log = logging.getLogger(__name__)

# Test-only fault switch: ranks listed here (comma separated) fail on their first attempt.
FAIL_RANKS_ENV = "TOKENIZATION_TEST_FAIL_RANKS"
MAP_LENGTH_FALLBACK = 1024  # Airflow's default [core] max_map_length


class PlanError(RuntimeError):
    """The run cannot start: a param, the input, the tokenizer or the deployment is wrong."""


def resolve_seed(seed: int | None, run_id: str) -> int:
    """The param's seed, or one derived from the run id: one seed per run, whatever is retried."""
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


def check_conf(conf: dict, declared: set[str]) -> None:
    """Refuse keys of the run's conf that are no param: a misspelled param would otherwise be ignored."""
    unknown = sorted(set(conf) - declared)
    if unknown:
        raise PlanError(f"unknown params in the run's conf: {', '.join(_hint(k, declared) for k in unknown)}")


def _hint(key: str, declared: set[str]) -> str:
    close = difflib.get_close_matches(key, declared, 1)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)


def check_map_length(num_ranks: int, max_map_length: int) -> None:
    if num_ranks > max_map_length:
        raise PlanError(
            f"param num_ranks={num_ranks} exceeds Airflow's [core] max_map_length={max_map_length} (the most mapped "
            f"tasks it creates): raise it (AIRFLOW__CORE__MAX_MAP_LENGTH) on every component, or use fewer ranks"
        )


def check_locations(params: dict) -> None:
    """Inputs, outputs and tokenizer files only where the deployment allows (never http://, never /etc)."""
    allowed = allowed_locations()
    for name in ("input", "output"):
        allowed.check(name, params[name])
    tokenizer = params["tokenizer"]
    if "://" in tokenizer or tokenizer.startswith(("/", ".", "~")) or os.path.exists(tokenizer):
        allowed.check("tokenizer", tokenizer)  # anything else is a hub name: the hub is a fixed host


def plan(params: dict, run_id: str, conf: dict, declared: set[str], max_map_length: int) -> dict:
    """Check everything that can be checked before any work, claim the run's folder, and return the run's spec."""
    check_conf(conf, declared)
    check_map_length(params["num_ranks"], max_map_length)
    check_locations(params)
    use_connection(params["aws_conn_id"])
    if params["output_format"] == "megatron" and params["save_loss"]:
        raise PlanError("params save_loss and output_format=megatron conflict: Megatron files have no loss mask")
    listing = list_input_files([params["input"]])
    encoder = Encoder(params["tokenizer"], params["eos_token"], no_eos=params["no_eos"])
    merges = params["output_format"] == "ds"
    found = pool_exists(MERGE_POOL) if merges else None
    log.info("merge pool %r: %s", MERGE_POOL, {True: "exists", False: "MISSING", None: "could not be checked"}[found])
    if found is False:
        raise PlanError(
            f"pool {MERGE_POOL!r} does not exist, so the merge would wait forever: "
            f"create it with `airflow pools set {MERGE_POOL} 1 'corpus-tokenization merge'`"
        )
    run_dir = run_folder(params["output"], run_id)
    claim_run_folder(run_dir, run_id)
    spec = {
        "run_dir": run_dir,
        "seed": resolve_seed(params["seed"], run_id),
        "num_ranks": params["num_ranks"],
        "ranks": list(range(params["num_ranks"])),
        "input_files": len(listing.files),
        "input_bytes": sum(f.size for f in listing.files),
        "skipped_inputs": len(listing.skipped),
        "tokenizer_sha256": encoder.sha256,
        "eos_token": encoder.eos_token,
        "merges": merges,
    }
    log.info("plan: %s", spec | {"ranks": f"0..{params['num_ranks'] - 1}"})
    return spec


def tokenize(spec: dict, rank: int, params: dict, owner: str, try_number: int) -> dict:
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
        no_eos=params["no_eos"],
        seed=spec["seed"],
        rank=rank,
        world_size=spec["num_ranks"],
        shuffle_documents=params["shuffle_documents"],
        shuffle_chunk_size=params["shuffle_chunk_size"],
        max_tokens_per_file=params["max_tokens_per_file"],
        save_loss=params["save_loss"],
        max_rejects=params["max_rejects"],
        max_reject_fraction=params["max_reject_fraction"],
        output_format=params["output_format"],
        engine=params["engine"],
        threads=params["threads"],
        local_working_dir=os.environ.get("TOKENIZATION_WORKDIR"),
    )
    result = tokenize_rank(config, progress=params["progress_seconds"], owner=owner)
    return {"rank": rank, "counts": result["counts"], "files": [o["name"] for o in result["outputs"]]}


def merge_ranks(spec: dict, params: dict, owner: str) -> dict:
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
    result = merge(config, progress=params["progress_seconds"], owner=owner)
    files = [o["name"] for o in result["outputs"]]
    shards = min(params["num_context_shards"], len(files)) if params["context_window"] else 0
    return {"counts": result["counts"], "files": files, "context_shards": list(range(shards))}


def shuffle_context(spec: dict, shard: int, num_shards: int, params: dict, owner: str) -> dict:
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
    result = context_shuffle(config, progress=params["progress_seconds"], owner=owner)
    return {"shard": shard, "counts": result["counts"]}


def publish(spec: dict, params: dict, run_id: str) -> dict:
    """Verify the final dataset, check that every document and every token is accounted for, then declare the
    build complete. The counts come from the manifests on storage, not from XCom."""
    use_connection(params["aws_conn_id"])
    layout = Layout(spec["run_dir"])
    stages = {"merge": stage_counts(layout.merged), "context_shuffle": stage_counts(layout.context)}
    dataset = layout.ranks if not spec["merges"] else layout.context if stages["context_shuffle"] else layout.merged
    checked = verify(dataset, params["tokenizer"], spec["eos_token"])
    for line in checked.problems[:50] + checked.notes:
        log.warning("verify: %s", line)
    if not checked.ok:
        raise RuntimeError(f"verify found {len(checked.problems)} problems in {dataset}; the build is not published")
    ranks = rank_manifests(layout.ranks, spec["num_ranks"])
    balance = conservation(ranks)
    if not balance["holds"]:
        raise RuntimeError(f"documents are not conserved: {balance}")
    flow = token_flow(balance["tokens"], stages, checked.tokens)
    record = {
        "run_id": run_id,
        "dataset": dataset,
        "seed": spec["seed"],
        "tokenizer": {"name": params["tokenizer"], "sha256": spec["tokenizer_sha256"], "eos": spec["eos_token"]},
        "params": params,
        "conservation": balance,
        "token_flow": flow,
        "tokens": checked.tokens,
        "digest": dataset_digest(dataset),
        "files": sorted(name for name in list_names(*open_fs(dataset)) if name.endswith((".ds", ".bin"))),
        "stages": {"tokenize": {"ranks": spec["num_ranks"], "input_files": spec["input_files"], **balance}, **stages},
        "verify": {"ok": checked.ok, "files": checked.files, "tokens": checked.tokens, "notes": checked.notes},
    }
    report = write_report(layout.run_dir, {"format": BUILD_FORMAT, **record})  # before the marker of completion
    log.info("report: %s", join(layout.run_dir, REPORT_HTML))
    build = write_build_manifest(layout, record | {"report": {"html": REPORT_HTML, "json": REPORT_JSON}})
    log.info("published: %d tokens, %d files, %s", report["tokens"], len(report["files"]), build["dataset"])
    return build
