"""tokenize_corpus: cleaned text in, verified and shuffled training token files out, nightly or on demand.

plan -> tokenize (one task per rank) -> wait_for_shards -> merge (single-slot pool, large-disk queue)
     -> context_shuffle (one task per shard) -> publish (verify, dataset manifest, Asset event)

Every task calls the ``tokenization`` package through the thin glue in ``plugins/tokenization_airflow``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import Asset, CronTriggerTimetable, Param, TriggerRule, dag, get_current_context, task
from airflow.sdk.configuration import conf as airflow_conf
from tokenization_airflow import tasks
from tokenization_airflow.deployment import DEFAULT_INPUT, DEFAULT_OUTPUT, DEFAULT_TOKENIZER, MERGE_POOL, MERGE_QUEUE
from tokenization_airflow.sensors import ShardSensor

from tokenization.documents import DEFAULT_MAX_REJECT_FRACTION, DEFAULT_MAX_REJECTS

DATASET = Asset(name="tokenized_corpus", uri="file:///tokenization/tokenize_corpus/dataset")
RETRIES = int(os.environ.get("TOKENIZATION_TASK_RETRIES", "2"))
MAX_ACTIVE_RUNS = int(os.environ.get("TOKENIZATION_MAX_ACTIVE_RUNS", "1"))
RETRY_DELAY = timedelta(seconds=float(os.environ.get("TOKENIZATION_RETRY_DELAY_SECONDS", "60")))
OPTIONAL_POSITIVE = {"type": ["null", "integer"], "minimum": 1}

PARAMS = {
    "input": Param(DEFAULT_INPUT, type="string", minLength=1, title="Input",
                   description="Folder, glob or URL of .jsonl[.gz|.zst] or .parquet files, inside the allowed "
                               "locations (TOKENIZATION_ALLOWED_LOCATIONS)"),
    "output": Param(DEFAULT_OUTPUT, type="string", minLength=1, title="Output",
                    description="Folder or s3:// URL inside the allowed locations; each run writes under "
                                "{output}/{run id}"),
    "tokenizer": Param(DEFAULT_TOKENIZER, type="string", minLength=1, title="Tokenizer",
                       description="tokenizer.json path, folder, URL or hub name"),
    "aws_conn_id": Param("aws_default", type="string", minLength=1,
                         description="Airflow connection for s3:// URLs (credentials, endpoint_url for MinIO)"),
    "text_key": Param("text", type="string", minLength=1, description="Field holding the text (dotted for nested)"),
    "id_key": Param("id", type="string", minLength=1, description="Field holding the document id"),
    "eos_token": Param(None, type=["null", "string"], minLength=1,
                       description="Token appended to every document; empty = the tokenizer's own end-of-text token "
                                   "(from its tokenizer_config.json, its post-processor or its vocabulary)"),
    "no_eos": Param(False, type="boolean", description="Append no end-of-text token (conflicts with eos_token)"),
    "seed": Param(None, type=["null", "integer"], minimum=0,
                  description="Shuffle seed; empty = derived from the run id (stable across retries)"),
    "num_ranks": Param(4, type="integer", minimum=1, maximum=4096, description="Tokenize tasks (input shards)"),
    "shuffle_documents": Param(True, type="boolean", description="Shuffle documents within each rank"),
    "shuffle_chunk_size": Param(None, **OPTIONAL_POSITIVE, description="Also shuffle chunks of N tokens in a rank"),
    "max_tokens_per_file": Param(None, **OPTIONAL_POSITIVE, description="Split rank files past N tokens"),
    "save_loss": Param(False, type="boolean", description="Write .ds.loss from no_loss_ranges"),
    "output_format": Param("ds", enum=["ds", "megatron"],
                           description="ds: merged and context-shuffled .ds files; megatron: .bin/.idx per rank"),
    "max_rejects": Param(DEFAULT_MAX_REJECTS, type=["null", "integer"], minimum=0,
                         description="A rank fails as soon as it rejects more records than this (empty: no limit)"),
    "max_reject_fraction": Param(DEFAULT_MAX_REJECT_FRACTION, type=["null", "number"], minimum=0, maximum=1,
                                 description="A rank fails when it rejects more than this share of its records"),
    "engine": Param("auto", enum=["auto", "hf"],
                    description="auto: the fast exact engine where it fits the tokenizer (self-checked against HF); "
                                "hf: HF tokenizers only"),
    "progress_seconds": Param(30, type="number", minimum=1,
                              description="Seconds between progress lines in the task logs (percent, docs, tokens, "
                                          "tokens/s, ETA)"),
    "threads": Param(None, **OPTIONAL_POSITIVE,
                     description="Encoding threads per rank; empty uses every core the task may use. Set cores / "
                                 "worker concurrency when several ranks share a Celery worker"),
    "merge_mode": Param("interleave", enum=["interleave", "shuffle"],
                        description="interleave: datatrove's file interleave; shuffle: uniform over all documents"),
    "merge_max_tokens_per_file": Param(100_000_000_000, type="integer", minimum=1,
                                       description="Tokens per merged file (cut at document boundaries)"),
    "context_window": Param(2049, type="integer", minimum=0, description="Context window + 1; 0 skips the stage"),
    "num_context_shards": Param(4, type="integer", minimum=1, maximum=1024, description="Context-shuffle tasks"),
    "sensor_timeout": Param(6 * 3600, type="integer", minimum=1,
                            description="Seconds to wait for every rank's shard before failing"),
}  # fmt: skip


@dag(
    dag_id="tokenize_corpus",
    schedule=CronTriggerTimetable("0 2 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,
    params=PARAMS,
    default_args={
        "retries": RETRIES,
        "retry_delay": RETRY_DELAY,
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
    },
    tags=["tokenization"],
    doc_md=__doc__,
)
def tokenize_corpus():
    @task(retries=0)
    def plan(params: dict | None = None, run_id: str | None = None, dag_run=None) -> list[int]:
        """Returns the ranks to map over; the run's spec (folder, seed, ...) goes out as XCom ``spec``."""
        max_map_length = airflow_conf.getint("core", "max_map_length", fallback=tasks.MAP_LENGTH_FALLBACK)
        spec = tasks.plan(params, run_id, dag_run.conf or {}, set(PARAMS), max_map_length)
        get_current_context()["ti"].xcom_push(key="spec", value=spec)
        return spec["ranks"]

    @task(map_index_template="rank-{{ rank_label }}")
    def tokenize(spec: dict, rank: int, params: dict | None = None) -> dict:
        context = get_current_context()
        context["rank_label"] = rank
        return tasks.tokenize(spec, rank, params, attempt_owner(context), context["ti"].try_number)

    @task(pool=MERGE_POOL, pool_slots=1, queue=MERGE_QUEUE)
    def merge(spec: dict, params: dict | None = None) -> list[int]:
        """Returns the context-shuffle shards to map over; the merge's result goes out as XCom ``merged``."""
        context = get_current_context()
        merged = tasks.merge_ranks(spec, params, attempt_owner(context)) if spec["merges"] else None
        context["ti"].xcom_push(key="merged", value=merged)
        return merged["context_shards"] if merged else []

    @task(map_index_template="shard-{{ shard_label }}")
    def context_shuffle(spec: dict, shard: int, shards: list, params: dict | None = None) -> dict:
        context = get_current_context()
        context["shard_label"] = shard
        return tasks.shuffle_context(spec, shard, len(shards), params, attempt_owner(context))

    @task(trigger_rule=TriggerRule.NONE_FAILED, outlets=[DATASET])
    def publish(spec: dict, params=None, run_id=None, outlet_events=None) -> dict:
        build = tasks.publish(spec, params, run_id)
        outlet_events[DATASET].extra = {
            "dataset": build["dataset"], "run_id": run_id, "tokens": build["tokens"],
            "files": len(build["files"]), "docs": build["conservation"]["docs_out"], "seed": build["seed"],
        }  # fmt: skip
        kept = build["conservation"]
        return {"dataset": build["dataset"], "tokens": build["tokens"], "docs": kept["docs_out"],
                "rejects": kept["quarantined"], "verify": build["verify"]["ok"]}  # fmt: skip

    ranks = plan()
    spec = ranks["spec"]
    shards = tokenize.partial(spec=spec).expand(rank=ranks)
    wait = ShardSensor(
        task_id="wait_for_shards",
        spec=spec,
        sensor_timeout="{{ params.sensor_timeout }}",
        retries=0,
        mode="reschedule",
        poke_interval=10,
        trigger_rule=TriggerRule.ALL_DONE,
    )
    context_shards = merge(spec)
    contexts = context_shuffle.partial(spec=spec, shards=context_shards).expand(shard=context_shards)
    shards >> wait >> context_shards
    contexts >> publish(spec)


def attempt_owner(context) -> str:
    """Names this task attempt in the message that refuses a second attempt at the same output."""
    ti = context["ti"]
    index = f"[{ti.map_index}]" if ti.map_index >= 0 else ""
    return f"Airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}{index} try {ti.try_number}"


tokenize_corpus()
