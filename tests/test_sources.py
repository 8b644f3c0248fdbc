"""Input discovery, formats, sharding, and what happens to every line: document, empty, rejected or blank."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.conftest import write_jsonl
from tokenization.sources import DocumentReader, InputError, Record, Rejected, list_input_files, shard

RECORDS = [{"id": f"d{i}", "text": f"document number {i}"} for i in range(5)]


def _read(files, **keys):
    return list(DocumentReader(list_input_files([str(f) for f in files]).files, **keys))


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.parquet"])
def test_every_format_gives_the_same_records(tmp_path, name: str) -> None:
    path = tmp_path / name
    lines = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    elif name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(RECORDS), path)
    else:
        path.write_bytes(lines)
    docs = _read([path])
    assert [(d.id, d.text, d.line) for d in docs] == [(r["id"], r["text"], i + 1) for i, r in enumerate(RECORDS)]


def test_folders_globs_and_lists_are_sorted_and_skip_markers(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ["b.jsonl", "a.jsonl.gz", "sub/c.jsonl", "_SUCCESS", ".hidden.jsonl", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    listing = list_input_files([str(tmp_path)])
    assert [f.url for f in listing.files] == [str(tmp_path / n) for n in ["a.jsonl.gz", "b.jsonl", "sub/c.jsonl"]]
    assert listing.skipped == [str(tmp_path / "notes.txt")]
    assert [f.url for f in list_input_files([str(tmp_path / "*.jsonl")]).files] == [str(tmp_path / "b.jsonl")]
    listed = list_input_files([str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl.gz")]).files
    assert [f.url for f in listed] == [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.jsonl")]
    with pytest.raises(InputError, match=r"notes\.txt: unsupported input format"):
        list_input_files([str(tmp_path / "notes.txt")])
    with pytest.raises(InputError, match="missing: no such file or folder"):
        list_input_files([str(tmp_path / "missing")])


def test_files_of_unsupported_types_are_named_in_the_log_and_the_manifest(tmp_path, sample_tokenizer, caplog) -> None:
    from tests.test_tokenize import run

    write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "kept"}])
    for name in ["b.jsonl.bz2", "c.jsonl.gzip"]:
        (tmp_path / "in" / name).write_bytes(b"not read")
    result = run([tmp_path / "in"], tmp_path / "out", sample_tokenizer)
    skipped = [str(tmp_path / "in" / n) for n in ["b.jsonl.bz2", "c.jsonl.gzip"]]
    assert result["skipped_inputs"] == skipped and result["counts"]["docs_read"] == 1
    assert f"skipped 2 input files of unsupported types: {', '.join(skipped)}" in caplog.text


def test_a_leading_byte_order_mark_is_not_a_bad_record(tmp_path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n{"text": "second"}\n')
    docs = _read([path])
    assert [(d.text, d.line) for d in docs] == [("first", 1), ("second", 2)]


def test_sharding_is_datatroves_stride(tmp_path) -> None:
    for i in range(7):
        (tmp_path / f"{i}.jsonl").write_bytes(b"")
    files = list_input_files([str(tmp_path)]).files
    assert [f.url.rsplit("/", 1)[1] for f in shard(files, 1, 3)] == ["1.jsonl", "4.jsonl"]
    assert shard(files, 2, 8) == [files[2]] and shard(files[:1], 2, 3) == []


def test_lines_split_on_newline_only(tmp_path) -> None:
    text = "before\u2028after\u2029end\x85x\x0cy"
    docs = _read([write_jsonl(tmp_path / "u.jsonl", [{"text": text}, {"text": "next"}])])
    assert [d.text for d in docs] == [text, "next"]


def test_dotted_keys_and_default_ids(tmp_path) -> None:
    path = write_jsonl(tmp_path / "n.jsonl", [{"meta": {"body": "nested"}, "doc": {"key": 7}}, {"meta.body": "flat"}])
    docs = _read([path], text_key="meta.body", id_key="doc.key")
    assert [(d.text, d.id) for d in docs] == [("nested", "7"), ("flat", f"{path}/1")]


def test_bad_records_are_rejected_with_reasons_and_raw_lines(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "good"}\n'
        b"{not json\n"
        b'{"text": "caf\xe9"}\n'
        b"[1, 2]\n"
        b'{"id": "x"}\n'
        b'{"text": 42}\n'
        b'{"text": "short", "no_loss_ranges": [[0, 99]]}\n'
        b"   \n"
        b'{"text": ""}\n'
        b'{"text": "masked", "no_loss_ranges": [[0, 3]]}\n'
    )
    reader = DocumentReader(list_input_files([str(path)]).files)
    items = list(reader)
    rejected = [(r.line, r.reason) for r in items if isinstance(r, Rejected)]
    assert rejected == [
        (2, "malformed_json"),
        (3, "invalid_utf8"),
        (4, "not_an_object"),
        (5, "missing_text"),
        (6, "text_not_string"),
        (7, "bad_no_loss_ranges"),
    ]
    assert next(r for r in items if isinstance(r, Rejected) and r.line == 3).raw == '{"text": "caf\\xe9"}'
    records = [r for r in items if isinstance(r, Record)]
    assert [(r.line, r.text, r.no_loss_ranges) for r in records] == [
        (1, "good", None),
        (9, "", None),
        (10, "masked", [(0, 3)]),
    ]
    assert reader.blank_lines == 1


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_truncated_compressed_file_names_file_and_last_good_line(tmp_path, compression: str) -> None:
    lines = "".join(json.dumps({"text": f"line {i} " + "x" * 200}) + "\n" for i in range(2000)).encode()
    data = gzip.compress(lines) if compression == "gz" else zstandard.ZstdCompressor().compress(lines)
    path = tmp_path / f"cut.jsonl.{compression}"
    path.write_bytes(data[: len(data) // 2])
    reader = DocumentReader(list_input_files([str(path)]).files)
    seen = []
    with pytest.raises(InputError) as info:
        seen.extend(reader)
    message = str(info.value)
    assert message.startswith(f"{path}: corrupt or truncated")
    assert f"after line {len(seen)} (the last good line)" in message
    assert 0 < len(seen) < 2000


def test_a_short_read_is_an_error_not_a_short_file(tmp_path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", RECORDS * 50)
    files = list_input_files([str(path)]).files
    path.write_bytes(gzip.compress(b""))  # the storage now returns less than the listing said
    with pytest.raises(InputError, match=r"a\.jsonl\.gz: read 20 of its \d+ bytes, then the storage said EOF"):
        list(DocumentReader(files))
