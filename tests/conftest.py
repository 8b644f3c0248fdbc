"""Shared fixtures: the bundled sample, the real data beside the repo (when present), and datatrove runs."""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
ADMIN_PASSWORD = "corpus-admin"
Path(AIRFLOW_HOME, "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": ADMIN_PASSWORD}))
MERGE_POOL = "tokenization_merge"
DAG_CONF = {
    "num_ranks": 3,
    "seed": 1234,
    "context_window": 1025,
    "num_context_shards": 2,
    "merge_max_tokens_per_file": 20_000,
    "save_loss": True,
}
SAMPLE_CORPUS = ROOT / "sample" / "corpus"
SAMPLE_TOKENIZER = ROOT / "sample" / "tokenizer.json"
SHARED = ROOT.parent / "shared" / "data"
EOS = "<|endoftext|>"


def shared_path(*parts: str) -> Path:
    """A file of ``../shared/data``, or skip: a user's clone has no shared data."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the real tokenizers and corpora live in ../shared/data beside the repo")
    return path


def in_trainer_env(script: str, *args: str, cwd: Path | None = None) -> str:
    """What ``script`` prints, run by the trainers' environment (torch, megatron-core, datatrove's reader), or skip."""
    python = ROOT / ".venv-trainers" / "bin" / "python"
    if not (python.parent.parent / "ready").exists():
        pytest.skip(f"{python.parent.parent} is absent: `make trainer-env` installs the trainers' readers")
    done = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def write_jsonl(path: Path, records: list[dict | str]) -> Path:
    """Records as JSON lines (strings are written verbatim), gzip-compressed when the name ends in .gz."""
    data = "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def sample_records() -> list[dict]:
    records = []
    for path in sorted(SAMPLE_CORPUS.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            records.extend(json.loads(line) for line in handle)
    return records


def in_process(build, keep: int | None = None):
    """What ``Build.run`` does, step by step in this process: no process started for a step keeps a test quick.
    Returns the build as published."""
    until_publish(build)
    return build.publish(keep)


def until_publish(build) -> None:
    """Every step of ``Build.run`` but publish, in this process."""
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    for bucket in build.merge_buckets:
        build.merge(bucket, progress=False)
    shards = build.context_shards()
    for shard in shards:
        build.context_shuffle(shard, len(shards), progress=False)


def run_datatrove(
    inputs: Path, output: Path, tokenizer: Path, ranks: int, *, seed: int, eos: str | None = EOS, **options
) -> Path:
    """datatrove 0.10.1's JsonlReader + DocumentTokenizer; ``options`` go to DocumentTokenizer."""
    step = f"""DocumentTokenizer({str(output)!r}, tokenizer_name_or_path={str(tokenizer)!r}, eos_token={eos!r},
                                 seed={seed}, **options)"""
    return _datatrove(f"JsonlReader({str(inputs)!r}), {step}", ranks, output, options)


def run_datatrove_merger(inputs: Path, output: Path, *, seed: int, **options) -> Path:
    """datatrove 0.10.1's DocumentTokenizerMerger; ``options`` go to it."""
    step = f"DocumentTokenizerMerger({str(inputs)!r}, {str(output)!r}, seed={seed}, progress=False, **options)"
    return _datatrove(step, 1, output, options)


def run_datatrove_context_shuffler(inputs: Path, output: Path, *, seed: int, **options) -> Path:
    step = f"DocumentTokenizerContextShuffler({str(inputs)!r}, {str(output)!r}, seed={seed}, **options)"
    return _datatrove(step, 1, output, options)


def _datatrove(steps: str, tasks: int, output: Path, options: dict) -> Path:
    """Run a datatrove pipeline in a subprocess (its logger and executor stay out of the test process)."""
    script = f"""
import json, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerContextShuffler, DocumentTokenizerMerger
options = json.loads(sys.argv[1])
LocalPipelineExecutor(pipeline=[{steps}], tasks={tasks}, workers=1, logging_dir={str(output) + "_logs"!r}).run()
"""
    subprocess.run([sys.executable, "-c", script, json.dumps(options)], check=True, capture_output=True)
    return output


# The tests that start a whole deployment (scheduler, API server, Celery workers, triggerer, browser): on two cores,
# two at once starve each other's heartbeats, so a parallel run gives them all to one worker, one after another.
DEPLOYMENT_TESTS = ("tests/test_distributed.py", "tests/test_schedule.py", "tests/test_ui_runs.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: a test of minutes (a deployment, the bench's smoke run), started before the others"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests first (a stable sort): ``make test``'s two workers take their work in this order, so one starts
    on the deployments and the other on the bench while the short tests fill the gaps."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's file-at-a-time scheduling (``--dist loadfile``), with the deployment tests as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class DeploymentsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "deployments" if file in DEPLOYMENT_TESTS else file

    return DeploymentsTogether(config, log)


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


def run_dag(dag, conf: dict):
    """One whole run with ``dag.test()``: the run, its task instances by (task, map index), and success."""
    from airflow.sdk import DagRunState

    saved = {task.task_id: copy.deepcopy(task.params) for task in dag.tasks}
    try:
        run = dag.test(run_conf=conf)
    finally:  # dag.test writes the run's conf into the tasks' params: the next run must start from the defaults
        for task in dag.tasks:
            task.params = saved[task.task_id]
    tis = {(ti.task_id, ti.map_index): ti for ti in run.get_task_instances()}
    return run, tis, run.state == DagRunState.SUCCESS


def build_of(run) -> tuple[Path, dict]:
    """A run's folder and its build manifest."""
    from tokenization.output.runs import folder_for

    folder = Path(folder_for(os.environ["TOKENIZATION_OUTPUT"], run.run_id))
    return folder, json.loads((folder / "_BUILD.json").read_text())


@pytest.fixture
def storage_questions(monkeypatch) -> Counter:
    """Counts the size and existence questions asked of local storage: on S3 each is a HEAD request, one after
    another. (A local listing asks ``info`` of each entry, so that is not counted: on S3 a listing is one request.)"""
    from fsspec.implementations.local import LocalFileSystem

    asked: Counter = Counter()
    for name in ("exists", "size"):
        real = getattr(LocalFileSystem, name)

        def counted(self, path, *args, _name=name, _real=real, **kwargs):
            asked[_name] += 1
            return _real(self, path, *args, **kwargs)

        monkeypatch.setattr(LocalFileSystem, name, counted)
    return asked
