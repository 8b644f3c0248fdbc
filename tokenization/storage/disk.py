"""The local filesystem as ``storage`` uses fsspec's ``LocalFileSystem``, on ``os`` alone: the same paths (absolute,
``file://`` stripped), the same infos and the same errors, without importing fsspec, which with asyncio and its
registry of protocols took ~0.1 s of CPU of every command's start (a third of the tokenize stage's imports). A glob
is fsspec's own (its rules are its own), imported when one is asked for.

Private to ``storage``, as ``files`` is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from os import PathLike
from typing import IO, Any, Literal

Info = dict[str, Any]  # what fsspec's ``info`` says of a path


class Disk:
    """The calls of fsspec's ``LocalFileSystem`` that ``storage`` makes on a local path, with its results."""

    protocol = ("file", "local")

    @classmethod
    def _strip_protocol(cls, path: str | PathLike[str]) -> str:
        """The absolute path of a local path or ``file://`` URL, without a trailing slash (fsspec's rule, POSIX)."""
        path = os.fspath(path)
        for prefix in ("file://", "file:", "local://", "local:"):
            if path.startswith(prefix):
                path = path.removeprefix(prefix)
                break
        if path.startswith("~"):
            path = os.path.expanduser(path)
        elif not path.startswith("/"):
            path = f"{os.getcwd()}/{'' if path == '.' else path.removeprefix('./')}"
        return path.rstrip("/") or "/"

    def info(self, path: str | os.DirEntry[str]) -> Info:
        """What fsspec says of a path (links followed for the size and type, as it follows them)."""
        if isinstance(path, os.DirEntry):
            out = path.stat(follow_symlinks=False)
            link = path.is_symlink()
            kind = (
                "directory"
                if path.is_dir(follow_symlinks=False)
                else "file"
                if path.is_file(follow_symlinks=False)
                else "other"
            )
            size = out.st_size
            if link:
                try:
                    size = path.stat(follow_symlinks=True).st_size
                except OSError:
                    size = 0
            name = self._strip_protocol(path.path)
        else:
            name = self._strip_protocol(path)
            out = os.stat(name, follow_symlinks=False)
            link = stat.S_ISLNK(out.st_mode)
            if link:
                out = os.stat(name, follow_symlinks=True)
            size = out.st_size
            kind = "directory" if stat.S_ISDIR(out.st_mode) else "file" if stat.S_ISREG(out.st_mode) else "other"
        result: Info = {
            "name": name,
            "size": size,
            "type": kind,
            "created": getattr(out, "st_birthtime", out.st_ctime),
            "islink": link,
        }
        for key in ("mode", "uid", "gid", "mtime", "ino", "nlink", "dev", "mtime_ns", "ctime_ns"):
            result[key] = getattr(out, f"st_{key}")  # the last three fsspec does not give: ``inputs.local`` takes them
        if link:
            result["destination"] = os.readlink(name)
        return result

    def ls(self, path: str, detail: bool = False) -> list[Any]:
        """A folder's entries (a file's own), each its path or, with ``detail``, its info; in the order the system
        lists them."""
        path = self._strip_protocol(path)
        found = self.info(path)
        if found["type"] != "directory":
            return [found] if detail else [found["name"]]
        entries: list[Any] = []
        with os.scandir(path) as listing:
            for entry in listing:
                with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                    entries.append(self.info(entry) if detail else self._strip_protocol(entry.path))
        return entries

    def find(
        self, path: str, detail: Literal[True] = True, unlistable: Callable[[str, OSError], object] | None = None
    ) -> dict[str, Info]:
        """Every file under a folder (a file's own), by path, sorted, as fsspec's ``find(detail=True)`` gives them;
        listed a folder at a time from a stack, not by fsspec's ``walk``, which recurses a Python call a level (a
        tree 1,100 deep raised RecursionError). A folder that cannot be listed is left out, as ``walk`` leaves it,
        or handed to ``unlistable`` (which may raise)."""
        path = self._strip_protocol(path)
        found: dict[str, Info] = {}
        folders = [path]
        while folders:
            folder = folders.pop()
            try:
                listing = self.ls(folder, detail=True)
            except OSError as exc:
                if unlistable is not None:
                    unlistable(folder, exc)
                continue
            for info in listing:
                name = info["name"].rstrip("/")
                if info["type"] == "directory" and name != folder:
                    folders.append(name)
                else:
                    found[name] = info
        return dict(sorted(found.items()))

    def names_under(self, path: str) -> list[str]:
        """The paths of every file under a folder, as ``find`` finds them, without its infos: a folder's entries
        from their directory listing alone, no ``stat`` each. A folder that cannot be listed raises."""
        found: list[str] = []
        folders = [self._strip_protocol(path)]
        while folders:
            with os.scandir(folders.pop()) as listing:
                for entry in listing:
                    (folders if entry.is_dir(follow_symlinks=False) else found).append(entry.path)
        return found

    def glob(self, path: str, **options: Any) -> Any:
        """fsspec's glob, its rules its own."""
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem().glob(path, **options)

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
            return True
        except Exception:  # as fsspec: any error is "not there"
            return False

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._strip_protocol(path))

    def isfile(self, path: str) -> bool:
        return os.path.isfile(self._strip_protocol(path))

    def size(self, path: str) -> int:
        return int(self.info(path)["size"])

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def open(self, path: str, mode: str = "rb", **options: Any) -> IO[Any]:
        """The file opened in ``mode`` (fsspec's ``block_size`` and cache options mean nothing to a local file)."""
        text = {key: options[key] for key in ("encoding", "errors", "newline") if key in options}
        return open(self._strip_protocol(path), mode, **text)  # the caller closes it

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        with open(self._strip_protocol(path), "rb") as handle:
            if start is not None:
                handle.seek(start if start >= 0 else max(0, os.fstat(handle.fileno()).st_size + start))
            if end is None:
                return handle.read()
            if end < 0:
                end += os.fstat(handle.fileno()).st_size
            return handle.read(end - handle.tell())

    def cat_ranges(
        self, paths: list[str], starts: int | None, ends: int | None, on_error: str = "return"
    ) -> list[bytes | Exception]:
        """Each file's bytes from ``starts`` to ``ends``, or (``on_error="return"``) the error reading it raised."""
        read: list[bytes | Exception] = []
        for path in paths:
            try:
                read.append(self.cat_file(path, starts, ends))
            except Exception as exc:
                if on_error != "return":
                    raise
                read.append(exc)
        return read

    def rm_file(self, path: str) -> None:
        os.remove(self._strip_protocol(path))

    def rm(self, path: str | list[str], recursive: bool = False) -> None:
        """Delete files, and with ``recursive`` folders with everything in them (never the working folder)."""
        for each in path if isinstance(path, list) else [path]:
            each = self._strip_protocol(each)
            if os.path.isdir(each) and not os.path.islink(each):
                if not recursive:
                    raise ValueError("Cannot delete directory, set recursive=True")
                if os.path.abspath(each) == os.getcwd():
                    raise ValueError("Cannot delete current working directory")
                shutil.rmtree(each)
            else:
                os.remove(each)

    def cp_file(self, src: str, dest: str) -> None:
        """``src`` copied to ``dest`` (a folder made there for a folder); FileNotFoundError when it is neither."""
        src, dest = self._strip_protocol(src), self._strip_protocol(dest)
        if os.path.isfile(src):
            shutil.copyfile(src, dest)
        elif os.path.isdir(src):
            os.makedirs(dest, exist_ok=True)
        else:
            raise FileNotFoundError(src)

    get_file = put_file = cp_file

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing: a local listing is never cached."""


DISK = Disk()
