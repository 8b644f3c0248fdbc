"""A builds folder's pointer to its newest complete build, and the retention of complete builds.

``{output}/LATEST`` holds one line: the name of the run folder of the newest complete build (the one whose
``_BUILD.json`` says it started last), one path segment, so that it resolves from anywhere: a reader joins it to
the output it was given and never follows it outside. Publishing a build points it there by compare-and-swap
(under a lock file locally, a conditional PUT on S3), unless a newer build already completed: a reader never sees
a half-written pointer nor one that goes back.

Only this project's own complete builds are candidates, for ``LATEST`` and for retention: a child folder of the
output whose ``_RUN.json`` claims it for the run its name spells and whose ``_BUILD.json`` is that run's record.
Anything else (a user's folder, a running or failed build, a malformed record) is left alone, with a warning when
it holds a ``_BUILD.json``. Retention keeps the newest ``keep`` candidates and deletes older ones, never the build
being published nor the one ``LATEST`` names.

No path given by a user is ever used as a glob: the output is listed, never globbed, and folders are removed with
:meth:`tokenization.storage.folder.Folder.remove_all`.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from tokenization.errors import MissingError, TokenizationError, UsageError
from tokenization.output.runs import BUILD_MANIFEST, LATEST, RUN_CLAIM, folder_for, percent_encoded_name, read_build
from tokenization.records import BuildRecord, RecordError, RunClaim
from tokenization.storage.folder import Condition, Folder

LOCK = ".LATEST.lock"  # beside LATEST; a dot name, which no run folder has (folder_name replaces a leading dot)
SWAP_ATTEMPTS = 20  # each a read, a listing and a conditional PUT: only a publish racing others ever retries

log = logging.getLogger(__name__)


class LatestError(TokenizationError, ValueError):
    """``LATEST``, or the build record it leads to, cannot be used; the message names the file and what to do."""


@dataclass(frozen=True)
class CompleteBuild:
    """One of this project's complete builds: its run folder, named ``name`` under the output, and its record."""

    run_dir: str
    name: str
    started: datetime
    record: BuildRecord

    @property
    def order(self) -> tuple[datetime, str]:
        return self.started, self.name


def complete_build(output: Folder, name: str) -> CompleteBuild | None:
    """The complete build in ``{output}/{name}``, None when that folder holds no ``_BUILD.json`` (a running or
    failed build, or no build at all); a record that is not this project's, or is malformed, raises
    :class:`LatestError` naming the file."""
    run = output.sub(name)
    run_dir = run.url
    try:
        record = read_build(run)
        if record is None:
            return None
        claim = RunClaim.read(run, RUN_CLAIM)
    except RecordError as exc:
        raise LatestError(str(exc)) from None
    if claim is None:
        raise LatestError(f"{run.url_of(BUILD_MANIFEST)}: no {RUN_CLAIM} claims the folder, so no build made it")
    if not _owns(output, name, claim.run_id):
        raise LatestError(
            f"{run.url_of(RUN_CLAIM)}: claims the folder for run {claim.run_id!r}, whose folder is another"
        )
    if record.run_id != claim.run_id:
        raise LatestError(f"{run.url_of(BUILD_MANIFEST)}: the record of run {record.run_id!r}, not {claim.run_id!r}")
    return CompleteBuild(run_dir, name, _started(record.started, run.url_of(BUILD_MANIFEST)), record)


def complete_builds(output: Folder) -> list[CompleteBuild]:
    """Every complete build under ``output``, the newest first; a folder with a ``_BUILD.json`` that is no build of
    this project is skipped with a warning naming it."""
    found = []
    for name in _child_folders(output):
        try:
            build = complete_build(output, name)
        except LatestError as exc:
            log.warning("%s; LATEST and retention leave it alone (move it out of %s to silence this)", exc, output.url)
            continue
        if build is not None:
            found.append(build)
    return sorted(found, key=lambda b: b.order, reverse=True)


def read_latest(output: Folder) -> str | None:
    """The run folder ``LATEST`` names, inside ``output``, or None when there is none yet."""
    try:
        text = output.read(LATEST)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise _a_folder(output.url_of(LATEST)) from None
    name = latest_name(output, text)
    return None if name is None else output.url_of(name)


def latest_complete_build(output: Folder) -> CompleteBuild:
    """The complete build ``LATEST`` names: ``FileNotFoundError`` when there is no ``LATEST`` yet, and
    :class:`LatestError` when it names no complete build of this project."""
    run_dir = read_latest(output)
    if run_dir is None:
        raise MissingError(f"{output.url}: no {LATEST}, so no complete build yet")
    name = Folder(run_dir).name
    build = complete_build(output, name)
    if build is None:
        raise LatestError(f"{output.url_of(LATEST)}: names {name}, which holds no {BUILD_MANIFEST} (not complete)")
    return build


def latest_name(output: Folder, text: bytes) -> str | None:
    """The run folder name that ``LATEST``'s content ``text`` gives, or None when it is empty. The previous version
    wrote a whole path or URL (relative to the writer's working folder, maybe): its last segment is taken when it
    names a folder of ``output``. Nothing outside ``output`` is ever named: anything else raises."""
    value = text.decode(errors="replace").strip()
    if not value:
        return None
    if _is_name(value):
        return value
    last = Folder(value).name  # the last segment of the path or URL an older version wrote
    if _is_name(last) and output.is_folder(last):
        return last
    raise LatestError(
        f"{output.url_of(LATEST)}: names {value!r}, which is no folder of {output.url} (it is never followed outside "
        f"it); publish a build to rewrite it, or remove it"
    )


def point_latest(output: Folder, published: str) -> str:
    """Point ``LATEST`` at the newest complete build and return it: the one just ``published`` (its folder's name
    under ``output``), unless the build ``LATEST`` names is newer (one that completed meanwhile). A compare-and-swap:
    read ``LATEST``, weigh the two, write only if ``LATEST`` still holds what was read (a lock locally, ``If-Match``
    on S3), else decide again; it never goes back. Every publish weighs its build so, so ``LATEST`` names the newest
    of them all without any earlier build read: a night costs the same after 500 builds as after one. Only when
    ``LATEST`` names no valid build (the first publish, or one removed or damaged) is every complete build read."""
    with _locked(output):
        for _ in range(SWAP_ATTEMPTS):
            text, seen = _read_latest_versioned(output)
            current = _named_build(output, text)
            builds = _candidates(output, current, published)
            if not builds:
                raise LatestError(f"{output.url}: no complete build to point {LATEST} at")
            newest = max(builds, key=lambda b: b.order)
            if current is not None and current.order >= newest.order:
                return current.run_dir
            try:
                _write_latest(output, newest.name, seen)
            except (FileExistsError, FileNotFoundError):  # another publish moved (or someone removed) it since
                continue
            log.info("%s now names %s", output.url_of(LATEST), newest.run_dir)
            return newest.run_dir
    raise LatestError(
        f"{output.url_of(LATEST)}: changed by other publishes {SWAP_ATTEMPTS} times in a row; publish again"
    )


def _candidates(output: Folder, current: CompleteBuild | None, published: str) -> list[CompleteBuild]:
    """The builds ``LATEST`` may name: the one it names (``current``) and the one ``published``; every complete
    build when it names none (``complete_builds``). A published build that is no valid one is left out, named."""
    if current is None:
        return complete_builds(output)
    try:
        build = complete_build(output, published)
    except LatestError as exc:
        log.warning("%s; LATEST leaves it alone", exc)
        build = None
    return [current] if build is None else [current, build]


def expire(output: Folder, keep: int, spare: set[str]) -> list[str]:
    """Delete the complete builds beyond the newest ``keep``, except those in ``spare``; returns what it deleted."""
    deleted = []
    for build in complete_builds(output)[keep:]:
        if build.run_dir in spare:
            continue
        run = output.sub(build.name)
        try:
            run.delete(BUILD_MANIFEST)  # first: a deletion cut short leaves an incomplete build, not
        except FileNotFoundError:  # a complete one with files missing; gone: another publish's retention took it
            continue
        run.remove_all()
        log.warning("retention (keep %d complete builds): deleted %s, started %s", keep, build.run_dir, build.started)
        deleted.append(build.run_dir)
    return deleted


def _named_build(output: Folder, text: bytes | None) -> CompleteBuild | None:
    """The complete build ``LATEST``'s content names, or None when it names none that is still a valid one."""
    try:
        name = None if text is None else latest_name(output, text)
        return None if name is None else complete_build(output, name)
    except LatestError as exc:
        log.warning("%s is replaced: %s", output.url_of(LATEST), exc)
        return None


def _read_latest_versioned(output: Folder) -> tuple[bytes | None, Condition]:
    """``LATEST``'s content (None when there is none) and the condition to replace only that version."""
    try:
        return output.read_versioned(LATEST)
    except IsADirectoryError:
        raise _a_folder(output.url_of(LATEST)) from None


def _a_folder(where: str) -> LatestError:
    """``LATEST`` is a folder: the run folder of a build that an older version let run under the build id
    ``LATEST``. Only a person can tell where it goes."""
    return LatestError(
        f"{where} is a folder (a build run under the build id LATEST, which is refused now), not the file naming "
        f"the newest complete build: move it out of the output, and the next build to publish writes LATEST"
    )


def _write_latest(output: Folder, name: str, seen: Condition) -> None:
    """Write ``LATEST`` whole; on S3 only over the version read (``seen``), or only if there was none, else
    ``FileExistsError``. Locally the caller holds the lock; other stores have no such condition, and a race of two
    publishes there can leave either one."""
    output.put(LATEST, f"{name}\n".encode(), seen)


@contextmanager
def _locked(output: Folder) -> Iterator[None]:
    """Hold ``{output}/.LATEST.lock`` exclusively, locally (``flock``: between processes and between threads, each
    opening the file). Elsewhere a no-op: on S3 the conditional writes do its work."""
    if output.local is None:
        yield
        return
    output.make()
    with open(output.local / LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def _child_folders(output: Folder) -> list[str]:
    """The names of the folders directly inside ``output`` (none when it does not exist), without dot names."""
    return sorted(name for name in output.folders() if not name.startswith("."))


def _started(started: str, where: str) -> datetime:
    try:
        moment = datetime.fromisoformat(started) if isinstance(started, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise LatestError(f'{where}: "started" is {started!r}, not an ISO 8601 time with its UTC offset')
    return moment


def _owns(output: Folder, name: str, run_id: object) -> bool:
    """Whether ``run_id`` is a run id whose folder under ``output`` is ``name`` (as this version names it, or as
    earlier ones did: ``percent_encoded_name``)."""
    try:
        return isinstance(run_id, str) and (
            folder_for(output.url, run_id) == output.url_of(name) or name == percent_encoded_name(run_id)
        )
    except UsageError:  # a run id that names no folder of its own ("", "..", LATEST)
        return False


def _is_name(value: str) -> bool:
    """Whether ``value`` is one folder name under the output, the kind ``folder_for`` makes."""
    return bool(value) and "/" not in value and "\\" not in value and not value.startswith(".")
