"""Input documents: each line or row read ends up as exactly one of a :class:`Record` (which may have empty text), a
:class:`Rejected` with a reason, or a counted blank line. Nothing is skipped silently."""

from __future__ import annotations

import bisect
import functools
import io
import itertools
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from gzip import BadGzipFile
from typing import IO, TYPE_CHECKING, Any

import orjson
import zstandard
from isal import isal_zlib

from tokenization.errors import StorageError
from tokenization.inputs.formats import InputError, file_format
from tokenization.inputs.lines import Oversized, bounded_lines, decompressed, skip, too_large, whole_gzip_lines
from tokenization.inputs.parts import Window, line_span, row_groups
from tokenization.records import InputFile, Rejected
from tokenization.rendering.renderer import MISSING, Renderer, get_field, no_loss_ranges, text_field
from tokenization.storage.folder import Folder, StorageOptions, file_at

if TYPE_CHECKING:
    import pyarrow.parquet


PARQUET_BATCH_ROWS = 1024
SAMPLE_READ = 64 << 10  # read at each place ``DocumentReader.at`` reads a plain file
DEFAULT_MAX_RECORD_BYTES = 64 << 20  # a line or row: a 50 MB document (1 GB to encode) passes; a few fit any worker
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    id: str
    no_loss_ranges: list[tuple[int, int]] | None
    file: str
    line: int
    data: dict[str, Any] | None = None  # the whole record, kept only when the reader is asked to (count --annotate)
    special_spans: list[tuple[int, int]] | None = None  # special tokens its chat template wrote (rendering.Rendered)
    offset: int = -1  # where its line starts in the file's (decompressed) bytes, or its row in a parquet file


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
    """Reads documents from a list of files (or parts of files), in order, tracking input bytes consumed for
    progress."""

    def __init__(
        self,
        files: Sequence[InputFile],
        text_key: str = "text",
        id_key: str = "id",
        keep_data: bool = False,
        renderer: Renderer | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        storage_options: StorageOptions | None = None,
    ):
        """``renderer`` makes a record's text (and its loss spans) from its fields instead of ``text_key``. A line
        or row of more than ``max_record_bytes`` is rejected as ``record_too_large``; a line is never held whole.
        ``storage_options`` open the files' URLs."""
        self.files = list(files)
        self.storage_options = storage_options
        self.renderer = renderer
        self.max_record_bytes = max_record_bytes
        self.text_key = text_key
        self.id_key = id_key
        self.keep_data = keep_data
        self.blank_lines = 0
        self._done_bytes = 0
        self._raw: io.IOBase | None = None
        self._span = (0, 0)  # of the file being read
        self._tails: dict[str, tuple[int, int]] = {}  # by URL: where a file's lines are read from, and those before

    def resume(self, url: str, offset: int, lines: int) -> None:
        """Read the plain JSON-lines file ``url`` from byte ``offset`` on, the start of a line, after ``lines``
        lines (its lines appended since the last night: ``inputs.grown``), numbering and placing its lines as a
        read of the whole file does."""
        self._tails[url] = (offset, lines)

    @property
    def total_bytes(self) -> int:
        """The bytes its files' reads cover (a resumed file's from where it resumes): progress's total."""
        return sum(end - start for start, end in map(self._read_span, self.files))

    def _read_span(self, file: InputFile) -> tuple[int, int]:
        """The bytes of ``file`` read: its span, or from where it resumes (``resume``) to its end."""
        return (self._tails[file.url][0], file.size) if file.url in self._tails else file.span

    @property
    def bytes_read(self) -> int:
        current = 0
        if self._raw is not None:
            try:
                start, end = self._span
                current = min(max(self._raw.tell() - start, 0), end - start)
            except (OSError, ValueError):
                current = 0
        return self._done_bytes + current

    def __iter__(self) -> Generator[Record | Rejected, None, None]:  # (a generator: callers close it)
        for file in self.files:
            kind, compression = file_format(file.url)
            self._span = start, end = self._read_span(file)
            yield from self._parquet(file) if kind == "parquet" else self._jsonl(file, compression)
            self._done_bytes += end - start
            self._raw = None

    def _parse(
        self, obj: object, url: str, line: int, raw: bytes | bytearray | str, offset: int = -1
    ) -> Record | Rejected:
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
        data = obj if self.keep_data else None
        return Record(text, doc_id, ranges, url, line, data, rendered.special_spans, offset)

    def _line(
        self, url: str, line_no: int, line: bytes | bytearray | Oversized, offset: int
    ) -> Record | Rejected | None:
        """The record of one line (None for a blank one, which is counted) that starts at byte ``offset``."""
        if isinstance(line, Oversized):
            return too_large(url, line_no, line.head, line.size, self.max_record_bytes)
        if line_no == 1 and line.startswith(UTF8_BOM):  # editors on Windows write one
            line = line[len(UTF8_BOM) :]
        if not line or line.isspace():  # (``strip`` copies the line: ~10 ms of the reader's 42 MB, the GIL held)
            self.blank_lines += 1
            return None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:
                line.decode("utf-8")
                reason = "malformed_json"
            except UnicodeDecodeError:
                reason = "invalid_utf8"
            return Rejected(url, line_no, reason, line.decode("utf-8", "backslashreplace").rstrip("\n"))
        return self._parse(obj, url, line_no, line, offset)

    def _jsonl(self, file: InputFile, compression: str | None) -> Iterator[Record | Rejected]:
        url = file.url
        folder, name = file_at(url, self.storage_options)
        line_no = 0
        limit = self.max_record_bytes
        with _open(folder, name) as raw:
            self._raw = raw
            try:
                tail = None if file.part or compression else self._tails.get(url)
                if file.part:
                    start, end, before = line_span(raw, file)
                else:
                    start, end, before = (tail[0], file.size, tail[1]) if tail else (0, file.size, 0)
                source = Window(raw, start, end) if file.part or tail else raw
                stream = decompressed(source, compression)  # (held: freeing it would close ``raw``)
                offset = start if not compression else 0  # of the line, in the bytes the lines are read from
                for line_no, line in enumerate(bounded_lines(stream, limit), before + 1):
                    at, offset = offset, offset + (line.size + 1 if isinstance(line, Oversized) else len(line))
                    if (item := self._line(url, line_no, line, at)) is not None:
                        yield item
                if raw.tell() < end:  # a short read must never pass for a short file
                    raise InputError(f"{url}: read {raw.tell()} of its {end} bytes, then the storage said EOF")
                if compression and not raw.tell():  # gzip and zstd read it as empty, `gzip -t` as truncated
                    raise InputError(
                        f"{url}: 0 bytes: an empty compressed file is truncated (a valid {compression} stream has a "
                        "header); an empty input should be an empty .jsonl"
                    )
            # isal's stubs declare ``isal_zlib.error`` an Exception instance; it is a class (igzip_lib.IsalError)
            except (EOFError, BadGzipFile, isal_zlib.error, zstandard.ZstdError) as exc:  # type: ignore[misc]
                if compression == "gzip":  # the read that failed lost the lines it inflated before the fault
                    with _open(folder, name) as again:
                        line_no = max(line_no, whole_gzip_lines(again))
                where = f"after line {line_no} (the last good line)" if line_no else "before its first line"
                raise InputError(
                    f"{url}: corrupt or truncated {compression or 'file'} data {where}; {type(exc).__name__}: {exc}"
                ) from exc
            except OSError as exc:  # the storage failed, not the data: another try may read it
                raise StorageError(f"{url}: read failed after line {line_no}; {type(exc).__name__}: {exc}") from exc

    def _parquet(self, file: InputFile) -> Iterator[Record | Rejected]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        url = file.url
        folder, name = file_at(url, self.storage_options)
        row = 0
        try:
            with _open(folder, name) as raw:
                self._raw = raw
                parquet = pq.ParquetFile(raw)
                groups, row = row_groups(parquet.metadata, file.part)
                if groups == []:  # a part of a file with fewer row groups than parts
                    return
                columns = self._columns(parquet)
                batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=columns)
                for batch in batches:
                    for obj in batch.to_pylist():
                        row += 1
                        yield self._row(url, row, obj)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{url}: unreadable parquet after row {row}; {type(exc).__name__}: {exc}") from exc

    def _columns(self, parquet: pyarrow.parquet.ParquetFile) -> list[str] | None:
        """The columns a parquet file's records need: all of them for a template, which may name any field."""
        wanted = {self.text_key, self.id_key, "no_loss_ranges"}
        wanted |= {key.split(".")[0] for key in (self.text_key, self.id_key)}
        every = self.keep_data or self.renderer is not None
        return None if every else [n for n in parquet.schema_arrow.names if n in wanted]

    def _row(self, url: str, row: int, obj: dict[str, Any]) -> Record | Rejected:
        """The record of a parquet file's row number ``row`` (from 1)."""
        raw_row = orjson.dumps(obj, default=str)
        if len(raw_row) > self.max_record_bytes:
            return too_large(url, row, raw_row, len(raw_row), self.max_record_bytes)
        return self._parse(obj, url, row, raw_row.decode(), row - 1)

    def at(self, file: InputFile, places: Sequence[tuple[int, int]]) -> list[Record | Rejected | None]:
        """The records that start at these places of a file, as its reading gives them, without reading the rest:
        each ``(offset, line)`` as ``Record.offset`` and ``Record.line`` give it, in order of offset. None where no
        line starts at the offset, or it is blank. A plain JSON-lines file is read at each offset only (a
        ``SAMPLE_READ`` buffer); a compressed one is decompressed from its start up to the last place, its bytes
        before discarded (gzip and zstd streams cannot be entered in the middle); a parquet file's row groups that
        hold the places are read, and only those."""
        kind, compression = file_format(file.url)
        folder, name = file_at(file.url, self.storage_options)
        with _open(folder, name) as raw:
            if kind == "parquet":
                return self._rows_at(file.url, raw, places)
            stream = decompressed(raw, compression) if compression else io.BufferedReader(raw, SAMPLE_READ)
            found: list[Record | Rejected | None] = []
            position, last = 0, b"\n"  # in a compressed stream, which only reads forward: the byte before it
            for offset, line in places:
                if offset < position or offset < 0:  # within a line read already
                    found.append(None)
                    continue
                if offset > position or not compression:
                    before = max(offset - 1, 0)  # the byte before the line: the newline that ends the one before
                    if compression:
                        skip(stream, before - position)
                    else:
                        stream.seek(before)
                    last = stream.read(1) if offset else b"\n"
                got = next(bounded_lines(stream, self.max_record_bytes), None) if last == b"\n" else None
                size = 0 if got is None else got.size + 1 if isinstance(got, Oversized) else len(got)
                position, last = offset + size, (b"\n" if size else last)
                found.append(None if got is None else self._line(file.url, line, got, offset))
            return found

    def _rows_at(self, url: str, raw: IO[bytes], places: Sequence[tuple[int, int]]) -> list[Record | Rejected | None]:
        """``at`` for a parquet file: its row groups that hold the places, read one at a time."""
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(raw)
        rows = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
        starts = list(itertools.accumulate(rows, initial=0))
        columns = self._columns(parquet)
        read = functools.lru_cache(maxsize=1)(lambda group: parquet.read_row_group(group, columns=columns))
        found: list[Record | Rejected | None] = []
        for offset, line in places:
            group = bisect.bisect_right(starts, offset) - 1
            if not 0 <= group < len(rows) or line != offset + 1:
                found.append(None)
                continue
            found.append(self._row(url, line, read(group).slice(offset - starts[group], 1).to_pylist()[0]))
        return found


def _open(folder: Folder, name: str) -> Any:
    """A file opened for reading as fsspec gives it: an ``io.IOBase`` of the store's own kind (raw or buffered),
    which the readers of parts and compressed streams take as it is."""
    return folder.open(name, "rb")
