"""The cache's size at the cost of what changed: each marker's files' bytes and tokens, as it showed them
(``listing.markers``), kept beside the cache by its name, size and last write, as its listing gives them
(``SIZES``). The next measure lists the markers (their sizes and times, no marker read) and reads only those that
are new or were written again since; a row whose marker is gone is dropped. A next night of 100,000 one-line hits
read every marker to say how big the cache is (~4 s); now it reads none.

The record is a memo: written whole, atomically, read bounded; a record missing, damaged or not written means the
markers are read again, and the log says so. It decides nothing but the report's line: it is not signed, and a
marker rewritten with the same size at the same moment (racy, as git's index calls it) keeps its old row until it
changes again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import orjson

from tokenization.output.cache.listing import markers
from tokenization.output.cache.names import KEY, SIZES, marker_name
from tokenization.output.cache.store import Store
from tokenization.records import RecordError

log = logging.getLogger("tokenization.output.cache")

FORMAT = "cache-sizes/1"
ROW_BYTES = 256  # a marker's name and four numbers, at most, as the record's bound
Row = tuple[int, float, int, int]  # a marker's size and last write, as listed; its files' bytes and its tokens


def measured(store: Store) -> list[Row]:
    """Every readable entry's row: those of markers listed as the record remembers them, kept; the others read
    (``markers``: a damaged one is logged and left out). The record is written again when a row changed."""
    found = store.entries.found().items()
    listing = {name: stamp for name, stamp in found if KEY.fullmatch(name.removesuffix(".json"))}
    known = _read(store, len(listing))
    rows = {name: row for name, row in known.items() if listing.get(name) == (row[0], row[1])}
    new = [name.removesuffix(".json") for name in listing if name not in rows]
    for key, shown in markers(store, new):
        size, written = listing[marker_name(key)]
        rows[marker_name(key)] = (size, written, shown.bytes, shown.tokens)
    if rows != known:
        _write(store, rows)
    return list(rows.values())


def forget_rows(store: Store, keys: Collection[str]) -> None:
    """Drop the rows of entries just removed (``cleaning``): the next measure bounds the record by the markers it
    lists then, and would find one that still holds theirs larger than those need, so damaged."""
    gone = {marker_name(key) for key in keys}
    if not gone:
        return
    known = _read(store, len(store.marker_keys()) + len(gone))
    if known and (rows := {name: row for name, row in known.items() if name not in gone}) != known:
        _write(store, rows)


def _read(store: Store, markers_listed: int) -> dict[str, Row]:
    """The rows remembered, by marker name; none when the record is missing, or damaged (logged)."""
    limit = (markers_listed + 1) * ROW_BYTES
    url = store.at.url_of(SIZES)
    try:
        data = store.bounded(store.at, SIZES, limit, "cache sizes")
        if data is None:
            return {}
        found = orjson.loads(data)
        if not (isinstance(found, dict) and found.get("format") == FORMAT and isinstance(found.get("rows"), dict)):
            raise ValueError(f"not a {FORMAT} record")
        rows = {name: _row(row) for name, row in found["rows"].items()}
    except (OSError, ValueError, TypeError) as exc:  # a JSON error too
        problem = exc if isinstance(exc, RecordError) else f"{url}: {exc}"  # a RecordError names the record itself
        log.warning("%s; the cache's markers are read to measure it", problem)
        return {}
    return rows


def _row(row: object) -> Row:
    """A remembered row, checked: four numbers, the second a time."""
    if not (isinstance(row, list) and len(row) == 4):
        raise ValueError(f"a row {row!r} is not four numbers")
    size, written, held, tokens = row
    if not (all(type(n) is int and n >= 0 for n in (size, held, tokens)) and type(written) in (int, float)):
        raise ValueError(f"a row {row!r} is not a marker's size, time, bytes and tokens")
    return size, float(written), held, tokens


def _write(store: Store, rows: dict[str, Row]) -> None:
    """The rows, whole; one that cannot be written is logged (the next measure reads the markers again)."""
    try:
        store.at.put(SIZES, orjson.dumps({"format": FORMAT, "rows": rows}))
    except OSError as exc:
        log.info("%s: not written (%s); the next measure reads the cache's markers again", store.at.url_of(SIZES), exc)
