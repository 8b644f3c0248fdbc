"""The tokenize_corpus DAG: its shape, its params, and whole runs with dag.test() (in process, SQLite)."""

from __future__ import annotations

import pytest

from tests.conftest import DAG_CONF, MERGE_POOL, build_of, run_dag
from tests.test_tokenize import file_bytes

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")


def test_shape(dag) -> None:
    from airflow.sdk import TriggerRule

    assert set(dag.task_dict) == {"plan", "tokenize", "wait_for_shards", "merge", "context_shuffle", "publish"}
    merge, sensor = dag.get_task("merge"), dag.get_task("wait_for_shards")
    assert merge.pool == MERGE_POOL and merge.pool_slots == 1 and merge.queue == "large_disk"
    assert sensor.mode == "reschedule" and sensor.trigger_rule == TriggerRule.ALL_DONE
    assert dag.get_task("publish").trigger_rule == TriggerRule.NONE_FAILED
    assert dag.get_task("tokenize").is_mapped and dag.get_task("context_shuffle").is_mapped
    assert dag.get_task("tokenize").retries == 2
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.timetable.expression == "0 2 * * *" and str(dag.timetable.timezone) == "UTC"
    assert {"input", "output", "tokenizer", "num_ranks", "merge_mode", "context_window", "sensor_timeout"} <= set(
        dag.params
    )
    assert [o.name for o in dag.get_task("publish").outlets] == ["tokenized_corpus"]


@pytest.mark.parametrize(
    ("conf", "param"),
    [({"num_ranks": 0}, "num_ranks"), ({"merge_mode": "random"}, "merge_mode"), ({"seed": -1}, "seed")],
)
def test_bad_params_are_refused_naming_the_param(airflow_db, dag, conf, param) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"Invalid input for param {param}"):
        dag.test(run_conf=conf)


def test_a_run_equals_the_cli_pipeline(airflow_db, dag, tmp_path, sample_corpus, sample_tokenizer) -> None:
    from tests.test_context import shuffled
    from tests.test_merge import merged
    from tests.test_tokenize import run

    run_, tis, ok = run_dag(dag, DAG_CONF)
    assert ok, {k: ti.state for k, ti in tis.items()}
    assert tis[("tokenize", 1)].rendered_map_index == "rank-1"
    assert tis[("context_shuffle", 1)].rendered_map_index == "shard-1"
    folder, build = build_of(run_)
    assert build["verify"]["ok"] and build["conservation"]["holds"]
    assert build["conservation"]["docs_in"] == 309 and build["conservation"]["docs_out"] == 308

    for rank in range(3):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=3, seed=1234, save_loss=True)
    merged(tmp_path / "ranks", tmp_path / "merged", save_filename="corpus", seed=1234, save_loss=True,
           max_tokens_per_file=20_000)  # fmt: skip
    for shard in range(2):
        shuffled(tmp_path / "merged", tmp_path / "context", seed=1234, window_size=1025, shard=shard, num_shards=2)
    assert file_bytes(folder / "context") == file_bytes(tmp_path / "context")
    assert len(build["files"]) == 4


def test_a_failed_rank_is_retried_and_the_bytes_match_a_clean_run(airflow_db, dag, monkeypatch) -> None:
    clean, _, ok = run_dag(dag, DAG_CONF)
    assert ok
    monkeypatch.setenv("TOKENIZATION_TEST_FAIL_RANKS", "2")
    faulty, tis, ok = run_dag(dag, DAG_CONF)
    assert ok and tis[("tokenize", 2)].try_number == 2 and tis[("tokenize", 0)].try_number == 1
    assert file_bytes(build_of(faulty)[0] / "context") == file_bytes(build_of(clean)[0] / "context")


def test_a_missing_pool_fails_plan_with_the_command_to_create_it(airflow_db, dag) -> None:
    from airflow.models.pool import Pool
    from tokenization_airflow import tasks

    Pool.delete_pool(MERGE_POOL)
    try:
        with pytest.raises(tasks.PlanError, match=f"airflow pools set {MERGE_POOL} 1"):
            tasks.plan(dict(dag.params.dump()), "manual__check")
        _, tis, ok = run_dag(dag, DAG_CONF)
        assert not ok and tis[("plan", -1)].state == "failed"
    finally:
        Pool.create_or_update_pool(MERGE_POOL, 1, "corpus-tokenization merge", include_deferred=False)
