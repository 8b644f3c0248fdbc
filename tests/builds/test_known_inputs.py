"""Issue 52, 1: the plan hashed every local input every night, in its one task. Each file's ``stat`` is remembered
beside its sha256 in the cache; the plan reads no file, and the ranks hash theirs that are new or changed, or whose
``stat`` cannot tell."""

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

from tests.support.builds import config_of, in_process
from tokenization.builds import run
from tokenization.builds.accounting import rank_manifests
from tokenization.builds.complete import summary
from tokenization.builds.pages import size
from tokenization.builds.run import Build
from tokenization.inputs import content
from tokenization.inputs.content import rank_hashes, with_content, with_sha256
from tokenization.inputs.listing import list_input_files
from tokenization.output import known
from tokenization.output.cache import ENTRIES, KNOWN, Cache
from tokenization.stages.tokenize import first_pass
from tokenization.storage.checksums import SHA256, file_checksum
from tokenization.storage.folder import Folder

checksum = Folder.checksum  # the real one, which the counting stand-ins call

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

    def hashing(folder, name, algorithm):
        read.append(folder.path_of(name))
        return checksum(folder, name, algorithm)

    monkeypatch.setattr(Folder, "checksum", hashing)
    content._sha256_once.cache_clear()
    return read


def night(config, name: str):
    """A build of ``config`` under ``name``, its ranks in this process (their hashing is seen), published."""
    return in_process(Build.start(config, name))


def reading(build) -> tuple[int, int, int]:
    """What a build's plan recorded of its local files: recognised unchanged, left to their ranks, their bytes."""
    read = build.claimed.claim.reading
    return read.files_recognised, read.files_hashed, read.bytes_hashed


def test_a_first_night_plan_reads_no_file_and_its_ranks_hash_theirs(tmp_path, inputs, sample_tokenizer, hashed) -> None:
    """The plan of 10,000 new files read them all in its one task. It reads none: each rank hashes its own files
    before it looks them up in the cache, each once; the build's bytes are a build's without a cache, which hashes
    no file at all."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    build = Build.start(config, "first")
    assert hashed == []
    assert reading(build) == (0, 4, sum(path.stat().st_size for path in inputs.iterdir()))
    assert not any("sha256" in file.identity for file in build.plan.files)  # a new file's identity: its stat
    published = in_process(build)
    assert sorted(hashed) == sorted(map(str, inputs.iterdir()))
    hashed.clear()
    without = night(config_of(inputs, tmp_path / "off", sample_tokenizer, cache="off"), "first")
    assert hashed == []
    assert published.record.digest == without.record.digest


def test_the_next_night_reads_only_new_or_changed_files(tmp_path, inputs, sample_tokenizer, hashed) -> None:
    """The second night's ranks hash the file that grew, the one rewritten in place with its size and mtime kept
    (its change time tells), the one chmodded (the same bytes: the same sha256, a hit) and the new one; not the
    fourth, which the plan recognises from what the first night's ranks remembered. No plan reads a byte."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    hashed.clear()
    content._sha256_once.cache_clear()
    grown, rewritten, chmodded, untouched = sorted(inputs.iterdir())
    grown.write_bytes(grown.read_bytes() + gzip.compress(b'{"text": "one more document"}\n'))
    before = rewritten.stat()
    data = rewritten.read_bytes()
    rewritten.write_bytes(data[:4] + bytes([data[4] ^ 1]) + data[5:])  # the gzip header's mtime: other bytes
    os.utime(rewritten, ns=(before.st_atime_ns, before.st_mtime_ns))
    chmodded.chmod(chmodded.stat().st_mode | stat.S_IROTH)
    new = inputs / "part-00009.jsonl"
    new.write_text('{"text": "a new document"}\n')
    nightly = Build.start(config, "next")
    assert hashed == []
    assert reading(nightly)[:2] == (1, 4)
    assert [f.url for f in nightly.plan.files if "sha256" in f.identity] == [str(untouched)]
    cache = in_process(nightly).record.cache
    assert sorted(hashed) == sorted(map(str, (grown, rewritten, chmodded, new)))
    assert (cache.files_hit, cache.files_missed) == (2, 3)  # the untouched and the chmodded
    hashed.clear()
    content._sha256_once.cache_clear()
    third = Build.start(config, "third")
    assert hashed == []
    assert reading(third)[:2] == (3, 2)
    in_process(third)
    assert sorted(hashed) == [str(grown), str(new)]  # written just before their hash: git's racy case


def test_the_plan_merges_what_the_ranks_remembered(tmp_path, inputs, sample_tokenizer) -> None:
    """Each rank leaves its rows in a record of its own (ranks run at once); the next plan merges them into the
    input's one record and removes theirs."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    records = tmp_path / "out/.cache/inputs"
    parts = sorted(path.name for path in records.iterdir())
    assert [name.split(".")[1:] for name in parts] == [
        ["rank", parts[0].split(".")[2], stem, "json"] for stem in ("00000", "00001")
    ]
    assert reading(Build.start(config, "next"))[:2] == (4, 0)
    (merged,) = records.iterdir()
    assert sorted(orjson.loads(merged.read_bytes())["files"]) == sorted(map(str, inputs.iterdir()))


def test_a_file_modified_as_it_was_hashed_is_hashed_again(tmp_path) -> None:
    """git's racy case: a file whose mtime is within ``RACY_NS`` of the moment it was hashed may have been written
    again in the same tick of a coarse clock, so its row is not trusted; hashed again later, it is."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n')
    listing = list_input_files([str(path)])
    first = with_content(listing)
    assert (first.hashed, first.recognised, first.bytes_to_hash) == (1, 0, path.stat().st_size)
    assert first.listing == listing  # the plan reads nothing: its rank will
    files, rows, _ = rank_hashes(first.listing.files)
    assert files == [with_sha256(listing.files[0], file_checksum(path, algorithm=SHA256))]
    second = with_content(listing, rows)
    assert (second.hashed, second.recognised) == (1, 0)
    clock = time.time_ns
    with pytest.MonkeyPatch.context() as later:
        later.setattr(content.time, "time_ns", lambda: clock() + content.RACY_NS)  # a rank 2 s on
        _, rows, _ = rank_hashes(second.listing.files)
    fourth = with_content(listing, rows)
    assert (fourth.hashed, fourth.recognised, fourth.bytes_to_hash) == (0, 1, 0)
    assert fourth.listing.files == files


def test_a_rank_hashes_its_new_files_at_once(tmp_path, monkeypatch) -> None:
    """A rank's new files are hashed on a thread a core, several at once, each file once however many of its parts
    the rank holds; a file whose plan records its sha256 is not read."""
    for k in range(5):
        (tmp_path / f"new-{k}.jsonl").write_text(f'{{"text": "new {k}"}}\n')
    together = threading.Barrier(2, timeout=10)  # broken unless two hashes are under way at once
    read: list[str] = []

    def hashed_beside_another(folder, name, algorithm):
        read.append(folder.path_of(name))
        together.wait()
        return checksum(folder, name, algorithm)

    monkeypatch.setattr(Folder, "checksum", hashed_beside_another)
    monkeypatch.setattr(content.os, "cpu_count", lambda: 2)
    content._sha256_once.cache_clear()
    files = list_input_files([str(tmp_path)]).files
    known_one = with_sha256(files[0], "0" * 64)
    found, rows, _ = rank_hashes([known_one, *files[1:], files[1]])
    assert sorted(read) == sorted(f.url for f in files[1:])
    assert found[0] == known_one and sorted(rows) == sorted(f.url for f in files[1:])


def test_a_remembered_row_of_another_stat_is_not_used(tmp_path) -> None:
    """A row whose device, inode, size or sha256 is not the file's is no reason to skip reading it."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n')
    then = time.time_ns() - HOUR_NS
    os.utime(path, ns=(then, then))
    listing = list_input_files([str(path)])
    _, rows, _ = rank_hashes(listing.files)
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
    """A read-only cache: the ranks' records are not written, the log says so, and the next night's ranks hash
    every file again."""

    class ReadOnly(Folder):
        def put(self, *args, **kwargs):
            raise OSError(30, "Read-only file system")

    config = config_of(inputs, tmp_path, sample_tokenizer)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(known, "_folder", lambda cache: ReadOnly(cache.at.sub(KNOWN).url, cache.at.options))
        with caplog.at_level(logging.WARNING, logger=known.__name__):
            night(config, "first")
    warnings = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert len(warnings) == 2  # a rank each
    for warning in warnings:
        assert warning.startswith(f"{tmp_path}/out/.cache/inputs/") and warning.endswith(
            ".json: not written ([Errno 30] Read-only file system); the next night's ranks hash these files again"
        )
    hashed.clear()
    content._sha256_once.cache_clear()
    assert reading(Build.start(config, "next"))[:2] == (0, 4)


def test_a_damaged_record_is_named_and_its_files_hashed(tmp_path, inputs, sample_tokenizer, caplog):
    """A rank's record damaged: named in the log, its files are hashed again; the other rank's are recognised."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    record = sorted((tmp_path / "out/.cache/inputs").iterdir())[0]
    data = orjson.loads(record.read_bytes())
    record.write_bytes(orjson.dumps({**data, "files": [1]}))
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        assert reading(Build.start(config, "next"))[:2] == (2, 2)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warning.startswith(f"{record}: not a valid record of known input files: ")
    assert warning.endswith("; its local input files are hashed")


def test_a_record_gone_before_it_is_read_is_no_failure_on_s3(s3, caplog, monkeypatch) -> None:
    """Plans and ranks run at once: a rank's record listed by one plan may be merged and removed by another before
    the first reads it. On S3 the read fails with the store's NoSuchKey; that record is gone, as a local one would
    be, and no warning is logged: its rows are the other plan's now."""
    cache, inputs = Cache(Folder("s3://corpus/cache", s3.options)), ["s3://corpus/in"]
    known.remember_part(cache, inputs, "0", {"s3://corpus/in/a.jsonl": "1,2,3,4,sha,5"})
    head = Folder.head

    def removed_first(folder: Folder, name: str, size: int) -> bytes:
        folder.remove(name)  # the other plan merged it into its record and removed it
        return head(folder, name, size)

    monkeypatch.setattr(Folder, "head", removed_first)
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        recalled = known.recall(cache, inputs, 1)
    assert recalled.rows == {} and len(recalled.parts) == 1
    assert [r.getMessage() for r in caplog.records if r.name == known.__name__] == []


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
        f"read, 1 new or changed, hashed by their ranks ({size(changed.stat().st_size)})"
    )
    report = orjson.loads((tmp_path / "out" / "next" / "report.json").read_bytes())
    assert report["build"]["cache"]["plan"] == cache.plan.to_json()
    shown = (tmp_path / "out" / "next" / "report.html").read_text()
    assert '<th>recognised unchanged, not read</th><td data-key="files_recognised">3</td>' in shown


def test_with_a_key_a_changed_row_is_refused(tmp_path, inputs, sample_tokenizer, caplog, monkeypatch):
    """A row made to name another sha256 would make a file another file's entry: with a cache key the records are
    signed, and one changed since is not used (named in the log); its files are hashed again."""
    monkeypatch.setenv("TOKENIZATION_CACHE_KEY", "a deployment's secret")
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    record = sorted((tmp_path / "out/.cache/inputs").iterdir())[0]
    data = orjson.loads(record.read_bytes())
    first, second, *_ = sorted(data["files"])
    data["files"][first] = data["files"][first].rsplit(",", 1)[0] + "," + data["files"][second].rsplit(",", 1)[1]
    record.write_bytes(orjson.dumps(data))
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        assert reading(Build.start(config, "next"))[:2] == (2, 2)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warning == (
        f"{record}: not a valid record of known input files: its signature does not verify with "
        "TOKENIZATION_CACHE_KEY (signed with another key, or changed since); its local input files are hashed"
    )


def test_the_rank_that_holds_a_changed_file_starts_first(tmp_path, inputs, sample_tokenizer, monkeypatch) -> None:
    """A next night of 4 ranks on 2 processes started them in rank order: the rank of the one changed file, when last,
    started once a process was free and ran alone at the end while the other core idled. The ranks start with the most
    bytes the plan did not recognise unchanged, then the most bytes: the first night, the largest shares first."""
    started: list[list[int]] = []

    def in_order(build, step, calls, parallel, progress, total=None) -> None:  # ``in_processes``, in this process
        if step == "tokenize":
            started.append([rank for (rank,) in calls])
        for call in calls:
            getattr(build, step)(*call, progress=False)

    monkeypatch.setattr(run, "in_processes", in_order)
    config = config_of(inputs, tmp_path, sample_tokenizer, num_ranks=4)
    first = Build.start(config, "first")
    shares = {rank: first.plan.share(rank, 4) for rank in first.ranks}
    assert all(len(files) == 1 for files in shares.values())
    first.run()
    assert started == [sorted(shares, key=lambda rank: (-shares[rank][0].size, rank))]
    last = started[0][-1]  # the smallest share
    grown = shares[last][0].url
    with open(grown, "ab") as out:
        out.write(gzip.compress(b'{"text": "one more document"}\n'))
    first_order = started.pop()
    Build.start(config, "next").run()
    assert started == [[last] + [rank for rank in first_order if rank != last]]


# A row forged in the cache (another sha256 for a file, no key set): the plan takes it, unread, and the file's key with
# it. The rank that misses the file (or finds the hit under that key unfit) reads it anyway, so it hashes it beside
# its encoding: the entry is stored under the file's real sha256, never the row's, the row is corrected for the next
# night, and the log names the file. Before, every night stored its entry under the forged sha256, and a real file of
# that sha256 could later have been served another file's tokens.

FUTURE_NS = 10**19 - 1  # a hashed_ns no rank writes: it must not let the forged row win over the corrected one


def sha256_of(path) -> str:
    return file_checksum(path, None, SHA256)


def forge(cache, url: str, sha256: str, hashed_ns: int | None = None) -> None:
    """Rewrite the rows of ``url`` in the records the cache holds (a rank's each, for a split file), as whoever can
    write the cache can."""
    forged = 0
    for record in sorted((cache / KNOWN).iterdir()):
        data = orjson.loads(record.read_bytes())
        if url in data["files"]:
            fields = data["files"][url].split(",")
            fields[5] = str(hashed_ns or fields[5])
            fields[6] = sha256
            data["files"][url] = ",".join(fields)
            record.write_bytes(orjson.dumps(data))
            forged += 1
    assert forged, f"no row of {url}"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == first_pass.__name__ and r.levelno == logging.WARNING]


@pytest.mark.parametrize("kind", ["unknown", "another input's, hashed in the future"])
def test_a_forged_row_does_not_outlive_its_forging(tmp_path, inputs, sample_tokenizer, caplog, kind) -> None:
    """A sha256 no file has (a miss) or another input's (that file's entry, which its sample finds unfit, and
    keeps): the build gives the bytes of a build without a cache, the entry is stored under the real sha256 (every
    marker's content is its source's bytes'), the row is corrected (the next plan takes the real sha256), and the
    next night, which hits every file, says nothing."""
    content._sha256_once.cache_clear()
    config = config_of(inputs, tmp_path, sample_tokenizer)
    cache = tmp_path / "out/.cache"
    night(config, "first")
    victim, other, *_ = sorted(inputs.iterdir())
    real = sha256_of(victim)
    forged = "f" * 64 if kind == "unknown" else sha256_of(other)
    forge(cache, str(victim), forged, None if kind == "unknown" else FUTURE_NS)
    content._sha256_once.cache_clear()

    with caplog.at_level(logging.WARNING, logger=first_pass.__name__):
        nightly = Build.start(config, "next")
        (taken,) = [f.identity for f in nightly.plan.files if f.url == str(victim)]
        assert taken.endswith(f",sha256={forged}")  # the plan took the forged row, as it takes any
        published = in_process(nightly)
    without = in_process(Build.start(config_of(inputs, tmp_path / "off", sample_tokenizer, cache="off"), "next"))
    assert published.record.digest == without.record.digest
    # the hit under the other's sha256, found unfit by its sample, is the other's entry: kept, the row corrected
    assert not [r for r in caplog.records if "it is removed, and the file tokenized again" in r.message]
    (rank,) = [r for r in nightly.ranks if str(victim) in {f.url for f in nightly.plan.share(r, 2)}]
    assert warnings_of(caplog) == [
        f"rank {rank}: {victim}: its bytes' sha256 is {real}, not the {forged} its plan took from the cache's record "
        "of known input files (a row forged or damaged); its entry is stored under its bytes' sha256, and its row "
        "corrected"
    ]
    markers = [orjson.loads(path.read_bytes()) for path in (cache / ENTRIES).glob("*.json")]
    assert f"sha256={forged}" not in {m["content"] for m in markers if m["source"]["url"] == str(victim)}
    assert all(m["content"] == f"sha256={sha256_of(inputs / os.path.basename(m['source']['url']))}" for m in markers)
    assert f"sha256={real}" in {m["content"] for m in markers}
    manifests = rank_manifests(nightly.layout.ranks, 2)
    (served,) = [f for m in manifests if m.cache for f in m.cache.files if f.url == str(victim)]
    assert (served.hit, served.content) == (False, f"sha256={real}")

    caplog.clear()
    content._sha256_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=first_pass.__name__):
        third = Build.start(config, "third")
        (taken,) = [f.identity for f in third.plan.files if f.url == str(victim)]
        assert taken.endswith(f",sha256={real}")  # the row its rank corrected
        done = in_process(third)
    assert warnings_of(caplog) == []
    assert (done.record.cache.files_hit, done.record.cache.files_missed) == (4, 0)
    assert done.record.digest == without.record.digest


def test_a_split_file_is_hashed_whole_and_said_once_a_rank(tmp_path, sample_tokenizer, caplog) -> None:
    """A file split between ranks (``split_input_mb``): each rank that misses a part hashes the whole file, once,
    and stores each part under the real sha256; a rank that holds two of its parts warns once."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    big = inputs / "big.jsonl"
    big.write_bytes(b"".join(b'{"text": "document %d of a file split between ranks"}\n' % n for n in range(60_000)))
    then = time.time_ns() - HOUR_NS
    os.utime(big, ns=(then, then))
    content._sha256_once.cache_clear()
    config = config_of(inputs, tmp_path, sample_tokenizer, split_input_mb=1)
    cache = tmp_path / "out/.cache"
    in_process(Build.start(config, "first"))
    forge(cache, str(big), "e" * 64)
    content._sha256_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger=first_pass.__name__):
        nightly = Build.start(config, "next")
        parts = [f.part.count for f in nightly.plan.shared if f.part]
        published = in_process(nightly)
    assert parts == [4, 4, 4, 4]  # ranks 0 and 1 hold two each
    assert [m.split(": ")[0] for m in warnings_of(caplog)] == ["rank 0", "rank 1"]
    off = config_of(inputs, tmp_path / "off", sample_tokenizer, split_input_mb=1, cache="off")
    without = in_process(Build.start(off, "next"))
    assert published.record.digest == without.record.digest
    markers = [orjson.loads(path.read_bytes()) for path in (cache / ENTRIES).glob("*.json")]
    real = sha256_of(big)
    assert sorted(m["content"] for m in markers) == [f"sha256={real},part={n}/4" for n in (1, 2, 3, 4)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=first_pass.__name__):
        done = in_process(Build.start(config, "third"))
    assert warnings_of(caplog) == []
    assert (done.record.cache.files_hit, done.record.cache.files_missed) == (4, 0)


def test_a_folder_named_as_a_ranks_record_is_left_alone(tmp_path, inputs, sample_tokenizer) -> None:
    """A folder planted under a rank's record's name is no record: the next plan merges the real ones, removes them,
    and leaves the folder (a plan that tried to remove it failed with a traceback, night after night)."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    records = tmp_path / "out/.cache/inputs"
    planted = records / sorted(path.name for path in records.iterdir())[0].replace(".00000.", ".planted.")
    planted.mkdir()
    assert reading(Build.start(config, "next"))[:2] == (4, 0)
    assert sorted(path.name for path in records.iterdir() if path.is_file()) == [f"{planted.name.split('.')[0]}.json"]
    assert planted.is_dir()


def test_a_folder_in_place_of_the_inputs_record_is_named_and_its_files_hashed(
    tmp_path, inputs, sample_tokenizer, caplog
) -> None:
    """A folder where the input's record goes: named in the log (the error alone named a file descriptor), and the
    rows the ranks left beside it are still recognised."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    night(config, "first")
    records = tmp_path / "out/.cache/inputs"
    planted = records / f"{sorted(path.name for path in records.iterdir())[0].split('.')[0]}.json"
    planted.mkdir()
    with caplog.at_level(logging.WARNING, logger=known.__name__):
        assert reading(Build.start(config, "next"))[:2] == (4, 0)
    warnings = [r.getMessage() for r in caplog.records if r.name == known.__name__]
    assert warnings[0].startswith(f"{planted}: not read (")
    assert warnings[0].endswith("; its local input files are hashed")
