"""A builds folder's pointer to its newest complete build, and the retention of complete builds.

``{output}/LATEST`` holds one line: the run folder of the newest complete build (the one whose ``_BUILD.json``
says it started last). Publishing a build points it there, atomically (a temporary name then a rename; one PUT on
S3), unless a newer build already completed: a reader never sees a half-written pointer nor one that goes back.

Retention keeps the newest ``keep`` complete builds and deletes older ones, after a build is published. Only
complete builds (those with ``_BUILD.json``) are ever candidates, so a running or failed build is never deleted;
neither is the build being published nor the one ``LATEST`` names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenization import manifest
from tokenization.runs import BUILD_MANIFEST
from tokenization.storage import join, open_fs, write_bytes_atomic

LATEST = "LATEST"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompleteBuild:
    run_dir: str
    started: str  # ISO 8601, UTC: ordered as text


def complete_builds(output: str) -> list[CompleteBuild]:
    """Every complete build under ``output``, the newest first."""
    fs, path = open_fs(output)
    found = []
    for marker in fs.glob(join(path, "*", BUILD_MANIFEST)):
        build = manifest.read_json(fs, marker) or {}
        run_dir = join(output, marker[len(path) :].strip("/").rsplit("/", 1)[0])
        found.append(CompleteBuild(run_dir, build.get("started") or ""))
    return sorted(found, key=lambda b: (b.started, b.run_dir), reverse=True)


def read_latest(output: str) -> str | None:
    """The run folder ``LATEST`` names, or None when there is none yet."""
    fs, path = open_fs(output)
    try:
        return fs.cat_file(join(path, LATEST)).decode().strip() or None
    except FileNotFoundError:
        return None


def point_latest(output: str) -> str:
    """Point ``LATEST`` at the newest complete build and return it (the one just published, unless a newer one
    completed meanwhile)."""
    newest = complete_builds(output)[0].run_dir
    if read_latest(output) != newest:
        fs, path = open_fs(output)
        write_bytes_atomic(fs, join(path, LATEST), f"{newest}\n".encode())
        log.info("%s now names %s", join(output, LATEST), newest)
    return newest


def expire(output: str, keep: int, spare: set[str]) -> list[str]:
    """Delete the complete builds beyond the newest ``keep``, except those in ``spare``; returns what it deleted."""
    deleted = []
    for build in complete_builds(output)[keep:]:
        if build.run_dir in spare:
            continue
        fs, path = open_fs(build.run_dir)
        fs.rm_file(join(path, BUILD_MANIFEST))  # first: a deletion cut short leaves an incomplete build, not a
        fs.rm(path, recursive=True)  # complete one with files missing
        log.warning("retention (keep %d complete builds): deleted %s, started %s", keep, build.run_dir, build.started)
        deleted.append(build.run_dir)
    return deleted
