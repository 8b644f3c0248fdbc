"""One attempt at a time writes a stage's output, and nothing of a failed attempt stays behind.

An output unit of a stage (a rank, a merge, a context shard) is named by its *stem*. Airflow may run two attempts
of one task at once (a zombie and its retry, a Celery message delivered twice), and a person may start a command
twice. Each attempt therefore:

1. takes the stem's **lease**, or is refused with a message naming the holder. On a local output the lease is an
   ``flock`` on ``.{stem}.lock``, which the kernel releases when its process dies. On S3 it is the object
   ``_leases/{stem}.json``, created with ``If-None-Match: *`` and renewed every ``HEARTBEAT_SECONDS`` with
   ``If-Match`` on its ETag; a lease not renewed for ``LEASE_TTL_SECONDS`` belongs to a dead attempt and is taken
   over, again with ``If-Match``, so that two contenders cannot both win;
2. removes its stem's completion marker and what earlier attempts left: their staging folders, and with them
   every temporary file, since temporary files live only there;
3. works in a staging folder named by its own attempt id, on the output's filesystem when that is local, so that
   publishing is a rename;
4. confirms that it still holds the lease, then writes the manifest and, last, the completion marker, which
   names the attempt and lists every published file with its size and sha256.

The marker is written only by the lease holder, after all its files, so it never describes a mix of attempts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import fsspec
import orjson

from tokenization import manifest
from tokenization.errors import reaching
from tokenization.formats.ds import WrittenTokenFile
from tokenization.storage import (
    is_local,
    is_s3,
    join,
    move_into_place,
    open_fs,
    put_if,
    remove_if_exists,
    write_bytes_atomic,
    writing,
)

log = logging.getLogger(__name__)

LEASE_TTL_SECONDS = 300.0  # an object-store lease not renewed for this long belongs to a dead attempt
HEARTBEAT_SECONDS = 30.0  # ten renewals a TTL: a few lost requests never let a live lease expire
STAGING = ".staging"
LEASES = "_leases"
ATTEMPT_MARK = ".attempt-"  # staging folders are {stem}.attempt-{id}


class AttemptConflict(RuntimeError):
    """Another attempt at the same output is alive; the message names it."""


class LeaseLost(RuntimeError):
    """This attempt's lease was taken over (it stalled past the TTL): it must not publish."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough for a person to find the other attempt."""

    attempt: str
    host: str
    pid: int
    owner: str
    since: float

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"attempt {self.attempt} ({self.owner}, host {self.host}, pid {self.pid}, started {started})"


def new_holder(owner: str | None) -> Holder:
    return Holder(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), owner or "command line", time.time())


class FileLease:
    """A local output's lease: ``flock`` on a lock file beside the output, released by the kernel on any exit.

    The lock file is removed on release; a contender that opened it just before then finds, once it holds the
    lock, that the path names another file (or none), and tries again, so two holders never coexist."""

    def __init__(self, out_path: str, stem: str):
        self.path = os.path.join(out_path, f".{stem}.lock")
        self.fd: int | None = None

    def acquire(self, holder: Holder) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _read_holder(os.pread(fd, 4096, 0))
                os.close(fd)
                raise AttemptConflict(_conflict(self.path, other)) from None
            if self._same_file(fd):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, orjson.dumps(asdict(holder)), 0)
        self.fd = fd

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def confirm(self) -> None:
        if self.fd is None or not self._same_file(self.fd):
            raise LeaseLost(f"{self.path}: the lock file was removed while this attempt held it")

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self.fd)
            self.fd = None


class ObjectLease:
    """An object store's lease: a small object created only if absent, renewed only if unchanged.

    On S3 both conditions are enforced by the store (``If-None-Match`` / ``If-Match``). Other object stores are
    checked before writing, which cannot exclude a race: a warning says so."""

    def __init__(self, fs: fsspec.AbstractFileSystem, out_path: str, stem: str):
        self.fs = fs
        self.path = join(out_path, LEASES, f"{stem}.json")
        self.holder: Holder | None = None
        self.etag: str | None = None
        self.lost: str | None = None
        self._body = b""
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self, holder: Holder) -> None:
        if not is_s3(self.fs):
            log.warning("%s: this store has no conditional writes; two attempts at once cannot be excluded", self.path)
        self.holder, self._body = holder, orjson.dumps(asdict(holder))
        current = self._current()
        if current is None:
            self._write(absent=True)
        else:
            other, etag, age = current
            if age < LEASE_TTL_SECONDS:
                raise AttemptConflict(_conflict(self.path, other, age))
            log.warning("%s: taking over the lease of %s, silent for %.0f s", self.path, _who(other), age)
            self._write(etag=etag)
        self._heartbeat = threading.Thread(target=self._renew_until_stopped, name="lease", daemon=True)
        self._heartbeat.start()

    def _current(self) -> tuple[Holder | None, str | None, float] | None:
        """The lease's holder, ETag and seconds since it was last written, or None when there is no lease."""
        self.fs.invalidate_cache(self.path)
        try:
            info = self.fs.info(self.path)
            body = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        modified = info.get("LastModified") or info.get("mtime") or info.get("created")
        written = modified.timestamp() if hasattr(modified, "timestamp") else float(modified or 0)
        return _read_holder(body), info.get("ETag"), max(0.0, time.time() - written)

    def _write(self, *, absent: bool = False, etag: str | None = None) -> None:
        """Write the lease under a condition; a condition that fails means another attempt holds it, unless the
        lease is our own (a write retried after a lost response)."""
        try:
            self.etag = put_if(self.fs, self.path, self._body, absent=absent, etag=etag)
        except FileExistsError as exc:
            current = self._current()
            if current is None or current[0] != self.holder:
                raise AttemptConflict(_conflict(self.path, current[0] if current else None)) from exc
            self.etag = current[1]

    def _renew(self) -> None:
        if not is_s3(self.fs):  # no If-Match: look first
            current = self._current()
            if current is None or current[0] != self.holder:
                raise AttemptConflict(_conflict(self.path, current[0] if current else None))
        self._write(etag=self.etag)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._renew()
            except AttemptConflict as exc:
                self.lost = str(exc)
                return
            except OSError as exc:  # a store that is down for a while: try again at the next beat
                log.warning("%s: lease renewal failed (%s)", self.path, exc)

    def confirm(self) -> None:
        """Renew now: the marker is then written within a TTL of a lease known to be ours."""
        if self.lost is None:
            try:
                self._renew()
            except AttemptConflict as exc:
                self.lost = str(exc)
        if self.lost is not None:
            raise LeaseLost(f"{self.path}: this attempt lost its lease and must not publish: {self.lost}")

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        current = self._current()
        if current is not None and current[0] == self.holder:
            remove_if_exists(self.fs, self.path)


def _read_holder(data: bytes) -> Holder | None:
    try:
        return Holder(**orjson.loads(data))
    except (orjson.JSONDecodeError, TypeError):
        return None


def _who(holder: Holder | None) -> str:
    return holder.describe() if holder else "another attempt"


def _conflict(where: str, other: Holder | None, age: float | None = None) -> str:
    who = _who(other)
    seen = f", last renewed {age:.0f} s ago" if age is not None else ""
    return (
        f"{where}: {who} is writing this output{seen}; two attempts at once would mix their files. "
        f"Wait for it to finish (or, if it is dead, for its lease to lapse: at once for a local output, after "
        f"{LEASE_TTL_SECONDS:.0f} s on an object store), then run again"
    )


@dataclass
class Attempt:
    """A stage's licence to write one stem of an output: its id, a private working folder, and the calls that
    publish into the output."""

    fs: fsspec.AbstractFileSystem
    out_path: str
    stem: str
    holder: Holder
    work: Path
    landing: Path | None  # on the output's filesystem, for local outputs: temporary copies are renamed from here
    lease: FileLease | ObjectLease

    @property
    def id(self) -> str:
        return self.holder.attempt

    def place(self, src: Path, name: str) -> None:
        """Move a finished local file to ``name`` (relative to the output folder)."""
        move_into_place(src, self.fs, join(self.out_path, name), self.landing)

    def place_families(self, written: Iterable[WrittenTokenFile]) -> None:
        """Move every file of each written token-file family into the output, under its own name."""
        for family in written:
            for f in family.files:
                self.place(family.path.with_name(f.name), f.name)

    def write(self, name: str, data: bytes) -> None:
        write_bytes_atomic(self.fs, join(self.out_path, name), data, self.landing)

    def commit(self, record: dict, files: dict[str, dict]) -> None:
        """Write the manifest, then the marker that names this attempt, the manifest's sha256 and every file it
        published (``name -> {bytes, sha256}``): the marker is the last file and only the lease holder writes it."""
        self.lease.confirm()
        data = manifest.dumps(record | {"attempt": self.id})
        self.write(manifest.manifest_name(self.stem), data)
        marker = {
            "manifest": manifest.manifest_name(self.stem),
            "sha256": hashlib.sha256(data).hexdigest(),
            "attempt": self.id,
            "files": files,
        }
        self.lease.confirm()
        self.write(manifest.marker_name(self.stem), orjson.dumps(marker, option=orjson.OPT_SORT_KEYS))


@contextmanager
def attempt_at(
    output: str, stem: str, local_working_dir: str | None = None, owner: str | None = None
) -> Iterator[Attempt]:
    """Take the lease of ``stem`` in ``output``, clear what earlier attempts left, and yield the attempt; its
    staging folder and lease are released on the way out, on failure too."""
    fs, out_path = open_fs(output)
    holder = new_holder(owner)
    lease: FileLease | ObjectLease = FileLease(out_path, stem) if is_local(fs) else ObjectLease(fs, out_path, stem)
    with reaching(output):
        if is_local(fs):
            with writing(out_path):
                fs.makedirs(out_path, exist_ok=True)
        lease.acquire(holder)
    base = _staging_base(fs, output, out_path, local_working_dir)
    landing_base = Path(out_path) / STAGING if is_local(fs) else None
    try:
        for folder in {base, landing_base} - {None}:
            _remove_leftovers(folder, stem)
        remove_if_exists(fs, manifest.marker_path(out_path, stem))  # from now until the new marker: not complete
        work = base / f"{stem}{ATTEMPT_MARK}{holder.attempt}"
        landing = landing_base / f"{stem}{ATTEMPT_MARK}{holder.attempt}" if landing_base else None
        for folder in {work, landing} - {None}:
            with writing(folder):
                folder.mkdir(parents=True)
        try:
            yield Attempt(fs, out_path, stem, holder, work, landing, lease)
        finally:
            for folder in {work, landing} - {None}:
                shutil.rmtree(folder, ignore_errors=True)
                with contextlib.suppress(OSError):  # other stems may still be working there
                    folder.parent.rmdir()
    finally:
        lease.release()


def _staging_base(fs, output: str, out_path: str, local_working_dir: str | None) -> Path:
    """Where attempts at this output stage their files: beside a local output (publishing is then a rename),
    else in a folder of the local working directory (or the system's temporary one) named after the output, so
    that outputs sharing a working directory never meet."""
    if local_working_dir is None and is_local(fs):
        return Path(out_path) / STAGING
    key = hashlib.sha256(str(output).rstrip("/").encode()).hexdigest()[:16]
    root = Path(local_working_dir) if local_working_dir else Path(tempfile.gettempdir()) / "corpus-tokenization"
    return root / key


def _remove_leftovers(folder: Path, stem: str) -> None:
    """The staging folders of earlier attempts at this stem (killed ones included): safe, as we hold the lease."""
    for leftover in folder.glob(f"{stem}{ATTEMPT_MARK}*"):
        log.info("removing %s, left by an earlier attempt", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
