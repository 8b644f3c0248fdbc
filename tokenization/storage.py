"""Storage on any fsspec URL: atomic publication of finished files, and S3-safe uploads.

A reader must never see half a file. Locally a file is written under a temporary name and renamed;
on an object store an object only appears once its upload completes, so it is uploaded to its final key.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

MIB = 1 << 20
MIN_PART_SIZE = 8 * MIB
MAX_PARTS = 10_000
PART_HEADROOM = 0.9  # stay well inside the 10,000-part limit of S3 multipart uploads


def open_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path within it for a local path or an fsspec URL."""
    fs, path = fsspec.core.url_to_fs(str(url))
    return fs, path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def join(base: str, *parts: str) -> str:
    return "/".join([str(base).rstrip("/"), *parts])


def part_size(file_size: int) -> int:
    """Multipart part size for a file, so that no upload ever needs more than ~9,000 parts."""
    needed = math.ceil(file_size / (MAX_PARTS * PART_HEADROOM))
    return max(MIN_PART_SIZE, math.ceil(needed / MIB) * MIB)


def publish_file(src: Path, fs: fsspec.AbstractFileSystem, dest: str) -> None:
    """Move a finished local file to its final place, atomically for readers."""
    if is_local(fs):
        fs.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.replace(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            tmp = f"{dest}.tmp-{os.getpid()}"
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
            src.unlink()
        return
    size = src.stat().st_size
    if "s3" in _protocols(fs):
        fs.put_file(str(src), dest, chunksize=part_size(size))
    else:
        fs.put_file(str(src), dest)
    src.unlink()


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, dest: str, data: bytes) -> None:
    """Write a small file so that it appears whole or not at all."""
    if is_local(fs):
        fs.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp-{os.getpid()}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    else:
        fs.pipe_file(dest, data)


def list_names(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    """Names directly inside a folder, freshly listed; empty when the folder does not exist yet."""
    fs.invalidate_cache(path)
    try:
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def remove_if_exists(fs: fsspec.AbstractFileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


@contextmanager
def working_dir(
    local_working_dir: str | None, fs: fsspec.AbstractFileSystem, out_path: str, name: str
) -> Iterator[Path]:
    """A clean local directory for one task, removed afterwards (also on failure). It is ``{output}/.staging``
    when the output is local, so that publishing is a rename; else a temporary directory."""
    if local_working_dir:
        path = Path(local_working_dir) / name
    elif is_local(fs):
        path = Path(out_path) / ".staging" / name
    else:
        path = Path(tempfile.mkdtemp(prefix=f"tokenization-{name}-"))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if path.parent.name == ".staging":
            with contextlib.suppress(OSError):  # another task may still be using it
                path.parent.rmdir()
