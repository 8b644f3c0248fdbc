"""Issue 52, 1: the plan hashed every local input every night. It remembers each file's ``stat`` beside its sha256
in the cache, and the next plan reads only the files that are new or changed, or whose ``stat`` cannot tell."""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import stat
import threading
import time

import orjson
import pytest

from tests.support.builds import config_of
from tokenization.builds.complete import summary
from tokenization.builds.pages import size
from tokenization.builds.run import Build
from tokenization.inputs import sources
from tokenization.inputs.sources import list_input_files, with_content
from tokenization.output import known
from tokenization.storage.files import file_sha256

HOUR_NS = 3600 * 10**9


@pytest.fixture
def inputs(tmp_path, sample_corpus):
    """A copy of the sample corpus (four files), last modified an hour ago."""
    folder = tmp_path / "in"
    shutil.copytree(sample_corpus, folder)
    for path in folder.iterdir():
        then = time.time_ns() - HOUR_NS
        os.utime(path, ns=(then, then))
    return folder


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The paths the plan reads to hash them, in the order it does."""
    read: list[str] = []
    monkeypatch.setattr(sources, "file_sha256", lambda path, fs: read.append(path) or file_sha256(path, fs))
    sources._sha256_once.cache_clear()
    return read


def test_the_next_plan_reads_only_new_or_changed_files(tmp_path, inputs, sample_tokenizer, hashed) -> None:
    """The second night hashes the file that grew, the one rewritten in place with its size and mtime kept (its
    change time tells), the one chmodded (the same bytes: the same sha256) and the new one; not the fourth. Its
    plan is the plan of a build without a cache, byte for byte."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    Build.start(config, "first")
    assert len(hashed) == 4
    hashed.clear()
    sources._sha256_once.cache_clear()
    grown, rewritten, chmodded, _untouched = sorted(inputs.iterdir())
    grown.write_bytes(grown.read_bytes() + b"\n")
    before = rewritten.stat()
    data = rewritten.read_bytes()
    rewritten.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(rewritten, ns=(before.st_atime_ns, before.st_mtime_ns))
    chmodded.chmod(chmodded.stat().st_mode | stat.S_IROTH)
    new = inputs / "part-00009.jsonl"
    new.write_text('{"text": "a new document"}\n')
    nightly = Build.start(config, "next")
    assert sorted(hashed) == sorted(map(str, (grown, rewritten, chmodded, new)))
    without = Build.start(config_of(inputs, tmp_path / "off", sample_tokenizer, cache="off"), "next")
    assert nightly.plan.record.to_json()["inputs"] == without.plan.record.to_json()["inputs"]
    hashed.clear()
    sources._sha256_once.cache_clear()
    Build.start(config, "third")
    assert sorted(hashed) == [str(grown), str(new)]  # written just before their hash: git's racy case


def test_a_file_modified_as_it_was_hashed_is_hashed_again(tmp_path) -> None:
    """git's racy case: a file whose mtime is within ``RACY_NS`` of the moment it was hashed may have been written
    again in the same tick of a coarse clock, so its row is not trusted; hashed again later, it is."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n')
    listing = list_input_files([str(path)])
    first = with_content(listing)
    assert (first.hashed, first.recognised) == (1, 0)
    second = with_content(listing, first.known)
    assert (second.hashed, second.recognised) == (1, 0)
    clock = time.time_ns
    with pytest.MonkeyPatch.context() as later:
        later.setattr(sources.time, "time_ns", lambda: clock() + sources.RACY_NS)  # a plan 2 s on
        third = with_content(listing, first.known)
    assert (third.hashed, third.recognised, third.bytes_read) == (1, 0, path.stat().st_size)
    fourth = with_content(listing, third.known)
    assert (fourth.hashed, fourth.recognised, fourth.bytes_read) == (0, 1, 0)
    assert fourth.listing == first.listing


def test_new_files_are_hashed_at_once_and_the_unchanged_recognised(tmp_path, monkeypatch) -> None:
    """A plan's new files are hashed on a thread a core, several at once (a plan of 10,000 new files is not one read
    after another), and the files it remembers are still recognised without a byte read."""
    old = [tmp_path / f"old-{k}.jsonl" for k in range(2)]
    for path in old:
        path.write_text('{"text": "old"}\n')
        os.utime(path, ns=(time.time_ns() - HOUR_NS,) * 2)
    rows = with_content(list_input_files([str(tmp_path)])).known
    for k in range(4):
        (tmp_path / f"new-{k}.jsonl").write_text(f'{{"text": "new {k}"}}\n')
    together = threading.Barrier(2, timeout=10)  # broken unless two hashes are under way at once

    def hashed_beside_another(path, fs):
        together.wait()
        return file_sha256(path, fs)

    monkeypatch.setattr(sources, "file_sha256", hashed_beside_another)
    monkeypatch.setattr(sources.os, "cpu_count", lambda: 2)
    sources._sha256_once.cache_clear()
    found = with_content(list_input_files([str(tmp_path)]), rows)
    assert (found.recognised, found.hashed) == (2, 4)
    assert all(found.known[str(path)] == rows[str(path)] for path in old)


def test_a_remembered_row_of_another_stat_is_not_used(tmp_path) -> None:
    """A row whose device, inode, size or sha256 is not the file's is no reason to skip reading it."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n')
    then = time.time_ns() - HOUR_NS
    os.utime(path, ns=(then, then))
    listing = list_input_files([str(path)])
    rows = with_content(listing).known
    size, mtime, ctime, ino, dev, when, sha = rows[str(path)].split(",")
    for row in (
        f"{size},{mtime},{ctime},{ino},{int(dev) + 1},{when},{sha}",
        f"{size},{mtime},{ctime},{int(ino) + 1},{dev},{when},{sha}",
        f"{int(size) + 1},{mtime},{ctime},{ino},{dev},{when},{sha}",
        f"{size},{mtime},{ctime},{ino},{dev},{when},{sha[:-1]}",
        f"{size},{mtime},{ctime},{ino},{dev},{when}",
    ):
        assert with_content(listing, {str(path): row}).hashed == 1
    assert with_content(listing, rows).hashed == 0


def test_a_cache_that_cannot_be_written_only_hashes_again(tmp_path, inputs, sample_tokenizer, hashed, caplog):
    """A read-only cache: the record is not written, the log says so, and the next plan hashes every file."""

    def refused(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    config = config_of(inputs, tmp_path, sample_tokenizer)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(known, "write_bytes_atomic", refused)
        with caplog.at_level(logging.WARNING, logger=known.__name__):
            Build.start(config, "first")
    (warning,) = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warning.startswith(f"{tmp_path}/out/.cache/inputs/") and warning.endswith(
        ".json: not written ([Errno 30] Read-only file system); the next plan hashes every local input file again"
    )
    sources._sha256_once.cache_clear()
    Build.start(config, "next")
    assert len(hashed) == 8


def test_a_damaged_record_is_named_and_every_file_hashed(tmp_path, inputs, sample_tokenizer, hashed, caplog):
    config = config_of(inputs, tmp_path, sample_tokenizer)
    Build.start(config, "first")
    (record,) = (tmp_path / "out/.cache/inputs").iterdir()
    data = orjson.loads(record.read_bytes())
    record.write_bytes(orjson.dumps({**data, "files": [1]}))
    sources._sha256_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        Build.start(config, "next")
    assert len(hashed) == 8
    (warning,) = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warning.startswith(f"{record}: not a valid record of known input files: ")
    assert warning.endswith("; every local input file is hashed")


def test_the_report_and_the_summary_say_what_the_next_night_read(tmp_path, inputs, sample_tokenizer) -> None:
    """Issue 52, 4: the files the plan listed, recognised unchanged and hashed, the bytes it read, the hits and
    misses, and the input the ranks read (the misses, and without a key the hits they checked)."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    Build.start(config, "first").run()
    changed = sorted(inputs.iterdir())[1]
    changed.write_bytes(changed.read_bytes() + gzip.compress(b'{"text": "one more document"}\n'))
    record = Build.start(config, "next").run().record
    cache = record.cache
    assert cache is not None and cache.plan is not None
    assert cache.plan.to_json() == {
        "files_listed": 4,
        "files_recognised": 3,
        "files_hashed": 1,
        "bytes_hashed": changed.stat().st_size,
    }
    assert (cache.files_hit, cache.files_missed, cache.input_bytes_read) == (3, 1, cache.bytes_total)  # no key
    line = next(line for line in summary(record).splitlines() if line.startswith("cache: "))
    assert line.endswith(
        f"and read {size(cache.bytes_total)} of input; the plan listed 4 files: 3 recognised unchanged without a byte "
        f"read, 1 hashed ({size(changed.stat().st_size)} read)"
    )
    report = orjson.loads((tmp_path / "out" / "next" / "report.json").read_bytes())
    assert report["build"]["cache"]["plan"] == cache.plan.to_json()
    shown = (tmp_path / "out" / "next" / "report.html").read_text()
    assert '<th>recognised unchanged, not read</th><td data-key="files_recognised">3</td>' in shown


def test_with_a_key_a_changed_row_is_refused(tmp_path, inputs, sample_tokenizer, hashed, caplog, monkeypatch):
    """A row made to name another sha256 would make a file another file's entry: with a cache key the record is
    signed, and one changed since is not used (named in the log); every file is hashed."""
    monkeypatch.setenv("TOKENIZATION_CACHE_KEY", "a deployment's secret")
    config = config_of(inputs, tmp_path, sample_tokenizer)
    Build.start(config, "first")
    (record,) = (tmp_path / "out/.cache/inputs").iterdir()
    data = orjson.loads(record.read_bytes())
    first, second, *_ = sorted(data["files"])
    data["files"][first] = data["files"][first].rsplit(",", 1)[0] + "," + data["files"][second].rsplit(",", 1)[1]
    record.write_bytes(orjson.dumps(data))
    sources._sha256_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        Build.start(config, "next")
    assert len(hashed) == 8
    (warning,) = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warning == (
        f"{record}: not a valid record of known input files: its signature does not verify with "
        "TOKENIZATION_CACHE_KEY (signed with another key, or changed since); every local input file is hashed"
    )
