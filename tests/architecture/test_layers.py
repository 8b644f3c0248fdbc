"""scripts/check_layers.py, which ``make lint`` runs: today's code keeps docs/architecture.md's picture and its
imports column is true; an import planted in a copy of the repository that breaks a rule fails the check, naming the
file, line, importer, imported and rule."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import ROOT


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts" / "check_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


check = load_check()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The library, the glue and the doc, copied: a test plants its import here."""
    for top in ("tokenization", "plugins", "dags"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "architecture.md", tmp_path / "docs")
    return tmp_path


def run(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = check.main(["--root", str(root), *args])
    return status, capsys.readouterr().err.splitlines()


def plant(root: Path, path: str, source: str) -> None:
    (root / path).write_text(source)


def test_todays_code_keeps_the_picture_and_the_table_is_true(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(ROOT, capsys) == (0, [])


@pytest.mark.parametrize(
    ("path", "source", "named"),
    [
        pytest.param(
            "tokenization/tokenizer/planted.py",
            "def late():\n    from tokenization.output import cache\n\n    return cache\n",
            "tokenization/tokenizer/planted.py:2: tokenization.tokenizer.planted imports tokenization.output.cache: "
            "tokenizer never imports output: the engines import nothing of the output protocol",
            id="engines-output-inside-a-function",
        ),
        pytest.param(
            "tokenization/output/planted.py",
            "from ..stages.merge import merge\n",
            "tokenization/output/planted.py:1: tokenization.output.planted imports tokenization.stages.merge: "
            "output never imports stages: the output protocol knows no stage",
            id="output-stage-relative",
        ),
        pytest.param(
            "tokenization/storage/planted.py",
            "from tokenization import records\n",
            "tokenization/storage/planted.py:1: tokenization.storage.planted imports tokenization.records: "
            "nothing imports a layer above it: records stands above storage in the table",
            id="below-imports-above",
        ),
        pytest.param(
            "tokenization/formats/planted.py",
            "from tokenization import TokenFile\n",
            "tokenization/formats/planted.py:1: tokenization.formats.planted imports tokenization: "
            "nothing imports a layer above it: the public API (tokenization/__init__.py) stands above every layer",
            id="the-public-api-from-inside",
        ),
        pytest.param(
            "tokenization/builds/planted.py",
            "import airflow.sdk\n",
            "tokenization/builds/planted.py:1: tokenization.builds.planted imports airflow.sdk: "
            "the library never imports Airflow",
            id="library-airflow",
        ),
        pytest.param(
            "plugins/tokenization_airflow/planted.py",
            "from tokenization.errors import TokenizationError\nfrom tokenization.stages.merge import merge\n",
            "plugins/tokenization_airflow/planted.py:2: plugins.tokenization_airflow.planted imports "
            "tokenization.stages.merge: the Airflow glue imports only the build, its config, report and pages, "
            "and the errors",
            id="glue-below-the-build",
        ),
        pytest.param(
            "tokenization/formats/planted.py",
            "from tokenization.storage import files\n",
            "tokenization/formats/planted.py:1: tokenization.formats.planted imports tokenization.storage.files: "
            "tokenization.storage.files is private to tokenization.storage: reach a store through a Folder "
            "(storage.folder)",
            id="storage-files-from-above",
        ),
        pytest.param(
            "plugins/tokenization_airflow/planted.py",
            "from tokenization.storage.files import open_fs\n",
            "plugins/tokenization_airflow/planted.py:1: plugins.tokenization_airflow.planted imports "
            "tokenization.storage.files: tokenization.storage.files is private to tokenization.storage: reach a "
            "store through a Folder (storage.folder)",
            id="storage-files-from-the-glue",
        ),
    ],
)
def test_a_planted_import_that_breaks_a_rule_is_named(
    copy: Path, capsys: pytest.CaptureFixture[str], path: str, source: str, named: str
) -> None:
    plant(copy, path, source)
    assert run(copy, capsys) == (1, [named])


def test_a_stale_imports_column_is_named_and_rewritten(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant(copy, "tokenization/rendering/planted.py", "from tokenization import wording\n")
    status, lines = run(copy, capsys)
    doc = (copy / "docs" / "architecture.md").read_text().splitlines()
    row = next(i + 1 for i, line in enumerate(doc) if line.startswith("| `rendering/`"))
    assert status == 1
    assert lines == [
        f"docs/architecture.md:{row}: rendering: the table says '`errors`', the code: '`errors`, `wording`' "
        "(python scripts/check_layers.py --write makes it)"
    ]
    assert run(copy, capsys, "--write") == (0, [])
    assert "| `errors`, `wording` |\n" in (copy / "docs" / "architecture.md").read_text()
    assert run(copy, capsys) == (0, [])


def test_a_table_whose_layers_differ_is_named(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy / "docs" / "architecture.md"
    doc.write_text(
        "".join(line for line in doc.read_text().splitlines(keepends=True) if "| `orderings.py`" not in line)
    )
    status, lines = run(copy, capsys, "--write")
    assert status == 1 and lines[0].startswith(
        "docs/architecture.md: the table's layers are ['version', 'errors', 'progress',"
    )
    assert "'records', 'formats', 'mixing'" in lines[0] and "'records', 'orderings', 'formats'" in lines[0]


def test_a_module_outside_the_layers_is_named(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant(copy, "tokenization/planted.py", "from tokenization import errors\n")
    plant(copy, "tokenization/errors.py", (copy / "tokenization/errors.py").read_text() + "from . import planted\n")
    assert run(copy, capsys) == (
        1,
        ["tokenization/planted.py: planted is no layer of docs/architecture.md's table (nor of LAYERS here)"],
    )


def test_a_known_exception_no_longer_met_is_named(
    copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check, "KNOWN", {*check.KNOWN, ("plugins.tokenization_airflow.params", "tokenization.stages")})
    assert run(copy, capsys) == (
        1,
        ["plugins.tokenization_airflow.params imports tokenization.stages: a known exception no longer met"],
    )
