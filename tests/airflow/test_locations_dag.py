"""Allowed locations and storage connections as the DAG's ``plan`` checks them: every file a build reads, after its
symlinks are resolved, and only a connection of the type S3 needs (finding 11 of issue 22)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.corpus import write_jsonl
from tests.support.dag_runs import run_dag
from tests.support.tokenizers import fetched

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")

HTTP_CONNECTION = {"conn_type": "http", "host": "http://airflow-apiserver:8080", "login": "admin", "password": "pw"}


@pytest.fixture
def deployment(tmp_path, monkeypatch, sample_tokenizer) -> dict:
    """A deployment that allows ``{tmp}/allowed`` and the sample tokenizer's folder, and a run's params there."""
    allowed = tmp_path / "allowed"
    write_jsonl(allowed / "in" / "a.jsonl", [{"text": "public"}])
    monkeypatch.setenv("TOKENIZATION_ALLOWED_LOCATIONS", f"{allowed},{sample_tokenizer.parent}")
    return {"input": str(allowed / "in"), "output": str(allowed / "builds"), "tokenizer": str(sample_tokenizer)}


def planned(dag, params: dict):
    from tokenization_airflow import tasks

    return tasks.plan(dict(dag.params.dump()) | params, "manual__locations", {}, set(dag.params), 1024)


def test_a_symlinked_input_file_leading_outside_is_refused_by_plan(airflow_db, dag, deployment, tmp_path) -> None:
    """Finding 11: the input folder was allowed, so a symlink in it put 50 secret documents in the dataset."""
    from tokenization.storage.locations import LocationError

    secret = write_jsonl(tmp_path / "secret" / "leak.jsonl", [{"text": "secret"}] * 50)
    link = Path(deployment["input"]) / "leak.jsonl"
    link.symlink_to(secret)
    with pytest.raises(LocationError, match=rf"^param input: {link} resolves to {secret}, outside the locations"):
        planned(dag, deployment)
    assert not Path(deployment["output"]).exists()  # refused before the run claimed its folder


def test_a_tokenizer_folder_whose_files_lead_outside_is_refused(airflow_db, dag, deployment, tmp_path) -> None:
    from tokenization_airflow import tasks

    from tokenization.storage.locations import LocationError

    folder = Path(deployment["input"]).parent / "tokenizer"
    folder.mkdir()
    (folder / "tokenizer.json").symlink_to(deployment["tokenizer"])  # inside the allowed sample folder: fine
    tasks.config_of(dict(dag.params.dump()) | deployment | {"tokenizer": str(folder)}).check_locations(
        tasks.deployment().allowed_locations
    )
    (folder / "tokenizer_config.json").symlink_to(write_jsonl(tmp_path / "secret" / "config.json", [{}]))
    with pytest.raises(LocationError, match=rf"^param tokenizer: {folder}/tokenizer_config.json resolves to "):
        tasks.config_of(dict(dag.params.dump()) | deployment | {"tokenizer": str(folder)}).check_locations(
            tasks.deployment().allowed_locations
        )


def test_a_connection_of_another_type_is_refused_by_name(airflow_db, dag, deployment, monkeypatch) -> None:
    """Finding 11: aws_conn_id named the api-server's HTTP connection; plan signed S3 requests with its login and
    failed 92 s later. It must fail at once, saying which connection and what type it needs."""
    from tokenization_airflow.connections import ConnectionTypeError, storage_options

    monkeypatch.setenv("AIRFLOW_CONN_API_SERVER_HTTP", json.dumps(HTTP_CONNECTION))
    aws = {"conn_type": "aws", "login": "id", "password": "key", "extra": {"endpoint_url": "http://minio:9000"}}
    monkeypatch.setenv("AIRFLOW_CONN_MINIO_STORE", json.dumps(aws))
    message = (
        "connection 'api_server_http' is of type 'http', but s3:// needs one of type 'aws': name an aws connection "
        "in aws_conn_id"
    )
    with pytest.raises(ConnectionTypeError) as refused:
        storage_options("api_server_http")
    assert str(refused.value) == message
    options = storage_options("minio_store")["s3"]
    assert options["key"] == "id" and options["client_kwargs"] == {"endpoint_url": "http://minio:9000"}
    from tokenization.builds.run import Build

    monkeypatch.setattr(Build, "start", lambda *args: pytest.fail("plan went on to list the input"))
    with pytest.raises(ConnectionTypeError, match=r"^connection 'api_server_http' is of type 'http'"):
        planned(dag, deployment | {"aws_conn_id": "api_server_http"})
    _, tis, ok = run_dag(dag, deployment | {"aws_conn_id": "api_server_http"})
    assert not ok and tis[("plan", -1)].state == "failed"


def test_plan_refuses_a_run_id_latest_and_params_that_crashed_a_build(airflow_db, dag, deployment) -> None:
    """Issue 37: a run id LATEST (the run id is the build id) and the params that crashed a build, or turned a
    limit off, fail at plan in one line, as on the command line, and before the run claims its folder."""
    from tokenization_airflow import tasks

    from tokenization.errors import UsageError

    with pytest.raises(UsageError) as refused:
        tasks.plan(dict(dag.params.dump()) | deployment, "LATEST", {}, set(dag.params), 1024)
    assert str(refused.value) == (
        f"build id 'LATEST' is the name (ignoring case, as some filesystems do) of {deployment['output']}/LATEST, "
        "which points at the newest complete build: choose another build id (in Airflow, another run id)"
    )
    for wrong, message in [
        ({"seed": 10**70}, f"seed must be at most 9223372036854775807, got {10**70}"),
        ({"max_reject_fraction": float("nan")}, "max_reject_fraction must be a finite number, got nan"),
        ({"output": "s3:/b/x"}, "output 's3:/b/x' is no URL, a scheme being followed by '://' (fsspec would take"),
    ]:
        with pytest.raises(UsageError) as refused:
            planned(dag, deployment | wrong)
        assert str(refused.value).startswith(message)
        assert tasks.is_data_error(refused.value)  # the task fails without retries
    assert not Path(deployment["output"]).exists()


def test_a_mixture_file_is_read_as_the_mixture_param_within_the_allowed_locations(
    airflow_db, dag, deployment, tmp_path
) -> None:
    """Issue 54: the trigger form's JSON editor lost typed keys; a spec in a file (``mixture_file``) is the same
    mixture as the JSON param, from a location checked as the build's own, and a run reads the planned one."""
    from tokenization_airflow import tasks

    from tokenization.output.runs import PlanConflict
    from tokenization.storage.locations import LocationError

    spec = {"tokens": 3, "sources": [{"name": "web", "input": deployment["input"], "weight": 1}]}
    file = Path(deployment["input"]).parent / "mix.yaml"
    file.write_text(f"tokens: 3\nsources:\n  - {{name: web, input: {deployment['input']}, weight: 1}}\n")
    build = planned(dag, deployment | {"mixture_file": str(file)})
    assert build.config.mixture == spec and build.plan.record.params.mixture == spec
    assert build.config.described_input == f"web={deployment['input']}"
    params = dict(dag.params.dump()) | deployment | {"mixture_file": str(file)}
    assert tasks.build_of(params, build.claimed.spec.to_json()).config.mixture == spec  # a later task's
    file.write_text(file.read_text().replace("tokens: 3", "tokens: 4"))
    with pytest.raises(PlanConflict, match=r" was planned with another mixture \(its file changed since\?\): "):
        tasks.build_of(params, build.claimed.spec.to_json())

    outside = tmp_path / "mix.yaml"
    outside.write_text(file.read_text())
    for wrong, error, message in [
        ({"mixture": spec}, tasks.PlanError, "give the mixture param (JSON) or mixture_file, not both"),
        ({}, LocationError, f"param mixture_file: {outside} is outside the locations this deployment allows"),
    ]:
        with pytest.raises(error) as refused:
            planned(dag, deployment | {"mixture_file": str(outside)} | wrong)
        assert str(refused.value).startswith(message)
    with pytest.raises(tasks.PlanError, match=r"^mixture_file 's3:/b/mix.yaml' is no URL, a scheme being followed"):
        planned(dag, deployment | {"mixture_file": "s3:/b/mix.yaml"})


@pytest.mark.parametrize(
    ("name", "eos"),
    [
        ("tokenizer.json", "<|endoftext|>"),
        ("cl100k_base.tiktoken", "<|endoftext|>"),
        ("mistral-v1/tokenizer.model", "</s>"),
    ],
)
def test_the_deployments_tokenizer_is_allowed_in_every_format(
    airflow_db, dag, tmp_path, monkeypatch, sample_tokenizer, name: str, eos: str
) -> None:
    """Issue 37, finding 8b: with TOKENIZATION_TOKENIZER a .tiktoken or .model file (and no allowed locations set),
    plan refused every run: the deployment allowed that file alone, not the tokenizer_config.json beside it."""
    tokenizer = tmp_path / "tokenizers" / Path(name).name
    tokenizer.parent.mkdir()
    shutil.copy(sample_tokenizer if name == "tokenizer.json" else fetched(name), tokenizer)
    params = {"input": str(tmp_path / "in"), "output": str(tmp_path / "builds"), "tokenizer": str(tokenizer)}
    write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "public"}])
    for setting, param in (("INPUT", "input"), ("OUTPUT", "output"), ("TOKENIZER", "tokenizer")):
        monkeypatch.setenv(f"TOKENIZATION_{setting}", params[param])
    monkeypatch.delenv("TOKENIZATION_ALLOWED_LOCATIONS", raising=False)
    plan = planned(dag, params).plan
    assert (len(plan.files), plan.record.tokenizer.eos_token) == (1, eos)
