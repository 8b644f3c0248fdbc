"""Input documents: file discovery, datatrove-style sharding, record parsing and quarantine reasons.

Every line or row read ends up as exactly one of: a :class:`Record` (which may have empty text), a
:class:`Rejected` with a reason, or a counted blank line. Nothing is skipped silently.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import orjson
import zstandard
from isal import igzip, isal_zlib

from tokenization.errors import reaching
from tokenization.rendering import MISSING, Renderer, get_field, no_loss_ranges, text_field
from tokenization.storage import is_local, open_fs

JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_EXTENSION = ".parquet"
PARQUET_BATCH_ROWS = 1024
READ_BUFFER = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"

log = logging.getLogger(__name__)


class InputError(ValueError):
    """Input cannot be read: no files, an unknown format, or corrupt compressed data (the message names it)."""


@dataclass(frozen=True)
class InputFile:
    url: str
    size: int


@dataclass(frozen=True)
class InputListing:
    """The input files, sorted by URL, and the files of unsupported types that folders held (named, not read)."""

    files: list[InputFile]
    skipped: list[str]


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    id: str
    no_loss_ranges: list[tuple[int, int]] | None
    file: str
    line: int
    data: dict | None = None  # the whole record, kept only when the reader is asked to (count --annotate)


@dataclass(frozen=True, slots=True)
class Rejected:
    file: str
    line: int
    reason: str
    raw: str

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "reason": self.reason, "raw": self.raw}


def file_format(url: str) -> tuple[str, str | None]:
    """``("jsonl"|"parquet", compression)`` from the name, or raise :class:`InputError`."""
    name = url.rsplit("/", 1)[-1].lower()
    compression = next((c for ext, c in COMPRESSIONS.items() if name.endswith(ext)), None)
    if compression:
        name = name.rsplit(".", 1)[0]
    if name.endswith(PARQUET_EXTENSION) and compression is None:
        return "parquet", None
    if name.endswith(JSONL_EXTENSIONS):
        return "jsonl", compression
    raise InputError(f"{url}: unsupported input format (expected .jsonl[.gz|.zst] or .parquet)")


def _is_supported(url: str) -> bool:
    try:
        file_format(url)
    except InputError:
        return False
    return True


class _ZstdFrames(io.RawIOBase):
    """Decompresses concatenated zstd frames, raising on a truncated last frame (zstandard's stream reader
    silently ends there, which would lose the tail of the file without a word)."""

    def __init__(self, raw: io.IOBase):
        self.raw = raw
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.in_frame = False
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = self.frame.unused_data if self.frame.eof else self.raw.read(READ_BUFFER)
            if self.frame.eof:
                self.frame, self.in_frame = zstandard.ZstdDecompressor().decompressobj(), False
                if not chunk:
                    continue
            if not chunk:
                if self.in_frame:
                    raise EOFError("zstd stream ended in the middle of a frame")
                return 0
            self.in_frame = True
            self.pending = memoryview(self.frame.decompress(chunk))
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def _visible(path: str) -> bool:
    return not path.rsplit("/", 1)[-1].startswith((".", "_"))


def list_input_files(inputs: Sequence[str]) -> InputListing:
    """Every input file, sorted by URL: folders are searched recursively, globs expanded, files taken as named.

    Names starting with ``.`` or ``_`` (markers, temp files) are ignored in folders and globs. Inside folders, files
    of other formats are skipped and listed in ``skipped`` (the caller logs and records them); a named or globbed
    file of another format is an error.
    """
    found: dict[str, int] = {}
    skipped: list[str] = []
    for spec in inputs:
        with reaching(spec):
            found.update(_list(spec, skipped))
    if skipped:
        log.warning("skipped %d input files of unsupported types: %s", len(skipped), ", ".join(skipped))
    if not found:
        unsupported = f" (skipped as unsupported: {', '.join(skipped)})" if skipped else ""
        raise InputError(f"no input files found in {', '.join(inputs)}{unsupported}")
    return InputListing([InputFile(url, found[url]) for url in sorted(found)], skipped)


def _list(spec: str, skipped: list[str]) -> dict[str, int]:
    """One input spec's files with their sizes, by URL; unsupported files of folders go to ``skipped``."""
    fs, path = open_fs(spec)
    if any(ch in path for ch in "*?["):
        entries = {p: i for p, i in fs.glob(path, detail=True).items() if i["type"] != "directory" and _visible(p)}
    elif fs.isdir(path):
        entries = {p: i for p, i in fs.find(path, detail=True).items() if _visible(p)}
        skipped += sorted(_url(fs, p) for p in entries if not _is_supported(p))
        entries = {p: i for p, i in entries.items() if _is_supported(p)}
    elif fs.exists(path):
        entries = {path: fs.info(path)}
    else:
        raise InputError(f"{spec}: no such file or folder")
    sizes = {_url(fs, p): int(info.get("size") or 0) for p, info in entries.items()}
    for url in sizes:
        file_format(url)  # a named or globbed file of another format is an error
    return sizes


def _url(fs, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)


def shard(files: Sequence[InputFile], rank: int, world_size: int) -> list[InputFile]:
    """Rank ``r`` of ``w`` takes ``files[r::w]`` of the sorted list, as datatrove's ``get_shard`` does."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return list(files[rank::world_size])


def _no_loss_ranges(value: object, text: str) -> list[tuple[int, int]] | str | None:
    """Validated ranges, ``None`` when absent, or the reject reason."""
    if value is MISSING or value is None or value == []:
        return None
    if not isinstance(value, list):
        return "bad_no_loss_ranges"
    ranges = []
    for item in value:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
            or not 0 <= item[0] <= item[1] <= len(text)
        ):
            return "bad_no_loss_ranges"
        ranges.append((item[0], item[1]))
    return ranges


class DocumentReader:
    """Reads documents from a list of files, in order, tracking input bytes consumed for progress."""

    def __init__(
        self,
        files: Sequence[InputFile],
        text_key: str = "text",
        id_key: str = "id",
        keep_data: bool = False,
        renderer: Renderer | None = None,
    ):
        """``renderer`` makes a record's text (and its loss spans) from its fields instead of ``text_key``."""
        self.files = list(files)
        self.renderer = renderer
        self.text_key = text_key
        self.id_key = id_key
        self.keep_data = keep_data
        self.blank_lines = 0
        self._done_bytes = 0
        self._raw: io.IOBase | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bytes_read(self) -> int:
        current = 0
        if self._raw is not None:
            try:
                current = self._raw.tell()
            except (OSError, ValueError):
                current = 0
        return self._done_bytes + current

    def __iter__(self) -> Iterator[Record | Rejected]:
        for file in self.files:
            kind, compression = file_format(file.url)
            yield from self._parquet(file.url) if kind == "parquet" else self._jsonl(file, compression)
            self._done_bytes += file.size
            self._raw = None

    def _parse(self, obj: object, url: str, line: int, raw: bytes | str) -> Record | Rejected:
        def reject(reason: str) -> Rejected:
            text = raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")
            return Rejected(url, line, reason, text.rstrip("\n"))

        if not isinstance(obj, dict):
            return reject("not_an_object")
        rendered = self.renderer.render(obj) if self.renderer else text_field(obj, self.text_key)
        if isinstance(rendered, str):
            return reject(rendered)
        text = rendered.text
        ranges = _no_loss_ranges(obj.get("no_loss_ranges", MISSING), text)
        if isinstance(ranges, str):
            return reject(ranges)
        ranges = no_loss_ranges(rendered.loss_spans, len(text), ranges)
        doc_id = get_field(obj, self.id_key)
        doc_id = f"{url}/{line - 1}" if doc_id is MISSING or doc_id is None else str(doc_id)
        return Record(text, doc_id, ranges, url, line, obj if self.keep_data else None)

    def _jsonl(self, file: InputFile, compression: str | None) -> Iterator[Record | Rejected]:
        url = file.url
        fs, path = open_fs(url)
        line_no = 0
        with fs.open(path, "rb") as raw:
            self._raw = raw
            try:
                stream: io.IOBase = raw
                if compression == "gzip":  # ISA-L inflates ~3x faster than zlib: the reader keeps up with the encoder
                    stream = igzip.GzipFile(fileobj=raw, mode="rb")
                elif compression == "zstd":
                    stream = io.BufferedReader(_ZstdFrames(raw), READ_BUFFER)
                for line_no, line in enumerate(stream, 1):
                    if line_no == 1 and line.startswith(UTF8_BOM):  # editors on Windows write one
                        line = line[len(UTF8_BOM) :]
                    if not line.strip():
                        self.blank_lines += 1
                        continue
                    try:
                        obj = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        try:
                            line.decode("utf-8")
                            reason = "malformed_json"
                        except UnicodeDecodeError:
                            reason = "invalid_utf8"
                        yield Rejected(url, line_no, reason, line.decode("utf-8", "backslashreplace").rstrip("\n"))
                        continue
                    yield self._parse(obj, url, line_no, line)
                if raw.tell() < file.size:  # a short read must never pass for a short file
                    raise InputError(f"{url}: read {raw.tell()} of its {file.size} bytes, then the storage said EOF")
            except (EOFError, OSError, isal_zlib.error, zstandard.ZstdError) as exc:
                raise InputError(
                    f"{url}: corrupt or truncated {compression or 'file'} data after line {line_no} "
                    f"(the last good line); {type(exc).__name__}: {exc}"
                ) from exc

    def _parquet(self, url: str) -> Iterator[Record | Rejected]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        fs, path = open_fs(url)
        row = 0
        try:
            with fs.open(path, "rb") as raw:
                self._raw = raw
                parquet = pq.ParquetFile(raw)
                wanted = {self.text_key, self.id_key, "no_loss_ranges"}
                wanted |= {key.split(".")[0] for key in (self.text_key, self.id_key)}
                every = self.keep_data or self.renderer is not None  # a template may name any field
                columns = None if every else [n for n in parquet.schema_arrow.names if n in wanted]
                for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                    for obj in batch.to_pylist():
                        row += 1
                        yield self._parse(obj, url, row, orjson.dumps(obj, default=str).decode())
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{url}: unreadable parquet after row {row}; {type(exc).__name__}: {exc}") from exc
