"""Storage as a value: a ``Folder`` is a URL bound to the options that open it (credentials, endpoint), so that a
read, listing or write through one does not depend on the context it is made in. Whatever addresses a folder (a
stage's output, the cache, the run folder, a listing of token files) takes a Folder; a reader of one file takes its
URL and ``storage_options``, as fsspec's and datatrove's readers do. No options are ever ambient.

Names inside a folder are relative (``"a.ds"``, ``"bucket00007/a.ds"``); ``url_of`` gives the URL that messages
name: a file is a folder and a name, and no caller cuts a URL by hand. Writes are whole or absent (``put``); a
conditional write or removal says its condition with a ``PutMode`` (after obstore's): create only, overwrite, or
update only the version that has an ETag (``UpdateIf``). Whether the store enforces the condition itself (S3's
``If-None-Match`` / ``If-Match``) or it must be looked at first (a race stays, that callers must say they cannot
exclude) is decided here, in ``put`` and ``remove``, and nowhere else.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tokenization.storage.checksums import file_checksum
from tokenization.storage.conditions import current_etag, put_if, remove_if
from tokenization.storage.files import (
    TEMPORARY_MARK,
    NotAFile,
    StorageOptions,
    download,
    fresh_listing,
    is_local,
    is_s3,
    join,
    link_or_copy,
    list_names,
    list_sizes,
    move_into_place,
    open_fs,
    read_head,
    read_many,
    remove_files,
    remove_tree,
    reserve_space,
    start_writeback,
    upload,
    write_bytes_atomic,
    writing,
)

if TYPE_CHECKING:
    import fsspec

__all__ = [
    "TEMPORARY_MARK",
    "Condition",
    "Folder",
    "NotAFile",
    "PutMode",
    "Stamped",
    "StorageOptions",
    "UpdateIf",
    "file_at",
    "reserve_space",
    "start_writeback",
    "writing",
]


class PutMode(Enum):
    CREATE = "create"  # only if no object has the name: FileExistsError otherwise
    OVERWRITE = "overwrite"  # whatever is there


@dataclass(frozen=True)
class UpdateIf:
    """Put mode: replace only the version with this ETag (None: as ``OVERWRITE``, where a store keeps none)."""

    etag: str | None


Condition = PutMode | UpdateIf  # what a put or a removal requires of the version it replaces


@dataclass(frozen=True)
class Stamped:
    """A small file read with its version (the ETag a store enforces ``UpdateIf`` on; elsewhere a digest of its
    bytes, which ``put`` compares before writing) and when it was last written (seconds since the epoch)."""

    data: bytes
    version: str | None
    written: float


def _digest(data: bytes) -> str:
    """The version of a file on a store that keeps no ETag it enforces: its bytes' sha256."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Opened:
    """A folder's filesystem and path, found the first time they are asked for and kept in the folder: what
    ``cached_property`` does, without the lock that Python 3.11's holds for every instance of the class while one
    computes (a rank's threads, each opening a hit's input, a folder each, waited on one another there)."""

    def __get__(self, folder: Folder, owner: type | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
        opened = folder.__dict__["_opened"] = open_fs(folder.url.rstrip("/"), folder.options)
        return opened  # kept in the folder's own attributes, which are looked up before this (no ``__set__``)


@dataclass(frozen=True)
class Folder:
    """A folder on a local path or an fsspec URL, with the storage options that open it (None: the environment's
    credentials, as fsspec finds them)."""

    url: str
    options: StorageOptions | None = field(default=None, compare=False, repr=False)

    _opened = _Opened()

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._opened[0]

    @property
    def path(self) -> str:
        """The folder's path within its filesystem."""
        return self._opened[1]

    @property
    def local(self) -> Path | None:
        """The folder as a local path, None on a remote store: what only a local file has (an ``flock``, a rename
        into place, a ``file://`` link) asks for it."""
        return Path(self.path) if self.on_disk else None

    @property
    def on_disk(self) -> bool:
        """Whether the folder is on the local filesystem: ``local``'s question without its ``Path``, which costs
        more than the question where it is asked for each file (a reader of many small token files)."""
        return is_local(self.fs)

    @property
    def enforces_conditions(self) -> bool:
        """Whether the store enforces a write's condition itself (``If-None-Match``, ``If-Match``): elsewhere
        ``put`` and ``remove`` look first, and two writers at once cannot be excluded."""
        return is_s3(self.fs)

    @property
    def location(self) -> str:
        """The folder's URL without a trailing slash: the same string for the same folder however it was given."""
        return self.url.rstrip("/")

    def sub(self, *parts: str) -> Folder:
        """A folder inside this one, opened the same way."""
        return Folder(join(self.url, *parts), self.options)

    def name_of(self, inner: Folder) -> str | None:
        """The name of ``inner`` relative to this folder (``"ranks"``, ``"a/b"``), None when it is not inside."""
        prefix = self.location + "/"
        return inner.location[len(prefix) :] if inner.location.startswith(prefix) else None

    @property
    def at_top(self) -> bool:
        """Whether the folder is at the top of its store (a bucket, a folder of ``/``): it has no parent folder."""
        return not self.path.rstrip("/").rpartition("/")[0]

    def and_above(self) -> Iterator[Folder]:
        """This folder and each folder above it, up to the filesystem's root or the bucket (a local one from its
        absolute path: a relative one is inside the working folder's)."""
        yield self
        url = os.path.abspath(self.path) if self.local is not None else self.location
        while True:
            head, _, name = url.rpartition("/")
            if not name or not head or head.endswith(":/"):
                return
            url = head
            yield Folder(url, self.options)

    def same_as(self, other: Folder) -> bool:
        """Whether two folders are one, however their paths are written (locally, through links too)."""
        if self.local is not None and other.local is not None:
            return os.path.realpath(self.path) == os.path.realpath(other.path)
        return self.location == other.location

    @property
    def parent(self) -> Folder:
        return Folder(self.url.rstrip("/").rpartition("/")[0], self.options)

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rpartition("/")[2]

    def url_of(self, name: str) -> str:
        """The URL of ``name`` in this folder, as messages name it."""
        return join(self.url, name)

    def path_of(self, name: str) -> str:
        """The path of ``name`` within the filesystem."""
        return join(self.path, name)

    def open(self, name: str, mode: str = "rb", **options: Any) -> IO[bytes]:
        return self.fs.open(self.path_of(name), mode, **options)

    def read(self, name: str) -> bytes:
        """A file's bytes; FileNotFoundError when it is not there."""
        return self.fs.cat_file(self.path_of(name))

    def read_many(self, names: list[str], limit: int | None = None) -> dict[str, bytes | None]:
        """Small files read concurrently, by name (``files.read_many``): None for one that is not there."""
        read = read_many(self.fs, [self.path_of(name) for name in names], limit)
        return {name: read[self.path_of(name)] for name in names}

    def version(self, name: str) -> Condition:
        """The condition under which a later ``put`` or ``remove`` of ``name`` changes only the version there now:
        on a store that enforces conditions, ``CREATE`` when there is none and ``UpdateIf`` its ETag (one fresh
        HEAD); elsewhere ``OVERWRITE``, with no request (a look then would exclude no race)."""
        if not self.enforces_conditions:
            return PutMode.OVERWRITE
        etag = current_etag(self.fs, self.path_of(name))
        return PutMode.CREATE if etag is None else UpdateIf(etag)

    def read_versioned(self, name: str) -> tuple[bytes | None, Condition]:
        """A small file's bytes (None when there is none) and ``version``'s condition for replacing them. The
        version is read first, so the bytes are at least as new: an update under it fails if they changed since."""
        condition = self.version(name)
        self.fs.invalidate_cache(self.path_of(name))
        try:
            return self.read(name), condition
        except FileNotFoundError:
            return None, condition

    def read_stamped(self, name: str) -> Stamped:
        """A small file with its version and the time it was last written, fresh; FileNotFoundError when it is not
        there."""
        path = self.path_of(name)
        self.fs.invalidate_cache(path)
        info = self.fs.info(path)
        data = self.fs.cat_file(path)
        version = info.get("ETag") if self.enforces_conditions else _digest(data)
        return Stamped(data, version, _written(info))

    def info(self, name: str) -> dict[str, Any]:
        """What the store says of a file now (fsspec's ``info``: its size, and its ETag or times), asked fresh;
        FileNotFoundError when it is not there."""
        path = self.path_of(name)
        self.fs.invalidate_cache(path)
        return self.fs.info(path)

    def checksum(self, name: str, algorithm: str) -> str:
        """The checksum of a file's bytes (``checksums``: read in bounded pieces)."""
        return file_checksum(self.path_of(name), self.fs, algorithm)

    def head(self, name: str, size: int) -> bytes:
        """The first ``size`` bytes of a file, or all of it when it is smaller, in one request
        (``files.read_head``): a small record read with a bound, never whole when it is larger."""
        return read_head(self.fs, self.path_of(name), size)

    def exists(self, name: str = "", fresh: bool = False) -> bool:
        """Whether ``name`` (or the folder itself) is there; ``fresh``: asked of the store now, not of a listing
        cached earlier in this process (another process may have removed it since)."""
        path = self.path_of(name) if name else self.path
        if fresh:
            self.fs.invalidate_cache(path)
        return self.fs.exists(path)

    def is_folder(self, name: str = "") -> bool:
        """Whether ``name`` (or this folder itself) is a folder of the store (on S3: a prefix that holds objects)."""
        return self.fs.isdir(self.path_of(name) if name else self.path)

    def is_file(self, name: str = "") -> bool:
        """Whether ``name`` (or what this folder's URL names) is a file."""
        return self.fs.isfile(self.path_of(name) if name else self.path)

    def size(self, name: str) -> int:
        """A file's size in bytes; FileNotFoundError when it is not there."""
        return self.fs.size(self.path_of(name))

    def make(self) -> None:
        """Make the folder, where a store has folders (an object store needs none)."""
        self.fs.makedirs(self.path, exist_ok=True)

    def list(self) -> list[str]:
        """Names directly inside, from a fresh listing; empty when the folder does not exist."""
        return list_names(self.fs, self.path)

    def sizes(self) -> dict[str, int]:
        """Files directly inside, with their sizes, from one fresh listing."""
        return list_sizes(self.fs, self.path)

    def folders(self) -> builtins.list[str]:
        """Names of the folders directly inside, from one fresh listing; empty when the folder does not exist."""
        return self._names(folders=True)

    def files(self) -> builtins.list[str]:
        """Names of everything directly inside but folders, from one fresh listing: what a file's removal can remove
        (a folder in a file's name would fail it); empty when the folder does not exist."""
        return self._names(folders=False)

    def _names(self, folders: bool) -> builtins.list[str]:
        entries = fresh_listing(self.fs, self.path)
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if (e["type"] == "directory") == folders]

    def put(
        self, name: str, data: bytes, mode: Condition = PutMode.OVERWRITE, staging: Path | None = None
    ) -> str | None:
        """Write a small file whole, under ``mode``; under a condition, its new version (the store's ETag, or the
        digest ``read_stamped`` gives where the store keeps none it enforces). A failed condition raises
        FileExistsError, and ``UpdateIf`` of a file that is gone FileNotFoundError. ``staging`` (a local folder on
        the same filesystem) holds a local write's temporary file."""
        path = self.path_of(name)
        if mode is PutMode.OVERWRITE:
            write_bytes_atomic(self.fs, path, data, staging)
            return None
        if self.enforces_conditions:
            return put_if(self.fs, path, data, absent=mode is PutMode.CREATE, etag=_etag(mode))
        if mode is PutMode.CREATE:
            put_if(self.fs, path, data, absent=True)  # O_EXCL locally; elsewhere looked at first
        else:
            self._unchanged(name, _etag(mode), missing_ok=False)
            write_bytes_atomic(self.fs, path, data, staging)
        return _digest(data)

    def remove(self, name: str, mode: Condition = PutMode.OVERWRITE) -> None:
        """Delete ``name`` if it is there; under ``UpdateIf``, only that version (FileExistsError if it changed;
        one already gone is no error); under ``CREATE`` (there was none), nothing."""
        if mode is PutMode.CREATE:
            return
        etag = _etag(mode)
        if not self.enforces_conditions and etag is not None and not self._unchanged(name, etag, missing_ok=True):
            return
        remove_if(self.fs, self.path_of(name), etag if self.enforces_conditions else None)

    def _unchanged(self, name: str, version: str | None, missing_ok: bool) -> bool:
        """On a store that enforces no condition: look whether ``name`` still has ``version`` (a digest of its
        bytes) before changing it; FileExistsError if it changed; False (or FileNotFoundError) if it is gone."""
        if version is None:
            return True
        try:
            data = self.read(name)
        except FileNotFoundError:
            if missing_ok:
                return False
            raise FileNotFoundError(f"{self.path_of(name)}: gone, removed by another writer") from None
        if _digest(data) != version:
            raise FileExistsError(f"{self.path_of(name)}: changed by another writer")
        return True

    def delete(self, name: str) -> None:
        """Delete ``name``: FileNotFoundError when it is not there (``remove`` takes that for done)."""
        self.fs.rm_file(self.path_of(name))

    def fetch(self, name: str, dest: Path) -> None:
        """Copy ``name`` to the local file ``dest`` (``files.download``: on S3 over several ranged reads at once)."""
        download(self.fs, self.path_of(name), dest)

    def place(self, src: Path, name: str, staging: Path | None = None) -> None:
        """Move a finished local file to ``name``, atomically for readers (``files.move_into_place``)."""
        move_into_place(src, self.fs, self.path_of(name), staging)

    def remove_files(self, names: builtins.list[str]) -> None:
        """Delete these files at once (one bulk request on S3), each name taken literally; locally, the subfolders
        that held them too, once empty (an object store has no folders to leave behind)."""
        remove_files(self.fs, [self.path_of(name) for name in names])
        if self.local is not None:
            for held in sorted({posixpath.dirname(name) for name in names} - {""}, reverse=True):
                with contextlib.suppress(OSError):  # not empty: it holds more than these
                    os.rmdir(self.local / held)

    def link_in(self, src: Path, name: str) -> None:
        """``name`` as a copy of the finished local file ``src``, which stays: a hard link where the folder is on a
        local filesystem (no byte is copied; neither name may be written again), else an upload."""
        if self.local is not None:
            link_or_copy(src, Path(self.path_of(name)))
        else:
            upload(src, self.fs, self.path_of(name))

    def link_out(self, name: str, dest: Path) -> None:
        """The local file ``dest`` as a copy of ``name``: a hard link where the folder is local (``link_in``), else
        a download (``fetch``)."""
        if self.local is not None:
            link_or_copy(Path(self.path_of(name)), dest)
        else:
            self.fetch(name, dest)

    def remove_if_empty(self) -> None:
        """Remove the folder when it holds nothing, where a store has folders (an object store has none to leave
        behind); one that holds anything, or is gone, stays as it is."""
        if self.local is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)

    def found(self) -> dict[str, tuple[int, float]]:
        """Every file under the folder, by its name relative to it, with its size and when it was last written: one
        fresh listing of the whole tree (a few requests on S3, however deep). Empty when the folder is not there; a
        folder URL that names a file gives that file, as ``""``."""
        self.fs.invalidate_cache(self.path)
        try:
            found = self.fs.find(self.path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        root = self.path.rstrip("/")
        # s3fs gives the folder itself when its listing was empty and a file landed in it before its second look (a
        # folder made by another writer at that moment): a folder, never a file of it
        return {
            path[len(root) + 1 :]: (int(info.get("size") or 0), _written(info))
            for path, info in found.items()
            if info["type"] != "directory"
        }

    def walk(self) -> Iterator[tuple[str, int]]:
        """Every file under the folder, by its name relative to it, with its size: one fresh listing a folder, one
        folder at a time."""
        folders = [""]
        while folders:
            folder = folders.pop()
            for entry in fresh_listing(self.fs, self.path_of(folder) if folder else self.path):
                name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
                inner = f"{folder}/{name}" if folder else name
                if entry["type"] == "directory":
                    folders.append(inner)
                else:
                    yield inner, int(entry.get("size") or 0)

    def remove_all(self) -> None:
        """Delete the folder and everything in it."""
        remove_tree(self.fs, self.path)


def _written(info: dict[str, Any]) -> float:
    """When a file was last written, from its fsspec info (seconds since the epoch; 0 when the store says not)."""
    modified: Any = info.get("LastModified") or info.get("mtime") or info.get("created")
    return modified.timestamp() if hasattr(modified, "timestamp") else float(modified or 0)


def _etag(mode: Condition) -> str | None:
    return mode.etag if isinstance(mode, UpdateIf) else None


def file_at(url: str, options: StorageOptions | None = None) -> tuple[Folder, str]:
    """A file's URL as the folder that holds it and its name (a bare name's folder is the working folder)."""
    head, slash, name = url.rstrip("/").rpartition("/")
    return Folder(head or ("/" if slash else "."), options), name
