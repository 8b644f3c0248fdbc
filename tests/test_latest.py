"""``{output}/LATEST`` names the newest complete build, and retention keeps the newest N complete builds, never a
running or incomplete one, nor the one LATEST names."""

from __future__ import annotations

import json

import pytest

from tokenization.build import Build, BuildConfig, latest_build
from tokenization.latest import LATEST, complete_builds, expire, point_latest, read_latest
from tokenization.report import report_data


def fake_build(output, name: str, started: str | None) -> str:
    """A run folder with a token file; complete (with ``_BUILD.json``) when it has a start time."""
    folder = output / name
    (folder / "context").mkdir(parents=True)
    (folder / "context" / "000_corpus.ds").write_bytes(b"\0\0")
    if started is not None:
        (folder / "_BUILD.json").write_text(json.dumps({"started": started}))
    return str(folder)


def test_latest_moves_forward_only_and_retention_spares_what_it_must(tmp_path) -> None:
    old = fake_build(tmp_path, "old", "2026-11-28T02:00:00+00:00")
    assert point_latest(str(tmp_path)) == old and read_latest(str(tmp_path)) == old
    new = fake_build(tmp_path, "new", "2026-11-30T02:00:00+00:00")
    mid = fake_build(tmp_path, "mid", "2026-11-29T02:00:00+00:00")  # completed last, started before "new"
    assert point_latest(str(tmp_path)) == new  # never back to an older build
    assert (tmp_path / LATEST).read_text() == f"{new}\n"
    running = fake_build(tmp_path, "running", None)
    assert [b.run_dir for b in complete_builds(str(tmp_path))] == [new, mid, old]

    assert expire(str(tmp_path), 1, {new, old}) == [mid]  # beyond the newest one, but "old" is spared
    assert not (tmp_path / "mid").exists() and (tmp_path / "old" / "context" / "000_corpus.ds").exists()
    assert expire(str(tmp_path), 1, {new}) == [old]
    assert (tmp_path / "running" / "context").exists() and running not in [
        b.run_dir for b in complete_builds(str(tmp_path))
    ]
    assert expire(str(tmp_path), 1, {new}) == []


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
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "night-2", "night-3", "unfinished"]
    assert latest_build(str(tmp_path))["run_id"] == "night-3"
    assert third.summary()["latest"] == third.latest
    data = report_data(str(tmp_path / "night-3"))
    assert json.loads((tmp_path / "night-3" / "report.json").read_text())["retention"] == {
        "keep": 2,
        "deleted": [str(tmp_path / "night-1")],
    }
    assert data["tokens"] == third.tokens and data["retention"] is None  # report_data alone has no retention
    assert str(tmp_path / "night-1") in (tmp_path / "night-3" / "report.html").read_text().replace("<wbr>", "")


def test_latest_build_needs_a_pointer(tmp_path) -> None:
    fake_build(tmp_path, "a", "2026-11-28T02:00:00+00:00")
    with pytest.raises(FileNotFoundError, match="no LATEST"):
        latest_build(str(tmp_path))
