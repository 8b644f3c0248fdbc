"""Whether a file's bytes are the ones planned: the identity the tokenization cache keys a file's content by
(``content_identity``), the plan's memo of local files' sha256, remembered from night to night so that a plan reads
no file (``with_content``, ``rank_hashes``), and the check that a file is unchanged since its plan
(``check_unchanged``)."""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from tokenization.errors import StorageError, reaching
from tokenization.inputs import grown
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import InputListing, identity
from tokenization.inputs.local import MTIME
from tokenization.records import InputFile, PlanReading
from tokenization.storage import checksums
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import Folder, StorageOptions, file_at
from tokenization.wording import counted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hashed:
    """A plan's listing with the sha256 of each local file it recognised unchanged (``with_content``), what the
    next plan is to remember of them (``known``: a row a local file, by URL), and what the night costs: files
    recognised unchanged without a byte read, files new or changed that their ranks hash (``rank_hashes``), and
    their bytes. The plan reads none."""

    listing: InputListing
    known: dict[str, str]
    recognised: int
    hashed: int
    bytes_to_hash: int

    def reading(self, listed: int) -> PlanReading:
        """As a build records it, of the ``listed`` files."""
        return PlanReading(
            files_listed=listed,
            files_recognised=self.recognised,
            files_hashed=self.hashed,
            bytes_hashed=self.bytes_to_hash,
        )


def with_content(listing: InputListing, known: Mapping[str, str] | None = None) -> Hashed:
    """The listing with the identity of each local file that ``known`` (an earlier night's rows, by URL)
    recognises ending in the sha256 of its bytes, read from there: its size, mtime, change time, inode and device
    are what they were, and its mtime is older than the moment it was hashed by ``RACY_NS`` at least, as git's index
    does. The plan reads no file's bytes: a plan of 10,000 new files on a shared file system would be one task's
    read of them all. A new file, a changed one, one modified within that margin of its hashing (git's "racy" case:
    a coarse clock could not tell a write during the hash) and one whose change time alone differs (a ``chmod``)
    keep their listed identity (their ``stat``): their ranks hash them before they look them up in the cache
    (``rank_hashes``), and remember them for the next night; one that is larger than it was is planned with its
    earlier size and sha256 (``InputFile.earlier``), for its rank to tell whether it only grew by lines appended
    (``inputs.grown``). An object store's ETag is a digest of the bytes already."""
    local = [f for f in listing.files if f.identity.startswith(MTIME)]
    known = known or {}
    digests = {f.url: sha for f in local if (sha := _recognised(f, _stat(f.url), known.get(f.url)))}
    was = {f.url: row for f in local if f.url not in digests and (row := grown.earlier(f, known.get(f.url)))}
    rows = {url: known[url] for url in digests}  # the recognised: as they were remembered
    unknown = [f for f in local if f.url not in digests]
    if unknown:
        log.info(
            "plan: %s recognised unchanged, not read; %s (%d bytes) new or changed, for their ranks to hash",
            counted(len(rows), "local input file"),
            counted(len(unknown), "file"),
            sum(f.size for f in unknown),
        )
    files = [
        with_sha256(f, digests[f.url]) if f.url in digests else replace(f, earlier=was[f.url]) if f.url in was else f
        for f in listing.files
    ]
    return Hashed(replace(listing, files=files), rows, len(rows), len(unknown), sum(f.size for f in unknown))


def with_sha256(file: InputFile, sha256: str) -> InputFile:
    """A local file's identity, as listed, ending in the sha256 of its bytes (``content_identity`` takes it), in
    place of any its plan recorded."""
    listed = ",".join(field for field in file.identity.split(",") if not field.startswith("sha256="))
    return replace(file, identity=f"{listed},sha256={sha256}")


def taken_from_row(file: InputFile) -> str | None:
    """The sha256 of a local ``file`` that its plan took from a remembered row (``with_content``), unread; None
    when its rank hashes it (``for_its_rank``) or it is no local file. A row is a memo that whoever can write the
    cache can forge: a rank that reads the file anyway (a miss) tells its real sha256 (``hashed_now``)."""
    return _fields(file.identity).get("sha256") if file.identity.startswith(MTIME) else None


def hashed_now(file: InputFile) -> tuple[str, str | None]:
    """The sha256 of a local ``file``'s bytes, read now, and the row the next night is to remember it by (None when
    its ``stat`` is no longer its planned one: the rank refuses it, ``check_unchanged``)."""
    st, hashed_ns = _stat(file.url), time.time_ns()  # before any byte is read: git's racy case
    sha256 = _sha256(file.url, file.identity)
    return sha256, _row(st, hashed_ns, sha256) if st is not None and _as_listed(file, st) else None


def for_its_rank(file: InputFile) -> bool:
    """Whether ``file`` is a local file whose plan records no sha256 of it: its rank hashes it (``rank_hashes``)."""
    return file.identity.startswith(MTIME) and "sha256" not in _fields(file.identity)


def rank_hashes(files: Sequence[InputFile]) -> tuple[list[InputFile], dict[str, str], dict[str, grown.Tail]]:
    """A rank's ``files``, each local one whose plan records no sha256 (new or changed: ``with_content``) given
    the sha256 of its bytes, which this rank reads here, on a thread a core (hashlib works without the GIL; a file
    of several parts is read once); the rows the next night is to remember of them, by URL; and, by URL, the lines
    appended to each that only grew by lines (``inputs.grown``, found in the same read). A file whose ``stat`` is
    no longer its planned one gets no row: the rank refuses it (``check_unchanged``)."""
    todo = {f.url: f for f in files if for_its_rank(f)}
    stats = {url: _stat(url) for url in todo}
    # ``hashed_ns``: before any byte is read, so that a write during the hash is git's racy case
    started, hashed_ns = time.perf_counter(), time.time_ns()
    found = map_concurrently(_rank_sha256, list(todo.values()), workers=os.cpu_count() or 1)
    digests = {url: sha for url, (sha, _) in zip(todo, found, strict=True)}
    tails = {url: tail for url, (_, tail) in zip(todo, found, strict=True) if tail is not None}
    if todo:
        log.info(
            "hashed %s new or changed since the last night, %d bytes, in %.1f s",
            counted(len(todo), "local input file"),
            sum(f.size for f in todo.values()),
            time.perf_counter() - started,
        )
    rows = {
        url: _row(st, hashed_ns, digests[url])
        for url, st in stats.items()
        if st is not None and _as_listed(todo[url], st)
    }
    return [with_sha256(f, digests[f.url]) if f.url in digests else f for f in files], rows, tails


def _rank_sha256(file: InputFile) -> tuple[str, grown.Tail | None]:
    """A file's sha256 for its rank, and what was appended to it when its plan records its earlier bytes."""
    if not grown.provable(file):  # a part's file is read once, whichever part's rank asks first
        return _sha256(file.url, file.identity), None
    try:
        with reaching(file.url):
            return grown.hashed(file.url, file)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{file.url}: could not be read to identify its content; {exc}") from exc


RACY_NS = 2 * 10**9  # a file modified this close to its hashing is hashed again: coarse filesystems keep 1-2 s mtimes
SHA256 = re.compile(r"[0-9a-f]{64}")
KNOWN_FIELDS = 7  # a row: size, mtime_ns, ctime_ns, inode, device, when it was hashed (ns), sha256


def _stat(path: str) -> os.stat_result | None:
    """A local file's ``stat``, or None when it is gone (the build then fails as it reads it, with its name)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def _row(st: os.stat_result, hashed_ns: int, sha256: str) -> str:
    """What the next plan remembers of a local file (``with_content``)."""
    return f"{st.st_size},{st.st_mtime_ns},{st.st_ctime_ns},{st.st_ino},{st.st_dev},{hashed_ns},{sha256}"


def _as_listed(file: InputFile, st: os.stat_result) -> bool:
    """Whether a local file's ``stat`` now (``st``) is what its listing (or its plan) recorded of it."""
    listed = _fields(file.identity)
    return (file.size, listed[MTIME], listed["ctime_ns"], listed["ino"]) == (
        st.st_size,
        str(st.st_mtime_ns),
        str(st.st_ctime_ns),
        str(st.st_ino),
    )


def _recognised(file: InputFile, st: os.stat_result | None, row: str | None) -> str | None:
    """The sha256 that ``row`` remembers of ``file``, when the file's ``stat`` now (``st``), and as it was listed,
    is what it was then, and its mtime was not racy; else None: the file is read."""
    if st is None or row is None or len(fields := row.split(",")) != KNOWN_FIELDS:
        return None
    if not _as_listed(file, st):
        return None  # changed since it was listed
    try:
        *remembered, hashed_ns = (int(field) for field in fields[:6])
    except ValueError:
        return None
    now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    if tuple(remembered) != now or st.st_mtime_ns >= hashed_ns - RACY_NS:
        return None
    return fields[6] if SHA256.fullmatch(fields[6]) else None


def _remembered_sha256(planned: InputFile, row: str | None) -> str | None:
    """The sha256 that ``row`` (a rank's, ``rank_hashes``) remembers of the file as ``planned`` (its ``stat``:
    a plan records no sha256 of a new file), or None when the row is of another ``stat``."""
    if row is None or len(fields := row.split(",")) != KNOWN_FIELDS or not SHA256.fullmatch(fields[6]):
        return None
    was = _fields(planned.identity)
    same = fields[:4] == [str(planned.size), was[MTIME], was["ctime_ns"], was["ino"]]
    return fields[6] if same else None


Remembered = Callable[[], Mapping[str, str]]  # the rows ranks remembered (``rank_hashes``), by URL, read when asked


def difference(planned: InputFile, now: InputFile, remembered: Remembered | None = None) -> str | None:
    """How the file ``now`` (a fresh listing's) differs from the one ``planned``, or None when it is the same file:
    a file whose bytes did not change is. An object store's identity is its ETag, a digest of the bytes. Locally
    the size and the mtime are the fast check; when they agree but the inode or the change time differ (a
    ``chmod``, a copy that kept the mtime), the bytes are hashed and compared with the sha256 the plan recorded, or,
    for a file new to its plan (its planned identity is its ``stat``), the one a rank remembered of it at that
    ``stat`` (``remembered``: the rows, by URL, read only then)."""
    if now.size != planned.size:
        return f"its size changed from {planned.size:,} to {now.size:,} bytes"
    if not planned.identity.startswith(MTIME):  # an ETag, or a store's modification time
        return None if now.identity == planned.identity else f"it changed ({now.identity}; planned {planned.identity})"
    was, found = _fields(planned.identity), _fields(now.identity)
    if found[MTIME] != was[MTIME]:
        return f"it was modified (mtime {_mtime(found)}; planned {_mtime(was)})"
    if (found["ino"], found["ctime_ns"]) == (was["ino"], was["ctime_ns"]):
        return None
    sha256 = was.get("sha256") or _remembered_sha256(planned, (remembered() if remembered else {}).get(planned.url))
    if sha256 is None:
        return (
            "its inode or change time changed (a chmod, or a copy that kept its mtime), and its plan records no "
            "sha256 of its bytes to tell whether they did (a file new to its plan, whose rank's hash is not "
            "remembered, is known by its stat; or a plan made by an earlier version)"
        )
    digest = _sha256(now.url, now.identity)
    if digest != sha256:
        return f"its content changed (sha256 {digest[:12]}…; planned {sha256[:12]}…), its size and mtime kept"
    return None


def _as_planned(planned: InputFile, path: str) -> bool:
    """Whether the local file at ``path`` is, by its ``stat``, the one ``planned`` (``difference`` has nothing to
    say of it); False for any other (changed, gone, no regular file), which ``check_unchanged`` then names."""
    st = _stat(path)
    return (
        st is not None and stat.S_ISREG(st.st_mode) and planned.identity.startswith(MTIME) and _as_listed(planned, st)
    )


def _fields(local: str) -> dict[str, str]:
    """A local identity's fields (``identity``, and the ``sha256`` a plan adds), by name."""
    return dict(field.split("=", 1) for field in local.split(","))


def _mtime(fields: dict[str, str]) -> str:
    """A local identity's mtime, in UTC to the nanosecond (a file can be modified within a microsecond)."""
    seconds, nanoseconds = divmod(int(fields[MTIME]), 10**9)
    return f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%dT%H:%M:%S}.{nanoseconds:09d}Z"


def content_identity(file: InputFile, storage_options: StorageOptions | None = None) -> str:
    """What tells this file's bytes (or this part's) from any other's, for the tokenization cache. On an object
    store, the ETag its listing gave, with its size: S3's ETag is the MD5 of the bytes (of the parts' MD5s, for a
    multipart upload), so other bytes give another one, whatever the size and the time; a store's version number
    changes with every write. Elsewhere (a local file), the sha256 of its bytes: an mtime can be set back and a
    rewrite in place keeps the size, so nothing cheaper tells. A part adds which one it is: the file's bytes decide
    its edges."""
    part = f",part={file.part.index + 1}/{file.part.count}" if file.part else ""
    if file.identity.startswith("etag="):
        return f"{file.identity},bytes={file.size}{part}"
    planned = _fields(file.identity).get("sha256") if file.identity.startswith(MTIME) else None
    return f"sha256={planned or _sha256(file.url, file.identity, storage_options)}{part}"


def _sha256(url: str, identity: str, storage_options: StorageOptions | None = None) -> str:
    """A file's sha256, once a process however many of its parts a rank holds (``identity``: a changed file's is
    another)."""
    return _sha256_once(*file_at(url, storage_options), url, identity)


@functools.lru_cache(maxsize=64)
def _sha256_once(folder: Folder, name: str, url: str, identity: str) -> str:
    try:
        with reaching(url):
            return folder.checksum(name, checksums.SHA256)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{url}: could not be read to identify its content; {exc}") from exc


def check_unchanged(
    files: Sequence[InputFile], storage_options: StorageOptions | None = None, remembered: Remembered | None = None
) -> None:
    """Raise :class:`InputError` naming the first of ``files`` that is gone or no longer the file it was when
    listed, and how (``difference``, with the rows ranks ``remembered``): a build reads exactly the files it
    planned. A local file whose ``stat`` is its planned one is passed at once: one ``stat`` a file, its folder
    opened once (a rank of 25,000 one-line files checked each in ~40 us, two ``stat`` calls and a folder each)."""
    folders: dict[str, Folder] = {}
    for file in files:
        folder, name = file_at(file.url, storage_options)
        folder = folders.setdefault(folder.url, folder)
        if folder.on_disk and _as_planned(file, folder.path_of(name)):
            continue
        try:
            with reaching(file.url):
                info = folder.info(name)
        except FileNotFoundError:
            raise InputError(
                f"{file.url}: gone since the build was planned; a build reads exactly its plan's files, "
                f"so run it under a new build id"
            ) from None
        now = InputFile(
            file.url,
            int(info.get("size") or 0),
            identity(folder.path_of(name), info, folder.on_disk),
            file.part,
        )
        if changed := difference(file, now, remembered):
            raise InputError(
                f"{file.url}: changed since the build was planned: {changed}; a build reads exactly its plan's "
                f"files, so run it under a new build id"
            )
