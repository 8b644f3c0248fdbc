"""Big input files shared by ranks (``split_input_mb``): every line or row is read once, by one rank, numbered as
the whole file numbers it, and a build of one big file keeps every rank busy with the books still balanced."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.builds import in_process
from tests.support.corpus import sample_records, write_jsonl
from tests.support.stages import documents
from tokenization.builds.accounting import rank_manifests
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import unread_or_reread
from tokenization.builds.report import report_data
from tokenization.builds.run import Build
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import idle_ranks, list_input_files, split_files
from tokenization.inputs.reader import DocumentReader
from tokenization.records import FilePart, InputFile
from tokenization.storage.folder import Folder

KB = 1000


def _awkward_jsonl(path: Path) -> Path:
    """Lines of many lengths, one far longer than a part, blank lines, bad JSON, bad UTF-8, a BOM on the first line
    and no newline after the last."""
    lines = ["\ufeff" + json.dumps({"text": "first"})]
    for i in range(1, 600):
        if i % 50 == 0:
            lines.append("")
        elif i % 77 == 0:
            lines.append('{"text": broken')
        lines.append(json.dumps({"text": "word " * (i % 40) + ("long " * 3000 if i == 300 else "")}))
    data = "\n".join(lines).encode().replace(b"broken", b"\xff\xfe", 1)
    path.write_bytes(data)
    return path


def _read(files: list[InputFile]) -> list[tuple]:
    return [
        (getattr(r, "id", None), r.file, r.line, getattr(r, "reason", None), getattr(r, "text", None))
        for r in DocumentReader(files)
    ]


@pytest.mark.parametrize("part_kb", [1, 3, 16, 1000])
def test_parts_read_every_record_once_numbered_as_the_whole_file(tmp_path, monkeypatch, part_kb: int) -> None:
    monkeypatch.setattr("tokenization.inputs.listing.MB", KB)  # split_input_mb counts kB here
    _awkward_jsonl(tmp_path / "a.jsonl")
    rows = [{"id": f"r{i}", "text": "row " * (i % 30)} for i in range(1000)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet", row_group_size=90)  # 12 row groups
    write_jsonl(tmp_path / "c.jsonl.gz", [{"text": "x" * 3000}] * 20)
    files = list_input_files([str(tmp_path)]).files
    whole = _read(files)
    shared = split_files(files, part_kb)
    assert _read(shared) == whole  # ids, files, lines, reasons and texts, in order
    by_file = {f.url.rsplit("/", 1)[1]: f.size for f in files}
    parts = {name: [f for f in shared if f.url.endswith(name)] for name in by_file}
    assert [p.part for p in parts["c.jsonl.gz"]] == [None]  # a compressed stream is read from its start
    for name in ("a.jsonl", "b.parquet"):
        count = -(-by_file[name] // (part_kb * KB))
        assert [p.part for p in parts[name]] == ([None] if count == 1 else [FilePart(i, count) for i in range(count)])
        assert sum(p.span_bytes for p in parts[name]) == by_file[name]
    reader = DocumentReader(shared)
    list(reader)
    assert reader.bytes_read == reader.total_bytes == sum(by_file.values())


def test_a_part_that_ends_short_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tokenization.inputs.listing.MB", KB)
    path = _awkward_jsonl(tmp_path / "a.jsonl")
    parts = split_files(list_input_files([str(path)]).files, 4)
    (last,) = [f for f in parts if f.part is not None and f.part.index == f.part.count - 1]
    with open(path, "r+b") as shrunk:
        shrunk.truncate(last.span[0] + 10)
    with pytest.raises(
        InputError,
        match=r"a\.jsonl: corrupt or truncated file data before its first line; "
        r"EOFError: the file ends at byte \d+, before the \d+ bytes it was listed with",
    ):
        list(DocumentReader([last]))


def test_the_books_name_a_part_read_twice_or_never() -> None:
    a, b = (InputFile("s3://c/a.jsonl", 10, "etag=1", FilePart(i, 2)) for i in range(2))
    assert unread_or_reread([a, b], [a, a]) == (
        "read more than once: s3://c/a.jsonl (part 1 of 2); planned but never read: s3://c/a.jsonl (part 2 of 2)"
    )
    assert unread_or_reread([a, b], [b, a]) is None


def test_idle_ranks_are_told_how_to_share_big_files(tmp_path, caplog) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x" * 1000}] * 3000)  # 3 MB
    files = list_input_files([str(tmp_path)]).files
    caplog.set_level(logging.WARNING)
    idle_ranks(4, split_files(files, None), None)
    idle_ranks(5, split_files(files, 1), 1)
    assert [r.getMessage() for r in caplog.records] == [
        "4 ranks for 1 input file: a rank takes whole files, so 3 ranks will have nothing to tokenize; use at most "
        "1 rank, or let ranks share big files: --split-input-mb 1 splits those above 1 MB",
        "5 ranks for 1 input file in 4 parts: 1 rank will have nothing to tokenize; use at most 4 ranks, or a "
        "smaller --split-input-mb (only uncompressed JSON lines and parquet files are split)",
    ]


def test_one_big_file_keeps_every_rank_busy_and_the_books_balance(tmp_path, sample_tokenizer, monkeypatch) -> None:
    """The same documents as an unsplit build, every one once; ranks read about a quarter each; a second build
    takes every part from the cache."""
    monkeypatch.setattr("tokenization.inputs.listing.MB", 10 * KB)  # split_input_mb counts 10 kB here
    records = sample_records()
    write_jsonl(tmp_path / "in" / "big.jsonl", records[:200])
    pq.write_table(pa.Table.from_pylist(records[200:]), tmp_path / "in" / "big.parquet", row_group_size=10)
    config = BuildConfig(
        input=str(tmp_path / "in"),
        output=str(tmp_path / "out"),
        tokenizer=str(sample_tokenizer),
        seed=5,
        num_ranks=4,
        context_window=0,
    )
    whole = in_process(Build.start(config, "whole"))
    split_config = replace(config, split_input_mb=3)
    split = in_process(Build.start(split_config, "split"))
    ranks = rank_manifests(Folder(str(tmp_path / "out" / "split" / "ranks")), 4)
    assert config.input is not None
    sizes = {f.url: f.size for f in list_input_files([config.input]).files}
    for rank in ranks:
        assert rank.inputs and all(f.part is not None for f in rank.inputs)
        assert rank.counts.docs_written > 0
        assert abs(rank.input_bytes - sum(sizes.values()) / 4) < 30 * KB  # a part at most off a quarter
    assert sum(r.input_bytes for r in ranks) == sum(sizes.values())
    assert split.record.tokens == whole.record.tokens and split.record.digest != whole.record.digest
    split_books, whole_books = split.record.stages.tokenize, whole.record.stages.tokenize
    assert split_books.docs_in == whole_books.docs_in == len(records) and split_books.holds
    assert (split_books.docs_out, split_books.empty) == (whole_books.docs_out, whole_books.empty)
    dataset = tmp_path / "out"
    assert sorted(documents(dataset / "split" / "merged")) == sorted(documents(dataset / "whole" / "merged"))
    report = report_data(Folder(str(dataset / "split")))
    rows = report["input_files"]
    assert report["settings"]["split_input_mb"] == 3
    assert rows[0]["url"].endswith("big.jsonl (part 1 of 7)") and sum(r["bytes"] for r in rows) == sum(sizes.values())
    again = in_process(Build.start(split_config, "again"))
    assert again.record.digest == split.record.digest
    assert (again.record.cache.files_hit, again.record.cache.files_missed) == (len(rows), 0)
