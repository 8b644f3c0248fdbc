"""One copy of the dataset on storage: once a build is published its intermediate token files (ranks/, merged/) are
removed unless it keeps them, every record stays, each step run again does nothing, and the bytes each folder and
the tokenization cache hold are recorded, reported and shown."""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path

import pytest

from tests.support.builds import in_process, until_publish
from tests.support.paths import SAMPLE_CORPUS, SAMPLE_TOKENIZER
from tests.support.processes import cli
from tokenization.builds import footprint
from tokenization.builds.config import BuildConfig
from tokenization.builds.pages import size
from tokenization.builds.run import Build
from tokenization.cli import build_parser
from tokenization.options import from_arguments
from tokenization.output.runs import Layout
from tokenization.records import ContextManifest, MergeManifest, RankManifest
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

STAGES = ("ranks", "merged", "context")
RECORDS = ("_manifests", "_completions", "_quarantine")
TOKEN_FILE = re.compile(r".+\.(ds(\.(index|loss|metadata))?|bin|idx)")
SETTINGS = {
    "seed": 7,
    "num_ranks": 3,
    "save_loss": True,
    "context_window": 1025,
    "num_context_shards": 2,
    "merge_max_tokens_per_file": 20_000,
}


def config_for(tmp_path: Path, **options) -> BuildConfig:
    return BuildConfig(
        input=str(SAMPLE_CORPUS),
        output=str(tmp_path / "builds"),
        tokenizer=str(SAMPLE_TOKENIZER),
        **(SETTINGS | options),
    )


def files(folder: Path) -> dict[str, int]:
    """Every file under a folder, by its path there, with its size."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def token_files(folder: Path) -> dict[str, int]:
    """The token files of a stage folder (its bucket folders' too), records aside."""
    return {
        path: n
        for path, n in files(folder).items()
        if TOKEN_FILE.fullmatch(path.rsplit("/", 1)[-1]) and not path.startswith(("_", "."))
    }


def records(folder: Path) -> dict[str, bytes]:
    return {path: (folder / path).read_bytes() for path in files(folder) if path.split("/")[0] in RECORDS}


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {path: (run_dir / path).read_bytes() for path in files(run_dir)}


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Build, dict[str, dict[str, int]], dict[str, dict[str, bytes]]]:
    """One build published with the defaults; what its stage folders held, and their records, just before."""
    build = Build.start(config_for(tmp_path_factory.mktemp("one-copy")), "night")
    until_publish(build)
    run_dir = Path(build.layout.run_dir)
    held = {stage: files(run_dir / stage) for stage in STAGES}
    kept = {stage: records(run_dir / stage) for stage in STAGES}
    build.publish()
    return build, held, kept


def test_a_published_build_holds_one_copy_of_its_dataset(published) -> None:
    """A 136 M-token build kept three copies of its tokens (649, 649 and 650 MB): ranks/, merged/ and context/."""
    build, before, kept = published
    run_dir = Path(build.layout.run_dir)
    record = build.published().record
    assert record.removed == ["ranks", "merged"] and record.dataset == str(run_dir / "context")
    assert token_files(run_dir / "ranks") == token_files(run_dir / "merged") == {}
    assert files(run_dir / "context") == before["context"]  # the dataset stays whole
    assert {stage: records(run_dir / stage) for stage in STAGES} == kept  # the books, report and quarantine's

    sizes = {folder.name: (folder.held, folder.removed) for folder in record.footprint.folders}
    now = {stage: sum(files(run_dir / stage).values()) for stage in STAGES}
    assert sizes == {stage: (now[stage], sum(before[stage].values()) - now[stage]) for stage in STAGES}
    assert sizes["ranks"][1] == sum(n for path, n in before["ranks"].items() if TOKEN_FILE.fullmatch(path)) > 0
    assert sizes["context"][1] == 0
    cache = record.footprint.cache  # the default one, {output}/.cache: the build's 4 input files
    assert cache.location == str(run_dir.parent / ".cache") and cache.entries == 4
    assert cache.tokens == record.tokens == 64_522
    markers = [json.loads(path.read_bytes()) for path in (run_dir.parent / ".cache" / "entries").glob("*.json")]
    inline = sum(len(base64.b64decode(data)) for marker in markers for data in (marker.get("inline") or {}).values())
    assert inline > 0  # a small entry's files are held in its marker (cache-entry/4), the others in data folders
    assert cache.bytes == sum(files(run_dir.parent / ".cache" / "data").values()) + inline

    done = cli("verify", str(run_dir))
    assert done.returncode == 0 and done.stdout.splitlines()[-1].endswith("4 files, 64,522 tokens: OK"), done.stderr
    done = cli("verify", str(run_dir / "ranks"))
    assert done.returncode == 0, done.stdout
    assert (
        f"{run_dir / 'ranks'}: its token files were removed once the build was published, as its _BUILD.json says "
        "(a build with keep_intermediate keeps them): only its records are checked (3 stage manifests)"
    ) in done.stdout.splitlines()
    done = cli("report", str(run_dir))
    assert done.returncode == 0 and "309 docs read = 308 written" in done.stdout, done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["footprint"]["folders"] == [folder.to_json() for folder in record.footprint.folders]
    assert report["footprint"]["cache"]["bytes_per_token"] == cache.bytes / cache.tokens
    page = (run_dir / "report.html").read_text()
    held, removed = sizes["ranks"]
    assert f'<td data-key="ranks">{size(held)} ({size(removed)} of token files removed)</td>' in page
    assert f'<td data-key="context">{size(sizes["context"][0])}</td>' in page
    shown = f"{size(cache.bytes)} for 64,522 tokens ({cache.bytes / cache.tokens:.1f} bytes a token)"
    assert f'<td data-key="cache">{shown}</td>' in page


@pytest.mark.parametrize(
    ("options", "removed", "with_tokens"),
    [
        ({"keep_intermediate": True}, [], ["ranks", "merged", "context"]),
        ({"context_window": 0}, ["ranks"], ["merged"]),  # merged/ is the dataset
        ({"output_format": "megatron", "save_loss": False}, [], ["ranks"]),  # the ranks' files are
        ({"merge_mode": "bucketed", "num_buckets": 2}, ["ranks", "merged"], ["context"]),
    ],
)
def test_what_a_published_build_keeps(tmp_path, options, removed, with_tokens) -> None:
    build = Build.start(config_for(tmp_path, **options), "night")
    record = in_process(build).record
    run_dir = Path(build.layout.run_dir)
    assert record.removed == removed and record.dataset == str(run_dir / with_tokens[-1])
    assert [stage for stage in STAGES if token_files(run_dir / stage)] == with_tokens
    assert [folder.name for folder in record.footprint.folders if folder.removed] == removed
    assert [folder.name for folder in record.footprint.folders] == [s for s in STAGES if (run_dir / s).is_dir()]
    assert all(verify(Folder(str(run_dir / stage))).ok for stage in STAGES if (run_dir / stage).is_dir())
    assert [p.name for p in (run_dir / "ranks").iterdir() if p.name.startswith("bucket")] == []  # none left empty
    done = cli("verify", str(run_dir))
    assert done.returncode == 0, done.stdout


def test_keep_intermediate_is_a_flag_of_tokenization_build() -> None:
    args = build_parser().parse_args(["build", "in", "--output", "out", "--tokenizer", "t", "--keep-intermediate"])
    assert from_arguments(BuildConfig, args).keep_intermediate is True
    args = build_parser().parse_args(["build", "in", "--output", "out", "--tokenizer", "t"])
    assert from_arguments(BuildConfig, args).keep_intermediate is False


def test_each_step_run_again_after_publish_does_nothing(tmp_path, caplog) -> None:
    """A rank, the sensor's check, a merge or a context shard cleared in Airflow's Grid, or ``tokenization build``
    run again, once the build is published: each returns what its records say, and writes nothing (a rank run
    again would otherwise rewrite its files under a published build, and a merge fail on rank files that are
    gone)."""
    build = Build.start(config_for(tmp_path), "night")
    published = in_process(build).record
    run_dir = Path(build.layout.run_dir)
    before = snapshot(run_dir)
    caplog.set_level(logging.INFO)

    rank = build.tokenize(1, progress=False)
    recorded = RankManifest.loads((run_dir / "ranks" / "_manifests" / "00001.json").read_bytes(), "rank 1")
    assert rank.record == recorded and rank.counts.docs_written == recorded.counts.docs_written == 77
    assert build.incomplete_ranks() == {}
    merge = build.merge(None, progress=False)
    assert merge.record == MergeManifest.loads((run_dir / "merged" / "_manifests" / "corpus.json").read_bytes(), "m")
    assert merge.outputs == ["000_corpus.ds", "001_corpus.ds", "002_corpus.ds", "003_corpus.ds"]
    assert build.context_shards() == [0, 1]
    shard = build.context_shuffle(1, 2, progress=False)
    path = run_dir / "context" / "_manifests" / "context_00001.json"
    assert shard.record == ContextManifest.loads(path.read_bytes(), "shard 1") and shard.counts.files == 2
    assert Build.start(config_for(tmp_path), "night").run(parallel=1).record == published

    assert snapshot(run_dir) == before  # not a byte written, nothing removed
    said = [r.getMessage() for r in caplog.records if "published already" in r.getMessage()]
    assert said == [
        f"{step}: {run_dir} is published already, so this step changes nothing and returns what its records say"
        for step in ("rank 1", "the shard check", "merge corpus", "the context shards", "context shard 1")
    ] + [f"{run_dir} is published already: nothing to publish again"]  # Build.run publishes nothing again


def test_the_shard_sensor_finds_every_rank_complete_after_publish(tmp_path) -> None:
    pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")
    from tokenization_airflow.sensors import missing_shards

    build = Build.start(config_for(tmp_path), "night")
    in_process(build)
    assert token_files(Path(build.layout.ranks.path)) == {}
    assert missing_shards(build, "tokenize_corpus", "night", "tokenize") == ([None], {})  # no wait, no question


def test_a_run_cleared_whole_rebuilds_and_publishes_again(tmp_path) -> None:
    """Clearing a run's ``plan`` in the Grid unpublishes it: every step runs again, on files built anew."""
    build = Build.start(config_for(tmp_path), "night")
    first = in_process(build).record
    markers = {p.name: p.read_bytes() for p in (Path(build.layout.ranks.path) / "_completions").iterdir()}
    again = Build.start(config_for(tmp_path), "night")  # what the plan task does
    again.unpublish()
    assert again.incomplete_ranks().keys() == {0, 1, 2}  # their files are gone: tokenized again
    second = in_process(again).record
    assert second.digest == first.digest and second.removed == ["ranks", "merged"]
    redone = {p.name: p.read_bytes() for p in (Path(build.layout.ranks.path) / "_completions").iterdir()}
    assert redone.keys() == markers.keys() and all(redone[name] != markers[name] for name in markers)
    assert token_files(Path(build.layout.ranks.path)) == token_files(Path(build.layout.merged.path)) == {}


def test_a_removal_cut_short_is_finished_by_the_next_run(tmp_path, monkeypatch) -> None:
    """Publish is killed while it removes: the build is complete (its record is written first), the files left are
    named by verify, and the next run (or publish) of the build removes them."""
    build = Build.start(config_for(tmp_path), "night")
    until_publish(build)
    run_dir = Path(build.layout.run_dir)
    real, calls = Folder.remove_files, []

    def killed_after_one_batch(folder: Folder, names: list[str]) -> None:
        calls.append(len(names))
        if len(calls) > 1:
            raise KeyboardInterrupt
        real(folder, names)

    monkeypatch.setattr(footprint, "REMOVED_AT_ONCE", 5)
    monkeypatch.setattr(Folder, "remove_files", killed_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        build.publish()
    record = (run_dir / "_BUILD.json").read_bytes()
    left = len(token_files(run_dir / "ranks"))
    assert calls == [5, 5] and left == 12 - 5
    notes = verify(Folder(str(run_dir / "ranks"))).notes
    assert notes[-1] == (
        f"{run_dir / 'ranks'}: {left} token files not removed yet (a removal cut short): publishing the build again "
        "removes them"
    )

    monkeypatch.undo()
    assert Build.start(config_for(tmp_path), "night").run(parallel=1).record.removed == ["ranks", "merged"]
    assert token_files(run_dir / "ranks") == token_files(run_dir / "merged") == {}
    assert (run_dir / "_BUILD.json").read_bytes() == record


def test_removal_on_s3_takes_each_path_literally(tmp_path, s3) -> None:
    """On S3 the token files go in bulk requests, a batch at a time; an output named ``out?`` never reaches
    ``outA``'s files, which fsspec would take a ``?`` in a path to match."""
    build = Build.start(config_for(tmp_path, keep_intermediate=True), "night")
    in_process(build)
    run_dir = Path(build.layout.run_dir)
    for path in files(run_dir):
        data = (run_dir / path).read_bytes()
        s3.fs.pipe_file(f"corpus/out?/night/{path}", data)
        if path.startswith("ranks/"):
            s3.fs.pipe_file(f"corpus/outA/night/{path}", data)
    layout = Layout(Folder("s3://corpus/out?/night", s3.options))
    measured = footprint.measure(layout, ["ranks", "merged"], None)
    freed = footprint.remove(layout, ["ranks", "merged"])
    assert (
        freed
        == measured.removed
        == sum(token_files(run_dir / "ranks").values()) + sum(token_files(run_dir / "merged").values())
    )
    s3.fs.invalidate_cache()
    left = {path.removeprefix("corpus/out?/night/") for path in s3.fs.find("corpus/out?/night")}
    assert left == set(files(run_dir)) - {f"{s}/{p}" for s in ("ranks", "merged") for p in token_files(run_dir / s)}
    assert len(s3.fs.find("corpus/outA/night/ranks")) == len(files(run_dir / "ranks"))  # untouched
