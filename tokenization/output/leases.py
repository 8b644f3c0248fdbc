"""The lease of a stem of a stage's output: one attempt at a time holds it, and confirms it before every change it
makes, so that an attempt that lost it (frozen past its TTL, taken over) stops instead of mixing its files with its
successor's. Locally an ``flock``; on S3 an object renewed under ``If-Match`` (``tokenization.output.attempts``
says how, and why that fences)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import orjson

from tokenization.errors import AttemptConflict, LeaseLost, reaching
from tokenization.storage.folder import Folder, PutMode, UpdateIf, writing

log = logging.getLogger(__name__)

# An object-store lease not renewed for this long belongs to a dead attempt. Shorter than the time Airflow takes to
# retry the task of a dead worker (compose: 90 s without heartbeats, 10 s to notice, then a 60 s retry delay), so
# the retry finds the dead attempt's lease expired, rather than failing on it until its retries run out.
LEASE_TTL_SECONDS = 120.0
HEARTBEAT_SECONDS = 12.0  # ten renewals a TTL: a few lost requests never let a live lease expire
CONFIRM_AFTER = 0.1  # of a TTL: a confirmation renews only a lease last renewed longer ago than this
LEASES = "_leases"


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
