"""A file that holds no document leaves no trace (issue 37, item 1).

An empty index used to give one start and no end, which shifted every later document: an error in most modes, and
in one a document written twice while the books and verify passed. A file of no document (0 bytes, blank lines,
empty texts, rejected records only, an empty part of a split file, a text that encodes to no token) must change no
byte of what a rank writes, in every mode and in every position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.builds import config_of
from tests.support.corpus import write_jsonl
from tests.support.stages import run
from tokenization.builds.run import Build

EMPTY = {
    "zero bytes": "",
    "blank lines": "\n\n\n",
    "empty texts": '{"text": ""}\n{"text": ""}\n',
    "rejects only": '{"txt": "no text key"}\n{"text": 5}\nnot json\n',
}
MODES: dict[str, dict[str, Any]] = {
    "shuffled": {},
    "input order": {"shuffle_documents": False},
    "chunks": {"shuffle_chunk_size": 7},
    "chunks, tail dropped": {"shuffle_chunk_size": 7, "drop_last_chunk": True},
    "buckets": {"num_buckets": 3},
    "megatron": {"output_format": "megatron"},
    "files of 50 tokens": {"max_tokens_per_file": 50},
    "with loss": {"save_loss": True},
}
DOCUMENTS = [{"text": f"document {i}: " + "word " * (i % 5) + "end"} for i in range(12)]


def token_files(output: Path) -> dict[str, bytes]:
    """Every token file a rank published (bucket folders included), by name."""
    suffixes = (".ds", ".ds.index", ".ds.loss", ".ds.metadata", ".bin", ".idx")
    return {
        str(p.relative_to(output)): p.read_bytes()
        for p in sorted(output.rglob("*"))
        if p.name.endswith(suffixes) and not p.relative_to(output).parts[0].startswith("_")
    }


def corpus(folder: Path, empty: str | None = None) -> Path:
    """Three files of four documents each; with ``empty``, also a file of no document first, one in the middle and
    one last, in name order."""
    for name, part in zip(
        ("a.jsonl", "m.jsonl", "z.jsonl"), (DOCUMENTS[:4], DOCUMENTS[4:8], DOCUMENTS[8:]), strict=True
    ):
        write_jsonl(folder / name, part)
    if empty is not None:
        for name in ("0.jsonl", "b.jsonl", "zz.jsonl"):
            (folder / name).write_text(empty)
    return folder


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("empty", EMPTY)
def test_a_file_of_no_document_changes_no_byte(tmp_path, sample_tokenizer, empty: str, mode: str) -> None:
    options = {"seed": 11, "max_reject_fraction": 1.0} | MODES[mode]
    run([corpus(tmp_path / "plain")], tmp_path / "without", sample_tokenizer, **options)
    done = run([corpus(tmp_path / "holes", EMPTY[empty])], tmp_path / "with", sample_tokenizer, **options)
    expected = token_files(tmp_path / "without")
    assert expected and token_files(tmp_path / "with") == expected
    counts = done["counts"]
    assert counts["docs_written"] == len(DOCUMENTS) == counts["contents_in"]["pieces"]
    assert counts["docs_read"] == counts["docs_written"] + counts["empty"] + counts["rejected_total"]


def test_a_text_of_no_token_is_counted_empty_not_written(tmp_path, sample_tokenizer) -> None:
    """With no EOS, a text that the tokenizer's normalizer removes whole encodes to nothing: an empty document."""
    spec = json.loads(sample_tokenizer.read_text())
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": "~"}, "content": ""}
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(json.dumps(spec))
    write_jsonl(tmp_path / "plain" / "a.jsonl", DOCUMENTS)
    write_jsonl(tmp_path / "holes" / "a.jsonl", [{"text": "~~~"}, *DOCUMENTS[:6], {"text": "~"}, *DOCUMENTS[6:]])
    for mode in ({}, {"shuffle_documents": False}, {"shuffle_chunk_size": 5}):
        options = {"seed": 2, "no_eos": True} | mode
        run([tmp_path / "plain"], tmp_path / "without", tokenizer, **options)  # "~" is in no document
        done = run([tmp_path / "holes"], tmp_path / "with", tokenizer, **options)
        assert token_files(tmp_path / "with") == token_files(tmp_path / "without")
        assert (done["counts"]["docs_written"], done["counts"]["empty"]) == (len(DOCUMENTS), 2)


def test_empty_parts_of_a_split_file_change_no_byte(tmp_path, sample_tokenizer, monkeypatch) -> None:
    """One line longer than a part, and a parquet file of one row group, leave parts that hold no record."""
    monkeypatch.setattr("tokenization.inputs.listing.MB", 1 << 10)  # split_input_mb counts kB here
    folder = tmp_path / "in"
    write_jsonl(folder / "a.jsonl", [DOCUMENTS[0], {"text": "long " * 800}, DOCUMENTS[1]])  # ~4 kB in one line
    rows = [{"text": " ".join(f"r{i}w{j}" for j in range(i % 40))} for i in range(300)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "b.parquet", row_group_size=1000)  # ~10 kB, one group
    run([folder], tmp_path / "whole", sample_tokenizer, seed=4)
    split = run([folder], tmp_path / "split", sample_tokenizer, seed=4, split_input_mb=1)
    assert len(split["inputs"]) >= 10  # parts that hold no record among them
    assert token_files(tmp_path / "split") == token_files(tmp_path / "whole")


def test_a_build_with_an_empty_file_holds_each_document_once(tmp_path, sample_tokenizer) -> None:
    """The silent case: one document, an empty file, two long documents, one rank: the dataset held one of them
    twice, and the books and verify passed."""
    long = [{"text": " ".join(f"w{i}-{j}" for j in range(4000))} for i in range(2)]
    for folder, empty in (("plain", False), ("holes", True)):
        write_jsonl(tmp_path / folder / "a.jsonl", DOCUMENTS[:1])
        if empty:
            (tmp_path / folder / "e.jsonl").write_text("")
        write_jsonl(tmp_path / folder / "f.jsonl", long)
    built = {}
    for folder in ("plain", "holes"):
        config = config_of(
            tmp_path / folder, tmp_path / "builds" / folder, sample_tokenizer, num_ranks=1, context_window=64
        )
        built[folder] = Build.start(config, "b").run().record
    assert built["holes"].digest == built["plain"].digest
    assert built["holes"].tokens == built["plain"].tokens
    read = built["holes"].stages.tokenize.contents_in
    assert read is not None and read.pieces == 3
