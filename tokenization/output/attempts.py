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
4. publishes its files, then writes the manifest and, last, the completion marker, which names the attempt and
   lists every published file with its size and checksum.

**Fencing.** An attempt can lose its lease without dying: a process frozen (SIGSTOP, a VM paused, a long GC)
past the TTL is taken over, and wakes up believing it still holds it. So every change an attempt makes to the
output (removing the old marker or a stale file, removing the leftovers of earlier attempts, placing a file,
writing the manifest or the marker) first *confirms* the lease. On S3 that is a renewal with ``If-Match`` on the
ETag this attempt last wrote; each renewal writes a new renewal number, so the ETag changes with every write,
and a takeover in between fails the renewal (412), as a lease deleted by a successor that finished does (404).
Both mean the lease is lost, never a warning, and so does a lease whose renewals kept failing for longer than a
TTL. A renewal right before a change means no contender can take the lease over for a whole TTL after it, so a
change that starts at once is the holder's. A renewal sent less than ``CONFIRM_AFTER`` of a TTL ago is as good
(nine tenths of a TTL are left, where a change starts in milliseconds): a confirmation then renews nothing, so
an attempt that places a thousand files asks S3 for a renewal every few seconds, not one a file. Where S3 can
also make the change itself conditional, it does: a
small file is written (and a stale one removed) only if it still has the ETag seen before the confirmation, and
the marker only if absent, so an attempt frozen between its confirmation and its request finds its successor's
version and stops instead of undoing it. An upload of a token file cannot be made conditional through s3fs: one
that starts within a TTL of a confirmation and is frozen past it may land after the successor's; it has the
same bytes (the same task), and the successor's marker lists their checksums for ``verify`` to check. Locally the
``flock`` cannot be taken over while its process lives; the confirmation checks that the lock file is still the
one locked (a person may have removed it and another attempt locked a new one).

A lease found lost stops the attempt: that confirmation and every later one raise :class:`LeaseLost`, naming the
lease and the attempt that took it over, and the attempt leaves on the way out only its own staging folders and
never another attempt's lease. The marker is written only by the lease holder, after all its files, so it never
describes a mix of attempts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import orjson

from tokenization.errors import AttemptConflict, LeaseLost, reaching
from tokenization.formats.ds import WrittenTokenFile
from tokenization.output import manifest
from tokenization.records import CompletionMarker, FileSum, StageManifest
from tokenization.storage.concurrent import files_at_once, map_concurrently
from tokenization.storage.folder import Folder, PutMode, UpdateIf, writing

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

M = TypeVar("M", bound=StageManifest)  # a stage's own manifest

log = logging.getLogger(__name__)

# An object-store lease not renewed for this long belongs to a dead attempt. Shorter than the time Airflow takes to
# retry the task of a dead worker (compose: 90 s without heartbeats, 10 s to notice, then a 60 s retry delay), so
# the retry finds the dead attempt's lease expired, rather than failing on it until its retries run out.
LEASE_TTL_SECONDS = 120.0
HEARTBEAT_SECONDS = 12.0  # ten renewals a TTL: a few lost requests never let a live lease expire
CONFIRM_AFTER = 0.1  # of a TTL: a confirmation renews only a lease last renewed longer ago than this
STAGING = ".staging"
LEASES = "_leases"
ATTEMPT_MARK = ".attempt-"  # staging folders are {stem}.attempt-{id}
STAGING_TRIES = 50  # to make a staging folder in a base that other attempts, finishing, remove when empty


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


class _Taken(Exception):
    """A lease's condition failed: ``holder`` holds it now (None: the lease is gone or unreadable)."""

    def __init__(self, holder: Holder | None):
        super().__init__(_who(holder))
        self.holder = holder


class _Lease:
    """What both leases share: the attempt that holds it and, once it is found lost, why. Lost is for good."""

    path: str
    holder: Holder | None = None
    lost: str | None = None

    def check(self) -> None:
        """Raise LeaseLost if the lease was found lost; no request."""
        if self.lost is not None:
            raise self._error()

    def lose(self, reason: str) -> LeaseLost:
        """Record that the lease is lost (the first reason found stays) and return the error to raise."""
        if self.lost is None:
            self.lost = reason
            log.error("%s: lease lost: %s", self.path, reason)
        return self._error()

    def _error(self) -> LeaseLost:
        attempt = self.holder.attempt if self.holder else "?"
        return LeaseLost(
            f"{self.path}: this attempt lost its lease and must not publish: {self.lost}. Attempt {attempt} stops "
            f"without changing anything more; the one that took over writes this output (run again if that one fails)"
        )


class FileLease(_Lease):
    """A local output's lease: ``flock`` on a lock file beside the output, released by the kernel on any exit.

    The lock file is removed on release; a contender that opened it just before then finds, once it holds the
    lock, that the path names another file (or none), and tries again, so two holders never coexist."""

    def __init__(self, output: str | Path, stem: str):
        self.path = os.path.join(output, f".{stem}.lock")
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
        self.fd, self.holder = fd, holder

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def confirm(self) -> None:
        """Before each change to the output: the lock file must still be the one this attempt locked."""
        if self.lost is None and (self.fd is None or not self._same_file(self.fd)):
            self.lose("its lock file was removed or replaced while it held it, and may now be another attempt's")
        self.check()

    def release(self) -> None:
        """Unlock, and remove the lock file if it is still ours (a replaced one is another attempt's)."""
        if self.fd is not None:
            if self._same_file(self.fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            os.close(self.fd)
            self.fd = None


class ObjectLease(_Lease):
    """An object store's lease: a small object created only if absent, renewed only if unchanged.

    On S3 both conditions are enforced by the store (``If-None-Match`` / ``If-Match``). Other object stores are
    checked before writing (by ``Folder.put``), which cannot exclude a race: a warning says so."""

    def __init__(self, output: Folder, stem: str):
        self.output = output
        self.name = f"{LEASES}/{stem}.json"
        self.path = output.path_of(self.name)
        self.etag: str | None = None
        self._renewals = 0  # written into the lease, so that its ETag changes with every renewal
        self._renewed = -math.inf  # time.monotonic() when the last write that succeeded was sent (never yet)
        self._lock = threading.Lock()  # the heartbeat and a confirmation renew one at a time
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self, holder: Holder) -> None:
        if not self.output.enforces_conditions:
            log.warning("%s: this store has no conditional writes; two attempts at once cannot be excluded", self.path)
        self.holder = holder
        current = self._current()
        try:
            if current is None:
                self._write(PutMode.CREATE)
            else:
                other, etag, age = current
                if age < LEASE_TTL_SECONDS:
                    raise AttemptConflict(_conflict(self.path, other, age))
                log.warning("%s: taking over the lease of %s, silent for %.0f s", self.path, _who(other), age)
                self._write(UpdateIf(etag))
        except _Taken as exc:
            raise AttemptConflict(_conflict(self.path, exc.holder)) from None
        except FileNotFoundError:  # the stale lease was removed as we took it over: by whoever holds it now
            raise AttemptConflict(_conflict(self.path, None)) from None
        self._heartbeat = threading.Thread(target=self._renew_until_stopped, name="lease", daemon=True)
        self._heartbeat.start()

    def _current(self) -> tuple[Holder | None, str | None, float] | None:
        """The lease's holder, version and seconds since it was last written, or None when there is no lease."""
        try:
            lease = self.output.read_stamped(self.name)
        except FileNotFoundError:
            return None
        return _read_holder(lease.data), lease.version, max(0.0, time.time() - lease.written)

    def _write(self, condition: PutMode | UpdateIf) -> None:
        """Write the lease, with the next renewal number, under a condition. A condition that fails raises
        ``_Taken`` naming the holder, unless the lease is our own (a write retried after a lost response)."""
        if self.holder is None:
            raise RuntimeError(f"{self.path}: a lease is written only once acquired, by its holder")
        sent = time.monotonic()
        self._renewals += 1
        body = orjson.dumps(asdict(self.holder) | {"renewal": self._renewals})
        try:
            self.etag = self.output.put(self.name, body, condition)
        except FileExistsError:
            current = self._current()
            if current is None or current[0] != self.holder:
                raise _Taken(current[0] if current else None) from None
            self.etag = current[1]
        self._renewed = sent

    def _renew(self, unless_fresh: bool = False) -> None:
        """Renew the lease, or find it lost: taken over, deleted (by the attempt that took it over, once done),
        or not renewed for a TTL, after which a contender may have taken it over. Any other failure is raised.
        ``unless_fresh``: not if the last renewal was sent less than ``CONFIRM_AFTER`` of a TTL ago (decided under
        the lock, so that confirmations of files placed at once renew it once)."""
        with self._lock:
            fresh = time.monotonic() - self._renewed < CONFIRM_AFTER * LEASE_TTL_SECONDS
            if self.lost is not None or (unless_fresh and fresh):
                return
            try:
                self._write(UpdateIf(self.etag))
            except _Taken as exc:
                self.lose(f"{exc} took it over" if exc.holder else "another attempt took it over")
            except FileNotFoundError:
                self.lose("its lease object is gone: the attempt that took it over finished (or it was removed)")
            except OSError as exc:
                silent = time.monotonic() - self._renewed
                if silent < LEASE_TTL_SECONDS:
                    raise
                self.lose(f"it was not renewed for {silent:.0f} s ({exc}), so another attempt may have taken it over")

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._renew()
            except OSError as exc:  # a store that is down for a while: try again at the next beat
                log.warning("%s: lease renewal failed (%s); lost unless renewed in time", self.path, exc)
            if self.lost is not None:
                return

    def confirm(self) -> None:
        """Before a change to the output: renew, unless the last renewal was sent less than ``CONFIRM_AFTER`` of
        a TTL ago. No contender can take the lease over for a whole TTL after a renewal, so a change that starts
        now is the holder's. A renewal that fails for a reason other than the lease is raised as a write error
        naming the lease: the change is not made."""
        with writing(self.path, local=False):
            self._renew(unless_fresh=True)
        self.check()

    def release(self) -> None:
        """Stop renewing, and delete the lease if it is still ours, only if unchanged since we read it: a lease
        taken over belongs to the attempt that took it."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        if self.lost is not None:
            return
        current = self._current()
        if current is not None and current[0] == self.holder:
            with contextlib.suppress(FileExistsError):
                self.output.remove(self.name, UpdateIf(current[1]))


def _read_holder(data: bytes) -> Holder | None:
    """The holder a lease names (an object lease also carries its renewal number, which is not the holder's)."""
    try:
        record = orjson.loads(data)
        return Holder(**{f.name: record[f.name] for f in fields(Holder)})
    except (orjson.JSONDecodeError, TypeError, KeyError):
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


@contextmanager
def leased(output: Folder, stem: str, holder: Holder) -> Iterator[FileLease | ObjectLease]:
    """Hold the lease of ``stem`` in ``output`` meanwhile (refused with ``AttemptConflict`` naming its holder), and
    release it on the way out, on failure too."""
    local = output.local
    lease: FileLease | ObjectLease = FileLease(local, stem) if local is not None else ObjectLease(output, stem)
    with reaching(output.url):
        if local is not None:
            with writing(local):
                output.make()
        lease.acquire(holder)
    try:
        yield lease
    finally:
        lease.release()


@dataclass
class Attempt:
    """A stage's licence to write one stem of an output: its id, a private working folder, and the calls that
    publish into the output."""

    output: Folder
    stem: str
    holder: Holder
    work: Path
    landing: Path | None  # on the output's filesystem, for local outputs: temporary copies are renamed from here
    lease: FileLease | ObjectLease

    @property
    def id(self) -> str:
        return self.holder.attempt

    @property
    def fs(self) -> AbstractFileSystem:
        """The output's filesystem, for the stages that still list it so (tokenize, merge): use ``output``."""
        return self.output.fs

    @property
    def out_path(self) -> str:
        """The output's path in ``fs``, for the stages that still list it so (tokenize, merge): use ``output``."""
        return self.output.path

    def place(self, src: Path, name: str) -> None:
        """Move a finished local file to ``name`` (relative to the output folder), as the lease holder."""
        self.lease.confirm()
        self.output.place(src, name, self.landing)

    def place_families(self, written: Sequence[WrittenTokenFile]) -> None:
        """Move every file of each written token-file family into the output, under its name there, several at
        once (``files_at_once``: a rank's hundreds of small bucket files would otherwise wait for each other)."""
        moves = {family.path.with_name(f.name): family.published(f.name) for family in written for f in family.files}
        largest = max((f.bytes for family in written for f in family.files), default=1)
        map_concurrently(lambda src: self.place(src, moves[src]), list(moves), workers=files_at_once(largest))

    def write(self, name: str, data: bytes) -> None:
        """Write a small file of the output whole, as the lease holder; on S3 only over the version seen before
        the lease was confirmed (or only if absent), so that a successor's version is never overwritten (where
        the store enforces no condition, the lease alone: ``Folder.version``)."""
        seen = self.output.version(name)
        self.lease.confirm()
        with self._unless_changed(name):
            self.output.put(name, data, seen, self.landing)

    def remove(self, name: str) -> None:
        """Remove a file of the output if it is there (the old marker, a stale file of an earlier run), as the
        lease holder; on S3 only the version seen before the lease was confirmed."""
        seen = self.output.version(name)
        self.lease.confirm()
        with self._unless_changed(name):
            self.output.remove(name, seen)

    @contextmanager
    def _unless_changed(self, name: str) -> Iterator[None]:
        """A conditional change that fails: another attempt changed the file since this one confirmed its lease,
        which only the attempt that took the lease over can have done."""
        try:
            yield
        except FileExistsError as exc:
            path = self.output.path_of(name)
            raise self.lease.lose(f"{path} was changed by another attempt after this one confirmed its lease") from exc

    def commit(self, record: M, files: dict[str, FileSum]) -> M:
        """Write the manifest, then the marker that names this attempt, the manifest's sha256 and every file it
        published: the marker is the last file and only the lease holder writes it (on S3, only where no marker
        is: the old one was removed when this attempt began). Returns the manifest as written."""
        record = replace(record, attempt=self.id)
        data = record.dumps()
        self.write(manifest.manifest_name(self.stem), data)
        marker = CompletionMarker(
            manifest=manifest.manifest_name(self.stem),
            sha256=hashlib.sha256(data).hexdigest(),
            attempt=self.id,
            files=files,
            checked=record.checked,
        )
        self.write(manifest.marker_name(self.stem), marker.dumps())
        return record


@contextmanager
def attempt_at(
    output: Folder, stem: str, local_working_dir: str | None = None, owner: str | None = None
) -> Iterator[Attempt]:
    """Take the lease of ``stem`` in ``output``, clear what earlier attempts left, and yield the attempt; its
    staging folder and lease are released on the way out, on failure too."""
    holder = new_holder(owner)
    with leased(output, stem, holder) as lease:
        base = _staging_base(output, local_working_dir)
        landing_base = output.local / STAGING if output.local is not None else None
        work = base / f"{stem}{ATTEMPT_MARK}{holder.attempt}"
        landing = landing_base / f"{stem}{ATTEMPT_MARK}{holder.attempt}" if landing_base else None
        attempt = Attempt(output, stem, holder, work, landing, lease)
        lease.confirm()  # earlier attempts' leftovers are ours to remove only while the lease is ours
        for folder in {f for f in (base, landing_base) if f is not None}:
            _remove_leftovers(folder, stem)
        attempt.remove(manifest.marker_name(stem))  # from now until the new marker: not complete
        folders = {f for f in (work, landing) if f is not None}
        for folder in folders:
            with writing(folder):
                _make_staging(folder)
        try:
            yield attempt
        finally:
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
                with contextlib.suppress(OSError):  # other stems may still be working there
                    folder.parent.rmdir()


def _staging_base(output: Folder, local_working_dir: str | None) -> Path:
    """Where attempts at this output stage their files: beside a local output (publishing is then a rename),
    else in a folder of the local working directory (or the system's temporary one) named after the output, so
    that outputs sharing a working directory never meet."""
    if local_working_dir is None and output.local is not None:
        return output.local / STAGING
    key = hashlib.sha256(output.location.encode()).hexdigest()[:16]
    root = Path(local_working_dir) if local_working_dir else Path(tempfile.gettempdir()) / "corpus-tokenization"
    return root / key


def _make_staging(folder: Path) -> None:
    """Make an attempt's staging folder in the staging base, which attempts at other stems share and the last one
    out removes (``rmdir``: only while it is empty). A base removed between making it and making the folder in it
    is made again; once the folder is in it, it stays."""
    for tries_left in reversed(range(STAGING_TRIES)):
        with contextlib.suppress(FileExistsError):  # there already, or removed while pathlib looked
            folder.parent.mkdir(parents=True)
        try:
            folder.mkdir()
            return
        except FileNotFoundError:  # another stem's attempt removed the base just now
            if not tries_left:
                raise


def remove_staging(output: Folder) -> None:
    """A local output's staging base, whatever it still holds: once its build is published no attempt writes there
    again, and an attempt interrupted between its marker and its own cleanup (Ctrl-C) is never run again to remove
    what it left (``_remove_leftovers`` runs only for a stem attempted again)."""
    if output.local is not None:
        shutil.rmtree(output.local / STAGING, ignore_errors=True)


def _remove_leftovers(folder: Path, stem: str) -> None:
    """The staging folders of earlier attempts at this stem (killed ones included): safe, as we hold the lease.
    No staging base (none yet, or another stem's attempt just removed it, empty) holds none."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(f"{stem}{ATTEMPT_MARK}"):
            log.info("removing %s, left by an earlier attempt", folder / name)
            shutil.rmtree(folder / name, ignore_errors=True)
