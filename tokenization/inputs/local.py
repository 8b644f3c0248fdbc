"""A local input file as ``stat`` sees it (``LocalFile``): what it is however its path is spelled, what tells a
change, and the words for what else a path may be (a folder, a device, a link loop)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any

from tokenization.inputs.formats import InputError

MTIME = "mtime_ns"  # a local file's identity starts with it


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A local file as ``stat`` sees it through its links: what it is (``device`` and ``inode``: every path to one
    file, a symlink, a hard link or a ``..``, gives the same pair), and what tells a change (``size``, ``mtime_ns``,
    ``ctime_ns``). Only a regular file is one (``of``)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str) -> LocalFile:
        """The regular file at ``path`` (links followed), or :class:`InputError` saying what else is there: a device
        or a FIFO would be read forever, a link loop or a dangling link not at all."""
        try:
            st = os.stat(path)
        except OSError as exc:
            raise InputError(f"{_shown(path)} {_unreachable(path, exc)}; {ONLY_REGULAR}") from None
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{_shown(path)} is {_kind(st.st_mode)}; {ONLY_REGULAR}")
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @classmethod
    def listed(cls, path: str, info: dict[str, Any]) -> LocalFile:
        """``of``, from what a local listing saw of ``path`` (``storage.disk``'s ``info``) when that was a regular
        file, not a link: its ``stat`` already (a plan of 100,000 files took each's twice)."""
        if info.get("type") == "file" and not info.get("islink") and "mtime_ns" in info:
            return cls(info["dev"], info["ino"], info["size"], info["mtime_ns"], info["ctime_ns"])
        return cls.of(path)

    @property
    def key(self) -> tuple[int, int]:
        """What the file is, however its path is spelled."""
        return self.device, self.inode

    @property
    def identity(self) -> str:
        """The identity a listing records (``InputFile.identity``)."""
        return f"{MTIME}={self.mtime_ns},ctime_ns={self.ctime_ns},ino={self.inode}"


ONLY_REGULAR = "only regular files (or links to them) are read as input: remove it, or name the files to read"
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), f"not a regular file (mode {mode:o})")


def _unreachable(path: str, exc: OSError) -> str:
    """Why ``stat`` found no file at ``path``, which a listing showed: a link loop, a dangling link, or another
    error (as the system words it)."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop"
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return "is a dangling symbolic link"
    return f"cannot be read ({exc.strerror or exc})"


def _shown(path: str) -> str:
    """A path, and where it links to when it is a symbolic link."""
    try:
        return f"{path} (a symbolic link to {os.readlink(path)})"
    except OSError:
        return path
