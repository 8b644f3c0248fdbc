"""
# tokenize_corpus

Cleaned text in, verified and shuffled training token files out: datatrove's `.ds` family (token ids, document
ends, loss masks, metadata), which datatrove's and nanotron's readers load, or Megatron's `.bin/.idx`.

```
plan -> tokenize [rank-0 ..] -> wait_for_shards -> merge [all | bucket-0 ..] -> plan_context
     -> context_shuffle [shard-0 ..] -> publish
```

- **plan** refuses a misspelled param, too many ranks, a location outside the allowed ones and a missing merge
  pool; loads the tokenizer and its EOS; fixes the seed (the `seed` param, or one derived from the run id, the
  same for every retry); lists the input once and claims `{output}/{run id}/` with the plan: the settings and the
  exact input files. Clearing it resumes only the same plan: other settings, or a planned file gone or changed,
  are refused, naming each difference.
- **tokenize** is one task a rank: rank r encodes the plan's input files r, r + ranks, ... (never a new listing:
  files that land later wait for the next build) and shuffles its documents.
  Rejected records go to `_quarantine/` with their reason; too many fail the rank. A file that an earlier build
  tokenized (the same bytes, tokenizer and settings) comes from the tokenization cache (`cache`, by default
  `{output}/.cache`; `off` for none), checked, instead of being tokenized again: a nightly build tokenizes only
  what changed.
- **wait_for_shards** waits until every rank's completion marker, manifest and files are on storage, and keeps
  waiting while a failed rank is cleared and run again.
- **merge** runs in pool `tokenization_merge` on the large-disk queue: one task reorders every rank file
  (`interleave`, datatrove's bytes, or `shuffle`), or, with `merge_mode` `bucketed` and `num_buckets`, one task a
  bucket, as many at once as the pool has slots. **plan_context** then counts the merged files.
- **context_shuffle** is one task a shard: it cuts the merged files into windows of `context_window` tokens and
  permutes them.
- **publish** verifies the dataset, checks that documents and tokens add up from stage to stage, with `mds` writes
  the windows as MDS shards in `mds/` (mosaicml streaming, litdata), writes `report.html` and `_BUILD.json`, and
  updates the Asset `tokenized_corpus`; then it removes the token files of
  `ranks/` and `merged/`, so that the dataset is the one copy (`keep_intermediate` keeps them; their records stay).

## Running it
- **Scheduled**: only where the deployment sets `TOKENIZATION_SCHEDULE` (docker compose: nightly, 02:00 UTC),
  with the defaults below; catchup is off, so unpausing starts the run of the DAG's *Next Run* slot at once, then
  only the latest slot. Unset (`make airflow`), there is no schedule: unpausing, which the trigger form's "Unpause
  on trigger" box (checked by default) does, starts nothing but the triggered run. `{output}/LATEST`
  names the newest complete build; `TOKENIZATION_KEEP_BUILDS` keeps that many complete builds, deleting older ones.
- **By hand**: *Trigger* opens a form of these params, in sections; the defaults are the deployment's.
- **A failed rank**: open the run's *Grid*, select the failed `rank-N`, *Clear* it. Only that rank runs again,
  taking from the cache the files it finished before it failed, and the build completes with the same bytes as
  a run without the failure.

Each run writes `{output}/{run id}/` (`ranks/`, `merged/`, `context/`, `report.html`, `_BUILD.json`); the build is
complete when `_BUILD.json` exists. A task of a published run cleared alone does nothing and says so; clearing the
run's `plan` builds it all again. Its *Build report* tab opens the report. The same build runs without Airflow:
`tokenization build INPUT --output OUTPUT --tokenizer T ... --build-id ID` gives the same bytes for the same params.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, Context, CronTriggerTimetable, TriggerRule, dag, get_current_context, task
from airflow.sdk.configuration import conf as airflow_conf
from tokenization_airflow import tasks
from tokenization_airflow.deployment import deployment
from tokenization_airflow.params import airflow_params, build_params
from tokenization_airflow.sensors import ShardSensor

from tokenization.builds.run import Build

DATASET = Asset(name="tokenized_corpus", uri="file:///tokenization/tokenize_corpus/dataset")
DEPLOYMENT = deployment()
DEFAULTS = {
    "input": DEPLOYMENT.default_input,
    "output": DEPLOYMENT.default_output,
    "tokenizer": DEPLOYMENT.default_tokenizer,
}
PARAMS = build_params(DEFAULTS) | airflow_params()


@dag(
    dag_id="tokenize_corpus",
    schedule=CronTriggerTimetable(DEPLOYMENT.schedule, timezone="UTC") if DEPLOYMENT.schedule else None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=DEPLOYMENT.max_active_runs,
    params=PARAMS,
    default_args={
        "retries": DEPLOYMENT.task_retries,
        "retry_delay": DEPLOYMENT.retry_delay,
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
    },
    tags=["tokenization"],
    doc_md=__doc__,
)
def tokenize_corpus() -> None:
    @task(retries=0)
    @tasks.one_line_failures
    def plan(
        params: dict[str, Any] | None = None, run_id: str | None = None, dag_run: Any = None, ti: Any = None
    ) -> list[int]:
        """Returns the ranks to map over; the run's plan goes out first, as XCom ``spec``.

        Not one ``multiple_outputs`` dict of both: ``.expand()`` maps only over a task's return value (Airflow 3.3
        refuses ``plan()["ranks"]`` when it parses the DAG: "cannot map over XCom with custom key"), and Airflow
        counts the mapped tasks, and checks ``[core] max_map_length``, on the return value alone."""
        max_map_length = airflow_conf.getint("core", "max_map_length", fallback=tasks.MAP_LENGTH_FALLBACK)
        params, run_id = tasks.passed(params, "params"), tasks.passed(run_id, "run_id")
        build = tasks.plan(params, run_id, dag_run.conf or {}, set(PARAMS), max_map_length)
        ti.xcom_push(key="spec", value=build.claimed.spec.to_json())
        return build.ranks

    @task(map_index_template="rank-{{ rank_label }}")
    @tasks.one_line_failures
    def tokenize(spec: dict[str, Any], rank: int, params: dict[str, Any] | None = None) -> list[str]:
        """Returns the rank's file names."""
        params = tasks.passed(params, "params")
        context = get_current_context()
        # map_index_template reads the label from the context, whose TypedDict in Airflow has no key of one's own
        context["rank_label"] = rank  # type: ignore[typeddict-unknown-key]
        Build.entered(params["threads"])  # the task's process is its own
        result = tasks.build_of(params, spec).tokenize(rank, params["progress_seconds"], attempt_owner(context))
        return result.outputs

    @task(
        pool=DEPLOYMENT.merge_pool,
        pool_slots=1,
        queue=DEPLOYMENT.merge_queue,
        map_index_template="bucket-{{ bucket_label }}",
    )
    @tasks.one_line_failures
    def merge(spec: dict[str, Any], bucket: int | None, params: dict[str, Any] | None = None) -> list[str]:
        """Returns the merged file names: of everything (bucket None), or of one bucket."""
        params = tasks.passed(params, "params")
        context = get_current_context()
        # (the same TypedDict gap as rank_label's)
        context["bucket_label"] = "all" if bucket is None else bucket  # type: ignore[typeddict-unknown-key]
        return tasks.build_of(params, spec).merge(bucket, params["progress_seconds"], attempt_owner(context)).outputs

    @task
    @tasks.one_line_failures
    def plan_context(spec: dict[str, Any], params: dict[str, Any] | None = None) -> list[int]:
        """Returns the context-shuffle shards to map over, from the merged files on storage."""
        return tasks.build_of(tasks.passed(params, "params"), spec).context_shards()

    @task(map_index_template="shard-{{ shard_label }}")
    @tasks.one_line_failures
    def context_shuffle(
        spec: dict[str, Any], shard: int, shards: list[Any], params: dict[str, Any] | None = None
    ) -> list[str]:
        """Returns the shard's file names."""
        params = tasks.passed(params, "params")
        context = get_current_context()
        context["shard_label"] = shard  # type: ignore[typeddict-unknown-key]  # (the TypedDict gap as above)
        build = tasks.build_of(params, spec)
        return build.context_shuffle(shard, len(shards), params["progress_seconds"], attempt_owner(context)).outputs

    @task(trigger_rule=TriggerRule.NONE_FAILED, outlets=[DATASET])
    @tasks.one_line_failures
    def publish(
        spec: dict[str, Any], params: Any = None, run_id: str | None = None, outlet_events: Any = None
    ) -> dict[str, Any]:
        """Returns the build's figures, which the builds page lists; the Asset event carries them too."""
        published = tasks.build_of(params, spec).publish(DEPLOYMENT.keep_builds).summary().to_json()
        outlet_events[DATASET].extra = published | {"run_id": run_id}
        return published

    ranks = plan()
    # the run's spec, pushed besides its return value; a task's call gives a PlainXComArg, which Airflow types as the
    # XComArg it derives from, which has no __getitem__
    spec = ranks["spec"]  # type: ignore[index]
    rank_files = tokenize.partial(spec=spec).expand(rank=ranks)
    wait = ShardSensor(
        task_id="wait_for_shards",
        spec=spec,
        sensor_timeout="{{ params.sensor_timeout }}",
        retries=0,
        poke_interval=10,
        trigger_rule=TriggerRule.ALL_DONE,
    )
    merged = merge.partial(spec=spec).expand(bucket=wait.output)  # the sensor returns the merge's buckets
    context_shards = plan_context(spec)
    contexts = context_shuffle.partial(spec=spec, shards=context_shards).expand(shard=context_shards)
    rank_files >> wait
    merged >> context_shards
    contexts >> publish(spec)


def attempt_owner(context: Context) -> str:
    """Names this task attempt in the message that refuses a second attempt at the same output."""
    ti = context["ti"]
    index = f"[{ti.map_index}]" if ti.map_index is not None and ti.map_index >= 0 else ""  # None: not mapped
    return f"Airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}{index} try {ti.try_number}"


tokenize_corpus()
