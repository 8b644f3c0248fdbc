"""Reading one part of a big input file that ranks share (``split_input_mb``; ``records.FilePart`` says which).

No part is planned by reading the file: each reader finds its own part's edges, and two neighbours find the same
edge, so every line or row is read by exactly one rank whatever else runs.

- A JSON-lines part is the lines that *start* in its nominal byte range: it begins after the first newline at or
  past its range's first byte - 1 (byte 0 for the first part) and ends where the next part begins.
- A parquet part is a run of whole row groups, ``[groups * index // count, groups * (index + 1) // count)``.

A part numbers its lines and rows as the whole file does, so that default document ids (``{url}/{line - 1}``) and
quarantine entries are the ones an unsplit read gives: a JSON-lines reader counts the newlines before its part
(a sequential read of that prefix, ~1 GB/s from a local disk's cache; on an object store, a cost to weigh), a
parquet reader adds up the rows of the row groups before its own from the footer. A process keeps the farthest
count it made of each file, and a rank reads its parts in order, so a rank reads a file's prefix once at most,
however many of its parts it holds.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from tokenization.records import FilePart, InputFile

if TYPE_CHECKING:
    import pyarrow.parquet

EDGE_READ = 64 << 10  # bytes read at a time while looking for the newline that ends a part: a line is ~1-10 KB
COUNT_READ = 8 << 20  # bytes read at a time while counting the lines before a part

_counted: dict[tuple[str, str], tuple[int, int]] = {}  # (url, identity): the farthest offset counted, its newlines


def line_span(raw: io.IOBase, file: InputFile) -> tuple[int, int, int]:
    """A JSON-lines part's bytes ``[start, end)`` and the number of lines before ``start``."""
    low, high = file.span
    start, end = _line_start(raw, low, file.size), _line_start(raw, high, file.size)
    return start, end, _newlines(raw, file, start)


def _line_start(raw: io.IOBase, offset: int, size: int) -> int:
    """Where the first line that starts at or after ``offset`` starts (``size`` when none does); ``EOFError`` when
    the file ends before its listed ``size``."""
    if offset <= 0 or offset >= size:
        return min(max(offset, 0), size)
    raw.seek(offset - 1)
    at = offset - 1
    while chunk := raw.read(EDGE_READ):
        if (newline := chunk.find(b"\n")) >= 0:
            return at + newline + 1
        at += len(chunk)
    if at < size:
        raise EOFError(f"the file ends at byte {at}, before the {size} bytes it was listed with")
    return size


def _newlines(raw: io.IOBase, file: InputFile, end: int) -> int:
    """The newlines in the file's first ``end`` bytes, counted on from the farthest count made before."""
    key = (file.url, file.identity)
    offset, count = _counted.get(key, (0, 0))
    if offset > end:
        offset, count = 0, 0
    raw.seek(offset)
    while offset < end and (chunk := raw.read(min(COUNT_READ, end - offset))):
        count += chunk.count(b"\n")
        offset += len(chunk)
    _counted[key] = (offset, count)
    return count


class Window(io.RawIOBase):
    """Bytes ``[start, end)`` of ``raw`` as a stream of their own, read forward."""

    def __init__(self, raw: io.IOBase, start: int, end: int):
        raw.seek(start)
        self.raw, self.left = raw, end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.left <= 0:
            return 0
        data = self.raw.read(min(len(buffer), self.left))
        if not data:
            raise EOFError(f"the file ends {self.left} bytes before the part's end")
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)


def row_groups(metadata: pyarrow.parquet.FileMetaData, part: FilePart | None) -> tuple[list[int] | None, int]:
    """A parquet part's row groups (None: all of them, for a whole file) and the rows before its first."""
    if part is None:
        return None, 0
    groups = metadata.num_row_groups
    first, last = groups * part.index // part.count, groups * (part.index + 1) // part.count
    return list(range(first, last)), sum(metadata.row_group(j).num_rows for j in range(first))
