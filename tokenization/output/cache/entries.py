"""An entry, as a rank uses it: looked up by its key, fetched into the rank's working folder and checked file by
file before any is used, or committed (its files into a data folder of the writer's own, then its marker, only where
none is). An entry found damaged is logged and removed (``discard``): its file is tokenized again, never used."""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from tokenization.errors import reaching
from tokenization.output.cache import names
from tokenization.output.cache.names import FILE_NAME, MARKER_BYTES, NOT_THERE, WRITER, marker_name
from tokenization.output.cache.store import Store
from tokenization.output.signing import Signer, signed_part
from tokenization.records import CacheEntry, FileSum, RecordError
from tokenization.storage.checksums import checksum, file_checksum
from tokenization.storage.folder import PutMode, UpdateIf

log = logging.getLogger("tokenization.output.cache")


class Entries:
    """The entries of the cache ``store``; with a ``signer``, every marker is signed, and only signed ones used."""

    def __init__(self, store: Store, signer: Signer | None):
        self.store, self.signer = store, signer

    def lookup(self, key: str) -> CacheEntry | None:
        """The entry stored under ``key``, or None; a damaged marker (one of more than ``MARKER_BYTES`` too) is
        logged and removed, and counts as none."""
        store, url = self.store, self.store.marker_url(key)
        try:
            with reaching(store.location):
                if (data := store.bounded(store.entries, marker_name(key), MARKER_BYTES, CacheEntry.LABEL)) is None:
                    return None
            entry = CacheEntry.loads(data, url)
            if entry.key != key:
                raise RecordError(url, f"it is the entry of key {entry.key}", CacheEntry.LABEL)
            if not WRITER.fullmatch(entry.data) or not all(FILE_NAME.fullmatch(name) for name in entry.files):
                raise RecordError(url, "its data folder or a file is not a plain name", CacheEntry.LABEL)
        except RecordError as exc:
            log.warning("%s; it is removed, and its file tokenized again", exc)
            forget(store, key, None)
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
        folder = self.store.data.sub(entry.key, entry.data)
        local = {name: into / name for name in entry.files}
        try:
            with reaching(self.store.location):
                into.mkdir(parents=True, exist_ok=True)
                for name, path in sorted(local.items()):
                    folder.link_out(name, path)
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

    def load(self, entry: CacheEntry) -> dict[str, bytes] | None:
        """A small entry's files in memory, by name, from its marker (``inline``; a larger entry is ``fetch``ed),
        each checked against its marker's
        size and checksum before any is used. None when one is missing, is no file, or differs: the entry is
        logged and removed, and its file must be tokenized again."""
        found, problem = {}, None
        for name in sorted(entry.files):
            data = self._file(entry, name)
            if isinstance(data, str):
                problem = data
                break
            found[name] = data
        if problem is None:
            return found
        self.discard(entry, problem)
        return None

    def read(self, entry: CacheEntry, name: str) -> bytes | None:
        """One small file of an entry (its index, which a plan reads to choose a mixture's documents), checked
        against its marker's size and checksum; None when it is missing, is no file, or differs (the rank that
        fetches the entry finds the same, and removes it)."""
        if name not in entry.files:
            return None
        data = self._file(entry, name)
        return None if isinstance(data, str) else data

    def _file(self, entry: CacheEntry, name: str) -> bytes | str:
        """One file of an entry, from its marker (``inline``) or its data folder, checked against its marker's
        size and checksum; or how it is missing or differs."""
        recorded = entry.files[name]
        if entry.inline is not None and name in entry.inline:
            try:
                data: bytes | None = base64.b64decode(entry.inline[name], validate=True)
            except ValueError:
                return f"its marker holds {name} in no base64"
        else:
            try:
                with reaching(self.store.location):
                    data = self.store.file_or_none(self.store.data.sub(entry.key, entry.data), name, recorded.bytes)
            except OSError as exc:
                if exc.errno not in NOT_THERE:
                    raise
                return f"{name} is {'missing' if exc.errno == errno.ENOENT else 'a folder, or under a file'}"
        if data is None:
            return f"{name} is missing"
        if len(data) != recorded.bytes:
            return f"{name} holds {len(data)} bytes, its marker {recorded.bytes}"
        if checksum(data, recorded.algorithm) != recorded.checksum:
            return f"{name} does not have the {recorded.algorithm} its marker records"
        return data

    def discard(self, entry: CacheEntry, problem: str, read_as: str | None = None) -> None:
        """Remove an entry found unfit for use (``problem`` says why, in the log): its file is tokenized again.
        ``read_as``: the file as this rank reads it, when known (a renamed file's entry names it as it was)."""
        made = entry.source.name
        of = made if read_as in (None, made) else f"{read_as}, stored from {made}"
        log.warning(
            "cache entry %s (of %s): %s; it is removed, and the file tokenized again",
            self.store.marker_url(entry.key),
            of,
            problem,
        )
        forget(self.store, entry.key, entry.data)

    def commit(self, entry: CacheEntry, files: Mapping[str, Path]) -> CacheEntry | None:
        """Store ``entry`` (whose ``data`` names no folder yet) with these local files, by name: the files into a
        data folder of this writer's own, then the marker, only where none is. Returns the entry as stored, or None
        when another writer's entry (the same bytes, a moment earlier) won, and this one's folder is removed. A
        store that fails is logged, and the rank goes on without it."""
        store = self.store
        if store.read_only:
            return None
        entry = replace(entry, data=uuid.uuid4().hex[:12], created=time.time(), inline=_inline(entry, files))
        if self.signer is not None:
            entry = replace(entry, signature=self.signer.sign(signed_part(entry.to_json())))
        folder = store.data.sub(entry.key, entry.data)
        try:
            with reaching(store.location):
                for name, path in files.items() if entry.inline is None else ():  # a small entry: its marker alone
                    folder.link_in(path, name)
                store.entries.put(marker_name(entry.key), entry.dumps(), PutMode.CREATE)
            return entry
        except FileExistsError:
            log.info("%s: stored by another writer a moment earlier", store.marker_url(entry.key))
        except OSError as exc:  # a write error or an unreachable store (StorageError) alike
            log.warning("%s: not stored in the cache (%s); the build goes on without it", entry.source.name, exc)
        with contextlib.suppress(OSError):
            folder.remove_all()
        return None


def forget(store: Store, key: str, data: str | None) -> None:
    """Remove a damaged entry: its marker, if it still names the data folder ``data`` (None: if it is still
    unreadable), then that folder. A marker a writer has meanwhile stored anew stays."""
    url = store.marker_url(key)
    try:
        # the version it has now: a removal changes no marker stored anew since; one with none (a folder in its
        # place, which keeps no version) goes as it is found
        condition = store.entries.version(marker_name(key))
        if not isinstance(condition, UpdateIf):
            condition = PutMode.OVERWRITE
        try:
            found = store.bounded(store.entries, marker_name(key), MARKER_BYTES, CacheEntry.LABEL)
            still = found is not None and CacheEntry.loads(found, url).data == data
        except RecordError:
            still = data is None
        if still:
            store.remove_marker(key, condition)
        if data is not None:
            store.data.sub(key, data).remove_all()
    except FileNotFoundError:
        pass
    except OSError as exc:  # it stays, and is found damaged again by the next reader
        log.warning("%s: could not remove it (%s)", url, exc)


def _inline(entry: CacheEntry, files: Mapping[str, Path]) -> dict[str, str] | None:
    """A small entry's files, to be held in its marker (base64), in place of a data folder: a hit of it is then one
    read."""
    if entry.bytes > names.INLINE_BYTES:
        return None
    return {name: base64.b64encode(path.read_bytes()).decode("ascii") for name, path in sorted(files.items())}


def _differences(local: Mapping[str, Path], recorded: Mapping[str, FileSum]) -> str | None:
    """How the fetched files differ from what the marker records, or None."""
    for name, path in local.items():
        size, want = path.stat().st_size, recorded[name]
        if size != want.bytes:
            return f"{name} holds {size} bytes, its marker {want.bytes}"
        if file_checksum(path, algorithm=want.algorithm) != want.checksum:
            return f"{name} does not have the {want.algorithm} its marker records"
    return None
