"""Input discovery, formats, sharding, and what happens to every line: document, empty, rejected or blank."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.support.corpus import write_jsonl
from tests.support.paths import SAMPLE_TOKENIZER
from tokenization.errors import StorageError
from tokenization.inputs.formats import InputError
from tokenization.inputs.lines import GZIP_BUFFER
from tokenization.inputs.listing import list_input_files, may_hold_others, shard
from tokenization.inputs.reader import DocumentReader, Record
from tokenization.records import Rejected

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


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.parquet"])
def test_records_are_read_at_their_places_alone(tmp_path, name: str) -> None:
    """Issue 52, 2: a cache hit reads the records its sample draws where they start (``Record.offset``), in any
    format; next to one another too (a compressed stream read the newline before the second twice: no record). A
    place inside a line, or past the end, holds none."""
    path = tmp_path / name
    records = [{"id": f"d{i}", "text": f"document number {i} " * (i % 3 + 1)} for i in range(12)]
    lines = "".join(json.dumps(r) + ("\n\n" if i == 4 else "\n") for i, r in enumerate(records)).encode()
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    elif name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=5)
    else:
        path.write_bytes(lines)
    (file,) = list_input_files([str(path)]).files
    docs = [d for d in DocumentReader([file]) if isinstance(d, Record)]
    for drawn in ([0, 1, 2], [3, 4, 5, 11], [6, 7], [11]):
        found = list(DocumentReader([file]).at(file, [(docs[k].offset, docs[k].line) for k in drawn]))
        assert all(isinstance(d, Record) for d in found), found
        assert [(d.id, d.text, d.line) for d in found if isinstance(d, Record)] == [
            (docs[k].id, docs[k].text, docs[k].line) for k in drawn
        ]
    wrong = [(docs[2].offset + 1, docs[2].line), (docs[11].offset + 10_000, 99)]
    assert DocumentReader([file]).at(file, wrong) == [None, None]


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


def test_a_folder_whose_names_are_all_known_holds_no_other_file(tmp_path) -> None:
    for name in ("a.jsonl", "sub/b.jsonl.gz", "_manifests/m.jsonl", ".tmp.jsonl", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b'{"text": "x"}\n')
    listed = {f.url for f in list_input_files([str(tmp_path)]).files}
    assert listed == {str(tmp_path / "a.jsonl"), str(tmp_path / "sub/b.jsonl.gz")}
    assert not may_hold_others([str(tmp_path)], listed, None)  # hidden and unsupported files are not inputs
    assert may_hold_others([str(tmp_path)], listed - {str(tmp_path / "a.jsonl")}, None)
    assert may_hold_others([str(tmp_path / "*.jsonl")], listed, None)  # a glob: the listing tells
    (tmp_path / "sub/c.parquet").write_bytes(b"")
    assert may_hold_others([str(tmp_path)], listed, None)


def test_a_folder_nested_1100_deep_is_listed_and_a_glob_over_it_is_one_line(tmp_path) -> None:
    """Issue 37: fsspec's find walks a Python call a level, and a tree 1,100 deep raised RecursionError."""
    deepest = tmp_path
    for _ in range(1100):  # os.makedirs recurses a level too
        deepest = deepest / "d"
        deepest.mkdir()
    write_jsonl(deepest / "deep.jsonl", RECORDS)
    write_jsonl(tmp_path / "top.jsonl", RECORDS)
    try:
        listing = list_input_files([str(tmp_path)])
        assert [f.url for f in listing.files] == [str(deepest / "deep.jsonl"), str(tmp_path / "top.jsonl")]
        with pytest.raises(InputError) as refused:
            list_input_files([f"{tmp_path}/**/*.jsonl"])
        assert str(refused.value) == (
            f"{tmp_path}/**/*.jsonl: its folders nest too deep for fsspec to search (a Python call a level, past "
            "the interpreter's limit): name a folder, which is listed without that limit, or flatten the tree"
        )
    finally:  # shutil.rmtree, which pytest cleans up with, recurses a level too
        (deepest / "deep.jsonl").unlink()
        while deepest != tmp_path:
            deepest.rmdir()
            deepest = deepest.parent


def test_files_of_unsupported_types_are_named_in_the_log_and_the_manifest(tmp_path, sample_tokenizer, caplog) -> None:
    from tests.support.stages import run

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


def test_lines_of_ascii_whitespace_alone_are_blank(tmp_path) -> None:
    """A blank line is one of ASCII whitespace alone (what ``bytes.strip`` removes), after a first line's BOM; a
    line with any other byte is parsed (a lone 0xA0 is invalid UTF-8, not a space)."""
    path = tmp_path / "blank.jsonl"
    path.write_bytes(b"\xef\xbb\xbf\n" + b" \t\r\n" + b"\x0b\x0c\n" + b'{"text": "a"}\n' + b"\xa0\n" + b"\n")
    reader = DocumentReader(list_input_files([str(path)]).files)
    items = list(reader)
    assert [(r.line, r.text) for r in items if isinstance(r, Record)] == [(4, "a")]
    assert [(r.line, r.reason) for r in items if isinstance(r, Rejected)] == [(5, "invalid_utf8")]
    assert reader.blank_lines == 4


def test_gzip_lines_longer_than_its_read_buffer_come_whole(tmp_path) -> None:
    texts = ["x" * (3 * GZIP_BUFFER + 7), "short", "y" * (GZIP_BUFFER - 20), "z" * GZIP_BUFFER]
    path = tmp_path / "long.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode()))
    reader = DocumentReader(list_input_files([str(path)]).files)
    assert [r.text for r in reader if isinstance(r, Record)] == texts


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_truncated_compressed_file_names_file_and_last_good_line(tmp_path, compression: str) -> None:
    lines = "".join(json.dumps({"text": f"line {i} " + "x" * 200}) + "\n" for i in range(2000)).encode()
    data = gzip.compress(lines) if compression == "gz" else zstandard.ZstdCompressor().compress(lines)
    path = tmp_path / f"cut.jsonl.{compression}"
    path.write_bytes(data[: len(data) // 2])
    reader = DocumentReader(list_input_files([str(path)]).files)
    seen: list[Record | Rejected] = []
    with pytest.raises(InputError) as info:
        seen.extend(reader)
    message = str(info.value)
    assert message.startswith(f"{path}: corrupt or truncated")
    whole = zlib.decompressobj(31).decompress(path.read_bytes()).count(b"\n") if compression == "gz" else len(seen)
    assert f"after line {whole} (the last good line)" in message  # gzip's: the lines its failed read inflated too
    assert 0 < len(seen) <= whole < 2000


@pytest.mark.parametrize(
    ("tail", "error"),
    [
        (b"garbage after the member", "BadGzipFile: Not a gzipped file (b'ga')"),
        (
            gzip.compress(b"a second member, cut short\n", mtime=0)[:20],
            "EOFError: Compressed file ended before the end-of-stream",
        ),
    ],
    ids=["garbage", "a cut member"],  # the same on every xdist worker
)
def test_a_gzip_with_a_bad_tail_names_the_line_after_its_last_good_one(tmp_path, tail: bytes, error: str) -> None:
    """Issue 51: five good lines, then garbage, said "before its first line": the gzip reader fails in the read
    that inflated them, and they were never seen."""
    path = tmp_path / "five.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(5))) + tail)
    with pytest.raises(InputError) as info:
        list(DocumentReader(list_input_files([str(path)]).files))
    assert str(info.value).startswith(
        f"{path}: corrupt or truncated gzip data after line 5 (the last good line); {error}"
    )


def test_a_short_read_is_an_error_not_a_short_file(tmp_path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", RECORDS * 50)
    files = list_input_files([str(path)]).files
    path.write_bytes(gzip.compress(b""))  # the storage now returns less than the listing said
    with pytest.raises(InputError, match=r"a\.jsonl\.gz: read 20 of its \d+ bytes, then the storage said EOF"):
        list(DocumentReader(files))


def _compress(name: str, data: bytes) -> bytes:
    if name.endswith(".gz"):
        return gzip.compress(data)
    return zstandard.ZstdCompressor().compress(data) if name.endswith((".zst", ".zstd")) else data


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl.zst", "a.ndjson.zstd"])
def test_an_empty_compressed_file_is_an_error_naming_it(tmp_path, name: str) -> None:
    """gzip and zstd read 0 bytes as an empty stream; ``gzip -t`` calls it truncated, and so must the reader."""
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(InputError) as info:
        _read([path])
    compression = "gzip" if name.endswith(".gz") else "zstd"
    assert str(info.value) == (
        f"{path}: 0 bytes: an empty compressed file is truncated (a valid {compression} stream has a header); an "
        "empty input should be an empty .jsonl"
    )
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))  # a valid stream of nothing
    assert _read([tmp_path / "empty.jsonl", tmp_path / "empty.jsonl.gz"]) == []


def _line(size: int) -> str:
    """A JSON record of exactly ``size`` bytes."""
    return json.dumps({"text": "x" * (size - len('{"text": ""}'))})


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.jsonl.zst"])
def test_a_line_above_max_record_bytes_is_rejected_and_reading_goes_on(tmp_path, monkeypatch, name: str) -> None:
    """Lines are read in pieces of ``READ_BUFFER`` (lowered here): a line within the limit is whole, one above it is
    rejected with its start and size, and the line after it is the next record, also at the end of the file."""
    monkeypatch.setattr("tokenization.inputs.lines.READ_BUFFER", 16)
    sizes = [20, 100, 101, 60, 5000, 30, 150]  # the limit is 100; the last line has no newline
    lines = [_line(n) for n in sizes]
    path = tmp_path / name
    path.write_bytes(_compress(name, "\n".join(lines).encode()))
    items = _read([path], max_record_bytes=100)
    assert [(type(i).__name__, i.line) for i in items] == [
        ("Record", 1),
        ("Record", 2),
        ("Rejected", 3),
        ("Record", 4),
        ("Rejected", 5),
        ("Record", 6),
        ("Rejected", 7),
    ]
    assert [len(i.text) for i in items if isinstance(i, Record)] == [n - 12 for n in (20, 100, 60, 30)]
    notes = [f"{lines[n][:1024]}... [{sizes[n]} bytes, above max_record_bytes=100]" for n in (2, 4, 6)]
    assert [(i.reason, i.raw) for i in items if isinstance(i, Rejected)] == [("record_too_large", n) for n in notes]


def test_a_parquet_row_above_max_record_bytes_is_rejected(tmp_path) -> None:
    rows = [{"id": "a", "text": "short"}, {"id": "b", "text": "y" * 500}]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    items = _read([path], max_record_bytes=100)
    raw = json.dumps(rows[1], separators=(",", ":"))  # the row as the reader serializes it
    assert isinstance(items[0], Record) and items[0].text == "short"
    assert items[1] == Rejected(
        str(path), 2, "record_too_large", f"{raw}... [{len(raw)} bytes, above max_record_bytes=100]"
    )


def test_a_storage_failure_while_reading_is_a_storage_error_not_bad_data(tmp_path, monkeypatch) -> None:
    """A connection reset mid-file may pass on another try; corrupt data never does (Airflow retries the first)."""
    path = write_jsonl(tmp_path / "a.jsonl", RECORDS)

    class Reset(io.BytesIO):
        def readline(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise ConnectionResetError("connection reset by peer")
            return super().readline(size)

    monkeypatch.setattr("tokenization.inputs.reader.decompressed", lambda raw, compression: Reset(path.read_bytes()))
    with pytest.raises(StorageError) as info:
        _read([path])
    assert str(info.value) == f"{path}: read failed after line 1; ConnectionResetError: connection reset by peer"


HUGE_LINE = 1 << 30  # bytes of 'a': the 0.7-1.5 GB lines that took 7-11 GB and killed the rank
MAX_RSS_KB = 384 << 10  # the process holds at most max_record_bytes (64 MiB) and buffers of it, over ~130 MB


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_small_file_inflating_to_a_1_gb_line_is_quarantined_in_bounded_memory(tmp_path, suffix: str) -> None:
    """A ~1 MB file of concatenated gzip members (zstd frames), whose middle line has 1 GiB without a space:
    the rank completes, the line is quarantined as record_too_large, the 200 others are written, and peak memory
    stays far below the line's size."""
    from tests.support.processes import HUGE_RUN

    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    before = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(100)) + '{"text": "'
    after = '"}\n' + "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(100, 200))
    block = _compress(suffix, b"a" * (1 << 20))
    data = _compress(suffix, before.encode()) + block * (HUGE_LINE >> 20) + _compress(suffix, after.encode())
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / f"huge.jsonl{suffix}").write_bytes(data)
    args = ["tokenize", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer", str(SAMPLE_TOKENIZER)]
    done = subprocess.run([sys.executable, "-c", HUGE_RUN, *args, "--no-shuffle"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_kb = int(done.stderr.strip().splitlines()[-1])
    assert peak_kb < MAX_RSS_KB, f"peak RSS {peak_kb} kB"
    (quarantined,) = [json.loads(line) for line in (tmp_path / "out" / "_quarantine" / "00000.jsonl").open()]
    size = len('{"text": "') + HUGE_LINE + len('"}')
    start = '{"text": "' + "a" * (1024 - len('{"text": "'))
    assert quarantined == {
        "file": str(tmp_path / "in" / f"huge.jsonl{suffix}"),
        "line": 101,
        "reason": "record_too_large",
        "raw": f"{start}... [{size} bytes, above max_record_bytes={64 << 20}]",
    }
    manifest = json.loads((tmp_path / "out" / "_manifests" / "00000.json").read_text())
    assert manifest["counts"]["docs_written"] == 200 and manifest["counts"]["rejected"] == {"record_too_large": 1}
