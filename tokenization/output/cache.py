"""The tokenization cache: each input file's first pass (its documents' tokens, ends and loss bytes, its counts and
its quarantined records) stored once, under a key of everything that decides it (``tokenization.tokenizer.cache_key``),
so that a nightly build tokenizes only the files that changed since the night before.

Layout under the cache's location::

    _CACHE.json                the cache's own file (``records.CacheFolder``): this folder is a cache
    entries/{key}.json         the entry's marker, written last and only where none is (``records.CacheEntry``):
                               which data folder holds the entry, each file's size and checksum, the file's counts
    data/{key}/{writer}/       the entry's files, under a folder of the writer's own: two writers never share a file
    uses/{owner}/{stem}.json   the entries a rank uses (``records.CacheUse``), written before it looks any up
    inputs/{key}.json          what the plans of one input found of its local files (``records.KnownInputs``)

**The folder.** Before its first write, a build's plan or a rank makes sure the folder is a cache (``claim``): it
has ``_CACHE.json``, or it is new or empty, or it holds exactly what a cache holds (a cache made by an earlier
version, which wrote no ``_CACHE.json``: it is adopted, once), and ``_CACHE.json`` is written then. Any other
folder is refused (``NotACache``) and nothing is written in it. Listing and cleaning refuse a folder without
``_CACHE.json``, and remove only what the cache's own names describe: an entry by its marker's key, and a data
folder named as a writer names it (``data/{key}/{writer}/``, holding plain files); nothing else under the folder.

**Writers.** A rank that misses encodes the file in its working folder, copies the files into a data folder of its
own (hard links when the cache is on the same local filesystem: no byte is copied), then creates the marker only
where none is (``If-None-Match`` on S3, ``O_EXCL`` locally). Two writers of one key, two ranks or two builds,
write the same bytes into two folders; the first marker wins, and the other writer removes its folder, so an entry
never mixes two writers. A writer that dies leaves a folder that no marker names, which cleaning removes once it
is ``IN_FLIGHT_SECONDS`` old.

**Readers.** A rank that hits copies (or links) the entry's files into its working folder and checks every size
and checksum (of the algorithm the marker names) against the marker before it uses any; its first pass then checks
the files against the marker's counts and against the input file (``stages.hits``). A missing, partial or corrupt
entry (a marker of more than ``MARKER_BYTES``, which is never read whole; a file that is a folder) is logged and
removed, and its file is tokenized again (and stored anew): it is never used.

**What it trusts.** Anyone who can write the cache's folder can write an entry whose files, checksums and counts agree
with one another: the checksums catch damage, not intent. With a key (``output.signing``), markers are signed and
only those signed with it are used; without one, what such a writer can and cannot do to a build is
``stages.hits``'s to say: a hit is held against its input file (read again, not encoded) and a sample of its
documents is encoded again. Reads are bounded (a marker at ``MARKER_BYTES``, a use at ``USE_BYTES``), and
cleaning touches only what the cache's own names describe, under a folder its own file identifies.

**Cleaning.** An entry stays while a use names it that is in flight (started less than ``IN_FLIGHT_SECONDS`` ago
and not finished) or whose build is still there (its ``_RUN.json``). Retention (``collect``) removes every other
entry, with the uses of builds that are gone; ``prune`` removes entries by age or down to a size, but never one a
use in flight names. An entry goes marker first, then its data, once the uses are read again: a reader that found
the marker before it went has written its use by then, and keeps the data it is copying. A cache may be shared by
builds of several outputs: a use whose build is on a storage that this one cannot read (no credentials for it, no
filesystem for its protocol) is kept, with a warning, for a build that can read it to clean; retention never fails
the build it runs after.
"""

from __future__ import annotations

import contextlib
import errno
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
from typing import Any

import fsspec
import orjson

from tokenization.errors import StorageError, TokenizationError, reaching
from tokenization.output.signing import Signer, signed_part
from tokenization.records import (
    CacheCleaning,
    CacheEntry,
    CacheFolder,
    CacheSize,
    CacheUse,
    FileSum,
    RecordError,
)
from tokenization.storage.checksums import checksum, file_checksum
from tokenization.storage.files import (
    StorageOptions,
    current_etag,
    download,
    in_batches,
    is_local,
    join,
    link_or_copy,
    list_names,
    open_fs,
    put_if,
    read_head,
    read_many,
    remove_if,
    remove_if_exists,
    remove_tree,
    upload,
    write_bytes_atomic,
)
from tokenization.storage.folder import Folder
from tokenization.wording import counted

log = logging.getLogger(__name__)

ENTRIES, DATA, USES = "entries", "data", "uses"
KNOWN = "inputs"  # what plans found of their local input files (``output.known``)
OWN_FILE = "_CACHE.json"  # the cache's own file, at its top (``records.CacheFolder``)
DEFAULT_FOLDER = ".cache"  # under a build's output: a dot name, which no run's folder has (``runs.folder_for``)
OFF = "off"  # the cache setting that turns it off
IN_FLIGHT_SECONDS = 24 * 3600  # a rank's first pass takes less; a use unfinished after this belongs to a dead rank
MARKER_BYTES = 4 << 20  # a marker holds a few kB; a larger one is damaged, and never read whole
USE_BYTES = 16 << 20  # a use lists its rank's keys, 72 bytes each: 230,000 input files a rank
KEY = re.compile(r"[0-9a-f]{64}")  # an entry's key (a sha256): nothing else under entries/ and data/ is an entry
WRITER = re.compile(r"[0-9a-f]{12}")  # a data folder's name
OWNER = re.compile(r"[0-9a-f]{16}")  # a use folder's name
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # an entry's file: a plain name, never a path
CACHE_FILE = re.compile(  # every file a cache writes, by its path under the cache (a use's temporary file too)
    rf"{ENTRIES}/{KEY.pattern}\.json|{DATA}/{KEY.pattern}/{WRITER.pattern}/{FILE_NAME.pattern}"
    rf"|{USES}/{OWNER.pattern}/[^/]+|{KNOWN}/[^/]+"
)
NOT_THERE = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR)  # an entry's file missing, or a folder, or under a file


_UNWRITABLE: set[str] = set()  # the caches whose write failed in this process, said once


class NotACache(TokenizationError):
    """A folder given as a tokenization cache is not one: writing entries in it, or cleaning it, would mix the
    cache's files with others, or remove files the cache never wrote."""


def chosen_location(setting: str | None, default: str | None) -> str | None:
    """Where a cache setting puts the cache: the setting itself, ``default`` when it is not given, None when it is
    ``off``."""
    if setting is None:
        return default
    return None if setting.strip().lower() == OFF else setting


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


class Cache:
    """The cache in the folder ``at``. Its retention asks whether the builds that used an entry are still there,
    with the same storage options: a build elsewhere that they cannot read counts as there."""

    def __init__(self, at: Folder):
        self.at = at
        self.location = at.url.rstrip("/") or at.url  # "/" is a location too
        self.fs, self.path = at.fs, at.path
        self.signer = Signer.from_environment()  # with a key, every marker is signed, and only signed ones are used
        self.read_only = False  # set by the first write that fails: storing is best effort, reading goes on

    def _unwritable(self, exc: OSError) -> None:
        """A write that failed (a read-only folder or store, no permission, a full disk): said once, then this
        cache only reads."""
        if self.location not in _UNWRITABLE:
            log.warning("cache %s cannot be written (%s): entries are read, none stored", self.location, exc)
        _UNWRITABLE.add(self.location)
        self.read_only = True

    # The folder: made a cache before the first write, checked before any listing or cleaning.

    def claim(self) -> None:
        """Make sure the folder is a cache before anything is written in it: its own file is there, or is written
        now in a folder that is new, empty, or holds exactly what a cache holds (a cache made by an earlier version,
        adopted). ``NotACache`` for any other folder."""
        with reaching(self.location):
            if self._identified():
                return
            files = self._files()
            if (stray := next((name for name in files if not CACHE_FILE.fullmatch(name)), None)) is not None:
                raise NotACache(
                    f"{self.location}: not a tokenization cache: it holds {stray or 'an object of its name'}, which a "
                    f"cache never writes, and no {OWN_FILE}; give the cache a folder of its own (a new or empty one)"
                )
            try:
                put_if(self.fs, join(self.path, OWN_FILE), CacheFolder(created=time.time()).dumps(), absent=True)
            except FileExistsError:
                return  # made by another rank or build a moment earlier
            except OSError as exc:
                self._unwritable(exc)
                return
        if files:
            log.info(
                "cache %s: made by an earlier version (%s); adopted, %s written",
                self.location,
                counted(len(files), "file"),
                OWN_FILE,
            )

    def check(self) -> None:
        """Refuse (``NotACache``) to list or clean a folder that has no cache's own file."""
        with reaching(self.location):
            if self._identified():
                return
        raise NotACache(
            f"{self.location}: not a tokenization cache (it has no {OWN_FILE}), so nothing in it is listed or "
            f"removed; a cache made by an earlier version gets one from the next build that uses it, when the folder "
            f"holds only what a cache holds"
        )

    def _identified(self) -> bool:
        """Whether the folder has the cache's own file; ``NotACache`` when what is there is not one."""
        where = join(self.path, OWN_FILE)
        try:
            if (data := self._bounded(where, MARKER_BYTES, CacheFolder.LABEL)) is None:
                return False
            CacheFolder.loads(data, self._url(where))
        except RecordError as exc:
            raise NotACache(f"{exc}; a tokenization cache is a folder with a valid one") from None
        return True

    def _files(self) -> list[str]:
        """Every file under the folder, by its path there, sorted (a whole listing: once, when a cache is made); a
        location that is a file gives ``""``."""
        self.fs.invalidate_cache(self.path)
        try:
            found = self.fs.find(self.path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        root = self.path.rstrip("/")
        # s3fs gives the folder itself when its listing was empty and a file landed in it before its second look (a
        # cache made by another build at that moment): a folder, never a file of it
        return sorted(path[len(root) + 1 :] for path, info in found.items() if info["type"] != "directory")

    # A rank: its use, then a lookup, a fetch or a commit a file.

    @contextmanager
    def using(self, owner: str, keeps: str, stem: str, keys: Iterable[str]) -> Iterator[None]:
        """Record that rank ``stem`` of ``owner`` uses these entries: in flight while the block runs (no cleaning
        removes them), then kept while ``keeps`` exists. The folder is claimed first (``claim``)."""
        self.claim()
        path = join(self.path, USES, hashlib.sha256(owner.encode()).hexdigest()[:16], f"{stem}.json")
        use = CacheUse(owner=owner, keeps=keeps, stem=stem, keys=sorted(set(keys)), started=time.time(), finished=None)
        try:
            if not self.read_only:
                with reaching(self.location):
                    write_bytes_atomic(self.fs, path, use.dumps())
        except OSError as exc:  # no use to keep entries for: none is stored, and cleaning may take those read
            self._unwritable(exc)
        try:
            yield
        finally:
            try:
                if not self.read_only:
                    with reaching(self.location):
                        write_bytes_atomic(self.fs, path, replace(use, finished=time.time()).dumps())
            except OSError as exc:  # it stays in flight for a day: its entries are only kept longer
                log.warning("%s: could not mark this use finished (%s)", self._url(path), exc)

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry stored under ``key``, or None; a damaged marker (one of more than ``MARKER_BYTES`` too) is
        logged and removed, and counts as none."""
        where = self._entry_path(key)
        try:
            with reaching(self.location):
                if (data := self._bounded(where, MARKER_BYTES, CacheEntry.LABEL)) is None:
                    return None
            entry = CacheEntry.loads(data, self._url(where))
            if entry.key != key:
                raise RecordError(self._url(where), f"it is the entry of key {entry.key}", CacheEntry.LABEL)
            if not WRITER.fullmatch(entry.data) or not all(FILE_NAME.fullmatch(name) for name in entry.files):
                raise RecordError(self._url(where), "its data folder or a file is not a plain name", CacheEntry.LABEL)
        except RecordError as exc:
            log.warning("%s; it is removed, and its file tokenized again", exc)
            self._forget(key, None)
            return None
        if self.signer is not None and (problem := self.signer.problem(data)):
            self.discard(entry, problem)
            return None
        return entry

    def fetch(self, entry: CacheEntry, into: Path) -> dict[str, Path] | None:
        """The entry's files in the local folder ``into``, by name: hard links when the cache is on the same local
        filesystem, else copies, each checked against its marker's size and checksum before any is used. None when
        one is missing, is no file, or differs: the entry is logged and removed, and its file must be tokenized
        again."""
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
        except OSError as exc:  # a file missing, a folder in its place; a storage that fails (no errno) goes on up
            if exc.errno not in NOT_THERE:
                raise
            missing = exc.errno == errno.ENOENT
            problem = f"{exc.filename or 'a file'} is {'missing' if missing else 'a folder, or under a file'}"
        if problem is None:
            return local
        self.discard(entry, problem)
        shutil.rmtree(into, ignore_errors=True)
        return None

    def read(self, entry: CacheEntry, name: str) -> bytes | None:
        """One small file of an entry (its index, which a plan reads to choose a mixture's documents), checked
        against its marker's size and checksum; None when it is missing, is no file, or differs (the rank that fetches
        the entry finds the same, and removes it)."""
        recorded = entry.files.get(name)
        if recorded is None:
            return None
        try:
            with reaching(self.location):
                data = self._file_or_none(join(self.path, DATA, entry.key, entry.data, name), recorded.bytes)
        except OSError as exc:
            if exc.errno not in NOT_THERE:
                raise
            return None
        if data is None or len(data) != recorded.bytes or checksum(data, recorded.algorithm) != recorded.checksum:
            return None
        return data

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
        if self.read_only:
            return None
        entry = replace(entry, data=uuid.uuid4().hex[:12], created=time.time())
        if self.signer is not None:
            entry = replace(entry, signature=self.signer.sign(signed_part(entry.to_json())))
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

    # Looking after it: listing, measuring, retention's collection and pruning, each only in a folder that is a cache.

    def entries(self) -> list[Listed]:
        """Every readable entry, with its last use, the most recently used first; damaged markers are logged and
        left out."""
        self.check()
        with reaching(self.location):
            return self._listed()

    def size(self) -> CacheSize:
        """Its entries, their files' bytes and the tokens they hold, summed from the markers as they are read, a
        batch at a time (no row is kept); damaged markers are logged and left out."""
        self.check()
        entries = held = tokens = 0
        with reaching(self.location):
            for _, shown in self._markers():
                entries, held, tokens = entries + 1, held + shown.bytes, tokens + shown.tokens
        return CacheSize(location=self.location, entries=entries, bytes=held, tokens=tokens)

    def collect(self) -> CacheCleaning:
        """Retention's part: remove every entry that no use keeps, the uses of builds that are gone, and writers'
        data folders no marker names that are ``IN_FLIGHT_SECONDS`` old. A use is kept while it is in flight, while
        its build's ``_RUN.json`` is there, or while that cannot be told from here."""
        self.check()
        with reaching(self.location):
            now = time.time()
            uses = self._uses()
            there = _builds_there({use.keeps for _, use in uses}, self.at.options)
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
        until the rest hold at most ``max_bytes``; never an entry a use in flight names. Damaged entries go (a marker
        unreadable, or a folder: no build can use one), and writers' data folders no marker names, once
        ``IN_FLIGHT_SECONDS`` old."""
        self.check()
        with reaching(self.location):
            now = time.time()
            busy = self._in_flight_keys(now)
            every = self._listed()  # the most recently used first
            damaged = set(self._keys()) - busy - {item.key for item in every}
            for key in sorted(damaged):
                self._forget(key, None)
            listed = [item for item in every if item.key not in busy]
            chosen = {item.key for item in listed if older_than is not None and item.recency < now - older_than}
            held = sum(item.bytes for item in every if item.key not in chosen)
            for item in reversed(listed):  # the least recently used first
                if max_bytes is None or held <= max_bytes:
                    break
                if item.key not in chosen:
                    chosen.add(item.key)
                    held -= item.bytes
            cleaned = CacheCleaning(entries=len(damaged), bytes=0)
            return _sum(cleaned, self._remove(sorted(chosen)), self._remove_orphans(now))

    def _listed(self) -> list[Listed]:
        """``entries``, its markers read a batch at a time, each kept as a small row."""
        last: dict[str, tuple[float, str]] = {}
        for _, use in self._uses():
            when = use.finished or use.started
            for key in use.keys:
                if key not in last or when > last[key][0]:
                    last[key] = (when, use.owner)
        listed = [
            Listed(key, shown.bytes, shown.created, shown.source, shown.tokens, *last.get(key, (None, None)))
            for key, shown in self._markers()
        ]
        return sorted(listed, key=lambda item: item.recency, reverse=True)

    def _markers(self) -> Iterator[tuple[str, _Shown]]:
        """Every readable entry's key and what its marker shows, read a batch at a time; a damaged marker is logged
        and left out."""
        for path, data in self._read_all([self._entry_path(key) for key in self._keys()], MARKER_BYTES):
            try:
                shown = _shown(data, self._url(path))
            except RecordError as exc:
                log.warning("%s; left out", exc)
                continue
            yield path.rsplit("/", 1)[-1].removesuffix(".json"), shown

    def _remove(self, keys: list[str]) -> CacheCleaning:
        """Remove these entries: each marker, then (once the uses in flight are read again) its writers' data
        folders as they were listed before, so that a writer storing the key anew at this moment keeps its own."""
        folders = {key: self._data_folders(key) for key in keys}
        for key in keys:
            self._remove_marker(self._entry_path(key))
        busy = self._in_flight_keys(time.time())
        freed = 0
        for key in keys:
            if key in busy:
                log.info("cache entry %s: a rank that found it before it went is copying it; its data stays", key)
                continue
            for folder, (size, _) in folders[key].items():
                remove_tree(self.fs, folder)
                freed += size
            self._remove_empty(join(self.path, DATA, key))  # unless another writer is storing the key anew
        if keys:
            log.info("cache %s: removed %s, %d bytes", self.location, counted(len(keys), "entry", "entries"), freed)
        return CacheCleaning(entries=len(keys), bytes=freed)

    def _remove_orphans(self, now: float) -> CacheCleaning:
        """The writers' data folders of keys with no marker whose every file is ``IN_FLIGHT_SECONDS`` old: left by
        a writer that died before its marker, or by a removal a reader held up."""
        marked = set(self._keys())
        freed = 0
        for key in list_names(self.fs, join(self.path, DATA)):
            if key in marked or not KEY.fullmatch(key):
                continue
            for folder, (size, newest) in self._data_folders(key).items():
                if now - newest > IN_FLIGHT_SECONDS:
                    remove_tree(self.fs, folder)
                    freed += size
            self._remove_empty(join(self.path, DATA, key))
        return CacheCleaning(entries=0, bytes=freed)

    def _remove_empty(self, folder: str) -> None:
        """A local folder left empty (an object store has none)."""
        if is_local(self.fs):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    # Where things are, and reading them.

    def _entry_path(self, key: str) -> str:
        return join(self.path, ENTRIES, f"{key}.json")

    def _url(self, path: str) -> str:
        return self.location + path[len(self.path.rstrip("/")) :]

    def _keys(self) -> list[str]:
        names = (name.removesuffix(".json") for name in list_names(self.fs, join(self.path, ENTRIES)))
        return [key for key in names if KEY.fullmatch(key)]

    def _data_folders(self, key: str) -> dict[str, tuple[int, float]]:
        """The writers' folders of a key, each with the bytes it holds and when its newest file was written: only
        folders named as a writer names them, holding only plain files (nothing else there is the cache's)."""
        prefix = join(self.path, DATA, key)
        self.fs.invalidate_cache(prefix)
        folders: dict[str, tuple[int, float]] = {}
        foreign = set()
        for path, info in self.fs.find(prefix, detail=True).items():
            name, _, rest = path[len(prefix) + 1 :].partition("/")
            folder = join(prefix, name)
            if not (WRITER.fullmatch(name) and FILE_NAME.fullmatch(rest)):
                foreign.add(folder)
                continue
            size, newest = folders.get(folder, (0, 0.0))
            folders[folder] = (size + int(info.get("size") or 0), max(newest, _modified(info)))
        return {folder: held for folder, held in folders.items() if folder not in foreign}

    def _uses(self) -> list[tuple[str, CacheUse]]:
        """Every readable use, with its path; a damaged one (one of more than ``USE_BYTES`` too) is logged and left
        out."""
        root = join(self.path, USES)
        self.fs.invalidate_cache(root)
        try:
            paths = [p for p in self.fs.find(root) if p.endswith(".json")]
        except FileNotFoundError:
            return []
        found = []
        for path, data in self._read_all(paths, USE_BYTES):
            try:
                found.append((path, CacheUse.loads(data, self._url(path))))
            except RecordError as exc:
                log.warning("%s; its entries are not kept for it", exc)
        return found

    def _in_flight_keys(self, now: float) -> set[str]:
        return {key for _, use in self._uses() if _in_flight(use, now) for key in use.keys}

    def _read_all(self, paths: list[str], limit: int) -> Iterator[tuple[str, bytes]]:
        """The bytes of many small files, a batch of requests at a time, as they come: a file removed since it was
        listed is left out, and so is one of more than ``limit`` bytes (logged, never read whole)."""
        for batch in in_batches(paths):
            try:
                read = read_many(self.fs, batch, limit)
            except StorageError as exc:  # a folder in a file's place, which no batch read says: each read alone
                if not isinstance(exc.__cause__, IsADirectoryError):
                    raise
                read = {path: self._file_or_none(path, limit) for path in batch}
            for path, data in read.items():
                if data is not None and len(data) > limit:
                    log.warning("%s: more than %s bytes, so damaged; left out", self._url(path), f"{limit:,}")
                elif data is not None:
                    yield path, data

    def _file_or_none(self, path: str, limit: int) -> bytes | None:
        """A small file's first ``limit + 1`` bytes, as ``read_many`` reads them; None (logged) for a folder."""
        try:
            return read_head(self.fs, path, limit + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            log.warning("%s: a folder, so damaged; left out", self._url(path))
            return None

    def _remove_marker(self, path: str, etag: str | None = None) -> None:
        """Remove a marker if it is there, as ``remove_if``; one that is a folder (damaged) whole."""
        try:
            remove_if(self.fs, path, etag)
        except IsADirectoryError:
            remove_tree(self.fs, path)

    def _bounded(self, path: str, limit: int, label: str) -> bytes | None:
        """A small file's bytes, or None when it is not there; ``RecordError`` when it has more than ``limit`` bytes
        (never read whole) or is not a file."""
        try:
            data = read_head(self.fs, path, limit + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise RecordError(self._url(path), "it is a folder", label) from None
        except NotADirectoryError:
            raise RecordError(self._url(path), "a folder of its path is a file", label) from None
        except OSError as exc:
            raise _looped(exc, self._url(path), label) from None
        if len(data) > limit:
            raise RecordError(self._url(path), f"it holds more than {limit:,} bytes", label)
        return data

    def _forget(self, key: str, data: str | None) -> None:
        """Remove a damaged entry: its marker, if it still names the data folder ``data`` (None: if it is still
        unreadable), then that folder. A marker a writer has meanwhile stored anew stays."""
        where = self._entry_path(key)
        try:
            etag = current_etag(self.fs, where) if not is_local(self.fs) else None
            try:
                found = self._bounded(where, MARKER_BYTES, CacheEntry.LABEL)
                still = found is not None and CacheEntry.loads(found, where).data == data
            except RecordError:
                still = data is None
            if still:
                self._remove_marker(where, etag)
            if data is not None:
                remove_tree(self.fs, join(self.path, DATA, key, data))
        except FileNotFoundError:
            pass
        except OSError as exc:  # it stays, and is found damaged again by the next reader
            log.warning("%s: could not remove it (%s)", self._url(where), exc)


def _looped(exc: OSError, url: str, label: str) -> Exception:
    """A symbolic link loop on a record's path (the cache's folder itself may be one) as a record that cannot be
    read, in one line; any other error as it is."""
    if exc.errno == errno.ELOOP:
        return RecordError(url, "a symbolic link loop is on its path", label)
    return exc


def _differences(local: Mapping[str, Path], recorded: Mapping[str, FileSum]) -> str | None:
    """How the fetched files differ from what the marker records, or None."""
    for name, path in local.items():
        size, want = path.stat().st_size, recorded[name]
        if size != want.bytes:
            return f"{name} holds {size} bytes, its marker {want.bytes}"
        if file_checksum(path, algorithm=want.algorithm) != want.checksum:
            return f"{name} does not have the {want.algorithm} its marker records"
    return None


@dataclass(frozen=True, slots=True)
class _Shown:
    """What a listing takes of a marker."""

    bytes: int
    created: float
    source: str
    tokens: int


def _shown(data: bytes, url: str) -> _Shown:
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
    return _Shown(sum(sizes), float(created), source, tokens)


def _builds_there(runs: set[str], storage_options: StorageOptions | None) -> dict[str, bool]:
    """Whether each build's ``_RUN.json`` is still there. A storage that cannot be read from here (a build of
    another output, whose credentials this one has not) is logged once, and its builds count as there: their
    entries are kept, for a build that can read it to clean."""
    there, unreadable = {}, set()
    for url in sorted(runs):
        storage = _storage_of(url)
        if storage in unreadable:
            there[url] = True
            continue
        try:
            there[url] = _exists(url, storage_options)
        except Exception as exc:  # no credentials for it, no filesystem for its protocol, a store that is down
            unreadable.add(storage)
            log.warning(
                "cache retention: cannot tell whether the builds on %s are still there (%s: %s); the entries they "
                "used are kept",
                storage,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "no details",
            )
            there[url] = True
    return there


def _storage_of(url: str) -> str:
    """The store a URL is on, as retention names it: ``s3://bucket``, or the path itself on this machine."""
    protocol, path = fsspec.core.split_protocol(url)
    return f"{protocol}://{path.split('/', 1)[0]}" if protocol else url


def _exists(url: str, storage_options: StorageOptions | None) -> bool:
    fs, path = open_fs(url, storage_options)
    with reaching(url):
        fs.invalidate_cache(path)
        return fs.exists(path)


def _in_flight(use: CacheUse, now: float) -> bool:
    return use.finished is None and now - use.started < IN_FLIGHT_SECONDS


def _modified(info: dict[str, Any]) -> float:
    moment = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
    return moment.timestamp() if hasattr(moment, "timestamp") else float(moment)


def _sum(*cleanings: CacheCleaning) -> CacheCleaning:
    return CacheCleaning(entries=sum(c.entries for c in cleanings), bytes=sum(c.bytes for c in cleanings))
