"""One build run's folder: one folder per run id, claimed by its run before anything is written, and its layout.

``{output}/{run id}``, with the run id percent-encoded where it holds a character outside ``A-Za-z0-9_.-~`` (so
``qa:col`` is ``qa%3Acol``, never ``qa-col``'s folder)::

    {run}/_RUN.json    the claim: which run owns the folder and its plan (``tokenization.plan``), written first
    {run}/ranks/       the tokenize stage's rank files, manifests, quarantine, markers
    {run}/merged/      the merge's output
    {run}/context/     the context-window shuffle's output (absent when the window is 0)
    {run}/report.html  the build report (and report.json), written by publish
    {run}/_BUILD.json  the dataset manifest, written last: its presence means the build is complete
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from urllib.parse import quote

from tokenization import manifest
from tokenization.errors import UsageError
from tokenization.storage import join, list_names, open_fs, put_if

BUILD_MANIFEST = "_BUILD.json"
BUILD_FORMAT = "corpus-tokenization/build/1"  # the format of _BUILD.json
RUN_CLAIM = "_RUN.json"
RUN_FORMAT = "corpus-tokenization/run/2"  # /1 held no plan


class BuildError(RuntimeError):
    """A build cannot go on: its folder belongs to another run, or its stages disagree about what they hold."""


def folder_for(output: str, run_id: str) -> str:
    """The folder of one run: one folder per run id, and one run id per folder. Characters outside
    ``A-Za-z0-9_.-~`` (and a leading dot) are percent-encoded, which no other run id can spell."""
    if not run_id or run_id in (".", ".."):
        raise UsageError(f"run id {run_id!r} cannot name a folder")
    name = quote(run_id, safe="")
    return join(output, "%2E" + name[1:] if name.startswith(".") else name)


def claim(folder: str, run_id: str, plan: dict) -> dict:
    """Make the folder this run's before anything is written, recording its ``plan``, or refuse: a folder claimed
    by another run, or holding files that no run claims, is never written into. Returns the claim as stored:
    ``{format, run_id, claimed, plan}``; a retry or a resume of this run finds its own claim, with the plan it
    made first (the caller compares the two), and ``claimed``, the start of the build's wall time."""
    fs, path = open_fs(folder)
    claim_path = join(path, RUN_CLAIM)
    owner = read_claim(folder)
    if owner is None:
        if found := sorted(list_names(fs, path)):
            raise BuildError(
                f"{folder} already holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}, which no run "
                f"claims: choose another output, or remove that folder"
            )
        made = {"format": RUN_FORMAT, "run_id": run_id, "claimed": time.time(), "plan": plan}
        try:
            put_if(fs, claim_path, manifest.dumps(made), absent=True)
            return made
        except FileExistsError:  # another task claimed it a moment ago: see whose claim it is
            owner = read_claim(folder)
    if owner["run_id"] != run_id:
        raise BuildError(
            f"{folder} holds the output of run {owner['run_id']!r}, not of {run_id!r}: two runs never share a "
            f"folder; trigger this run under another run id or output"
        )
    return owner


def read_claim(folder: str) -> dict | None:
    """The run folder's claim, or None when it has none; a claim that is not this version's whole record (an older
    version's has no plan) is refused, naming the file, since no plan can be resumed without it."""
    fs, path = open_fs(folder)
    where = join(folder, RUN_CLAIM)
    owner = manifest.read_json(fs, join(path, RUN_CLAIM), "run claim")  # a damaged one: one line naming it
    if owner is None:
        return None
    if not isinstance(owner.get("run_id"), str):
        raise BuildError(f"{where}: not a run claim (no run_id)")
    if owner.get("format") != RUN_FORMAT or not isinstance(owner.get("plan"), dict):
        raise BuildError(
            f"{where}: claimed by run {owner['run_id']!r} in format {owner.get('format', 'run/1')!r}, which records "
            f"no plan to resume: run it under a new build id"
        )
    return owner


def resolve_seed(seed: int | None, run_id: str) -> int:
    """The given seed, or one derived from the run id: one seed per run, whatever is retried."""
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


@dataclass(frozen=True)
class Layout:
    run_dir: str

    @property
    def ranks(self) -> str:
        return join(self.run_dir, "ranks")

    @property
    def merged(self) -> str:
        return join(self.run_dir, "merged")

    @property
    def context(self) -> str:
        return join(self.run_dir, "context")

    @property
    def manifest(self) -> str:
        return join(self.run_dir, BUILD_MANIFEST)
