"""One build run's folder: one folder per run id, claimed by its run before anything is written, and its layout.

``{output}/{run id}``, the run id spelt safely (``folder_name``: ``manual__2026-12-05T09:53:42+00:00`` is
``manual__2026-12-05T09-53-42-00-00~862f2572``, never ``qa-col``'s folder for ``qa:col``), so that a folder's
name and its ``file://`` link need no percent-encoding. Beside the run folders, the output holds ``LATEST``
(``tokenization.builds.latest``) and names starting with a dot (the tokenization cache's ``.cache``, lock files),
which ``folder_for`` gives no run::

    {run}/_RUN.json    the claim: which run owns the folder and its plan (``tokenization.builds.plan``), written first
    {run}/ranks/       the tokenize stage's rank files, manifests, quarantine, markers; when bucketed, each
                       bucket's rank files in a folder of their own (``ranks/bucket00007/``)
    {run}/merged/      the merge's output
    {run}/context/     the context-window shuffle's output (absent when the window is 0)
    {run}/report.html  the build report (and report.json), written by publish
    {run}/_BUILD.json  the dataset manifest, written last: its presence means the build is complete

Once a build is published, the token files of the stage folders before its dataset's (``ranks/``, and ``merged/``
when a context shuffle follows) are removed unless it keeps them; their records stay (``builds.footprint``).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import quote

from tokenization.errors import TokenizationError, UsageError
from tokenization.records import PlanReading, TokenizerFacts
from tokenization.storage.folder import Folder, PutMode

if TYPE_CHECKING:  # imported where used: a rank imports this module for its names, and not the build records
    from tokenization.records import BuildRecord, PlanRecord, RunClaim

BUILD_MANIFEST = "_BUILD.json"
RUN_CLAIM = "_RUN.json"
LATEST = "LATEST"  # beside the run folders: names the newest complete build's
MAX_FOLDER_NAME = 200  # characters: a file name holds 255 bytes, an S3 key 1,024 with the output and the run's files
SHOWN_CHARACTERS = 40  # of a build id too long to name a folder
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # what a run folder's name spells as "-"


class BuildError(TokenizationError):
    """A build cannot go on: its folder belongs to another run, or its stages disagree about what they hold."""


class PlanConflict(BuildError):
    """A run id is asked to resume with another plan, or its plan's files are no longer what it planned."""


def folder_for(output: str, run_id: str) -> str:
    """The folder of one run: one folder per run id, and one run id per folder (``folder_name``). A run id (the
    build id) that can name no folder of its own is refused, before any work."""
    if not run_id or run_id in (".", ".."):
        raise UsageError(f"build id {run_id!r} cannot name a folder: choose another build id")
    if not run_id.isprintable():
        raise UsageError(
            f"build id {run_id!r} holds a control character or bytes that are not UTF-8: choose a build id of "
            f"printable characters"
        )
    name = folder_name(run_id)
    if len(name) > MAX_FOLDER_NAME:
        raise UsageError(
            f"build id {run_id[:SHOWN_CHARACTERS]!r}{'...' * (len(run_id) > SHOWN_CHARACTERS)} names a folder of "
            f"{len(name)} characters, more than the {MAX_FOLDER_NAME} a run folder's name may have: choose a shorter "
            f"build id"
        )
    if name.upper() == LATEST:
        latest = Folder(output).url_of(LATEST)
        raise UsageError(
            f"build id {run_id!r} is the name (ignoring case, as some filesystems do) of {latest}, "
            f"which points at the newest complete build: choose another build id (in Airflow, another run id)"
        )
    return Folder(output).url_of(name)


def folder_name(run_id: str) -> str:
    """A run id as a folder's name that no URL or shell needs to escape: a run id of ``A-Za-z0-9_.-`` alone (and no
    leading dot) as it is; any other with each other character as ``-`` and, after a ``~``, the first 8 hex digits
    of the run id's sha256. Deterministic, and collision-safe: a name without ``~`` is its run id, and one with it
    names its run id's hash (``qa-col``, ``qa-col~<hash of qa:col>``, ``qa-col~<hash of qa+col>``)."""
    name = UNSAFE.sub("-", run_id)
    name = "-" + name[1:] if name.startswith(".") else name
    return name if name == run_id else f"{name}~{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def percent_encoded_name(run_id: str) -> str:
    """The folder name earlier versions gave a run id (percent-encoded), by which their builds are still known."""
    name = quote(run_id, safe="")
    return "%2E" + name[1:] if name.startswith(".") else name


def claim(
    folder: Folder,
    run_id: str,
    plan: PlanRecord,
    tokenizer: TokenizerFacts | None = None,
    reading: PlanReading | None = None,
) -> RunClaim:
    """Make the folder this run's before anything is written, recording its ``plan`` (what loading the
    ``tokenizer`` told it, and what ``reading`` the input cost it), or refuse: a folder claimed by another run, or
    holding files that no run claims, is never written into. Returns the claim as stored; a retry or a resume of
    this run finds its own claim, with the plan it made first (the caller compares the two), and when it was
    claimed, the start of the build's wall time."""
    from tokenization.records import RunClaim

    owner = read_claim(folder)
    if owner is None:
        found = sorted(folder.list())
        if found and RUN_CLAIM not in found:
            raise BuildError(
                f"{folder.url} already holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}, which no run "
                f"claims: choose another output, or remove that folder"
            )
        made = RunClaim(run_id=run_id, claimed=time.time(), plan=plan, tokenizer=tokenizer, reading=reading)
        try:
            if not found:
                made.write(folder, RUN_CLAIM, PutMode.CREATE)
                return made
        except FileExistsError:
            pass
        owner = read_claim(folder)  # another task claimed it a moment ago: see whose claim it is
        if owner is None:
            raise BuildError(f"{folder.url}: a claim written a moment ago by another task is gone again")
    if owner.run_id != run_id:
        raise BuildError(
            f"{folder.url} holds the output of run {owner.run_id!r}, not of {run_id!r}: two runs never share a "
            f"folder; trigger this run under another run id or output"
        )
    return owner


def read_claim(run: Folder) -> RunClaim | None:
    """The run folder's claim, or None when it has none; a damaged one, or one that records no plan (an older
    version's), is one line naming the file, since no plan can be resumed without it."""
    from tokenization.records import RunClaim

    where = run.url_of(RUN_CLAIM)
    owner = RunClaim.read(run, RUN_CLAIM)
    if owner is not None and owner.plan is None:
        raise BuildError(
            f"{where}: claimed by run {owner.run_id!r} in an older format, which records no plan to resume: run it "
            f"under a new build id"
        )
    return owner


def read_build(run: Folder) -> BuildRecord | None:
    """The run's build record, checked, or None while the build is not complete."""
    from tokenization.records import BuildRecord

    return BuildRecord.read(run, BUILD_MANIFEST)


def resolve_seed(seed: int | None, run_id: str) -> int:
    """The given seed, or one derived from the run id: one seed per run, whatever is retried."""
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


@dataclass(frozen=True)
class Layout:
    """A run folder's stage folders, each a Folder opened as the run folder is."""

    RANKS: ClassVar[str] = "ranks"
    MERGED: ClassVar[str] = "merged"
    CONTEXT: ClassVar[str] = "context"
    MDS: ClassVar[str] = "mds"  # the context windows as MDS shards, where asked for (``stages.export_mds``)
    run: Folder

    @property
    def run_dir(self) -> str:
        return self.run.url

    @property
    def ranks(self) -> Folder:
        return self.run.sub(self.RANKS)

    @property
    def merged(self) -> Folder:
        return self.run.sub(self.MERGED)

    @property
    def context(self) -> Folder:
        return self.run.sub(self.CONTEXT)

    @property
    def mds(self) -> Folder:
        return self.run.sub(self.MDS)

    @property
    def stages(self) -> dict[str, Folder]:
        """The stage folders by name, in the order the stages write them."""
        return {self.RANKS: self.ranks, self.MERGED: self.merged, self.CONTEXT: self.context}
