"""``{output}/LATEST`` names the newest complete build, and retention keeps the newest N complete builds, never a
running or incomplete one, nor the one LATEST names, nor anything that is not one of this project's builds; no
output path is ever taken as a glob."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3 import ON_BOTH_STORES
from tokenization.builds import latest
from tokenization.builds.complete import latest_build
from tokenization.builds.config import BuildConfig
from tokenization.builds.latest import (
    LATEST,
    LatestError,
    complete_builds,
    expire,
    point_latest,
    read_latest,
)
from tokenization.builds.report import report_data
from tokenization.builds.run import Build
from tokenization.errors import UsageError
from tokenization.records import (
    BuildParams,
    BuildRecord,
    BuildTokenizer,
    Conservation,
    StageSummary,
    TokenizeSummary,
    VerifySummary,
)
from tokenization.storage.folder import Folder

DAY1, DAY2, DAY3 = (f"2026-11-{day}T02:00:00+00:00" for day in (28, 29, 30))
WIDENED_SECONDS = 1.0  # how long the first publish waits, inside its window, for the second one to finish


def build_record(run_id: str, started: object) -> dict:
    """The ``_BUILD.json`` of a complete build of no documents, with every field of its format."""
    nothing = Conservation(
        docs_in=0, docs_out=0, empty=0, quarantined=0, rejected_by_reason={}, tokens=0, tokens_dropped=0, holds=True
    )
    record = BuildRecord(
        run_id=run_id,
        dataset="",
        input="",
        seed=1,
        tokenizer=BuildTokenizer(name="tokenizer.json", sha256="x", eos=None),
        params=BuildParams.of({}),
        started="",
        conservation=nothing,
        tokens=0,
        digest="",
        files=[],
        stages=StageSummary(tokenize=TokenizeSummary(ranks=0, input_files=0, **asdict(nothing))),
        verify=VerifySummary(ok=True, files=0, tokens=0, notes=[]),
    )
    return record.to_json() | {"started": started}


def fake_build(output: Path, name: str, started: str | None, run_id: str | None = None) -> str:
    """A claimed run folder with a token file; complete (with ``_BUILD.json``) when it has a start time."""
    folder = output / name
    (folder / "context").mkdir(parents=True)
    (folder / "context" / "000_corpus.ds").write_bytes(b"\0\0")
    (folder / "_RUN.json").write_text(json.dumps({"run_id": run_id or name, "claimed": 0.0}))
    if started is not None:
        (folder / "_BUILD.json").write_text(json.dumps(build_record(run_id or name, started)))
    return str(folder)


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_latest_moves_forward_only_and_retention_spares_what_it_must(tmp_path) -> None:
    old = fake_build(tmp_path, "old", DAY1)
    assert point_latest(Folder(str(tmp_path)), "old") == old and read_latest(Folder(str(tmp_path))) == old
    new = fake_build(tmp_path, "new", DAY3)
    mid = fake_build(tmp_path, "mid", DAY2)  # completed last, started before "new"
    assert point_latest(Folder(str(tmp_path)), "new") == new
    assert point_latest(Folder(str(tmp_path)), "mid") == new  # never back to an older build
    assert (tmp_path / LATEST).read_text() == "new\n"  # the folder's name: it resolves from anywhere
    running = fake_build(tmp_path, "running", None)
    assert [b.run_dir for b in complete_builds(Folder(str(tmp_path)))] == [new, mid, old]

    assert expire(Folder(str(tmp_path)), 1, {new, old}) == [mid]  # beyond the newest one, but "old" is spared
    assert not (tmp_path / "mid").exists() and (tmp_path / "old" / "context" / "000_corpus.ds").exists()
    assert expire(Folder(str(tmp_path)), 1, {new}) == [old]
    assert (tmp_path / "running" / "context").exists() and running not in [
        b.run_dir for b in complete_builds(Folder(str(tmp_path)))
    ]
    assert expire(Folder(str(tmp_path)), 1, {new}) == []


def test_a_publish_reads_no_earlier_build_but_the_one_latest_names(tmp_path, monkeypatch) -> None:
    """Each publish read every earlier build's records to find the newest: a deployment of hundreds of nightly
    builds paid for its whole history every night (200 builds: ~80 ms a publish locally, 400 reads on S3). It
    weighs the build LATEST names against its own; only a LATEST that names no valid build has them all read."""
    output = Folder(str(tmp_path))
    for day in range(1, 29):  # night-28 completes after night-27's publish
        fake_build(tmp_path, f"night-{day:02d}", f"2026-11-{day:02d}T02:00:00+00:00" if day < 28 else None)
    assert point_latest(output, "night-27") == str(tmp_path / "night-27")  # no LATEST yet: all are read
    (tmp_path / "night-28/_BUILD.json").write_text(json.dumps(build_record("night-28", "2026-11-28T02:00:00+00:00")))
    read: list[str] = []
    reading = latest.complete_build

    def counted(folder: Folder, name: str):
        read.append(name)
        return reading(folder, name)

    monkeypatch.setattr(latest, "complete_build", counted)
    assert point_latest(output, "night-28") == str(tmp_path / "night-28")
    assert sorted(read) == ["night-27", "night-28"]
    read.clear()
    fake_build(tmp_path, "late", "2026-10-31T02:00:00+00:00")  # completed last, started before them all
    assert point_latest(output, "late") == str(tmp_path / "night-28")  # never back
    assert sorted(read) == ["late", "night-28"]
    read.clear()
    shutil.rmtree(tmp_path / "night-28")  # LATEST names a build gone: every build is read, the newest named
    assert point_latest(output, "late") == str(tmp_path / "night-27")
    assert len(read) == 29 and (tmp_path / LATEST).read_text() == "night-27\n"


def test_three_nightly_builds_keep_two_and_name_the_last(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Three successive builds with keep 2: the first is deleted by the third's publish, a build that never
    finished stays, LATEST names the third and the third's report lists what went."""
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path),
        tokenizer=str(sample_tokenizer),
        seed=1,
        num_ranks=1,
        context_window=0,
    )
    first = Build.start(config, "night-1").run(keep=2)
    assert first.latest == str(tmp_path / "night-1") and first.deleted == []
    Build.start(config, "unfinished")  # claimed its folder, then stopped
    second = Build.start(config, "night-2").run(keep=2)
    assert second.latest == str(tmp_path / "night-2") and second.deleted == []
    third = Build.start(config, "night-3").run(keep=2)
    assert third.latest == str(tmp_path / "night-3") and third.deleted == [str(tmp_path / "night-1")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        *(".LATEST.lock", ".cache", LATEST),
        *("night-2", "night-3", "unfinished"),
    ]
    assert latest_build(str(tmp_path)).run_id == "night-3"
    assert third.summary().latest == third.latest
    data = report_data(Folder(str(tmp_path / "night-3")))
    assert json.loads((tmp_path / "night-3" / "report.json").read_text())["retention"] == {
        "keep": 2,
        "deleted": [str(tmp_path / "night-1")],
        "cache": {"entries": 0, "bytes": 0},  # every night read the same files: the builds kept use their entries
    }
    assert data["build"]["tokens"] == third.record.tokens
    assert data["retention"] is None  # report_data alone has no retention
    assert str(tmp_path / "night-1") in (tmp_path / "night-3" / "report.html").read_text().replace("<wbr>", "")


def test_a_publish_killed_before_it_pointed_latest_points_it_when_run_again(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    """A build killed between its ``_BUILD.json`` and ``LATEST`` is complete; run again under its build id, it was
    "published already" and left ``LATEST`` on the build before it, until another build published."""
    config = BuildConfig(
        input=str(sample_corpus), output=str(tmp_path), tokenizer=str(sample_tokenizer), num_ranks=1, context_window=0
    )
    Build.start(config, "night-1").run()
    Build.start(config, "night-2").run()
    (tmp_path / LATEST).write_text("night-1\n")  # where the killed publish left it
    again = Build.start(config, "night-2").run()
    assert again.latest == str(tmp_path / "night-2") and (tmp_path / LATEST).read_text() == "night-2\n"


@pytest.mark.parametrize("build_id", ["LATEST", "latest"])
def test_latest_is_refused_as_a_build_id_before_any_work(tmp_path, sample_corpus, sample_tokenizer, build_id) -> None:
    """Issue 37: a build under the id LATEST ran every stage, then failed to publish (IsADirectoryError), and so did
    every later build on that output; with a LATEST file there, it failed with NotADirectoryError."""
    config = BuildConfig(input=str(sample_corpus), output=str(tmp_path / "out"), tokenizer=str(sample_tokenizer))
    with pytest.raises(UsageError) as refused:
        Build.start(config, build_id)
    assert str(refused.value) == (
        f"build id {build_id!r} is the name (ignoring case, as some filesystems do) of {tmp_path}/out/LATEST, which "
        "points at the newest complete build: choose another build id (in Airflow, another run id)"
    )
    assert not (tmp_path / "out").exists()


def test_a_latest_folder_an_older_version_made_is_one_line(tmp_path) -> None:
    """Issue 37: the folder of a build run under the id LATEST, before that was refused, failed every publish."""
    fake_build(tmp_path, LATEST, DAY1)
    fake_build(tmp_path, "night-2", DAY2)
    refusal = (
        f"{tmp_path}/LATEST is a folder (a build run under the build id LATEST, which is refused now), not the file "
        "naming the newest complete build: move it out of the output, and the next build to publish writes LATEST"
    )
    for read in (read_latest, lambda output: point_latest(output, "night-2")):
        with pytest.raises(LatestError) as refused:
            read(Folder(str(tmp_path)))
        assert str(refused.value) == refusal


def test_a_build_id_naming_the_cache_folder_is_refused(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """The cache may be a folder of the output of another name than .cache: no build may share it."""
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path),
        tokenizer=str(sample_tokenizer),
        cache=str(tmp_path / "tokens"),
    )
    with pytest.raises(UsageError) as refused:
        Build.start(config, "tokens")
    assert str(refused.value) == (
        f"build id 'tokens' names {tmp_path}/tokens, which holds the tokenization cache {tmp_path}/tokens: choose "
        "another build id, or another cache"
    )
    assert list(tmp_path.iterdir()) == []


def test_latest_build_needs_a_pointer(tmp_path) -> None:
    fake_build(tmp_path, "a", DAY1)
    with pytest.raises(FileNotFoundError, match="no LATEST"):
        latest_build(str(tmp_path))


def test_retention_leaves_alone_what_is_no_build(tmp_path, caplog) -> None:
    """Finding 4: a user's folder holding a file named ``_BUILD.json`` (and a thesis) is not a build: never deleted."""
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "_BUILD.json").write_text(json.dumps({"run_id": "thesis", "started": DAY1}))
    (thesis / "thesis.tex").write_text("\\documentclass{article}")
    old, new = fake_build(tmp_path, "old", DAY2), fake_build(tmp_path, "new", DAY3)
    assert point_latest(Folder(str(tmp_path)), "new") == new
    with caplog.at_level(logging.WARNING, "tokenization.builds.latest"):
        assert expire(Folder(str(tmp_path)), 1, {new}) == [old]
    assert (thesis / "thesis.tex").read_text() == "\\documentclass{article}" and (thesis / "_BUILD.json").exists()
    assert (
        f"{thesis}/_BUILD.json: not a valid build record: format null, not corpus-tokenization/build/N; LATEST and "
        f"retention leave it alone (move it out of {tmp_path} to silence this)"
    ) in caplog.messages


ODD_CLAIM = {"run_id": "odd", "claimed": 0.0}
ODD = build_record("odd", "2026-12-01T02:00:00+00:00")


@pytest.mark.parametrize(
    ("run_claim", "record", "reason"),
    [
        (ODD_CLAIM, json.dumps(ODD | {"started": 17}), "started is 17, not a string"),
        (ODD_CLAIM, json.dumps(ODD | {"started": "2026-12-01"}), "\"started\" is '2026-12-01', not an ISO 8601 time"),
        (ODD_CLAIM, '["odd", "2026-11-30T02:00:00+00:00"]', 'the file is ["odd","2026-11-30T02:00:00+00:00"], not an'),
        (ODD_CLAIM, '{"run_id": "odd", "started": "2026-11-', "not JSON"),
        (None, json.dumps(ODD), "no _RUN.json claims the folder"),
        ({"run_id": "other", "claimed": 0.0}, json.dumps(ODD | {"run_id": "other"}), "for run 'other'"),
        (ODD_CLAIM, json.dumps(ODD | {"run_id": "other"}), "the record of run"),
        (ODD_CLAIM, json.dumps({k: v for k, v in ODD.items() if k != "format"}), "format null, not corpus-tokeniz"),
    ],
)
def test_a_malformed_sibling_never_blocks_a_publish(tmp_path, caplog, run_claim, record, reason) -> None:
    """Finding 4: a sibling with a malformed record (or no claim, or another run's) is skipped with a warning
    naming it, never deleted, and never stops LATEST or retention."""
    odd = tmp_path / "odd"
    odd.mkdir()
    if run_claim is not None:
        (odd / "_RUN.json").write_text(json.dumps(run_claim))
    (odd / "_BUILD.json").write_text(record)
    old, new = fake_build(tmp_path, "old", DAY1), fake_build(tmp_path, "new", DAY2)
    with caplog.at_level(logging.WARNING, "tokenization.builds.latest"):
        assert point_latest(Folder(str(tmp_path)), "new") == new
        assert expire(Folder(str(tmp_path)), 1, {new}) == [old]
    assert (odd / "_BUILD.json").read_text() == record
    warnings = [m for m in caplog.messages if str(odd) in m]
    assert warnings and all(reason in m for m in warnings), caplog.messages


def racing_publishes(monkeypatch, output: str, first: str, second: str, make, options=None) -> str | None:
    """Two publishes of ``output`` at once: ``first`` completes and weighs the builds, then waits (at most
    ``WIDENED_SECONDS``) in the window before its write while ``second`` completes and points ``LATEST``; ``make``
    completes a build. Returns what ``LATEST`` names at the end."""
    in_window, second_done = threading.Event(), threading.Event()
    weighing = latest._candidates

    def widened(folder: Folder, current, published: str) -> list:
        builds = weighing(folder, current, published)
        if threading.current_thread().name == first and not in_window.is_set():
            in_window.set()
            second_done.wait(WIDENED_SECONDS)
        return builds

    monkeypatch.setattr(latest, "_candidates", widened)
    errors = []

    def publish(name: str) -> None:
        try:
            make(name)
            point_latest(Folder(output, options), name)
        except Exception as exc:  # reported by the test, from the main thread
            errors.append(exc)
        finally:
            if name == second:
                second_done.set()

    threads = {name: threading.Thread(target=publish, args=(name,), name=name) for name in (first, second)}
    threads[first].start()
    assert in_window.wait(30)
    threads[second].start()
    for thread in threads.values():
        thread.join(60)
    assert not errors, errors
    return read_latest(Folder(output, options))


@pytest.mark.parametrize("first", ["older", "newer"])
def test_latest_never_goes_back_when_publishes_race(tmp_path, monkeypatch, first) -> None:
    """Finding 4: an older build's publish, held between its listing and its write while a newer build publishes,
    never overwrites the pointer to the newer one (the lock makes the two one after the other)."""
    started = {"older": DAY1, "newer": DAY2}
    second = "newer" if first == "older" else "older"
    named = racing_publishes(
        monkeypatch, str(tmp_path), first, second, lambda name: fake_build(tmp_path, name, started[name])
    )
    assert named == str(tmp_path / "newer") and (tmp_path / LATEST).read_text() == "newer\n"


def s3_build(fs, output: str, name: str, started: str | None, run_id: str | None = None) -> None:
    """``fake_build`` on S3: ``output`` is ``bucket/folder``."""
    fs.pipe_file(f"{output}/{name}/context/000_corpus.ds", b"\0\0")
    fs.pipe_file(f"{output}/{name}/_RUN.json", json.dumps({"run_id": run_id or name, "claimed": 0.0}).encode())
    if started is not None:
        fs.pipe_file(f"{output}/{name}/_BUILD.json", json.dumps(build_record(run_id or name, started)).encode())
    fs.invalidate_cache()


@ON_BOTH_STORES
@pytest.mark.parametrize("existing", [False, True])
def test_latest_on_s3_is_a_compare_and_swap(s3, monkeypatch, existing) -> None:
    """Finding 4 on S3: no lock there, so the older publish's write, made after the newer one's, must fail its
    condition (If-None-Match with no LATEST yet, If-Match over an existing one) and decide again."""
    if existing:
        s3_build(s3.fs, "corpus/builds", "oldest", "2026-11-27T02:00:00+00:00")
        assert point_latest(Folder("s3://corpus/builds", s3.options), "oldest") == "s3://corpus/builds/oldest"
    started = {"older": DAY1, "newer": DAY2}
    named = racing_publishes(
        monkeypatch,
        "s3://corpus/builds",
        "older",
        "newer",
        lambda name: s3_build(s3.fs, "corpus/builds", name, started[name]),
        s3.options,
    )
    assert named == "s3://corpus/builds/newer" and s3.fs.cat_file("corpus/builds/LATEST") == b"newer\n"


def test_latest_resolves_from_anywhere_and_never_outside_the_output(tmp_path, monkeypatch) -> None:
    """Finding 4: LATEST holds one folder name, so a build run as ``--output builds`` is found from any folder;
    the previous version's paths are read by their last segment; nothing outside the output is ever followed."""
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    fake_build(Path("builds"), "qa%3Acol", DAY1, run_id="qa:col")  # as an earlier version named its folder
    assert point_latest(Folder("builds"), "qa%3Acol") == "builds/qa%3Acol"
    assert Path("builds/LATEST").read_text() == "qa%3Acol\n"
    monkeypatch.chdir(tmp_path)
    output = str(tmp_path / "run" / "builds")
    assert latest_build(output).run_id == "qa:col"

    fake_build(Path(output), "tty1", DAY2)
    for old in ("builds/tty1", f"{output}/tty1/", "s3://elsewhere/builds/tty1"):  # the previous version's
        Path(output, LATEST).write_text(f"{old}\n")
        assert read_latest(Folder(str(output))) == f"{output}/tty1"
    outside = tmp_path / "outside"
    fake_build(outside.parent, "outside", DAY3)
    for value in ("..", "../outside", str(outside), "s3://bucket/outside", ".hidden"):
        Path(output, LATEST).write_text(f"{value}\n")
        with pytest.raises(LatestError) as caught:
            latest_build(output)
        assert str(caught.value) == (
            f"{output}/LATEST: names {value!r}, which is no folder of {output} (it is never followed outside it); "
            f"publish a build to rewrite it, or remove it"
        )
    assert point_latest(Folder(str(output)), "tty1") == f"{output}/tty1"  # a publish replaces such a LATEST
    assert Path(output, LATEST).read_text() == "tty1\n"


def summarize(folder: str | Path) -> subprocess.CompletedProcess:
    """``python -m tokenization.builds FOLDER``."""
    return subprocess.run(
        [sys.executable, "-m", "tokenization.builds", str(folder)], capture_output=True, text=True, timeout=120
    )


def test_the_summary_of_a_malformed_build_is_one_line(tmp_path) -> None:
    """Finding 4: ``python -m tokenization.builds OUT`` names the file it cannot use, in one line, and follows
    nothing outside ``OUT``."""
    fake_build(tmp_path, "a", DAY1)
    point_latest(Folder(str(tmp_path)), "a")
    (tmp_path / "a" / "_BUILD.json").write_text(
        json.dumps(build_record("a", 17) | {"format": "corpus-tokenization/build/1"})
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "LATEST").write_text("../a\n")
    (tmp_path / "c").mkdir()
    fake_build(tmp_path / "c", "x", DAY1)
    unbalanced = {k: v for k, v in build_record("x", DAY1).items() if k != "conservation"}
    (tmp_path / "c" / "x" / "_BUILD.json").write_text(json.dumps(unbalanced))
    (tmp_path / "c" / "LATEST").write_text("x\n")
    messages = {
        "a": f"error: {tmp_path}/a/_BUILD.json: not a valid build record: started is 17, not a string",
        "b": f"error: {tmp_path}/b/LATEST: names '../a', which is no folder of {tmp_path}/b (it is never followed "
        f"outside it); publish a build to rewrite it, or remove it",
        "c": f"error: {tmp_path}/c/x/_BUILD.json: not a valid build record: conservation is missing",
    }
    for folder, message in [(tmp_path, messages["a"])] + [(tmp_path / k, m) for k, m in messages.items() if k != "a"]:
        done = summarize(folder)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", message + "\n")


def test_publish_into_outputs_with_glob_characters(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Finding 5: outputs named ``out?`` (beside ``outA``, which holds complete builds of the same names) and
    ``other path [x]`` publish, keep their builds, and never see nor touch ``outA``'s."""
    fake_build(tmp_path / "outA", "night-0", DAY1)
    fake_build(tmp_path / "outA", "night-1", DAY2)
    kept = files_of(tmp_path / "outA")
    config: dict[str, Any] = {
        "input": str(sample_corpus),
        "tokenizer": str(sample_tokenizer),
        "num_ranks": 1,
        "context_window": 0,
    }
    for name in ("out?", "other path [x]"):
        output = tmp_path / name
        fake_build(output, "night-0", DAY1)
        published = Build.start(BuildConfig(output=str(output), **config), "night-1").run(keep=1)
        assert published.latest == str(output / "night-1") and published.deleted == [str(output / "night-0")]
        assert (output / LATEST).read_text() == "night-1\n"
        assert sorted(p.name for p in output.iterdir()) == [".LATEST.lock", ".cache", LATEST, "night-1"]
        done = summarize(output)
        assert done.returncode == 0 and f"dataset: {output}/night-1/merged" in done.stdout, done.stderr
    assert files_of(tmp_path / "outA") == kept


def test_retention_on_s3_takes_the_output_literally(s3) -> None:
    """Finding 5 on S3, where fsspec globs in ``rm(recursive=True)`` too: retention in ``out?`` lists and deletes
    only its own builds, never ``outA``'s of the same names."""
    for name in ("corpus/out?", "corpus/outA"):
        s3_build(s3.fs, name, "night-1", DAY1)
        s3_build(s3.fs, name, "night-2", DAY2)
    kept = {p: s3.fs.cat_file(p) for p in s3.fs.find("corpus/outA")}
    output = Folder("s3://corpus/out?", s3.options)
    assert [b.run_dir for b in complete_builds(output)] == ["s3://corpus/out?/night-2", "s3://corpus/out?/night-1"]
    assert point_latest(output, "night-2") == "s3://corpus/out?/night-2"
    assert expire(output, 1, set()) == ["s3://corpus/out?/night-1"]
    s3.fs.invalidate_cache()
    assert not s3.fs.exists("corpus/out?/night-1/context/000_corpus.ds")
    assert s3.fs.exists("corpus/out?/night-2/_BUILD.json")
    assert {p: s3.fs.cat_file(p) for p in s3.fs.find("corpus/outA")} == kept
