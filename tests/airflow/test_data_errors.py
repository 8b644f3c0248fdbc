"""Data errors fail an Airflow task at once, with their one-line cause last in its log; other errors keep their
retries."""

from __future__ import annotations

import logging

import pytest

from tests.support.corpus import write_jsonl
from tests.support.dag_runs import DAG_CONF, run_dag
from tests.support.paths import ROOT

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")


def _errors() -> tuple[list[BaseException], list[BaseException]]:
    """Errors that running again repeats, and errors that another try may not meet."""
    from tokenization_airflow.tasks import PlanError

    from tokenization.errors import AttemptConflict, LeaseLost, StorageError, UsageError
    from tokenization.formats.ds import TokenFileError
    from tokenization.inputs.formats import InputError
    from tokenization.output.runs import BuildError
    from tokenization.records import RecordError
    from tokenization.storage.locations import LocationError
    from tokenization.tokenizer.counts import TooManyRejects

    data: list[BaseException] = [
        InputError("a.jsonl.gz: corrupt"),
        UsageError("rank 3 is outside 0..1"),
        LocationError("param output: /etc is outside"),
        TokenFileError("a.ds: truncated"),
        RecordError("_manifests/00000.json", "field 'counts' missing"),
        TooManyRejects("rank 0: 1001 rejected records"),
        BuildError("verify found 1 problems"),
        PlanError("unknown params"),
    ]
    transient: list[BaseException] = [
        StorageError("s3://bucket/a.jsonl: EndpointConnectionError"),
        ConnectionResetError("connection reset by peer"),
        AttemptConflict("another attempt is alive"),
        LeaseLost("the lease was taken over"),
        RuntimeError("a bug"),
        ValueError("a bug in a library"),
    ]
    return data, transient


def test_data_errors_are_told_from_errors_that_a_retry_may_not_meet() -> None:
    from tokenization_airflow.tasks import is_data_error

    data, transient = _errors()
    assert [type(e).__name__ for e in data if not is_data_error(e)] == []
    assert [type(e).__name__ for e in transient if is_data_error(e)] == []


def test_a_data_error_fails_without_retry_and_other_errors_pass_unchanged(caplog) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tokenization_airflow.tasks import one_line_failures

    data, transient = _errors()
    for error in data + transient:

        @one_line_failures
        def task(error=error):
            raise error

        with pytest.raises((AirflowFailException, type(error))) as info:
            task()
        if error in data:
            assert type(info.value) is AirflowFailException and str(info.value) == str(error)
            assert info.value.__suppress_context__  # the traceback stops at the task: its last line is the cause
        else:
            assert info.value is error
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"{e} (a data error: the task fails without retries)" for e in data
    ]


def test_every_task_and_the_sensors_poke_fail_at_once_on_data_errors(dag) -> None:
    from tokenization_airflow.sensors import ShardSensor
    from tokenization_airflow.tasks import one_line_failures

    wrapper = one_line_failures(lambda: None).__code__
    callables = {
        t.task_id: getattr(t, "python_callable", None) or t.partial_kwargs["python_callable"]
        for t in dag.tasks
        if not isinstance(t, ShardSensor)
    }
    assert len(callables) == len(dag.tasks) - 1 == 6
    assert [task for task, function in callables.items() if function.__code__ is not wrapper] == []
    assert ShardSensor.poke.__code__ is ShardSensor.resume.__code__ is wrapper


def logged_failure(output: str, cause: str) -> tuple[list[str], list[str]]:
    """In the output of a ``dag.test()`` run, the traceback that Airflow's task runner logged for the failure whose
    last line is ``cause``, and the task's lines after it (up to the execution API's next line, which a deployment
    logs in the API server, not in the task's log)."""
    lines = output.splitlines()
    last = lines.index(cause)
    start = max(i for i in range(last) if "Task failed with exception" in lines[i])
    end = next(i for i in range(last, len(lines)) if "[airflow.api_fastapi" in lines[i])
    return lines[start : last + 1], lines[last + 1 : end]


def test_a_corrupt_gz_fails_its_rank_once_with_the_cause_as_the_last_log_line(
    airflow_db, dag, tmp_path, monkeypatch, capfd, caplog
) -> None:
    """Finding 10: a corrupt .gz was retried 3 times, ~4.5 min, its cause buried under a stack trace. The builds
    page names the failed task and its cause."""
    from tokenization_airflow.builds_page import list_builds

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl.gz").write_bytes(b'{"text": "not compressed at all"}\n')  # a .jsonl named .gz
    write_jsonl(inputs / "b.jsonl.gz", [{"text": "fine"}])
    allowed = [str(inputs), str(ROOT / "sample"), dag.params.dump()["output"]]
    monkeypatch.setenv("TOKENIZATION_ALLOWED_LOCATIONS", ",".join(allowed))
    capfd.readouterr()
    run, tis, ok = run_dag(dag, DAG_CONF | {"input": str(inputs), "num_ranks": 2, "sensor_timeout": 1})
    out = capfd.readouterr().out
    assert not ok and (tis[("tokenize", 0)].state, tis[("tokenize", 0)].try_number) == ("failed", 1)
    assert tis[("tokenize", 1)].state == "success"
    assert tis[("wait_for_shards", -1)].state == "failed"  # deferred, then out of time (sensor_timeout=1)
    assert "AirflowSensorTimeout: shards still missing after 1s: rank 0 (" in out
    cause = (
        f"{inputs / 'a.jsonl.gz'}: corrupt or truncated gzip data before its first line; "
        "BadGzipFile: Not a gzipped file (b'{\"')"
    )
    traceback, after = logged_failure(out, f"airflow.sdk.exceptions.AirflowFailException: {cause}")
    assert len(after) == 2 and "::group::Post Execute" in after[0] and "::endgroup::" in after[1]  # an empty group
    assert not [line for line in traceback if "tokenization/inputs/reader.py" in line]  # the library's frames stay out
    logged = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR]
    assert ("tokenization_airflow.tasks", "ERROR", f"{cause} (a data error: the task fails without retries)") in logged
    row = next(r for r in list_builds(dag.dag_id) if r["run_id"] == run.run_id)  # the "Corpus builds" page's
    assert (row["state"], row["failure"]) == ("failed", {"task": "tokenize[0]", "cause": cause})
    assert list_builds(dag.dag_id)[0]["run_id"] == run.run_id  # the newest run: the one that started last
