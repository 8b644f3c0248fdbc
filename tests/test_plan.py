"""A build's plan is fixed once: ranks read exactly its files, a re-run resumes only the same plan, and the books
check that every planned file was read once (issue 22, findings 1 and 2)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import orjson
import pytest

from tokenization.builds.accounting import incomplete_ranks
from tokenization.builds.complete import summary
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Plan, unread_or_reread
from tokenization.builds.run import Build
from tokenization.publish.records import InputFile, RecordError
from tokenization.publish.runs import BuildError, PlanConflict
from tokenization.text.sources import InputError

EOS = "<|endoftext|>"


@pytest.fixture
def inputs(tmp_path, sample_corpus):
    """A copy of the sample corpus (four files), which the tests change."""
    folder = tmp_path / "in"
    shutil.copytree(sample_corpus, folder)
    return folder


def config_of(inputs, tmp_path, tokenizer, **options) -> BuildConfig:
    settings = {"seed": 3, "num_ranks": 2, "context_window": 0, "eos_token": EOS} | options
    return BuildConfig(input=str(inputs), output=str(tmp_path / "out"), tokenizer=str(tokenizer), **settings)


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
    with pytest.raises(PlanConflict, match=r"1 planned input files are gone \(.*/in/part-00002.jsonl.gz\)"):
        Build.start(config, "b1")
    assert record.read_bytes() == published  # nothing of b1 was touched


def test_a_planned_file_that_changes_or_vanishes_fails_its_rank_naming_it(tmp_path, inputs, sample_tokenizer):
    """Rewritten with its size and mtime kept, a file is still another file; so is one that is gone."""
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    rank_0 = inputs / "part-00000.jsonl.gz"  # rank 0 takes files 0 and 2
    before = rank_0.stat()
    data = bytearray(rank_0.read_bytes())
    rank_0.write_bytes(bytes(data))  # the same bytes, written again
    os.utime(rank_0, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(InputError, match=r"part-00000.jsonl.gz: changed since the build was planned \(\d+ bytes, "):
        build.tokenize(0, progress=False)
    (inputs / "part-00003.jsonl.gz").unlink()
    with pytest.raises(InputError, match=r"part-00003.jsonl.gz: gone since the build was planned"):
        build.tokenize(1, progress=False)
    assert incomplete_ranks(build.layout.ranks, 2) == {0: "no completion marker", 1: "no completion marker"}


def test_the_books_refuse_ranks_that_read_other_files(tmp_path, inputs, sample_tokenizer, monkeypatch) -> None:
    """Finding 1's mechanism, forced: rank 1 takes its share of a new listing. Publish refuses, naming the files,
    and leaves no _BUILD.json."""
    build = Build.start(config_of(inputs, tmp_path, sample_tokenizer), "b")
    build.tokenize(0, progress=False)
    relisted = [InputFile(late_file(inputs), 0), *build.recorded_plan().files]
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
