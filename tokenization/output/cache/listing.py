"""What ``tokenization cache list`` shows and pruning weighs: each entry as a small row read from its marker without
decoding it whole, with the newest use that names it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from tokenization.output.cache.names import MARKER_BYTES, marker_name
from tokenization.output.cache.store import Store
from tokenization.output.cache.uses import read_uses
from tokenization.records import CacheEntry, RecordError

log = logging.getLogger("tokenization.output.cache")


@dataclass(frozen=True, slots=True)
class Listed:
    """An entry as ``tokenization cache list`` shows it and ``prune`` weighs it: its key, its files' bytes, when it
    was made, its input file (as it was stored), the tokens it holds, and the newest use that names it (its time:
    when that use finished or, in flight, started; its owner: the build's run folder), if any. A small row, whatever
    its marker holds: a listing of 100,000 entries keeps no marker."""

    key: str
    bytes: int
    created: float
    source: str
    tokens: int
    last_used: float | None
    last_owner: str | None

    @property
    def recency(self) -> float:
        return self.created if self.last_used is None else max(self.last_used, self.created)


@dataclass(frozen=True, slots=True)
class Shown:
    """What a listing takes of a marker."""

    bytes: int
    created: float
    source: str
    tokens: int


def listed(store: Store) -> list[Listed]:
    """``entries``, its markers read a batch at a time, each kept as a small row, the most recently used first."""
    last: dict[str, tuple[float, str]] = {}
    for used in read_uses(store):
        when = used.use.finished or used.use.started
        for key in used.use.keys:
            if key not in last or when > last[key][0]:
                last[key] = (when, used.use.owner)
    rows = [
        Listed(key, shown.bytes, shown.created, shown.source, shown.tokens, *last.get(key, (None, None)))
        for key, shown in markers(store)
    ]
    return sorted(rows, key=lambda item: item.recency, reverse=True)


def markers(store: Store, keys: Iterable[str] | None = None) -> Iterator[tuple[str, Shown]]:
    """Every readable entry's key (or those of ``keys``) and what its marker shows, read a batch at a time; a
    damaged marker is logged and left out."""
    names = {marker_name(key): key for key in (store.marker_keys() if keys is None else keys)}
    for name, data in store.read_all(store.entries, list(names), MARKER_BYTES):
        try:
            shown = _shown(data, store.entries.url_of(name))
        except RecordError as exc:
            log.warning("%s; left out", exc)
            continue
        yield names[name], shown


def _shown(data: bytes, url: str) -> Shown:
    """A marker's files' bytes, when it was made, its input file and its tokens: what a listing shows, read without
    decoding the whole record, whose counts take most of the 0.5 ms that costs (a minute for 100,000 entries; a
    lookup decodes and checks it all). ``RecordError`` when they are not there."""
    family = CacheEntry.format_tag().rsplit("/", 1)[0] + "/"
    try:
        found = orjson.loads(data)
        tag, created, source = found["format"], found["created"], found["source"]["url"]
        sizes = [f["bytes"] for f in found["files"].values()]
        tokens = found["counts"]["tokens"]
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise RecordError(url, f"{type(exc).__name__}: {exc}", CacheEntry.LABEL) from None
    if not (isinstance(tag, str) and tag.startswith(family)):
        raise RecordError(url, f"format {tag!r}, not {family}N", CacheEntry.LABEL)
    numbers = all(type(n) is int and n >= 0 for n in [*sizes, tokens]) and type(created) in (int, float)
    if not numbers or type(source) is not str:
        raise RecordError(url, "its sizes, tokens, time or input file are not a cache entry's", CacheEntry.LABEL)
    return Shown(sum(sizes), float(created), source, tokens)
