"""The merge: datatrove's interleave byte for byte, a true shuffle, validation, bounded open files, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.support.references import run_datatrove_merger
from tests.support.stages import documents, file_bytes, merged, run, synthetic_ranks
from tokenization.formats import moves, source_pool
from tokenization.formats.ds import TokenFileError
from tokenization.storage.folder import Folder


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """The sample tokenized by 3 ranks, with loss."""
    out = tmp_path_factory.mktemp("ranks")
    for rank in range(3):
        run([sample_corpus], out, sample_tokenizer, rank=rank, world_size=3, seed=1, save_loss=True)
    return out


@pytest.mark.parametrize("max_tokens", [None, 20_000])
def test_interleave_equals_datatroves_merger(tmp_path, ranks, max_tokens) -> None:
    split = {"max_tokens_per_file": max_tokens} if max_tokens else {}
    run_datatrove_merger(ranks, tmp_path / "dt", seed=1234, save_filename="merged", save_loss_metadata=True, **split)
    result = merged(ranks, tmp_path / "ours", seed=1234, save_loss=True, **{f"merge_{k}": v for k, v in split.items()})
    theirs = file_bytes(tmp_path / "dt")
    assert file_bytes(tmp_path / "ours") == theirs
    assert len(result["outputs"]) == (4 if max_tokens else 1)
    assert (tmp_path / "ours" / "merged.ds.metadata").read_bytes() == (
        tmp_path / "dt" / "merged.ds.metadata"
    ).read_bytes()


def test_chunk_mode_equals_datatrove_when_tails_are_dropped(tmp_path, ranks) -> None:
    run_datatrove_merger(ranks, tmp_path / "dt", seed=7, save_filename="m", shuffle_chunk_size=300)
    result = merged(ranks, tmp_path / "ours", seed=7, save_filename="m", shuffle_chunk_size=300, drop_last_chunk=True)
    assert file_bytes(tmp_path / "ours") == file_bytes(tmp_path / "dt")
    kept = merged(ranks, tmp_path / "kept", seed=7, save_filename="m", shuffle_chunk_size=300)
    dropped = result["counts"]["tokens_dropped"]
    assert dropped > 0 and kept["counts"]["partial_chunk_tokens"] == dropped
    assert kept["counts"]["tokens"] == result["counts"]["tokens"] + dropped
    ours, full = file_bytes(tmp_path / "kept")["000_m.ds"], file_bytes(tmp_path / "ours")["000_m.ds"]
    assert ours.startswith(full)  # the tails come after every full chunk


def test_shuffle_mode_is_a_uniform_permutation_of_all_documents(tmp_path, ranks) -> None:
    result = merged(ranks, tmp_path / "a", seed=3, merge_mode="shuffle", save_loss=True)
    merged(ranks, tmp_path / "b", seed=3, merge_mode="shuffle", save_loss=True)
    merged(ranks, tmp_path / "c", seed=3, shuffle=False, save_loss=True)
    assert file_bytes(tmp_path / "a") == file_bytes(tmp_path / "b")
    in_order = documents(tmp_path / "c")
    assert in_order == documents(ranks)  # no shuffle: the rank files concatenated
    perm = np.random.default_rng(3).permutation(len(in_order))
    assert documents(tmp_path / "a") == [in_order[i] for i in perm]
    assert result["counts"]["index_entries"] == len(in_order)


def test_validation_refuses_mixed_or_broken_inputs(tmp_path) -> None:
    base = synthetic_ranks(tmp_path / "in", 2, 5)
    wide = synthetic_ranks(tmp_path / "wide", 1, 5, token_size=4)
    (wide / "00000_00000_doc_shuffled.ds").rename(base / "00009_00000_doc_shuffled.ds")
    for suffix in (".index", ".loss", ".metadata"):
        (wide / f"00000_00000_doc_shuffled.ds{suffix}").rename(base / f"00009_00000_doc_shuffled.ds{suffix}")
    with pytest.raises(TokenFileError, match=r"00009_00000_doc_shuffled\.ds: token_size 4 differs from .*'s 2"):
        merged(base, tmp_path / "out")
    for suffix in ("", ".index", ".loss", ".metadata"):
        (base / f"00009_00000_doc_shuffled.ds{suffix}").unlink()

    victim = base / "00001_00000_doc_shuffled.ds"
    victim.with_name(victim.name + ".loss").rename(tmp_path / "loss")
    merged(base, tmp_path / "out")  # loss not merged: not needed
    before = file_bytes(tmp_path / "out")
    with pytest.raises(TokenFileError, match=r"00001_00000_doc_shuffled\.ds\.loss is missing"):
        merged(base, tmp_path / "out", save_loss=True)
    (tmp_path / "loss").rename(victim.with_name(victim.name + ".loss"))

    data = victim.read_bytes()
    victim.write_bytes(data[:-2])
    with pytest.raises(TokenFileError, match=r"00001_00000_doc_shuffled\.ds: \d+ bytes, but its index ends at token"):
        merged(base, tmp_path / "out")
    victim.write_bytes(data)
    victim.with_name(victim.name + ".metadata").unlink()
    with pytest.raises(TokenFileError, match=r"00001_00000_doc_shuffled\.ds\.metadata is missing"):
        merged(base, tmp_path / "out")
    assert file_bytes(tmp_path / "out") == before  # refused before anything was written


def test_ranks_that_typed_one_tokenizer_otherwise_merge_and_other_tokenizers_do_not(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
) -> None:
    """A rank's metadata names the tokenizer as typed: ranks tokenized by hand, one with a relative path and one
    with the absolute one, hold one tokenizer (their manifests record one sha256) and merge, the merge naming it as
    the first does."""
    monkeypatch.chdir(sample_tokenizer.parent.parent)
    relative = f"{sample_tokenizer.parent.name}/{sample_tokenizer.name}"
    for rank, tokenizer in enumerate([relative, str(sample_tokenizer)]):
        run([sample_corpus], tmp_path / "in", tokenizer, rank=rank, world_size=2, seed=1)
    merged(tmp_path / "in", tmp_path / "out")
    assert (tmp_path / "out" / "merged.ds.metadata").read_text().startswith(f"{relative}|2\n")
    manifest = tmp_path / "in" / "_manifests" / "00001.json"
    record = json.loads(manifest.read_text())
    record["tokenizer"]["sha256"] = "0" * 64  # as another tokenizer's rank would record it
    manifest.write_text(json.dumps(record))
    with pytest.raises(TokenFileError, match="inputs were tokenized with different tokenizers"):
        merged(tmp_path / "in", tmp_path / "again")


def test_open_files_stay_bounded(tmp_path, monkeypatch) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 6, 40)
    merged(inputs, tmp_path / "wide", seed=5, save_loss=True)
    peak = 0
    real_source = source_pool.SourcePool._source

    def counting_source(self, i):
        nonlocal peak
        source = real_source(self, i)
        peak = max(peak, self.open_count)
        return source

    monkeypatch.setattr(source_pool.SourcePool, "_source", counting_source)
    merged(inputs, tmp_path / "narrow", seed=5, save_loss=True, max_open_files=2)
    assert peak == 2
    assert file_bytes(tmp_path / "narrow") == file_bytes(tmp_path / "wide")


def test_output_names_sort_in_file_order_past_999_files(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 1, 1200)
    result = merged(inputs, tmp_path / "out", seed=1, merge_max_tokens_per_file=1)
    names = [o["name"] for o in result["outputs"]]
    assert len(names) == 1200 and names == sorted(names) and names[0] == "0000_merged.ds"


def test_a_crashed_merge_resumes_to_the_same_bytes(tmp_path, monkeypatch) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 4, 300)
    options = {"seed": 11, "merge_max_tokens_per_file": 30_000, "save_loss": True, "merge_mode": "interleave"}
    clean = merged(inputs, tmp_path / "clean", **options)
    real_publish = moves.SplitWriter._finish
    calls = 0

    def crash_after_three(self):
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("simulated crash")
        real_publish(self)

    monkeypatch.setattr(moves.SplitWriter, "_finish", crash_after_three)
    with pytest.raises(RuntimeError, match="simulated crash"):
        merged(inputs, tmp_path / "crashed", **options)
    monkeypatch.undo()
    assert len(list((tmp_path / "crashed").glob("*.ds"))) == 3
    resumed = merged(inputs, tmp_path / "crashed", **options)
    assert resumed["counts"]["resumed_files"] == 3
    assert file_bytes(tmp_path / "crashed") == file_bytes(tmp_path / "clean")
    assert [o["name"] for o in resumed["outputs"]] == [o["name"] for o in clean["outputs"]]


def test_sigkill_midway_then_resume_gives_the_same_bytes(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 8, 4000)  # ~13 M tokens, ~65 output files
    args = [str(inputs), "--save-filename", "m", "--seed", "5", "--merge-max-tokens-per-file", "200000", "--save-loss"]
    subprocess.run(
        [sys.executable, "-m", "tokenization.cli", "merge", *args, "--output", str(tmp_path / "clean")],
        check=True,
        capture_output=True,
    )
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenization.cli", "merge", *args, "--output", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while len(list(killed.glob("_manifests/0*_m.json"))) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list(killed.glob("_manifests/0*_m.json")))
    assert proc.returncode == -signal.SIGKILL and 5 <= done_before < 60, "the merge ended before it was killed"
    assert not (killed / "_completions" / "m.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "tokenization.cli", "merge", *args, "--output", str(killed)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert f", {done_before} resumed" in resumed.stdout or f", {done_before - 1} resumed" in resumed.stdout
    assert file_bytes(killed) == file_bytes(tmp_path / "clean")
    manifest = json.loads((killed / "_manifests" / "m.json").read_text())
    assert manifest["counts"]["resumed_files"] >= 4
    assert Counter(len(o["files"]) for o in manifest["outputs"]) == {4: len(manifest["outputs"])}


def test_credentials_never_reach_a_manifest_nor_stop_a_resume(tmp_path, ranks) -> None:
    """Storage options hold credentials: a merge run again with rotated ones resumes, and no manifest keeps them."""
    first = merged(ranks, tmp_path, seed=3, merge_max_tokens_per_file=20_000)
    secret = {"s3": {"key": "AKIA-ROTATED", "secret": "s3cr3t"}}
    again = merged(ranks, tmp_path, seed=3, merge_max_tokens_per_file=20_000, storage_options=secret)
    assert again["counts"]["resumed_files"] == len(first["outputs"]) >= 3
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*.json"))
    assert b"s3cr3t" not in written and b"AKIA-ROTATED" not in written


def test_checking_the_inputs_asks_storage_no_size_and_no_existence(ranks, storage_questions) -> None:
    """On S3 each size or existence question is a HEAD request: a bucket merge of a thousand rank files would wait
    for ten thousand of them. The inputs' sizes come from one listing of their folder instead."""
    from tokenization.output.manifest import output_entries, token_files
    from tokenization.stages.merge.inputs import validate_inputs

    urls = token_files(Folder(str(ranks)))
    inputs = validate_inputs(urls, save_loss=True, entries=list(output_entries(Folder(str(ranks))).values()))
    assert len(urls) == 3 and sum(inputs.sizes) > 0
    assert storage_questions == Counter(), storage_questions
