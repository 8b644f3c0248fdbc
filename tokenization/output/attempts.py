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
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from tokenization.formats.ds import WrittenTokenFile
from tokenization.output import manifest
from tokenization.output.leases import FileLease, Holder, ObjectLease, leased, new_holder
from tokenization.records import CompletionMarker, FileSum, StageManifest
from tokenization.storage.concurrent import files_at_once, map_concurrently
from tokenization.storage.folder import Folder, writing

M = TypeVar("M", bound=StageManifest)  # a stage's own manifest

log = logging.getLogger(__name__)

STAGING = ".staging"
ATTEMPT_MARK = ".attempt-"  # staging folders are {stem}.attempt-{id}
STAGING_TRIES = 50  # to make a staging folder in a base that other attempts, finishing, remove when empty


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
