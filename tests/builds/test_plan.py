"""A build's plan is fixed once: ranks read exactly its files, a re-run resumes only the same plan, and the books
check that every planned file was read once (issue 22, findings 1 and 2)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import replace
from datetime import datetime, timezone

import orjson
import pytest

import tokenization.stages.tokenize as stage
from tests.support.builds import config_of, in_process
from tests.support.stages import cache_of
from tokenization.builds.accounting import incomplete_ranks
from tokenization.builds.complete import summary
from tokenization.builds.config import tokenizer_folder
from tokenization.builds.plan import Plan, unread_or_reread
from tokenization.builds.run import Build
from tokenization.inputs import content
from tokenization.inputs.content import difference
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import list_input_files
from tokenization.output.runs import BuildError, PlanConflict
from tokenization.records import InputFile, RecordError
from tokenization.storage.checksums import SHA256, file_checksum
from tokenization.storage.folder import Folder

checksum = Folder.checksum  # the real one, which the counting stand-ins call


@pytest.fixture
def inputs(tmp_path, sample_corpus):
    """A copy of the sample corpus (four files), which the tests change."""
    folder = tmp_path / "in"
    shutil.copytree(sample_corpus, folder)
    return folder


def late_file(inputs) -> str:
    """A file that lands while a build runs, whose name sorts before every planned one."""
    path = inputs / "a-late.jsonl"
    path.write_text("".join(orjson.dumps({"text": f"late document {i}"}).decode() + "\n" for i in range(5)))
    return str(path)


def test_a_resume_after_new_input_reads_exactly_the_plan(tmp_path, inputs, sample_tokenizer) -> None:
    """Finding 1: killed after rank 0, a file sorting first lands, the same build id runs again. Rank 1 used to
    shard the new listing: two files twice, two never, and the books said they held."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    clean = Build.start(config, "clean").run()

    first = Build.start(config, "nightly")
    first.tokenize(0, progress=False)  # then the build is killed
    late = late_file(inputs)
    resumed = Build.start(config, "nightly")
    assert resumed.plan.digest == first.plan.digest
    published = resumed.run()

    assert published.record.digest == clean.record.digest
    books = published.record.conservation
    assert (books.docs_in, books.holds, books.inputs_problem) == (309, True, None)
    assert published.record.inputs is not None and published.record.inputs.arrived_after_plan is not None
    assert published.record.inputs.arrived_after_plan.to_json() == {"files": 1, "first": [late]}
    assert "inputs: the plan's 4 files, each read once; 1 arrived after the plan, left for the next build" in (
        summary(published.record)
    )
    read = [f for r in (0, 1) for f in _rank_manifest(tmp_path / "out" / "nightly", r)["inputs"]]
    assert sorted(f["url"] for f in read) == sorted(str(p) for p in inputs.glob("part-*.jsonl.gz"))


def test_a_rerun_with_other_settings_or_inputs_is_refused_naming_them(tmp_path, inputs, sample_tokenizer) -> None:
    """Finding 2: a re-run kept the ranks of another plan (a deleted input; another seed; another tokenizer)."""
    config = config_of(inputs, tmp_path, tmp_path / "tokenizer.json", seed=1)
    shutil.copy(sample_tokenizer, tmp_path / "tokenizer.json")
    Build.start(config, "b1").run()
    record = tmp_path / "out" / "b1" / "_BUILD.json"
    published = record.read_bytes()

    with pytest.raises(PlanConflict, match=r"b1 was planned otherwise: seed 2 \(planned 1\)\. A build id resumes"):
        Build.start(config_of(inputs, tmp_path, tmp_path / "tokenizer.json", seed=2), "b1")
    with pytest.raises(PlanConflict, match=r"num_ranks 3 \(planned 2\); seed 7 \(planned 1\)"):
        Build.start(config_of(inputs, tmp_path, tmp_path / "tokenizer.json", seed=7, num_ranks=3), "b1")
    other = orjson.loads((tmp_path / "tokenizer.json").read_bytes())
    other["added_tokens"].append({**other["added_tokens"][0], "id": 50257, "content": "<|other|>"})
    (tmp_path / "tokenizer.json").write_bytes(orjson.dumps(other))
    with pytest.raises(PlanConflict, match=r"tokenizer sha256 '[0-9a-f]{64}' \(planned '[0-9a-f]{64}'\)"):
        Build.start(config, "b1")
    shutil.copy(sample_tokenizer, tmp_path / "tokenizer.json")
    (inputs / "part-00002.jsonl.gz").unlink()  # the failed input, deleted
    with pytest.raises(PlanConflict, match=r"1 planned input file is gone \(.*/in/part-00002.jsonl.gz\)"):
        Build.start(config, "b1")
    assert record.read_bytes() == published  # nothing of b1 was touched


def rewritten(path, data: bytes) -> None:
    """``path`` holding ``data``, written in place, with its mtime kept (its change time moves on)."""
    before = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_ctime_ns != before.st_ctime_ns


def test_a_planned_file_that_changes_or_vanishes_fails_its_rank_naming_it(tmp_path, inputs, sample_tokenizer):
    """Rewritten with its size and mtime kept, a file whose bytes differ is another file; so is one that is gone.
    Its plan, made the first night, knows it by its stat (no plan reads a file); the sha256 that an earlier build's
    rank remembered of it at that very stat tells that its bytes changed. Without one (no cache), its stat does."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    build = Build.start(config, "b")
    uncached = Build.start(config_of(inputs, tmp_path / "off", sample_tokenizer, cache="off"), "b")
    assert not any("sha256" in file.identity for file in build.plan.files + uncached.plan.files)
    in_process(Build.start(config, "another"))  # its ranks hash the files, and remember them
    rank_0 = inputs / "part-00000.jsonl.gz"  # rank 0 takes files 0 and 2
    data = rank_0.read_bytes()
    planned, changed = hashlib.sha256(data).hexdigest(), data[:-1] + bytes([data[-1] ^ 1])
    rewritten(rank_0, changed)
    with pytest.raises(InputError) as refused:
        build.tokenize(0, progress=False)
    assert str(refused.value) == (
        f"{rank_0}: changed since the build was planned: its content changed (sha256 "
        f"{hashlib.sha256(changed).hexdigest()[:12]}…; planned {planned[:12]}…), its size and mtime kept; a build "
        "reads exactly its plan's files, so run it under a new build id"
    )
    with pytest.raises(InputError) as refused:
        uncached.tokenize(0, progress=False)
    assert str(refused.value) == (
        f"{rank_0}: changed since the build was planned: its inode or change time changed (a chmod, or a copy that "
        "kept its mtime), and its plan records no sha256 of its bytes to tell whether they did (a file new to its "
        "plan, whose rank's hash is not remembered, is known by its stat; or a plan made by an earlier version); a "
        "build reads exactly its plan's files, so run it under a new build id"
    )
    (inputs / "part-00003.jsonl.gz").unlink()
    with pytest.raises(InputError, match=r"part-00003.jsonl.gz: gone since the build was planned"):
        build.tokenize(1, progress=False)
    assert incomplete_ranks(build.layout.ranks, 2) == {0: "no completion marker", 1: "no completion marker"}


def test_a_file_changed_while_its_rank_read_it_fails_the_rank_and_a_hit_is_not_looked_at_again(
    tmp_path, inputs, sample_tokenizer, monkeypatch
) -> None:
    """A rank looks at the files it read again once it has read them: one that changed meanwhile fails it, naming
    the file. A cache hit was not read whole (a sample at most, which a change fails): its tokens are the planned
    bytes', so it is not looked at again (a next night's rank of 25,000 hits stat-ed each twice), and the build is the
    first night's."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    first = Build.start(config, "first").run()
    uncached = Build.start(config_of(inputs, tmp_path / "off", sample_tokenizer, cache="off"), "b")
    cached = Build.start(config, "next")
    rank_0 = inputs / "part-00000.jsonl.gz"  # rank 0 takes files 0 and 2
    data = rank_0.read_bytes()
    original = stage.second_pass

    def changing(*args, **kwargs):
        rewritten(rank_0, data[:-1] + bytes([data[-1] ^ 1]))  # after pass 1 read it, before the rank ends
        return original(*args, **kwargs)

    monkeypatch.setattr(stage, "second_pass", changing)
    with pytest.raises(InputError, match=rf"^{rank_0}: changed since the build was planned: "):
        uncached.tokenize(0, progress=False)
    rewritten(rank_0, data)
    served = cached.tokenize(0, progress=False).record
    assert [f.hit for f in cache_of(served).files] == [True, True]
    rewritten(rank_0, data)
    monkeypatch.undo()
    assert cached.run().record.digest == first.record.digest


def test_a_chmod_or_a_copy_keeping_the_mtime_is_the_same_file(tmp_path, inputs, sample_tokenizer, monkeypatch):
    """Issue 37, 8c: after ``chmod o+r`` on unchanged inputs, re-running a published build id was refused ("was
    planned otherwise: 4 planned input files changed"), and so was a rank of a build resumed after it: the identity
    held the change time. A file whose bytes did not change is the same file; only files whose inode or change time
    differ are read again, to tell."""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    published = Build.start(config, "b").run()
    resumed = Build.start(config, "r")
    resumed.tokenize(0, progress=False)  # then the build is killed
    copied, chmodded = inputs / "part-00001.jsonl.gz", [inputs / f"part-0000{i}.jsonl.gz" for i in (0, 3)]
    before = {path: path.stat() for path in inputs.iterdir()}
    shutil.copy2(copied, tmp_path / "copy")  # the same bytes and mtime, another inode
    os.replace(tmp_path / "copy", copied)
    for path in chmodded:
        path.chmod(path.stat().st_mode | stat.S_IROTH)
    for path in (copied, *chmodded):
        now = path.stat()
        assert now.st_mtime_ns == before[path].st_mtime_ns
        assert (now.st_ino, now.st_ctime_ns) != (before[path].st_ino, before[path].st_ctime_ns)
    hashed = []

    def hashing(folder, name, algorithm):
        hashed.append(folder.path_of(name))
        return checksum(folder, name, algorithm)

    monkeypatch.setattr(Folder, "checksum", hashing)
    content._sha256_once.cache_clear()
    assert Build.start(config, "b").run().record == published.record
    assert sorted(hashed) == sorted(map(str, (copied, *chmodded)))  # part-00002, untouched, is not read
    again = Build.start(config, "r")
    again.tokenize(1, progress=False)  # its files: 1 (copied) and 3 (chmod)
    assert again.run().record.digest == published.record.digest


def test_a_rerun_names_how_each_planned_file_changed(tmp_path, inputs, sample_tokenizer) -> None:
    """Issue 37, 8c: the refusal named the files only ("7 planned input files changed"); it says what changed. (The
    plan takes each file's sha256 from what the night before's ranks remembered.)"""
    config = config_of(inputs, tmp_path, sample_tokenizer)
    in_process(Build.start(config, "night before"))
    assert all("sha256" in file.identity for file in Build.start(config, "b").plan.files)
    grown, touched, edited = (inputs / f"part-0000{i}.jsonl.gz" for i in range(3))
    size = grown.stat().st_size
    grown.write_bytes(grown.read_bytes() + b"\n")
    mtime = touched.stat().st_mtime_ns
    os.utime(touched, ns=(mtime, mtime + 10**9 + 1))
    data = edited.read_bytes()
    rewritten(edited, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(PlanConflict) as refused:
        Build.start(config, "b")
    was, now = (
        f"{datetime.fromtimestamp(ns // 10**9, timezone.utc):%Y-%m-%dT%H:%M:%S}.{ns % 10**9:09d}Z"
        for ns in (mtime, mtime + 10**9 + 1)
    )
    assert str(refused.value) == (
        f"{tmp_path}/out/b was planned otherwise: 3 planned input files changed since ({grown}: its size changed "
        f"from {size:,} to {size + 1:,} bytes, {touched}: it was modified (mtime {now}; planned {was}), {edited}: its "
        f"content changed (sha256 {hashlib.sha256(edited.read_bytes()).hexdigest()[:12]}…; planned "
        f"{hashlib.sha256(data).hexdigest()[:12]}…), its size and mtime kept). A build id resumes only its own "
        "plan: run these settings or inputs under a new build id"
    )


def test_a_plan_made_before_content_hashes_cannot_tell_a_chmod_from_a_rewrite(tmp_path) -> None:
    """A plan of the version before records no sha256: a file whose inode or change time differs cannot be told the
    same, and the message says why."""
    path = tmp_path / "a.jsonl"
    path.write_text("{}\n")
    (now,) = list_input_files([str(path)]).files
    fields = dict(field.split("=") for field in now.identity.split(","))
    old = replace(now, identity=f"mtime_ns={fields['mtime_ns']},ctime_ns=1,ino={fields['ino']}")
    assert difference(old, now) == (
        "its inode or change time changed (a chmod, or a copy that kept its mtime), and its plan records no sha256 "
        "of its bytes to tell whether they did (a file new to its plan, whose rank's hash is not remembered, is known "
        "by its stat; or a plan made by an earlier version)"
    )
    assert difference(replace(old, identity=now.identity), now) is None
    sha256, st = file_checksum(path, algorithm=SHA256), path.stat()
    row = f"{st.st_size},{fields['mtime_ns']},1,{fields['ino']},{st.st_dev},{st.st_mtime_ns + 1},{sha256}"
    assert difference(old, now, lambda: {str(path): row}) is None  # a rank hashed it at its planned stat
    other = row.replace(sha256, "0" * 64)
    changed = difference(old, now, lambda: {str(path): other})
    assert changed is not None and changed.startswith("its content changed (sha256 ")
    changed = difference(old, now, lambda: {str(path): row.replace(",1,", ",2,", 1)})
    assert changed is not None and changed.startswith("its inode or")


def test_the_books_refuse_ranks_that_read_other_files(tmp_path, inputs, sample_tokenizer, monkeypatch) -> None:
    """Finding 1's mechanism, forced: rank 1 takes its share of a new listing. Publish refuses, naming the files,
    and leaves no _BUILD.json."""
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    build.tokenize(0, progress=False)
    relisted = [InputFile(late_file(inputs), 0), *build.plan.files]
    monkeypatch.setattr(Plan, "share", lambda self, rank, ranks: relisted[rank::ranks])
    build.tokenize(1, progress=False)  # takes files 0 and 2 again
    build.merge(progress=False)
    twice, never = r"read more than once: \S+/part-00000.jsonl.gz, \S+/part-00002", r"never read: \S+/part-00001"
    with pytest.raises(BuildError, match=rf"the plan's input files: {twice}.jsonl.gz; planned but {never}"):
        build.publish()
    assert not (tmp_path / "out" / "b" / "_BUILD.json").exists()


def test_a_rank_of_another_plan_is_not_complete(tmp_path, inputs, sample_tokenizer) -> None:
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    for rank in (0, 1):
        build.tokenize(rank, progress=False)
    assert build.incomplete_ranks() == {}
    assert incomplete_ranks(build.layout.ranks, 2, "0" * 64) == {
        r: f"tokenized under another plan ({build.plan.digest}, not {'0' * 64})" for r in (0, 1)
    }


def test_a_failed_publish_takes_back_the_build_record(tmp_path, inputs, sample_tokenizer) -> None:
    """Finding 2: publish refused, but the old _BUILD.json stayed over files that no longer verify. Publish reads
    no byte of the files the merge checked before upload, so what it finds is a file that is not the size its
    marker records (a byte changed in place is for ``tokenization verify`` to find)."""
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    build.run()
    record = tmp_path / "out" / "b" / "_BUILD.json"  # as an earlier version wrote it, naming no plan: publish checks
    record.write_bytes(orjson.dumps(orjson.loads(record.read_bytes()) | {"plan": None}))  # the build anew
    merged = next((tmp_path / "out" / "b" / "merged").glob("*.ds"))
    merged.write_bytes(merged.read_bytes()[:-2])  # the last token gone: not the size its marker records, and
    with pytest.raises(BuildError, match="verify found 2 problems"):  # not the tokens corpus.ds.metadata counts
        build.publish()
    assert not (tmp_path / "out" / "b" / "_BUILD.json").exists()


def test_a_published_build_run_again_is_returned_as_it_is(tmp_path, inputs, sample_tokenizer) -> None:
    config = config_of(inputs, tmp_path, sample_tokenizer)
    first = Build.start(config, "b").run()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "b").rglob("*")}
    again = Build.start(config, "b").run()
    assert again.record == first.record
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "b").rglob("*")} == before


def test_a_claim_without_a_plan_is_refused(tmp_path, inputs, sample_tokenizer) -> None:
    """A run folder claimed by the previous version records no plan, so nothing can be checked against it."""
    (tmp_path / "out" / "old").mkdir(parents=True)
    (tmp_path / "out" / "old" / "_RUN.json").write_bytes(orjson.dumps({"run_id": "old", "claimed": 1.0}))
    with pytest.raises(BuildError, match=r"old/_RUN.json: claimed by run 'old' in an older format, which records no"):
        Build.start(config_of(inputs, tmp_path, sample_tokenizer), "old")
    (tmp_path / "out" / "old" / "_RUN.json").write_bytes(b'{"run_id": "old", "cla')
    with pytest.raises(RecordError, match=r"old/_RUN.json: not a valid run claim: not JSON \(unexpected end of data"):
        Build.start(config_of(inputs, tmp_path, sample_tokenizer), "old")


def test_files_read_against_the_plan() -> None:
    a, b, c = (InputFile(name, 10, "etag=1") for name in "abc")
    assert unread_or_reread([a, b], [a, b]) is None
    assert unread_or_reread([a, b, c], [a, b, a]) == "read more than once: a; planned but never read: c"
    changed = replace(b, identity="etag=2")
    assert unread_or_reread([a, b], [a, changed]) == "planned but never read: b; read but not planned: b"


def _rank_manifest(run_dir, rank: int) -> dict:
    return orjson.loads((run_dir / "ranks" / "_manifests" / f"{rank:05d}.json").read_bytes())


def test_a_damaged_rank_manifest_stops_publish_in_one_line(tmp_path, inputs, sample_tokenizer) -> None:
    """A flipped key in a rank manifest was a KeyError traceback in the books."""
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    for rank in (0, 1):
        build.tokenize(rank, progress=False)
    build.merge(progress=False)
    path = tmp_path / "out" / "b" / "ranks" / "_manifests" / "00001.json"
    path.write_bytes(path.read_bytes().replace(b'"docs_read"', b'"docs_reed"'))
    with pytest.raises(RecordError, match=r"ranks/_manifests/00001.json: not a valid manifest: counts.docs_read is mi"):
        build.publish()
    assert not (tmp_path / "out" / "b" / "_BUILD.json").exists()


@pytest.mark.parametrize(
    ("tokenizer", "folder"),
    [
        ("tok.json", "."),
        ("a/b/tok.json", "a/b"),
        ("/x/tok.model", "/x"),
        ("s3://bucket/t/tok.json", "s3://bucket/t"),
        ("s3://bucket/tok.tiktoken", "s3://bucket"),
        ("s3://bucket/tokenizer-folder", "s3://bucket/tokenizer-folder"),
    ],
)
def test_a_tokenizer_files_folder_is_the_one_that_holds_it(tokenizer: str, folder: str) -> None:
    """A deployment allows its default tokenizer's folder (the tokenizer_config.json beside the file names its
    EOS): a bare file name's was the name itself, so nothing beside it was allowed."""
    assert tokenizer_folder(tokenizer) == folder
