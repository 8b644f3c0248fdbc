"""What an input spec names on storage: the files a glob matches, every file under a folder, or the file named,
each by its path with what its store says of it (``info``: its size, and its ETag or mtime), and its URL. The
inputs layer lists through it (``inputs.listing``), never through fsspec itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tokenization.storage.disk import DISK
from tokenization.storage.files import StorageOptions, is_local, open_fs
from tokenization.storage.locations import GLOB_CHARS, glob_folder

if TYPE_CHECKING:
    import fsspec

Info = dict[str, Any]  # what a store says of a file: fsspec's ``info``


class Unlistable(OSError):
    """A local folder under the spec that cannot be listed (``folder``: its path): a listing never leaves out,
    without a word, what it could not read."""

    def __init__(self, folder: str, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.folder = folder


@dataclass(frozen=True)
class Matched:
    """The files ``spec`` names (``files``: info by path), and what it named: a ``glob``, a ``folder`` (``root``:
    the path below which names are the files' own, a glob's fixed part for a glob), a ``file``, or nothing
    (``missing``; ``link``: a local symbolic link there, dangling or in a loop)."""

    kind: Literal["glob", "folder", "file", "missing"]
    root: str
    files: dict[str, Info]
    local: bool
    link: bool
    _fs: fsspec.AbstractFileSystem

    def url(self, path: str) -> str:
        """The URL of a file listed here: a local one's path as it is, an object's with its protocol."""
        return path if self.local else self._fs.unstrip_protocol(path)


def matched(spec: str, storage_options: StorageOptions | None) -> Matched:
    """What ``spec`` names. A path that holds a glob character but exists is what it names (``data [v2]/`` may be
    a real folder), not a glob."""
    fs, path = open_fs(spec, storage_options)
    local = is_local(fs)
    if any(ch in path for ch in GLOB_CHARS) and not fs.exists(path):
        files = {p: i for p, i in fs.glob(path, detail=True).items() if i["type"] != "directory"}
        return Matched("glob", glob_folder(path), files, local, False, fs)
    if fs.isdir(path):
        return Matched("folder", path, _files_under(fs, path), local, False, fs)
    if fs.exists(path):
        return Matched("file", path, {path: fs.info(path)}, local, False, fs)
    return Matched("missing", path, {}, local, local and os.path.islink(path), fs)


def local_folder_files(spec: str, storage_options: StorageOptions | None) -> tuple[str, list[str]] | None:
    """When ``spec`` names a local folder (not a glob), its path and the paths of every file under it, by their
    names alone (``Disk.names_under``: no ``stat`` a file, which ``matched`` makes); else, or when a folder under it
    cannot be listed, None."""
    fs, path = open_fs(spec, storage_options)
    if not is_local(fs) or any(ch in path for ch in GLOB_CHARS) or not os.path.isdir(path):
        return None
    try:
        return path, DISK.names_under(path)
    except OSError:
        return None


def _files_under(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Info]:
    """Every file under the folder ``path``, as ``fs.find(path, detail=True)`` gives them. A local folder is listed
    by ``Disk.find``, which never recurses a Python call a level, and a folder it cannot list is an error
    (``Unlistable``), not left out without a word. An object store lists the whole prefix at once, in pages."""
    return DISK.find(path, unlistable=_unlistable) if is_local(fs) else fs.find(path, detail=True)


def _unlistable(folder: str, exc: OSError) -> None:
    raise Unlistable(folder, exc) from None
