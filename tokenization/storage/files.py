"""Storage on any fsspec URL: atomic publication of finished files, S3-safe uploads, and write errors that say
where.

A reader must never see half a file. Locally a file is written under a temporary name and renamed; on an object
store an object only appears once its upload completes, so it is uploaded to its final key. A write that fails
removes its temporary file and raises :class:`WriteError`, which names the file and, locally, what the error alone
does not say: the filesystem and its free space when it is full (a bare ``[Errno 28] No space left on device`` names
neither), or that the location is on one of the kernel's virtual filesystems, where no build can write.

Private to ``storage``: the layers above reach a store through ``folder.Folder`` (and ``concurrent``); ``make lint``
fails on an import of this module from outside the package (``scripts/check_layers.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import itertools
import math
import os
import shutil
import stat
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from tokenization.errors import StorageError, WriteError
from tokenization.storage.checksums import READ_BYTES
from tokenization.storage.disk import DISK
from tokenization.storage.locations import LOCAL_SCHEMES, split_protocol

if TYPE_CHECKING:
    import fsspec

MIB = 1 << 20
# S3 serves ~3,500 PUT-class requests a second a prefix: with 8 MiB parts, 1,024 ranks uploading at once made
# ~5,400 (docs/scaling.md); 64 MiB parts make 8x fewer, and a file under two parts is one PUT.
MIN_PART_SIZE = 64 * MIB
# A file moves to or from S3 over several connections at once (s3fs's ranged GETs and multipart parts): one stream
# reaches a fraction of a worker's network. Bounded: at most TRANSFER_STREAMS requests, and TRANSFER_BUFFER bytes
# held, a file. A deployment sets the streams with TOKENIZATION_S3_STREAMS (1: one connection a file).
TRANSFER_STREAMS = max(1, int(os.environ.get("TOKENIZATION_S3_STREAMS") or 8))
TRANSFER_BUFFER = 256 * MIB
MAX_PARTS = 10_000
PART_HEADROOM = 0.9  # stay well inside the 10,000-part limit of S3 multipart uploads
TEMPORARY_MARK = ".tmp-"  # in the name of every temporary file this package writes beside a final one
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing dirty pages out, do not wait
FALLOC_FL_KEEP_SIZE = 1  # <linux/falloc.h>: allocate blocks past a file's end, its size unchanged
S3_PROTOCOLS = ("s3", "s3a")
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP)  # a hard link refused: copy instead
T = TypeVar("T")
U = TypeVar("U")
_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None  # the C library the interpreter runs on


StorageOptions = Mapping[str, Mapping[str, Any]]  # protocol -> the filesystem's keyword arguments: {"s3": {"key": ...}}


def open_fs(url: str, options: StorageOptions | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path within it for a local path or an fsspec URL, opened with ``options`` for its
    protocol (credentials, endpoint; None: the environment's). Nothing ambient chooses them: whoever opens a URL
    says with what, so two stages or two web requests in one process never see each other's. A local path is the
    ``Disk``'s, with no fsspec imported (5 us, not url_to_fs's 35-90)."""
    protocol = split_protocol(str(url))[0] or "file"
    given = dict((options or {}).get(protocol, {}))
    if protocol in LOCAL_SCHEMES and not given and "::" not in str(url):
        return _LOCAL, _LOCAL._strip_protocol(str(url))
    import fsspec

    if protocol not in S3_PROTOCOLS:
        return fsspec.core.url_to_fs(str(url), **given)
    # s3fs reads a whole object over its max_concurrency connections, 10 by default, and so first asks for its
    # size: a HEAD before each GET of every record. The transfers that want several connections ask for them.
    given.setdefault("max_concurrency", 1)
    fs = _shared_s3(protocol, given)
    return fs, fs._strip_protocol(str(url))


_LOCAL = cast("fsspec.AbstractFileSystem", DISK)  # fsspec's calls, on os: what a local path with no options opens
_S3_INSTANCES: dict[str, fsspec.AbstractFileSystem] = {}
_S3_LOCK = threading.Lock()


def _shared_s3(protocol: str, options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    """One S3 filesystem a process and set of options, whichever thread asks. fsspec caches an instance a thread,
    so each of ``map_concurrently``'s threads built its own client (~0.3 s of CPU under the interpreter lock): the
    reads meant to overlap ran one after another. s3fs runs every request on its own event loop, which any thread
    may call."""
    import fsspec

    key = fsspec.utils.tokenize(os.getpid(), protocol, options)
    with _S3_LOCK:
        if key not in _S3_INSTANCES:
            _S3_INSTANCES[key] = fsspec.filesystem(protocol, **options)
        return _S3_INSTANCES[key]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local filesystem: ``Disk``, or fsspec's own, which a local URL with options opens."""
    return "file" in _protocols(fs)


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in _protocols(fs)


def join(base: str, *parts: str) -> str:
    return "/".join([str(base).rstrip("/"), *parts])


def part_size(file_size: int, smallest: int = MIN_PART_SIZE) -> int:
    """Multipart part size for a file, so that no upload ever needs more than ~9,000 parts."""
    needed = math.ceil(file_size / (MAX_PARTS * PART_HEADROOM))
    return max(smallest, math.ceil(needed / MIB) * MIB)


# The write errors that the filesystem's free space (or a quota, or its largest file) explains
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# The kernel's virtual filesystems: they hold no files of a build's (creating one fails, often as "No such file")
VIRTUAL_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "configfs", "pstore"}
    | {"bpf", "mqueue", "fusectl", "binfmt_misc", "efivarfs", "selinuxfs", "autofs", "rpc_pipefs", "nsfs"}
)


def _mount_of(path: str | Path) -> Path:
    mount = Path(os.path.abspath(path))
    while not mount.exists() or not os.path.ismount(mount):
        if mount.parent == mount:
            break
        mount = mount.parent
    return mount


def _filesystem_type(mount: Path) -> str | None:
    """The type of the filesystem mounted at ``mount`` (``/proc/mounts``; None where there is none)."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    types = [fields[2] for fields in map(str.split, lines) if len(fields) > 2 and fields[1] == str(mount)]
    return types[-1] if types else None  # the last mount there hides the others


def filesystem_of(path: str | Path) -> str:
    """Where a local path lives: its mount point and the space left there, for error messages."""
    mount = _mount_of(path)
    try:
        stat = os.statvfs(mount)
    except OSError:
        return f"filesystem {mount}"
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    return f"filesystem {mount}: {free / MIB:,.1f} MiB free of {total / MIB:,.1f} MiB"


def write_error(exc: OSError, path: str | Path, local: bool = True) -> WriteError:
    """``exc`` raised while writing ``path``, as an error that says which file, and what is wrong where the
    message alone does not: the filesystem and its free space when it is full (or a quota or its largest file is
    reached), that the
    location is none a build can write to when it is on one of the kernel's virtual filesystems (``/proc``,
    ``/sys``: "No such file or directory" there means "no file can be made here")."""
    if isinstance(exc, WriteError):
        return exc
    reason = exc.strerror or str(exc)
    message = f"{path}: {reason}"  # one argument: printed as it is, without "[Errno n]"
    if local and exc.errno in NO_ROOM:
        message += f" ({filesystem_of(path)})"
    elif local and (kind := _filesystem_type(mount := _mount_of(path))) in VIRTUAL_FILESYSTEMS:
        message = (
            f"{path}: a location the build cannot write to: {mount} is the kernel's {kind} filesystem, not storage "
            f"({reason}); choose an output on a disk or an object store"
        )
    error = WriteError(message)
    error.errno = exc.errno or errno.EIO
    return error


@contextmanager
def writing(path: str | Path, local: bool = True) -> Iterator[None]:
    """Turn an ``OSError`` raised inside into a :class:`WriteError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise write_error(exc, path, local) from exc


def temporary_name(dest: str, tmp_dir: Path | None = None) -> str:
    """A name no other writer uses, on the same filesystem as ``dest`` (so that a rename publishes it)."""
    name = f".{os.path.basename(dest)}{TEMPORARY_MARK}{uuid.uuid4().hex[:12]}"
    return str((tmp_dir or Path(os.path.dirname(dest))) / name)


def move_into_place(src: Path, fs: fsspec.AbstractFileSystem, dest: str, tmp_dir: Path | None = None) -> None:
    """Move a finished local file to its final place, atomically for readers. ``tmp_dir`` (on the destination's
    filesystem) holds the copy when a rename cannot cross filesystems."""
    if is_local(fs):
        with writing(dest):
            fs.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                os.replace(src, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                tmp = temporary_name(dest, tmp_dir)
                try:
                    shutil.copyfile(src, tmp)
                    os.replace(tmp, dest)
                finally:
                    _unlink(tmp)
                src.unlink()
        return
    upload(src, fs, dest)
    src.unlink()


def upload(src: Path, fs: fsspec.AbstractFileSystem, dest: str) -> None:
    """Copy a finished local file to an object store; the object appears only once its upload completes. On S3,
    parts of ``part_size`` go up as many at once as ``TRANSFER_BUFFER`` holds, at most ``TRANSFER_STREAMS``."""
    with writing(dest, local=False):
        if is_s3(fs):
            part = part_size(src.stat().st_size)
            streams = max(1, min(TRANSFER_STREAMS, TRANSFER_BUFFER // part))
            fs.put_file(str(src), dest, chunksize=part, max_concurrency=streams)
        else:
            fs.put_file(str(src), dest)


def download(fs: fsspec.AbstractFileSystem, src: str, dest: Path) -> None:
    """Copy a remote file to local disk; on S3 over ``TRANSFER_STREAMS`` ranged GETs at once, each of an equal
    share of ``TRANSFER_BUFFER``."""
    if is_s3(fs):
        fs.get_file(src, str(dest), chunksize=TRANSFER_BUFFER // TRANSFER_STREAMS, max_concurrency=TRANSFER_STREAMS)
    else:
        fs.get_file(src, str(dest))


def link_or_copy(src: Path, dest: Path) -> None:
    """``dest`` as a second name of the finished file ``src`` (a hard link: no byte is copied, and removing either
    name leaves the other whole), or, across filesystems or where links are refused, as a copy flushed to disk. A
    missing ``src`` raises ``FileNotFoundError`` as it is; ``dest``'s folder is made when missing. The files must
    never be written again through either name."""
    for made in (False, True):  # its folder made only when the link finds none: a stat and a mkdir a file saved
        try:
            os.link(src, dest)
            return
        except FileNotFoundError:
            if made or dest.parent.is_dir():
                raise
            with writing(dest):
                dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno not in NO_LINK:
                raise write_error(exc, dest) from exc
            break
    with open(src, "rb") as source, writing(dest), open(dest, "wb") as target:
        shutil.copyfileobj(source, target, READ_BYTES)
        target.flush()
        os.fsync(target.fileno())


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing a range of a file to disk now, without waiting (Linux ``sync_file_range``; elsewhere the final
    fsync does it all), so the disk works while the caller computes: the fsync closing a 960 MB file then waits
    ~0 s instead of ~0.45 s. The pages stay cached; fsync is still what makes the file durable."""
    if _LIBC is not None:
        _LIBC.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), SYNC_FILE_RANGE_WRITE)


def reserve_space(fd: int, length: int) -> bool:
    """Allocate the blocks of a file about to be written whole, ``length`` bytes, its size unchanged (Linux
    ``fallocate``): its appends then skip the filesystem's allocation a page at a time (ext4's delayed allocation,
    a fifth of a write's CPU: writing and syncing 960 MB took 0.27 s of CPU and 0.50 s, 0.21 s and 0.45 s with
    it). A hint: False where the platform or the filesystem has none. Blocks left past the end when fewer bytes
    come are freed by truncating the file at its size (``os.ftruncate``)."""
    if _LIBC is None or length <= 0:
        return False
    return _LIBC.fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_int64(0), ctypes.c_int64(length)) == 0


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, dest: str, data: bytes, tmp_dir: Path | None = None) -> None:
    """Write a small file so that it appears whole or not at all; a failed write leaves nothing behind."""
    if not is_local(fs):
        with writing(dest, local=False):
            fs.pipe_file(dest, data)
        return
    with writing(dest):
        fs.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = temporary_name(dest, tmp_dir)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, dest)
        finally:
            _unlink(tmp)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def list_names(fs: fsspec.AbstractFileSystem, path: str) -> list[str]:
    """Names directly inside a folder, freshly listed (no detail: locally, no stat of each); empty when the folder
    does not exist yet."""
    fs.invalidate_cache(path)
    try:
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


CONCURRENT_READS = 32  # small records read at once: on S3 that many requests in flight (~50 ms each), a few kB each


def read_many(fs: fsspec.AbstractFileSystem, paths: list[str], limit: int | None = None) -> dict[str, bytes | None]:
    """The bytes of these small files, by path, read concurrently where the store can (all in flight at once on
    S3): None for a file that is not there. Callers bound what is held by passing at most ``CONCURRENT_READS``
    paths at a time (``in_batches``), and, with ``limit``, by reading no more than ``limit + 1`` bytes of a file:
    one that gives more is larger than the caller accepts, and was never read whole."""
    if not paths:
        return {}
    if limit is not None and is_local(fs):  # one at a time, as fsspec reads local files anyway
        found = [_attempt(read_head, fs, path, limit + 1) for path in paths]
    else:
        start, end = (None, None) if limit is None else (0, limit + 1)
        found = fs.cat_ranges(list(paths), start, end, on_error="return")  # never a glob, unlike ``cat``
    read: dict[str, bytes | None] = {}
    for path, data in zip(paths, found, strict=True):
        if isinstance(data, Exception) and not isinstance(data, FileNotFoundError):
            raise StorageError(f"{path}: {data}") from data
        read[path] = data if isinstance(data, bytes) else None
    return read


class NotAFile(OSError):
    """A FIFO, a device or a socket where a file was to be read (``read_head``)."""


def read_head(fs: fsspec.AbstractFileSystem, path: str, size: int) -> bytes:
    """The first ``size`` bytes of a file, or all of it when it is smaller, in one request. Locally only what the
    file holds is set aside: a read of ``size`` bytes takes that much memory first, whatever it finds."""
    if not is_local(fs):
        return fs.cat_file(path, start=0, end=size)
    # not blocking: a FIFO put in a record's place would hold ``open`` until a writer came, the build with it
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        found = os.fstat(handle.fileno())
        if stat.S_ISDIR(found.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(found.st_mode):
            raise NotAFile(errno.EINVAL, f"not a regular file (mode {found.st_mode:o})", path)
        return handle.read(min(size, found.st_size + 1))


def _attempt(read: Callable[..., T], *args: object) -> T | Exception:
    """What ``read`` returns, or the error it raised, as ``cat_ranges(on_error="return")`` gives it."""
    try:
        return read(*args)
    except Exception as exc:
        return exc


def map_concurrently(fn: Callable[[T], U], items: Sequence[T], workers: int = CONCURRENT_READS) -> list[U]:
    """``fn`` of each item, in order, on up to ``workers`` threads (for requests that wait, not for computing);
    every item is done, and the first item's error in their order is raised. Up to ``workers`` items, a future
    each, on the executor's threads, which it starts only while none is idle; more, and each of ``workers``
    threads takes the next item itself: a future, its queue and the executor's semaphore cost ~0.1 ms an item
    under a rank's GIL, its threads queuing on the semaphore's lock (a rank of 25,000 one-line hits maps each hit
    twice)."""
    if len(items) <= workers:
        with ThreadPoolExecutor(max(1, workers), thread_name_prefix="storage") as pool:
            futures = [pool.submit(fn, item) for item in items]
            return [future.result() for future in futures]
    done: list[tuple[bool, Any]] = [(False, None)] * len(items)
    taken = itertools.count()  # its ``next`` is atomic: each item is taken once

    def take() -> None:
        while (k := next(taken)) < len(items):
            try:
                done[k] = (True, fn(items[k]))
            except Exception as exc:
                done[k] = (False, exc)

    with ThreadPoolExecutor(workers, thread_name_prefix="storage") as pool:
        for future in [pool.submit(take) for _ in range(workers)]:
            future.result()
    for ok, value in done:
        if not ok:
            raise value
    return [value for _, value in done]


@contextmanager
def meanwhile(fn: Callable[..., U], *args: object) -> Iterator[Future[U]]:
    """``fn(*args)`` on a thread of its own while the body runs (a stage hashes its inputs again as it moves their
    bytes); leaving waits for it."""
    with ThreadPoolExecutor(1, thread_name_prefix="meanwhile") as thread:
        yield thread.submit(fn, *args)


def files_at_once(largest: int) -> int:
    """Files of at most ``largest`` bytes to move at once: as many as ``TRANSFER_BUFFER`` holds, at most
    ``CONCURRENT_READS``. A small file costs a request's wait more than its bytes, and one after another those waits
    are most of the time of a stage that moves many small files (a rank's bucket files, a bucket merge's inputs);
    a large one moves alone, over its own streams."""
    return min(CONCURRENT_READS, max(1, TRANSFER_BUFFER // max(1, largest)))


def in_batches(items: list[T], size: int = CONCURRENT_READS) -> Iterator[list[T]]:
    """``items`` in consecutive lists of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def list_sizes(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, int]:
    """Files directly inside a folder with their sizes, from one fresh listing (one request on an object store)."""
    return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in fresh_listing(fs, path)}


def fresh_listing(fs: fsspec.AbstractFileSystem, path: str) -> list[dict[str, Any]]:
    """fsspec's detailed entries directly inside a folder, listed now (not from its cache); none when it does not
    exist."""
    fs.invalidate_cache(path)
    try:
        return fs.ls(path, detail=True)
    except FileNotFoundError:
        return []


def remove_if_exists(fs: fsspec.AbstractFileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def remove_tree(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Delete a folder and everything in it, taking its path literally: fsspec's recursive ``rm`` expands ``*?[``
    in a path as a glob on object stores (an output ``out?`` would take ``outA``'s files with it), so the path is
    escaped there; locally ``rm`` is a plain ``rmtree``."""
    fs.rm(path if is_local(fs) else glob.escape(path), recursive=True)
    if is_s3(fs):
        _remove_empty_folders(fs, path)


def _remove_empty_folders(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """The folders left of a tree whose objects were all deleted, deepest first. AWS and moto have no folders, only
    keys: once the objects are gone the listing is empty (one LIST, which finds nothing). SeaweedFS keeps each as a
    directory of its filer, listed as a common prefix until a ``DeleteObject`` of ``folder/`` removes it (one of a
    folder that still holds anything changes nothing there)."""
    for entry in fresh_listing(fs, path):
        if entry["type"] == "directory" and entry["name"].rstrip("/") != path.rstrip("/"):
            _remove_empty_folders(fs, entry["name"])
    bucket, key, _ = fs.split_path(path)
    if key:
        fs.call_s3("delete_object", Bucket=bucket, Key=key.rstrip("/") + "/")
    fs.invalidate_cache(path)


def remove_files(fs: fsspec.AbstractFileSystem, paths: list[str]) -> None:
    """Delete these files with one ``rm`` (on S3, a bulk request of up to 1,000 keys each), taking each path
    literally: one holding ``*?[`` is escaped, which fsspec would otherwise expand as a glob (``remove_tree``)."""
    if paths:
        fs.rm(paths if is_local(fs) else [glob.escape(path) for path in paths])


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
