"""The shard sensor waits deferred: its trigger checks the shards until they are complete, a rank can never finish,
or time is up, and the sensor goes on from the trigger's event. (Whole runs: ``tests/airflow/test_dag.py``,
``tests/airflow/test_data_errors.py``; clearing a rank while it waits, from the Grid and the REST API:
``tests/airflow/test_ui_runs.py``, ``tests/deployment/test_distributed.py``.)"""

from __future__ import annotations

import asyncio
import importlib
import re
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred
from tokenization_airflow import sensors
from tokenization_airflow.sensors import ShardsCannotComplete, ShardSensor, ShardTrigger

from tokenization.builds.run import Build
from tokenization.errors import StorageError

RUN = {"dag_id": "tokenize_corpus", "run_id": "manual__1", "ranks_task_id": "tokenize"}
MISSING = {1: "no completion marker"}


def checks(monkeypatch, *answers) -> list[Any]:
    """``missing_shards`` gives ``answers`` in turn, then the last one again and again (an exception is raised);
    returns the arguments it got, the build being what a call of ``build_of`` made (of a 3-rank plan)."""
    asked: list[Any] = []
    pending = list(answers)

    def build_of(params, spec):
        asked.append("build_of")
        return SimpleNamespace(made_of=(params, spec), config=SimpleNamespace(num_ranks=3))

    monkeypatch.setattr(sensors, "build_of", build_of)

    def missing_shards(*args):
        asked.append(args)
        answer = pending.pop(0) if len(pending) > 1 else pending[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(sensors, "missing_shards", missing_shards)
    return asked


def events(trigger: ShardTrigger) -> list[dict]:
    async def every():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(every())


def trigger(deadline: float = float("inf")) -> ShardTrigger:
    return ShardTrigger(params={"seed": 1}, spec={"run_dir": "x"}, **RUN, poke_interval=0, deadline=deadline)


def test_the_trigger_waits_through_storage_errors_and_fires_once_with_the_buckets(monkeypatch, capsys) -> None:
    waiting = (None, MISSING)
    asked = checks(monkeypatch, waiting, waiting, StorageError("s3://corpus: SlowDown"), waiting, ([0, 1], {}))
    assert events(trigger()) == [{"buckets": [0, 1]}]
    assert asked[0] == "build_of" and asked[1][0].made_of == ({"seed": 1}, {"run_dir": "x"})
    assert asked[1:] == [(asked[1][0], "tokenize_corpus", "manual__1", "tokenize")] * 5  # the build made once
    logged = re.findall(r"\[(\w+) *\] (.*) \[tokenization_airflow.sensors.ShardTrigger\]", capsys.readouterr().out)
    assert logged == [
        ("info", "waiting for 1 of 3 ranks: rank 1 (no completion marker)"),  # once: the ranks missing did not change
        ("warning", "checking the shards failed, trying again: s3://corpus: SlowDown"),
    ]


def test_the_trigger_fires_a_data_error_at_once(monkeypatch) -> None:
    cause = "ranks that can never finish, so the build cannot: rank 2 (upstream_failed)"
    checks(monkeypatch, ShardsCannotComplete(cause))
    assert events(trigger()) == [{"failure": cause}]


def test_the_trigger_fires_the_missing_ranks_when_time_is_up(monkeypatch) -> None:
    checks(monkeypatch, (None, MISSING), StorageError("unreachable"))  # the ranks last seen missing are named
    assert events(trigger(deadline=time.time() + 0.05)) == [{"missing": [(1, "no completion marker")]}]


def test_the_trigger_is_rebuilt_from_what_it_serializes() -> None:
    classpath, kwargs = trigger(deadline=123.0).serialize()  # what the triggerer imports and calls
    module, name = classpath.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)


class TaskInstance:
    dag_id, run_id = RUN["dag_id"], RUN["run_id"]


def sensor() -> ShardSensor:
    return ShardSensor(task_id="wait_for_shards", spec={"run_dir": "x"}, sensor_timeout="900", poke_interval=10)


def test_the_sensor_returns_at_once_when_the_shards_are_there_and_defers_otherwise(monkeypatch) -> None:
    context = cast(Context, {"ti": TaskInstance(), "params": {"seed": 1}})  # what the sensor reads of it
    checks(monkeypatch, ([None], {}), (None, MISSING))
    assert sensor().execute(context) == [None]
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        sensor().execute(context)
    assert deferred.value.method_name == "resume" and deferred.value.timeout.total_seconds() == 900 + 300
    _, kwargs = deferred.value.trigger.serialize()
    assert before + 900 <= kwargs.pop("deadline") <= time.time() + 900
    assert kwargs == {"params": {"seed": 1}, "spec": {"run_dir": "x"}, **RUN, "poke_interval": 10.0}


def test_the_sensor_goes_on_from_the_triggers_event() -> None:
    assert sensor().resume({}, {"buckets": [None]}) == [None]
    timeout = r"^shards still missing after 900s: rank 1 \(no completion marker\)$"
    with pytest.raises(AirflowSensorTimeout, match=timeout):
        sensor().resume({}, {"missing": [(1, "no completion marker")]})
    with pytest.raises(AirflowFailException, match=r"^ranks that can never finish"):  # no retries: it would not help
        sensor().resume({}, {"failure": "ranks that can never finish, so the build cannot: rank 2 (removed)"})


@pytest.mark.parametrize(
    ("missing", "states", "expected"),
    [
        ({}, {}, ([3, 4], {})),
        (MISSING, {"tokenize_0": "success", "tokenize_1": "failed"}, (None, MISSING)),  # a failed rank may be cleared
        (MISSING, {"tokenize_0": "success", "tokenize_1": None}, (None, MISSING)),  # cleared, not yet queued
        (MISSING, {"tokenize_1": "upstream_failed"}, "ranks that can never finish, so the build cannot: rank 1 "),
        ({2: "no completion marker"}, {"tokenize_1": "success"}, "the build cannot: rank 2 (never created)"),
        (MISSING, {"tokenize": "upstream_failed"}, "no rank was created (tokenize is upstream_failed): plan failed"),
    ],
)
def test_the_check_waits_only_for_ranks_that_can_still_finish(monkeypatch, missing, states, expected) -> None:
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    build = cast(Build, SimpleNamespace(incomplete_ranks=lambda: missing, merge_buckets=[3, 4]))  # what it reads
    asked = []

    def get_task_states(**query):
        asked.append(query)
        return {"manual__1": states}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    if isinstance(expected, str):
        with pytest.raises(ShardsCannotComplete, match=re.escape(expected)):
            sensors.missing_shards(build, "tokenize_corpus", "manual__1", "tokenize")
    else:
        assert sensors.missing_shards(build, "tokenize_corpus", "manual__1", "tokenize") == expected
    query = {"dag_id": "tokenize_corpus", "task_ids": ["tokenize"], "run_ids": ["manual__1"]}
    assert asked == ([query] if missing else [])  # Airflow is asked only while ranks are missing
