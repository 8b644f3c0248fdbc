"""The tokenization cache: each input file's first pass (its documents' tokens, ends and loss bytes, its counts and
its quarantined records) stored once, under a key of everything that decides it (``tokenization.text.cache_key``),
so that a nightly build tokenizes only the files that changed since the night before.

Layout under the cache's location::

    entries/{key}.json         the entry's marker, written last and only where none is (``records.CacheEntry``):
                               which data folder holds the entry, each file's size and sha256, the file's counts
    data/{key}/{writer}/       the entry's files, under a folder of the writer's own: two writers never share a file
    uses/{owner}/{stem}.json   the entries a rank uses (``records.CacheUse``), written before it looks any up

**Writers.** A rank that misses encodes the file in its working folder, copies the files into a data folder of its
own (hard links when the cache is on the same local filesystem: no byte is copied), then creates the marker only
where none is (``If-None-Match`` on S3, ``O_EXCL`` locally). Two writers of one key, two ranks or two builds,
write the same bytes into two folders; the first marker wins, and the other writer removes its folder, so an entry
never mixes two writers. A writer that dies leaves a folder that no marker names, which cleaning removes once it
is ``IN_FLIGHT_SECONDS`` old.

**Readers.** A rank that hits copies (or links) the entry's files into its working folder and checks every size
and sha256 against the marker before it uses any. A missing, partial or corrupt entry is logged and removed, and
its file is tokenized again (and stored anew): it is never used.

**Cleaning.** An entry stays while a use names it that is in flight (started less than ``IN_FLIGHT_SECONDS`` ago
and not finished) or whose build is still there (its ``_RUN.json``). Retention (``collect``) removes every other
entry, with the uses of builds that are gone; ``prune`` removes entries by age or down to a size, but never one a
use in flight names. An entry goes marker first, then its data, once the uses are read again: a reader that found
the marker before it went has written its use by then, and keeps the data it is copying.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tokenization.io.errors import reaching
from tokenization.io.storage import (
    current_etag,
    download,
    file_sha256,
    in_batches,
    is_local,
    join,
    link_or_copy,
    list_names,
    open_fs,
    put_if,
    read_many,
    remove_if,
    remove_if_exists,
    remove_tree,
    upload,
    write_bytes_atomic,
)
from tokenization.publish.records import CacheCleaning, CacheEntry, CacheUse, FileSum, RecordError

log = logging.getLogger(__name__)

ENTRIES, DATA, USES = "entries", "data", "uses"
DEFAULT_FOLDER = ".cache"  # under a build's output: a dot name, which no run's folder has (``runs.folder_for``)
OFF = "off"  # the cache setting that turns it off
IN_FLIGHT_SECONDS = 24 * 3600  # a rank's first pass takes less; a use unfinished after this belongs to a dead rank
KEY = re.compile(r"[0-9a-f]{64}")  # an entry's key (a sha256): nothing else under entries/ and data/ is an entry
WRITER = re.compile(r"[0-9a-f]{12}")  # a data folder's name
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # an entry's file: a plain name, never a path


def chosen_location(setting: str | None, default: str | None) -> str | None:
    """Where a cache setting puts the cache: the setting itself, ``default`` when it is not given, None when it is
    ``off``."""
    if setting is None:
        return default
    return None if setting.strip().lower() == OFF else setting


@dataclass(frozen=True)
class Listed:
    """An entry as ``tokenization cache list`` shows it: its marker, and the newest use that names it (its time:
    when that use finished or, in flight, started; its owner: the build's run folder), if any."""

    entry: CacheEntry
    last_used: float | None
    last_owner: str | None

    @property
    def recency(self) -> float:
        return self.entry.created if self.last_used is None else max(self.last_used, self.entry.created)


class Cache:
    """The cache at ``location`` (a folder or an fsspec URL), opened with the storage options of the stage that
    uses it."""

    def __init__(self, location: str):
        self.location = location.rstrip("/")
        self.fs, self.path = open_fs(self.location)

    # A rank: its use, then a lookup, a fetch or a commit a file.

    @contextmanager
    def using(self, owner: str, keeps: str, stem: str, keys: Iterable[str]) -> Iterator[None]:
        """Record that rank ``stem`` of ``owner`` uses these entries: in flight while the block runs (no cleaning
        removes them), then kept while ``keeps`` exists."""
        path = join(self.path, USES, hashlib.sha256(owner.encode()).hexdigest()[:16], f"{stem}.json")
        use = CacheUse(owner=owner, keeps=keeps, stem=stem, keys=sorted(set(keys)), started=time.time(), finished=None)
        with reaching(self.location):
            write_bytes_atomic(self.fs, path, use.dumps())
        try:
            yield
        finally:
            try:
                with reaching(self.location):
                    write_bytes_atomic(self.fs, path, replace(use, finished=time.time()).dumps())
            except OSError as exc:  # it stays in flight for a day: its entries are only kept longer
                log.warning("%s: could not mark this use finished (%s)", self._url(path), exc)

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry stored under ``key``, or None; a damaged marker is logged and removed, and counts as none."""
        where = self._entry_path(key)
        with reaching(self.location):
            try:
                data = self.fs.cat_file(where)
            except FileNotFoundError:
                return None
        try:
            entry = CacheEntry.loads(data, self._url(where))
            if entry.key != key:
                raise RecordError(self._url(where), f"it is the entry of key {entry.key}", CacheEntry.LABEL)
            if not WRITER.fullmatch(entry.data) or not all(FILE_NAME.fullmatch(name) for name in entry.files):
                raise RecordError(self._url(where), "its data folder or a file is not a plain name", CacheEntry.LABEL)
        except RecordError as exc:
            log.warning("%s; it is removed, and its file tokenized again", exc)
            self._forget(key, None)
            return None
        return entry

    def fetch(self, entry: CacheEntry, into: Path) -> dict[str, Path] | None:
        """The entry's files in the local folder ``into``, by name: hard links when the cache is on the same local
        filesystem, else copies, each checked against its marker's size and sha256 before any is used. None when
        one is missing or differs: the entry is logged and removed, and its file must be tokenized again."""
        folder = join(self.path, DATA, entry.key, entry.data)
        local = {name: into / name for name in entry.files}
        try:
            with reaching(self.location):
                if is_local(self.fs):
                    for name, path in local.items():
                        link_or_copy(Path(folder, name), path)
                else:
                    into.mkdir(parents=True, exist_ok=True)
                    for name, path in sorted(local.items()):
                        download(self.fs, join(folder, name), path)
            problem = _differences(local, entry.files)
        except FileNotFoundError as exc:
            problem = f"{exc.filename or 'a file'} is missing"
        if problem is None:
            return local
        self.discard(entry, problem)
        shutil.rmtree(into, ignore_errors=True)
        return None

    def discard(self, entry: CacheEntry, problem: str) -> None:
        """Remove an entry found unfit for use (``problem`` says why, in the log): its file is tokenized again."""
        log.warning(
            "cache entry %s (of %s): %s; it is removed, and the file tokenized again",
            self._url(self._entry_path(entry.key)),
            entry.source.name,
            problem,
        )
        self._forget(entry.key, entry.data)

    def commit(self, entry: CacheEntry, files: Mapping[str, Path]) -> CacheEntry | None:
        """Store ``entry`` (whose ``data`` names no folder yet) with these local files, by name: the files into a
        data folder of this writer's own, then the marker, only where none is. Returns the entry as stored, or None
        when another writer's entry (the same bytes, a moment earlier) won, and this one's folder is removed. A
        store that fails is logged, and the rank goes on without it."""
        entry = replace(entry, data=uuid.uuid4().hex[:12], created=time.time())
        folder = join(self.path, DATA, entry.key, entry.data)
        try:
            with reaching(self.location):
                for name, path in files.items():
                    if is_local(self.fs):
                        link_or_copy(path, Path(folder, name))
                    else:
                        upload(path, self.fs, join(folder, name))
                put_if(self.fs, self._entry_path(entry.key), entry.dumps(), absent=True)
            return entry
        except FileExistsError:
            log.info("%s: stored by another writer a moment earlier", self._url(self._entry_path(entry.key)))
        except OSError as exc:  # a write error or an unreachable store (StorageError) alike
            log.warning("%s: not stored in the cache (%s); the build goes on without it", entry.source.name, exc)
        with contextlib.suppress(OSError):
            remove_tree(self.fs, folder)
        return None

    # Looking after it: listing, retention's collection and pruning.

    def entries(self) -> list[Listed]:
        """Every readable entry, with its last use, the most recently used first; damaged markers are logged and
        left out."""
        markers = _read_all(self.fs, [join(self.path, ENTRIES, f"{key}.json") for key in self._keys()])
        entries = []
        for path, data in markers.items():
            try:
                entries.append(CacheEntry.loads(data, self._url(path)))
            except RecordError as exc:
                log.warning("%s; left out", exc)
        last: dict[str, tuple[float, str]] = {}
        for _, use in self._uses():
            when = use.finished or use.started
            for key in use.keys:
                if key not in last or when > last[key][0]:
                    last[key] = (when, use.owner)
        listed = [Listed(e, *last.get(e.key, (None, None))) for e in entries]
        return sorted(listed, key=lambda item: item.recency, reverse=True)

    def collect(self) -> CacheCleaning:
        """Retention's part: remove every entry that no use keeps, the uses of builds that are gone, and data
        folders no marker names that are ``IN_FLIGHT_SECONDS`` old. A use is kept while it is in flight or while
        its build's ``_RUN.json`` is there."""
        now = time.time()
        uses = self._uses()
        there = {keeps: _exists(keeps) for keeps in {use.keeps for _, use in uses}}
        named = set()
        for path, use in uses:
            if there[use.keeps] or _in_flight(use, now):
                named.update(use.keys)
            else:
                remove_if_exists(self.fs, path)
                self._remove_empty(path.rsplit("/", 1)[0])
        cleaned = self._remove([key for key in self._keys() if key not in named])
        return _sum(cleaned, self._remove_orphans(now))

    def prune(self, older_than: float | None = None, max_bytes: int | None = None) -> CacheCleaning:
        """Remove the entries last used more than ``older_than`` seconds ago, then the least recently used ones
        until the rest hold at most ``max_bytes``; never an entry a use in flight names. Data folders no marker
        names go too, once ``IN_FLIGHT_SECONDS`` old."""
        now = time.time()
        busy = self._in_flight_keys(now)
        every = self.entries()  # the most recently used first
        listed = [item for item in every if item.entry.key not in busy]
        chosen = {item.entry.key for item in listed if older_than is not None and item.recency < now - older_than}
        held = sum(item.entry.bytes for item in every if item.entry.key not in chosen)
        for item in reversed(listed):  # the least recently used first
            if max_bytes is None or held <= max_bytes:
                break
            if item.entry.key not in chosen:
                chosen.add(item.entry.key)
                held -= item.entry.bytes
        return _sum(self._remove(sorted(chosen)), self._remove_orphans(now))

    def _remove(self, keys: list[str]) -> CacheCleaning:
        """Remove these entries: each marker, then (once the uses in flight are read again) its data folders as
        they were listed before, so that a writer storing the key anew at this moment keeps its own."""
        folders = {key: self._data_folders(key) for key in keys}
        for key in keys:
            remove_if_exists(self.fs, self._entry_path(key))
        busy = self._in_flight_keys(time.time())
        freed = 0
        for key in keys:
            if key in busy:
                log.info("cache entry %s: a rank that found it before it went is copying it; its data stays", key)
                continue
            for folder, size in folders[key].items():
                remove_tree(self.fs, folder)
                freed += size
            self._remove_empty(join(self.path, DATA, key))  # unless another writer is storing the key anew
        if keys:
            log.info("cache %s: removed %d entries, %d bytes", self.location, len(keys), freed)
        return CacheCleaning(entries=len(keys), bytes=freed)

    def _remove_orphans(self, now: float) -> CacheCleaning:
        """The data folders of keys with no marker whose every file is ``IN_FLIGHT_SECONDS`` old: left by a writer
        that died before its marker, or by a removal a reader held up."""
        marked = set(self._keys())
        orphans = []
        for key in list_names(self.fs, join(self.path, DATA)):
            if key in marked or not KEY.fullmatch(key):
                continue
            listed = self.fs.find(join(self.path, DATA, key), detail=True)
            if all(now - _modified(info) > IN_FLIGHT_SECONDS for info in listed.values()):
                orphans.append(key)
        freed = 0
        for key in orphans:
            freed += sum(self._data_folders(key).values())
            remove_tree(self.fs, join(self.path, DATA, key))
        return CacheCleaning(entries=0, bytes=freed)

    def _remove_empty(self, folder: str) -> None:
        """A local folder left empty (an object store has none)."""
        if is_local(self.fs):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    # Where things are.

    def _entry_path(self, key: str) -> str:
        return join(self.path, ENTRIES, f"{key}.json")

    def _url(self, path: str) -> str:
        return self.location + path[len(self.path.rstrip("/")) :]

    def _keys(self) -> list[str]:
        names = (name.removesuffix(".json") for name in list_names(self.fs, join(self.path, ENTRIES)))
        return [key for key in names if KEY.fullmatch(key)]

    def _data_folders(self, key: str) -> dict[str, int]:
        """Each writer's folder of a key, with the bytes it holds."""
        prefix = join(self.path, DATA, key)
        self.fs.invalidate_cache(prefix)
        folders: dict[str, int] = {}
        for path, info in self.fs.find(prefix, detail=True).items():
            folder = join(prefix, path[len(prefix) + 1 :].split("/", 1)[0])
            folders[folder] = folders.get(folder, 0) + int(info.get("size") or 0)
        return folders

    def _uses(self) -> list[tuple[str, CacheUse]]:
        """Every readable use, with its path; a damaged one is logged and left out."""
        root = join(self.path, USES)
        self.fs.invalidate_cache(root)
        try:
            paths = [p for p in self.fs.find(root) if p.endswith(".json")]
        except FileNotFoundError:
            return []
        found = []
        for path, data in _read_all(self.fs, paths).items():
            try:
                found.append((path, CacheUse.loads(data, self._url(path))))
            except RecordError as exc:
                log.warning("%s; its entries are not kept for it", exc)
        return found

    def _in_flight_keys(self, now: float) -> set[str]:
        return {key for _, use in self._uses() if _in_flight(use, now) for key in use.keys}

    def _forget(self, key: str, data: str | None) -> None:
        """Remove a damaged entry: its marker, if it still names the data folder ``data`` (None: if it is still
        unreadable), then that folder. A marker a writer has meanwhile stored anew stays."""
        where = self._entry_path(key)
        try:
            etag = current_etag(self.fs, where) if not is_local(self.fs) else None
            found = self.fs.cat_file(where)
            try:
                still = CacheEntry.loads(found, where).data == data
            except RecordError:
                still = data is None
            if still:
                remove_if(self.fs, where, etag)
            if data is not None:
                remove_tree(self.fs, join(self.path, DATA, key, data))
        except FileNotFoundError:
            pass
        except OSError as exc:  # it stays, and is found damaged again by the next reader
            log.warning("%s: could not remove it (%s)", self._url(where), exc)


def _differences(local: Mapping[str, Path], recorded: Mapping[str, FileSum]) -> str | None:
    """How the fetched files differ from what the marker records, or None."""
    for name, path in local.items():
        size, want = path.stat().st_size, recorded[name]
        if size != want.bytes:
            return f"{name} holds {size} bytes, its marker {want.bytes}"
        if file_sha256(path) != want.sha256:
            return f"{name} does not have the sha256 its marker records"
    return None


def _read_all(fs, paths: list[str]) -> dict[str, bytes]:
    """The bytes of many small files, a batch of requests at a time; a file removed since it was listed is left out."""
    return {
        path: data for batch in in_batches(paths) for path, data in read_many(fs, batch).items() if data is not None
    }


def _exists(url: str) -> bool:
    fs, path = open_fs(url)
    fs.invalidate_cache(path)
    return fs.exists(path)


def _in_flight(use: CacheUse, now: float) -> bool:
    return use.finished is None and now - use.started < IN_FLIGHT_SECONDS


def _modified(info: dict) -> float:
    moment = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
    return moment.timestamp() if hasattr(moment, "timestamp") else float(moment)


def _sum(*cleanings: CacheCleaning) -> CacheCleaning:
    return CacheCleaning(entries=sum(c.entries for c in cleanings), bytes=sum(c.bytes for c in cleanings))
