"""Verify where the bytes are: each context-shuffle task checks its own files before it uploads them, on the blocks
as it writes them (it reads none back), its manifest and marker say so, and publish then reads no byte of them;
``tokenization verify`` still reads all, or trusts those checks and re-reads a random sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.builds import in_process, until_publish
from tests.support.processes import cli
from tests.support.tokenizers import EOS
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.formats import block_checks
from tokenization.formats import checks as checking
from tokenization.formats.block_checks import Checks
from tokenization.formats.checks import OwnCheck, SelfCheckFailed
from tokenization.formats.ds import TokenFileWriter
from tokenization.output import manifest
from tokenization.records import CompletionMarker, ContextManifest, MergeManifest, PseudoEnds, stage_manifest
from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

SETTINGS: dict[str, Any] = {
    "num_ranks": 2,
    "num_context_shards": 2,
    "context_window": 257,
    "merge_max_tokens_per_file": 20000,
}

# The C helper and the numpy path, on the same inputs: the proofs and checks must find the same.
pytestmark = pytest.mark.usefixtures("byte_path")


def started(tmp_path, corpus, tokenizer) -> Build:
    config = BuildConfig(
        input=str(corpus), output=str(tmp_path / "out"), tokenizer=str(tokenizer), eos_token=EOS, **SETTINGS
    )
    return Build.start(config, "night")


def reading_no_token_file(monkeypatch) -> None:
    """From here on, reading a token file's bytes fails the test (a dataset's ``.ds.metadata`` text may be read)."""
    blocks = block_checks.blocks

    def guarded(folder, name: str, *args):
        assert name.endswith(".metadata"), f"read {folder.url_of(name)}"
        return blocks(folder, name, *args)

    monkeypatch.setattr(checking, "blocks", guarded)


def test_each_context_task_checks_its_files_as_it_writes_them_and_publish_reads_no_token_byte(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
) -> None:
    build = started(tmp_path, sample_corpus, sample_tokenizer)
    reading_no_token_file(monkeypatch)
    until_publish(build)
    context = Path(build.layout.context.path)
    facts = build.claimed.claim.tokenizer
    assert facts is not None
    files = tokens = 0
    for shard in range(2):
        stem = f"context_{shard:05d}"
        record = ContextManifest.loads((context / "_manifests" / f"{stem}.json").read_bytes(), stem)
        marker = CompletionMarker.loads((context / "_completions" / f"{stem}.json").read_bytes(), stem)
        checked = record.checked
        assert checked is not None and marker.checked == checked
        assert (checked.vocab_size, checked.eos_id) == (facts.vocab_size, facts.eos_id) and checked.eos_id is not None
        assert checked.families == [o.name for o in record.outputs] and checked.tokens == record.counts.tokens
        files, tokens = files + len(checked.families), tokens + checked.tokens

    published = build.publish()
    assert published.record.verify.ok and published.record.verify.files == files and published.record.tokens == tokens
    assert any(
        "not read again: their stages checked them before upload" in note for note in published.record.verify.notes
    )


def test_a_task_whose_own_files_fail_publishes_nothing(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Ids beyond the vocabulary (a check against too small a vocabulary stands in for a corrupt write): the task
    fails naming the file and the first token, and leaves no manifest, marker or token file in the output."""
    build = started(tmp_path, sample_corpus, sample_tokenizer)
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    build.merge(None, progress=False)
    output = tmp_path / "shuffled"
    config = ContextShuffleConfig(input=build.layout.merged.url, output=str(output), context_window=257, seed=1)
    with pytest.raises(
        SelfCheckFailed,
        match=r"context shuffle context_00000: 000_corpus\.ds fails verify before "
        r"upload, so nothing is published: .*000_corpus\.ds @ token \d+: id beyond the vocabulary of 100",
    ):
        context_shuffle(config, progress=False, checks=Checks(vocab_size=100))
    assert not [p for p in output.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_a_marker_without_the_check_gets_its_files_read(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """A check vouches only when the manifest and the marker carry the same one, made with at least the checks
    asked for: otherwise the files are read as before, and a flipped byte is found."""
    build = started(tmp_path, sample_corpus, sample_tokenizer)
    until_publish(build)
    context = tmp_path / "out" / "night" / "context"
    data = context / "000_corpus.ds"
    flipped = bytearray(data.read_bytes())
    flipped[10] ^= 0xFF
    data.write_bytes(bytes(flipped))
    facts = build.claimed.claim.tokenizer
    assert facts is not None
    checks = Checks(facts.vocab_size, facts.eos_id)
    assert verify(Folder(str(context)), checks=checks, vouched=True).ok  # trusted: not read
    assert not verify(Folder(str(context)), checks=checks).ok  # read
    assert not verify(Folder(str(context)), checks=Checks(facts.vocab_size + 1, facts.eos_id), vouched=True).ok
    marker = context / "_completions" / "context_00000.json"
    record = json.loads(marker.read_bytes())
    record["checked"] = None
    marker.write_text(json.dumps(record))
    found = verify(Folder(str(context)), checks=checks, vouched=True)
    assert any("000_corpus.ds: differs from what _completions/context_00000.json records" in p for p in found.problems)
    disagree = "context_00000.json: records another check of the stage's own files than its manifest"
    assert any(disagree in p for p in found.problems)


def test_verify_re_reads_a_random_sample_of_what_stages_checked(tmp_path, sample_corpus, sample_tokenizer) -> None:
    build = started(tmp_path, sample_corpus, sample_tokenizer)
    published = in_process(build)
    context = published.record.dataset
    files = published.record.verify.files
    sampled = cli("verify", context, "--sample", str(files))
    assert sampled.returncode == 0, sampled.stdout + sampled.stderr
    assert "not read again" not in sampled.stdout
    trusting = cli("verify", context, "--sample", "0")
    assert trusting.returncode == 0 and f"{files} files not read again" in trusting.stdout
    data = next(p for p in sorted((tmp_path / "out" / "night" / "context").glob("*.ds")))
    flipped = bytearray(data.read_bytes())
    flipped[10] ^= 0xFF
    data.write_bytes(bytes(flipped))
    assert cli("verify", context, "--sample", "0").returncode == 0  # the checks vouch for it: not read
    caught = cli("verify", context, "--sample", str(files))
    assert caught.returncode == 1 and f"{data.name}: differs from what _completions/" in caught.stdout
    assert cli("verify", context).returncode == 1  # the full check reads everything


@pytest.mark.parametrize("buckets", [None, 2])
def test_without_a_context_shuffle_the_merge_checks_its_own_files(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch, buckets
) -> None:
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path / "out"),
        tokenizer=str(sample_tokenizer),
        eos_token=EOS,
        **SETTINGS | {"context_window": 0, "num_buckets": buckets, "merge_mode": "bucketed" if buckets else "shuffle"},
    )
    build = Build.start(config, "night")
    reading_no_token_file(monkeypatch)  # the merge checks its files as it writes them
    until_publish(build)
    merged = Path(build.layout.merged.path)
    families = set()
    for path in sorted((merged / "_manifests").glob("*.json")):
        record = stage_manifest(path.read_bytes(), str(path))  # the merge's manifest, or a file's checkpoint
        if isinstance(record, MergeManifest):
            assert record.checked is not None and record.checked.families == [o.name for o in record.outputs]
            families |= set(record.checked.families)
    assert families == {p.name for p in merged.glob("*.ds")} and len(families) >= 2
    assert build.publish().record.verify.files == len(families)


def test_the_check_made_while_writing_finds_what_reading_the_file_finds(tmp_path, monkeypatch) -> None:
    """Blocks cut anywhere, an index entry at a block's edge given to the block before or the one after: the
    problems the writer's blocks show are those verify finds reading the family back (ids beyond the vocabulary,
    loss bytes past 1, documents ending without EOS, window ends aside), and the check names them."""
    monkeypatch.setattr(block_checks, "MAX_REPORTED", 10**6)  # every problem listed, by position
    rng = np.random.default_rng(7)
    size, eos, pseudo = 6000, 7, PseudoEnds(every=50, until=4000)
    tokens = rng.integers(0, 103, size).astype(np.uint16)  # ids of 100 and more are beyond a vocabulary of 100
    loss = (rng.random(size) < 0.001).astype(np.uint8) * 2 + (rng.random(size) < 0.5)
    ends = np.union1d(rng.choice(np.arange(1, size), 300, replace=False), np.arange(50, size + 1, 50))
    tokens[ends[rng.random(len(ends)) < 0.9] - 1] = eos  # most documents end in EOS
    checks = Checks(vocab_size=100, eos_id=eos)
    own, path = OwnCheck(checks, "a test"), tmp_path / "x.ds"
    writer = TokenFileWriter(path, tokenizer="t", token_size=2, save_loss=True, observe=own.watch(path, pseudo))
    cuts = np.union1d(rng.choice(ends[:-1], 20, replace=False), rng.integers(1, size, 20))
    given = 0  # entries written so far: ends[:given]
    for start, stop in zip([0, *cuts], [*cuts, size], strict=True):
        taken = int(np.searchsorted(ends, stop, side="right"))
        if stop < size and ends[taken - 1] == stop and rng.random() < 0.5:
            taken -= 1  # the entry at the edge goes to the next block, at its 0
        writer.write(tokens[start:stop], ends[given:taken] - start, loss[start:stop])
        given = taken
    entry = manifest.output_entry(writer.close(), pseudo_ends=pseudo)
    read = block_checks.Report()
    checking.verify_ds(checking.Listing.of(Folder(str(tmp_path))), path.name, entry, checks, read)
    seen = own._watched[path.name].report
    kinds = ("beyond the vocabulary", "neither 0 nor 1", "without EOS")
    assert all(any(kind in p for p in read.problems) for kind in kinds)
    assert sorted(seen.problems) == sorted(read.problems)
    with pytest.raises(SelfCheckFailed, match=r"a test: x\.ds fails verify before upload, so nothing is published"):
        own.family(tmp_path, entry)
