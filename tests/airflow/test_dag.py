"""The tokenize_corpus DAG: its shape, its params, and whole runs with dag.test() (in process, SQLite)."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest

from tests.support.dag_runs import DAG_CONF, MERGE_POOL, build_of, run_dag
from tests.support.stages import file_bytes

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")


def test_shape(dag) -> None:
    from airflow.sdk import TriggerRule

    assert set(dag.task_dict) == {
        "plan",
        "tokenize",
        "wait_for_shards",
        "merge",
        "plan_context",
        "context_shuffle",
        "publish",
    }
    merge, sensor = dag.get_task("merge"), dag.get_task("wait_for_shards")
    assert merge.pool == MERGE_POOL and merge.pool_slots == 1 and merge.queue == "large_disk"
    assert sensor.trigger_rule == TriggerRule.ALL_DONE and sensor.poke_interval == 10
    assert dag.get_task("publish").trigger_rule == TriggerRule.NONE_FAILED
    assert all(dag.get_task(t).is_mapped for t in ("tokenize", "merge", "context_shuffle"))
    assert dag.get_task("tokenize").retries == 2
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.schedule is None and type(dag.timetable).__name__ == "NullTimetable"  # no TOKENIZATION_SCHEDULE here
    assert {"input", "output", "tokenizer", "num_ranks", "merge_mode", "context_window", "sensor_timeout"} <= set(
        dag.params
    )
    assert [o.name for o in dag.get_task("publish").outlets] == ["tokenized_corpus"]


def test_every_param_has_a_title_a_description_and_a_section(dag) -> None:
    """The trigger form is made from the library's BuildConfig: nothing untitled, defaults from one place."""
    from tokenization.builds.config import BuildConfig
    from tokenization.stages.merge.config import DEFAULT_MAX_TOKENS_PER_FILE

    params = {name: dag.params.get_param(name) for name in dag.params}
    schemas = {name: param.schema for name, param in params.items()}
    assert list(schemas)[:3] == ["input", "output", "tokenizer"] and len(schemas) == 44
    assert schemas["keep_intermediate"] == {"type": "boolean", "title": "Keep intermediate token files"}
    keep = params["keep_intermediate"]  # a flag of the build's own, off: a published build is one copy
    assert keep.value is False and "ranks/ and merged/" in keep.description
    assert schemas["mds"] == {"type": "boolean", "title": "Also write MDS"}
    assert params["mds"].value is False and "{run}/mds/" in params["mds"].description
    assert schemas["context_mode"]["enum"] == ["windows", "packed"] and dag.params.dump()["context_mode"] == "windows"
    assert schemas["cache"]["type"] == ["null", "string"] and "off" in params["cache"].description
    assert [name for name, param in params.items() if not (param.schema.get("title") and param.description)] == []
    assert schemas["text_key"]["section"] == "Reading and encoding" and schemas["save_loss"]["section"] == "Rank files"
    assert schemas["template"]["type"] == ["null", "string"] and dag.params.dump()["loss_roles"] == "assistant"
    assert schemas["sensor_timeout"]["section"] == "Airflow" and "section" not in schemas["num_ranks"]
    assert [name for name in ("input", "output", "tokenizer") if "section" in schemas[name]] == []  # the form's top
    mixture = schemas["mixture"]  # a JSON object in the form, checked field by field when the run is triggered
    assert mixture["type"] == ["null", "object"] and mixture["required"] == ["sources"] and "section" not in mixture
    source = mixture["properties"]["sources"]["items"]
    assert source["type"] == "object" and set(source["required"]) == {"name", "input", "weight"}
    assert params["mixture"].value is None and "docs/mixtures.md" in params["mixture"].description
    assert list(schemas)[list(schemas).index("mixture") + 1] == "mixture_file"  # the same spec as a file, beside it
    assert schemas["mixture_file"]["type"] == ["null", "string"] and params["mixture_file"].value is None
    defaults = dag.params.dump()
    assert defaults["merge_max_tokens_per_file"] == DEFAULT_MAX_TOKENS_PER_FILE
    assert defaults["context_window"] == BuildConfig.__dataclass_fields__["context_window"].default
    assert "\n## Running it\n" in dag.doc_md


@pytest.mark.parametrize(
    ("conf", "param"),
    [
        ({"num_ranks": 0}, "num_ranks"),
        ({"merge_mode": "random"}, "merge_mode"),
        ({"seed": -1}, "seed"),
        ({"mixture": {"sources": [{"name": "web", "weight": 1}]}}, "mixture"),  # a source without its input
        ({"mixture": {"sources": [{"name": "web", "input": "x", "weight": 1, "wieght": 2}]}}, "mixture"),
    ],
)
def test_bad_params_are_refused_naming_the_param(airflow_db, dag, conf, param) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"Invalid input for param {param}"):
        dag.test(run_conf=conf)


@pytest.fixture(scope="module")
def clean_run(airflow_db, dag):
    """One whole run of ``DAG_CONF``, which the tests of a clean run and of a retried rank both hold theirs to (a
    run of the DAG takes ~25 s here, most of this file's time)."""
    return run_dag(dag, DAG_CONF)


def test_a_run_equals_tokenization_build(clean_run, tmp_path, sample_corpus, sample_tokenizer) -> None:
    """The DAG and ``tokenization build`` are one build: the same params give the same digest and the same bytes."""
    from tests.support.processes import cli

    run_, tis, ok = clean_run
    assert ok, {k: ti.state for k, ti in tis.items()}
    assert tis[("tokenize", 1)].rendered_map_index == "rank-1"
    assert tis[("context_shuffle", 1)].rendered_map_index == "shard-1"
    folder, build = build_of(run_)
    assert build["verify"]["ok"] and build["conservation"]["holds"]
    assert build["conservation"]["docs_in"] == 309 and build["conservation"]["docs_out"] == 308
    assert len(build["files"]) == 4 and build["params"]["num_ranks"] == 3
    assert (folder.parent / "LATEST").read_text() == f"{folder.name}\n"  # the run folder's name, in the output
    assert tis[("publish", -1)].xcom_pull(task_ids="publish")["latest"] == str(folder)

    options = [f"--{k.replace('_', '-')}={v}" for k, v in DAG_CONF.items() if k != "save_loss"] + ["--save-loss"]
    done = cli(
        "build",
        str(sample_corpus),
        "--output",
        str(tmp_path),
        "--tokenizer",
        str(sample_tokenizer),
        *options,
        "--build-id",
        "by-hand",
    )
    assert done.returncode == 0, done.stderr
    by_hand = json.loads((tmp_path / "by-hand" / "_BUILD.json").read_text())
    assert f"digest:  {by_hand['digest']}" in done.stdout
    assert by_hand["digest"] == build["digest"]
    assert file_bytes(tmp_path / "by-hand" / "context") == file_bytes(folder / "context")
    assert by_hand["params"] == build["params"] | {"output": str(tmp_path)}


def test_a_bucketed_run_maps_the_merge_over_buckets(airflow_db, dag, tmp_path, sample_corpus, sample_tokenizer):
    """Also with ``mds``: publish writes the MDS copy, the same bytes as a build by hand writes."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    conf = DAG_CONF | {"merge_mode": "bucketed", "num_buckets": 4, "mds": True}
    run_, tis, ok = run_dag(dag, conf)
    assert ok, {k: ti.state for k, ti in tis.items()}
    assert [tis[("merge", b)].rendered_map_index for b in range(4)] == [f"bucket-{b}" for b in range(4)]
    folder, build = build_of(run_)
    assert build["verify"]["ok"] and build["conservation"]["docs_out"] == 308 and build["token_flow"]["merge"] == 64_522
    assert {name[:5] for name in build["files"]} == {"00000", "00001", "00002", "00003"}
    assert build["mds"]["tokens"] == 64_522 and (folder / "mds" / "index.json").is_file()
    config = BuildConfig(input=str(sample_corpus), output=str(tmp_path), tokenizer=str(sample_tokenizer), **conf)
    by_hand = Build.start(config, "by-hand").run(parallel=2).record
    assert by_hand.mds is not None
    assert (by_hand.digest, by_hand.mds.index_sha256) == (build["digest"], build["mds"]["index_sha256"])


def test_a_mixture_run_takes_each_source_at_its_share(airflow_db, dag, tmp_path, sample_corpus, sample_tokenizer):
    """A mixture in the trigger form's conf: three sources made of the sample's files (``code`` too small for its
    share but for ``max_repetition`` 2), each at its target share within one of its mean documents; the same
    mixture built by ``Build`` gives the same digest."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    corpus = f"{sample_corpus}/part-0000"
    mixture: dict[str, Any] = {
        "tokens": 50_000,
        "sources": [
            {"name": "web", "input": f"{corpus}[01].jsonl.gz", "weight": 5},  # 32,323 tokens for 25,000
            {"name": "code", "input": f"{corpus}2.jsonl.gz", "weight": 4, "max_repetition": 2},  # 16,726 for 20,000
            {"name": "math", "input": f"{corpus}3.jsonl.gz", "weight": 1},  # 15,473 for 5,000; one empty document
        ],
    }
    conf = DAG_CONF | {"mixture": mixture}
    run_, tis, ok = run_dag(dag, conf)
    assert ok, {k: ti.state for k, ti in tis.items()}
    folder, build = build_of(run_)
    assert build["verify"]["ok"] and build["conservation"]["holds"] and build["params"]["input"] is None
    assert build["input"] == ", ".join(f"{s['name']}={s['input']}" for s in mixture["sources"])
    accounts = {account["name"]: account for account in build["mixture"]}
    assert list(accounts) == ["web", "code", "math"]
    means = []  # each source's mean document, in tokens
    for account, weight in zip(accounts.values(), (0.5, 0.4, 0.1), strict=True):
        assert account["target"] == weight
        means.append(account["tokens_available"] / (account["docs_chosen"] + account["docs_not_chosen"]))
        assert abs(account["tokens_chosen"] - weight * build["tokens"]) <= means[-1], account
        assert account["docs_read"] == (
            account["docs_chosen"] + account["docs_not_chosen"] + account["empty"] + account["quarantined"]
        )
    assert accounts["code"]["docs_repeated"] > 0 and accounts["code"]["uses"] > accounts["code"]["docs_chosen"]
    assert accounts["web"]["docs_repeated"] == accounts["math"]["docs_repeated"] == 0
    assert (accounts["math"]["docs_read"], accounts["math"]["empty"]) == (77, 1)
    assert sum(account["tokens_chosen"] for account in accounts.values()) == build["tokens"]
    assert abs(build["tokens"] - mixture["tokens"]) <= sum(means)
    assert all((folder / "context" / f"{name}.source").is_file() for name in build["files"])

    config = BuildConfig(output=str(tmp_path), tokenizer=str(sample_tokenizer), **conf)
    assert Build.start(config, "by-hand").run(parallel=2).record.digest == build["digest"]


@pytest.fixture
def fails_once(monkeypatch):
    """``fails_once(rank)``: that rank's first attempt fails (dag.test runs every task in this process)."""
    from tokenization.builds.run import Build

    tokenize, failed = Build.tokenize, set()

    def arm(*ranks: int) -> None:
        def failing(self, rank, *args, **kwargs):
            if rank in ranks and rank not in failed:
                failed.add(rank)
                raise RuntimeError(f"rank {rank}: failing its first attempt on purpose (a test fixture)")
            return tokenize(self, rank, *args, **kwargs)

        monkeypatch.setattr(Build, "tokenize", failing)

    return arm


def test_a_failed_rank_is_retried_and_the_bytes_match_a_clean_run(airflow_db, dag, clean_run, fails_once) -> None:
    clean, _, ok = clean_run
    assert ok
    fails_once(2)
    faulty, tis, ok = run_dag(dag, DAG_CONF)
    assert ok and tis[("tokenize", 2)].try_number == 2 and tis[("tokenize", 0)].try_number == 1
    assert file_bytes(build_of(faulty)[0] / "context") == file_bytes(build_of(clean)[0] / "context")
    cache = build_of(faulty)[1]["cache"]  # the nightly default: the second night tokenizes nothing again
    assert (cache["files_hit"], cache["files_missed"]) == (4, 0)


def test_a_missing_pool_fails_plan_with_the_command_to_create_it(airflow_db, dag) -> None:
    from airflow.models.pool import Pool
    from tokenization_airflow import tasks

    Pool.delete_pool(MERGE_POOL)
    try:
        with pytest.raises(tasks.PlanError, match=f"airflow pools set {MERGE_POOL} 1"):
            tasks.plan(dict(dag.params.dump()), "manual__check", {}, set(dag.params), 1024)
        _, tis, ok = run_dag(dag, DAG_CONF)
        assert not ok and tis[("plan", -1)].state == "failed"
    finally:
        Pool.create_or_update_pool(MERGE_POOL, 1, "corpus-tokenization merge", include_deferred=False)


def failed_fast(dag, conf: dict) -> dict:
    """Run with a conf that plan must refuse: the run fails within a minute, and no rank ever ran."""
    started = time.monotonic()
    _, tis, ok = run_dag(dag, conf)
    assert not ok and time.monotonic() - started < 60
    assert tis[("plan", -1)].state == "failed" and tis[("wait_for_shards", -1)].state == "failed"
    assert not [key for key, ti in tis.items() if key[0] == "tokenize" and ti.state == "success"]
    return tis


def test_a_misspelled_param_is_refused_naming_it(airflow_db, dag) -> None:
    from tokenization_airflow import tasks

    with pytest.raises(
        tasks.PlanError, match=r"unknown params in the run's conf: 'num_rank' \(did you mean 'num_ranks'\?\)"
    ):
        tasks.check_conf({"num_rank": 8, "seed": 1}, set(dag.params))
    failed_fast(dag, {"num_rank": 8})


@pytest.mark.parametrize(
    ("param", "value", "message"),
    [
        ("output", "http://127.0.0.1:8765/secret/index.html?x=", "http:// is not a storage this deployment"),
        ("output", "/etc", "/etc is outside the locations this deployment allows"),
        ("output", "../../", "../../ is outside the locations this deployment allows"),
        ("input", "/etc/passwd", "/etc/passwd is outside the locations this deployment allows"),
        ("tokenizer", "/etc/hostname", "/etc/hostname is outside the locations"),
        ("chat_template", "/etc/passwd", "/etc/passwd is outside the locations"),
    ],
)
def test_locations_outside_the_allowed_ones_are_refused(airflow_db, dag, param, value, message) -> None:
    from tokenization_airflow import tasks

    from tokenization.storage.locations import LocationError

    with pytest.raises(LocationError, match=f"param {param}: .*{re.escape(message)}"):
        chat = {"messages_key": "messages"} if param == "chat_template" else {}  # a chat template needs its messages
        tasks.config_of(dict(dag.params.dump()) | chat | {param: value}).check_locations(
            tasks.deployment().allowed_locations
        )
    if param == "output" and value.startswith("http"):
        failed_fast(dag, {param: value})


def test_more_ranks_than_airflow_maps_are_refused_naming_the_setting(airflow_db, dag, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "2")
    from tokenization_airflow import tasks

    with pytest.raises(tasks.PlanError, match=r"num_ranks=3 exceeds Airflow's \[core\] max_map_length=2"):
        tasks.check_map_length({"num_ranks": 3}, 2)
    with pytest.raises(tasks.PlanError, match=r"num_buckets=8 exceeds Airflow's \[core\] max_map_length=4"):
        tasks.check_map_length({"num_ranks": 3, "num_buckets": 8}, 4)
    failed_fast(dag, {"num_ranks": 3})


def nightly(monkeypatch, schedule: str | None):
    """The DAG as a deployment with ``TOKENIZATION_SCHEDULE=schedule`` (None: unset) parses it."""
    from airflow.dag_processing.dagbag import DagBag

    if schedule is None:
        monkeypatch.delenv("TOKENIZATION_SCHEDULE", raising=False)
    else:
        monkeypatch.setenv("TOKENIZATION_SCHEDULE", schedule)
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags["tokenize_corpus"]


@pytest.mark.parametrize("schedule", [None, "", "none", "None"])
def test_no_schedule_unless_the_deployment_asks_for_one(monkeypatch, schedule) -> None:
    """Unset (``make airflow``, ``make demo``), the DAG runs only what is triggered: unpausing it, which the
    trigger form's "Unpause on trigger" box does by default, starts no run of its own ahead of the triggered one."""
    dag = nightly(monkeypatch, schedule)
    assert dag.schedule is None and type(dag.timetable).__name__ == "NullTimetable"


def test_a_deployment_schedule_is_a_utc_cron_trigger(monkeypatch) -> None:
    """docker-compose.yaml asks for the nightly build; a deployment's cron expression is read in UTC."""
    dag = nightly(monkeypatch, "0 2 * * *")
    assert dag.timetable.expression == "0 2 * * *" and str(dag.timetable.timezone) == "UTC"
    assert dag.max_active_runs == 1 and not dag.catchup


def test_unpausing_starts_the_most_recent_nightly_slot(monkeypatch) -> None:
    """What the scheduler plans for a DAG deployed at 14:00 UTC with the nightly schedule, catchup being off: the
    latest 02:00 UTC slot, the run that unpausing starts (tests/airflow/test_schedule.py sees it happen)."""
    import pendulum
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.timetables import trigger
    from airflow.timetables.base import TimeRestriction

    dag = nightly(monkeypatch, "0 2 * * *")
    timetable = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable  # as the scheduler holds it
    monkeypatch.setattr(trigger, "utcnow", lambda: pendulum.datetime(2026, 11, 30, 14, 0, tz="UTC"))
    first = timetable.next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(dag.start_date, None, catchup=False)
    )
    assert first is not None and first.run_after == pendulum.datetime(2026, 11, 30, 2, 0, tz="UTC")


def test_the_sensor_fails_at_once_when_plan_failed_after_recording_the_run(airflow_db, dag, monkeypatch) -> None:
    """Finding 8 as it happened: plan records the run's spec, then fails to push its list of ranks (more than
    [core] max_map_length); the sensor has a spec, but no rank will ever exist, so it must not wait for them."""
    from tokenization_airflow import tasks

    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "2")
    monkeypatch.setattr(tasks, "check_map_length", lambda params, limit: None)
    tis = failed_fast(dag, {"num_ranks": 3})
    spec = tis[("plan", -1)].xcom_pull(task_ids="plan", key="spec")
    assert set(spec) == {"format", "run_dir", "digest"} and len(spec["digest"]) == 64
