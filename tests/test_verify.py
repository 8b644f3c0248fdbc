"""verify passes on every output the pipeline makes and names the file of each kind of damage."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import EOS
from tests.test_context import shuffled
from tests.test_merge import merged
from tests.test_tokenize import run
from tokenization.cli import main
from tokenization.verify import verify

NAME = "00000_00000_doc_shuffled.ds"


@pytest.fixture
def rank(tmp_path, sample_corpus, sample_tokenizer):
    run([sample_corpus], tmp_path / "out", sample_tokenizer, seed=2, save_loss=True)
    return tmp_path / "out"


def check(folder, sample_tokenizer):
    return verify(str(folder), str(sample_tokenizer), EOS)


def test_every_pipeline_output_passes(tmp_path, sample_corpus, sample_tokenizer) -> None:
    outputs = {
        "doc": {"save_loss": True},
        "chunk": {"shuffle_chunk_size": 333, "save_loss": True, "max_tokens_per_file": 20_000},
        "plain": {"shuffle_documents": False, "max_tokens_per_file": 9000},
        "megatron": {"output_format": "megatron"},
    }
    for name, options in outputs.items():
        for r in range(2):
            run([sample_corpus], tmp_path / name, sample_tokenizer, rank=r, world_size=2, **options)
    merged(tmp_path / "doc", tmp_path / "merged", seed=1, save_loss=True, max_tokens_per_file=15_000)
    merged(tmp_path / "doc", tmp_path / "merged_chunks", seed=1, shuffle_chunk_size=400, max_tokens_per_file=15_000)
    shuffled(tmp_path / "merged", tmp_path / "context", window_size=1025)
    shuffled(tmp_path / "merged_chunks", tmp_path / "context_of_chunks", window_size=1025)
    for folder in sorted(tmp_path.iterdir()):
        report = check(folder, sample_tokenizer)
        assert report.ok and report.tokens == 64522, (folder.name, report.problems)
    notes = check(tmp_path / "context_of_chunks", sample_tokenizer).notes
    assert notes and all("EOS not checked" in n for n in notes)


def test_a_missing_eos_is_found(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, no_eos=True)
    report = check(tmp_path, sample_tokenizer)
    assert not report.ok and f"{tmp_path}/{NAME} @ token " in report.problems[0]
    assert "document ends without EOS 0" in report.problems[0]
    assert verify(str(tmp_path), str(sample_tokenizer)).ok  # without --eos-token that is not checked


@pytest.mark.parametrize(
    ("damage", "where", "message"),
    [
        ("truncate", NAME, "bytes of 2-byte tokens, but the index ends at token"),
        ("shuffle_index", NAME + ".index", "entry smaller than the one before"),
        ("short_loss", NAME + ".loss", "bytes for"),
        ("beyond_vocab", NAME, "id beyond the vocabulary of 4096"),
        ("token_size", NAME, "bytes of 4-byte tokens, but the index ends at token"),
        ("checksum", NAME, "differs from the manifest"),
    ],
)
def test_damage_is_reported_with_its_file(rank, sample_tokenizer, damage, where, message) -> None:
    path = rank / NAME
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "shuffle_index":
        index = np.fromfile(f"{path}.index", dtype="<u8")
        index[[3, 4]] = index[[4, 3]]
        index.tofile(f"{path}.index")
    elif damage == "short_loss":
        loss = rank / (NAME + ".loss")
        loss.write_bytes(loss.read_bytes()[:-1])
    elif damage == "beyond_vocab":
        tokens = np.fromfile(path, dtype="<u2")
        tokens[100] = 5000
        tokens.tofile(path)
    elif damage == "token_size":
        meta = rank / (NAME + ".metadata")
        meta.write_text(meta.read_text().replace("|2\n", "|4\n"))
    elif damage == "checksum":
        tokens = np.fromfile(path, dtype="<u2")
        tokens[[10, 11]] = tokens[[11, 10]] if tokens[10] != tokens[11] else (tokens[[10, 11]] + 1) % 4000
        tokens.tofile(path)
    report = check(rank, sample_tokenizer)
    assert not report.ok
    assert any(p.startswith(f"{rank}/{where}") and message in p for p in report.problems), report.problems
    assert main(["verify", str(rank), "--tokenizer", str(sample_tokenizer), "--eos-token", EOS]) == 1


def test_damaged_megatron_index_is_reported(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, output_format="megatron")
    idx = tmp_path / "00000_00000_doc_shuffled.idx"
    data = bytearray(idx.read_bytes())
    data[40:44] = (10**6).to_bytes(4, "little")  # the second sequence length
    idx.write_bytes(bytes(data))
    problems = check(tmp_path, sample_tokenizer).problems
    assert any(p.startswith(f"{tmp_path}/00000_00000_doc_shuffled.bin: ") and "lengths add up" in p for p in problems)
    assert any("byte pointer disagrees" in p for p in problems)


def test_a_deleted_family_is_reported(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Finding 3: deleting a whole family that the manifest lists passed."""
    run([sample_corpus], tmp_path, sample_tokenizer, max_tokens_per_file=20_000)
    gone = "00000_00001_doc_shuffled.ds"
    for path in tmp_path.glob(f"{gone}*"):
        path.unlink()
    report = check(tmp_path, sample_tokenizer)
    assert f"{tmp_path}/{gone}: listed in the tokenize manifest but missing" in report.problems
    assert main(["verify", str(tmp_path)]) == 1


def test_an_unlisted_family_is_reported(tmp_path, rank, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "other", sample_tokenizer, seed=3, save_filename="extra", save_loss=True)
    for path in (tmp_path / "other").glob("extra_*.ds*"):
        path.rename(rank / path.name)
    report = check(rank, sample_tokenizer)
    assert report.problems == [
        f"{rank}/extra_00000_00000_doc_shuffled.ds: no manifest lists this file family: a leftover of another run, "
        "or the output of a stage that did not finish"
    ]


def test_manifest_counts_and_markers_are_checked(rank, sample_tokenizer) -> None:
    path = rank / "_manifests" / "00000.json"
    record = json.loads(path.read_text())
    record["outputs"][0]["tokens"] += 1
    record["outputs"][0]["index_entries"] -= 1
    path.write_text(json.dumps(record))
    problems = check(rank, sample_tokenizer).problems
    tokens = record["outputs"][0]["tokens"] - 1
    assert f"{rank}/{NAME}: holds {tokens} tokens, its manifest says {tokens + 1}" in problems
    assert any(p.startswith(f"{rank}/{NAME}: its index holds ") for p in problems)
    assert f"{rank}/_manifests/00000.json: counts {tokens} tokens written, its outputs list {tokens + 1}" in problems
    assert f"{rank}/_manifests/00000.json: differs from the checksum its completion marker records" in problems
    (rank / "_completions" / "00000.json").unlink()
    assert f"{rank}/_manifests/00000.json: has no completion marker: its stage did not finish" in (
        check(rank, sample_tokenizer).problems
    )


def test_verify_asks_storage_no_size_and_no_existence_a_file(rank, sample_tokenizer, storage_questions) -> None:
    """publish verifies a whole dataset: the folder's one listing answers every size and existence question."""
    report = check(rank, sample_tokenizer)
    assert report.ok and report.files == 1 and not storage_questions, storage_questions
