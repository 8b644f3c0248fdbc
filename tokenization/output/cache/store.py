"""The cache's folder and its three parts (markers, data, uses), and the bounded reads every part makes of them: a
record is read up to a limit and never whole beyond it, a batch of them at a time, and a damaged one (too large, a
folder in its place, a link loop on its path) is a ``RecordError`` or left out, never a crash of the build."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator

from tokenization.errors import StorageError
from tokenization.output.cache.names import DATA, ENTRIES, FILE_NAME, KEY, USES, WRITER, marker_name
from tokenization.records import RecordError
from tokenization.storage.concurrent import in_batches
from tokenization.storage.folder import Condition, Folder, NotAFile, PutMode

log = logging.getLogger("tokenization.output.cache")

_UNWRITABLE: set[str] = set()  # the caches whose write failed in this process, said once


class Store:
    """The cache in the folder ``at``, as its parts see it: where each of its files is, and how each is read."""

    def __init__(self, at: Folder):
        self.at = at
        self.location = at.location or at.url  # "/" is a location too
        self.entries, self.data, self.uses = at.sub(ENTRIES), at.sub(DATA), at.sub(USES)
        self.read_only = False  # set by the first write that fails: storing is best effort, reading goes on

    def unwritable(self, exc: OSError) -> None:
        """A write that failed (a read-only folder or store, no permission, a full disk): said once, then this
        cache only reads."""
        if self.location not in _UNWRITABLE:
            log.warning("cache %s cannot be written (%s): entries are read, none stored", self.location, exc)
        _UNWRITABLE.add(self.location)
        self.read_only = True

    def marker_keys(self) -> list[str]:
        """The keys of the markers in ``entries/``, by their names (nothing else there is an entry)."""
        names = (name.removesuffix(".json") for name in self.entries.list())
        return [key for key in names if KEY.fullmatch(key)]

    def marker_url(self, key: str) -> str:
        return self.entries.url_of(marker_name(key))

    def data_folders(self, key: str) -> dict[str, tuple[int, float]]:
        """The writers' folders of a key, by name, each with the bytes it holds and when its newest file was
        written: only folders named as a writer names them, holding only plain files (nothing else there is the
        cache's)."""
        folders: dict[str, tuple[int, float]] = {}
        foreign = set()
        for inner, (size, written) in self.data.sub(key).found().items():
            name, _, rest = inner.partition("/")
            if not (WRITER.fullmatch(name) and FILE_NAME.fullmatch(rest)):
                foreign.add(name)
                continue
            held, newest = folders.get(name, (0, 0.0))
            folders[name] = (held + size, max(newest, written))
        return {name: held for name, held in folders.items() if name not in foreign}

    def bounded(self, folder: Folder, name: str, limit: int, label: str) -> bytes | None:
        """A small file's bytes, or None when it is not there; ``RecordError`` when it has more than ``limit`` bytes
        (never read whole) or is not a file."""
        url = folder.url_of(name)
        try:
            data = folder.head(name, limit + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise RecordError(url, "it is a folder", label) from None
        except NotADirectoryError:
            raise RecordError(url, "a folder of its path is a file", label) from None
        except NotAFile:
            raise RecordError(url, "it is not a regular file (a FIFO, a device or a socket)", label) from None
        except OSError as exc:
            raise _looped(exc, url, label) from None
        if len(data) > limit:
            raise RecordError(url, f"it holds more than {limit:,} bytes", label)
        return data

    def read_all(self, folder: Folder, names: list[str], limit: int) -> Iterator[tuple[str, bytes]]:
        """The bytes of many small files, a batch of requests at a time, as they come: a file removed since it was
        listed is left out, and so is one of more than ``limit`` bytes (logged, never read whole)."""
        for batch in in_batches(names):
            try:
                read = folder.read_many(batch, limit)
            except StorageError as exc:  # a folder (or a FIFO) in a file's place, which no batch read says: each alone
                if not isinstance(exc.__cause__, (IsADirectoryError, NotAFile)):
                    raise
                read = {name: self.file_or_none(folder, name, limit) for name in batch}
            for name, data in read.items():
                if data is not None and len(data) > limit:
                    log.warning("%s: more than %s bytes, so damaged; left out", folder.url_of(name), f"{limit:,}")
                elif data is not None:
                    yield name, data

    def file_or_none(self, folder: Folder, name: str, limit: int) -> bytes | None:
        """A small file's first ``limit + 1`` bytes, as ``Folder.read_many`` reads them; None (logged) for a
        folder, a FIFO, a device or a socket."""
        try:
            return folder.head(name, limit + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            log.warning("%s: a folder, so damaged; left out", folder.url_of(name))
            return None
        except NotAFile:
            log.warning(
                "%s: not a regular file (a FIFO, a device or a socket), so damaged; left out", folder.url_of(name)
            )
            return None

    def remove_marker(self, key: str, condition: Condition = PutMode.OVERWRITE) -> None:
        """Remove a marker if it is there (only its version ``condition`` names); one that is a folder (damaged)
        whole."""
        try:
            self.entries.remove(marker_name(key), condition)
        except IsADirectoryError:
            self.entries.sub(marker_name(key)).remove_all()


def _looped(exc: OSError, url: str, label: str) -> Exception:
    """A symbolic link loop on a record's path (the cache's folder itself may be one) as a record that cannot be
    read, in one line; any other error as it is."""
    if exc.errno == errno.ELOOP:
        return RecordError(url, "a symbolic link loop is on its path", label)
    return exc
