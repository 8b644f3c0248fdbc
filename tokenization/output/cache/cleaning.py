"""Cleaning, only in a folder that is a cache: retention's ``collect`` (every entry no use keeps) and ``prune`` (by
age, or down to a size), each never taking an entry a use in flight names. An entry goes marker first, then its data
once the uses are read again: a reader that found the marker before it went has written its use by then, and keeps
the data it is copying."""

from __future__ import annotations

import logging
import time

from tokenization.output.cache.entries import forget
from tokenization.output.cache.listing import listed
from tokenization.output.cache.names import IN_FLIGHT_SECONDS, KEY
from tokenization.output.cache.sizes import forget_rows
from tokenization.output.cache.store import Store
from tokenization.output.cache.uses import builds_there, in_flight, in_flight_keys, read_uses
from tokenization.records import CacheCleaning
from tokenization.wording import counted

log = logging.getLogger("tokenization.output.cache")


def collect(store: Store) -> CacheCleaning:
    """Remove every entry that no use keeps, the uses of builds that are gone, and writers' data folders no marker
    names that are ``IN_FLIGHT_SECONDS`` old. A use is kept while it is in flight, while its build's ``_RUN.json``
    is there, or while that cannot be told from here."""
    now = time.time()
    uses = read_uses(store)
    there = builds_there({used.use.keeps for used in uses}, store.at.options)
    named = set()
    for used in uses:
        if there[used.use.keeps] or in_flight(used.use, now):
            named.update(used.use.keys)
        else:
            used.folder.remove(used.name)
            used.folder.remove_if_empty()
    cleaned = _remove(store, [key for key in store.marker_keys() if key not in named])
    return _sum(cleaned, _remove_orphans(store, now))


def prune(store: Store, older_than: float | None, max_bytes: int | None) -> CacheCleaning:
    """Remove the entries last used more than ``older_than`` seconds ago, then the least recently used ones until
    the rest hold at most ``max_bytes``; never an entry a use in flight names. Damaged entries go (a marker
    unreadable, or a folder: no build can use one), and writers' data folders no marker names, once
    ``IN_FLIGHT_SECONDS`` old."""
    now = time.time()
    busy = in_flight_keys(store, now)
    every = listed(store)  # the most recently used first
    damaged = set(store.marker_keys()) - busy - {item.key for item in every}
    for key in sorted(damaged):
        forget(store, key, None)
    rows = [item for item in every if item.key not in busy]
    chosen = {item.key for item in rows if older_than is not None and item.recency < now - older_than}
    held = sum(item.bytes for item in every if item.key not in chosen)
    for item in reversed(rows):  # the least recently used first
        if max_bytes is None or held <= max_bytes:
            break
        if item.key not in chosen:
            chosen.add(item.key)
            held -= item.bytes
    cleaned = CacheCleaning(entries=len(damaged), bytes=0)
    return _sum(cleaned, _remove(store, sorted(chosen)), _remove_orphans(store, now))


def _remove(store: Store, keys: list[str]) -> CacheCleaning:
    """Remove these entries: each marker, then (once the uses in flight are read again) its writers' data folders
    as they were listed before, so that a writer storing the key anew at this moment keeps its own."""
    folders = {key: store.data_folders(key) for key in keys}
    for key in keys:
        store.remove_marker(key)
    busy = in_flight_keys(store, time.time())
    freed = 0
    for key in keys:
        if key in busy:
            log.info("cache entry %s: a rank that found it before it went is copying it; its data stays", key)
            continue
        for writer, (size, _) in folders[key].items():
            store.data.sub(key, writer).remove_all()
            freed += size
        store.data.sub(key).remove_if_empty()  # unless another writer is storing the key anew
    if keys:
        forget_rows(store, keys)
        log.info("cache %s: removed %s, %d bytes", store.location, counted(len(keys), "entry", "entries"), freed)
    return CacheCleaning(entries=len(keys), bytes=freed)


def _remove_orphans(store: Store, now: float) -> CacheCleaning:
    """The writers' data folders of keys with no marker whose every file is ``IN_FLIGHT_SECONDS`` old: left by a
    writer that died before its marker, or by a removal a reader held up."""
    marked = set(store.marker_keys())
    freed = 0
    for key in store.data.list():
        if key in marked or not KEY.fullmatch(key):
            continue
        for writer, (size, newest) in store.data_folders(key).items():
            if now - newest > IN_FLIGHT_SECONDS:
                store.data.sub(key, writer).remove_all()
                freed += size
        store.data.sub(key).remove_if_empty()
    return CacheCleaning(entries=0, bytes=freed)


def _sum(*cleanings: CacheCleaning) -> CacheCleaning:
    return CacheCleaning(entries=sum(c.entries for c in cleanings), bytes=sum(c.bytes for c in cleanings))
