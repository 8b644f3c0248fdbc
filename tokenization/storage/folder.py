"""Storage as a value: a ``Folder`` is a URL bound to the options that open it (credentials, endpoint), so that a
read, listing or write through one does not depend on the context it is made in. Whatever addresses a folder (a
stage's output, the cache, the run folder, a listing of token files) takes a Folder; a reader of one file takes its
URL and ``storage_options``, as fsspec's and datatrove's readers do. No options are ever ambient.

Names inside a folder are relative (``"a.ds"``, ``"bucket00007/a.ds"``); ``url_of`` gives the URL that messages
name. Writes are whole or absent (``put``); a conditional write says its condition with a ``PutMode``
(after obstore's): create only, overwrite, or update only the version that has an ETag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import IO, Any

import fsspec

from tokenization.storage.files import (
    StorageOptions,
    is_local,
    is_s3,
    join,
    list_names,
    list_sizes,
    open_fs,
    put_if,
    read_many,
    read_with_etag,
    remove_if,
    remove_tree,
    write_bytes_atomic,
)


class PutMode(Enum):
    CREATE = "create"  # only if no object has the name: FileExistsError otherwise
    OVERWRITE = "overwrite"  # whatever is there


@dataclass(frozen=True)
class UpdateIf:
    """Put mode: replace only the version with this ETag (None: as ``OVERWRITE``, where a store keeps none)."""

    etag: str | None


@dataclass(frozen=True)
class Folder:
    """A folder on a local path or an fsspec URL, with the storage options that open it (None: the environment's
    credentials, as fsspec finds them)."""

    url: str
    options: StorageOptions | None = field(default=None, compare=False, repr=False)

    @cached_property
    def _opened(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return open_fs(self.url.rstrip("/"), self.options)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._opened[0]

    @property
    def path(self) -> str:
        """The folder's path within its filesystem."""
        return self._opened[1]

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    @property
    def is_s3(self) -> bool:
        """Whether the store enforces a write's condition itself (``If-None-Match``, ``If-Match``)."""
        return is_s3(self.fs)

    def sub(self, *parts: str) -> Folder:
        """A folder inside this one, opened the same way."""
        return Folder(join(self.url, *parts), self.options)

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

    def open(self, name: str, mode: str = "rb", **options: Any) -> IO:
        return self.fs.open(self.path_of(name), mode, **options)

    def read(self, name: str) -> bytes:
        """A file's bytes; FileNotFoundError when it is not there."""
        return self.fs.cat_file(self.path_of(name))

    def read_many(self, names: list[str], limit: int | None = None) -> dict[str, bytes | None]:
        """Small files read concurrently, by name (``files.read_many``): None for one that is not there."""
        read = read_many(self.fs, [self.path_of(name) for name in names], limit)
        return {name: read[self.path_of(name)] for name in names}

    def read_with_etag(self, name: str) -> tuple[bytes, str | None]:
        return read_with_etag(self.fs, self.path_of(name))

    def exists(self, name: str = "") -> bool:
        return self.fs.exists(self.path_of(name) if name else self.path)

    def list(self) -> list[str]:
        """Names directly inside, from a fresh listing; empty when the folder does not exist."""
        return list_names(self.fs, self.path)

    def sizes(self) -> dict[str, int]:
        """Files directly inside, with their sizes, from one fresh listing."""
        return list_sizes(self.fs, self.path)

    def put(self, name: str, data: bytes, mode: PutMode | UpdateIf = PutMode.OVERWRITE) -> str | None:
        """Write a small file whole, under ``mode``; its new ETag (None where the store keeps none). A failed
        condition raises FileExistsError (``files.put_if``)."""
        path = self.path_of(name)
        if mode is PutMode.OVERWRITE:
            write_bytes_atomic(self.fs, path, data)
            return None
        if mode is PutMode.CREATE:
            return put_if(self.fs, path, data, absent=True)
        return put_if(self.fs, path, data, etag=mode.etag)

    def remove(self, name: str, if_etag: str | None = None) -> None:
        """Delete ``name`` if it is there; with ``if_etag``, only that version (FileExistsError if it changed)."""
        remove_if(self.fs, self.path_of(name), if_etag)

    def remove_all(self) -> None:
        """Delete the folder and everything in it."""
        remove_tree(self.fs, self.path)
