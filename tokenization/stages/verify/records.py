"""The records of a folder verify reads (stage manifests, completion markers, the merge's checkpoints), held against
the folder's files and against each other: every family listed and present, every marker's files there with their
sizes and checksums, each manifest's counts adding up, each checkpoint its manifest's entry."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from tokenization.formats import DS, MEGATRON
from tokenization.formats.block_checks import Report
from tokenization.formats.checks import Listing
from tokenization.output import manifest
from tokenization.output.attempts import STAGING
from tokenization.output.leases import LEASES
from tokenization.output.manifest import Described
from tokenization.output.runs import RUN_CLAIM
from tokenization.records import (
    CompletionMarker,
    ContentsSum,
    MergeManifest,
    MergeOutput,
    RankManifest,
    RecordError,
    StageManifest,
    stage_manifest,
)
from tokenization.storage.concurrent import in_batches

R = TypeVar("R")


BOOKKEEPING = {manifest.MANIFESTS, manifest.COMPLETIONS, manifest.QUARANTINE, LEASES, STAGING}  # folders, not files
NO_STAGE_MANIFEST = (
    f"no stage manifest in {manifest.MANIFESTS}/: the stage that writes this folder did not finish, or its manifest "
    "was removed; run that stage again"
)


@dataclass(frozen=True)
class _Read(Generic[R]):
    """A record and the bytes it was read from (a marker records their sha256)."""

    data: bytes
    record: R


@dataclass
class Records:
    """A folder's manifests, by stem: the stage manifests and the merge's per-file checkpoints; and its completion
    markers, by stem."""

    manifests: dict[str, _Read[StageManifest | MergeOutput]]
    markers: dict[str, CompletionMarker]

    @property
    def stages(self) -> dict[str, _Read[StageManifest]]:
        # cast: the reads kept are those whose record is a StageManifest
        return {
            stem: cast("_Read[StageManifest]", read)
            for stem, read in self.manifests.items()
            if isinstance(read.record, StageManifest)
        }


def read_records(listing: Listing, report: Report) -> Records | None:
    """Every record of the listing, each checked; None when one is malformed (each such is one problem): a listing
    whose records cannot be read cannot be checked against them."""
    manifests = _read_subfolder(listing, manifest.MANIFESTS, stage_manifest, report)
    markers = _read_subfolder(listing, manifest.COMPLETIONS, CompletionMarker.loads, report)
    if manifests is None or markers is None:
        return None
    return Records(manifests, {stem: read.record for stem, read in markers.items()})


def _read_subfolder(
    listing: Listing, sub: str, parse: Callable[[bytes, str], R], report: Report
) -> dict[str, _Read[R]] | None:
    """The records of ``sub`` by stem, with their bytes; None when one is malformed. A file there that is no
    record is a problem."""
    records: dict[str, _Read[R]] | None = {}
    folder = listing.folder.sub(sub)
    names = sorted(folder.list())
    for name in names:
        if not name.endswith(".json"):
            report.problem(
                listing.label(f"{sub}/{name}"), f"not a record: only {sub}/{{stem}}.json files belong there; remove it"
            )
    for batch in in_batches([name for name in names if name.endswith(".json")]):
        for name, data in folder.read_many(batch).items():
            if data is None:  # removed since the listing: a stage is writing this folder
                continue
            try:
                record = parse(data, listing.label(f"{sub}/{name}"))
            except RecordError as exc:
                report.problems.append(str(exc))
                records = None
                continue
            if records is not None:
                records[name.removesuffix(".json")] = _Read(data, record)
    return records


def check_records(
    listing: Listing, records: Records, families: set[str], described: dict[str, Described], report: Report
) -> None:
    """The folder holds what its records say, and its records vouch for each other: every stage manifest has its
    completion marker, every marker its stage manifest, every file a marker lists is there with its size and
    sha256, every file there is listed, and the merge's checkpoints are its manifest's entries."""
    stages = records.stages
    if stages:
        missing = _check_families(listing, families, described, report)
    elif records.manifests or records.markers or in_a_run(listing):
        report.problem(listing.url, NO_STAGE_MANIFEST)
        missing = set()
    else:
        report.notes.append(f"{listing.url}: no manifests, so which files belong here cannot be checked")
        return
    check_stages(listing, stages, records.markers, report)
    listed = check_markers(listing, stages, records.markers, missing, report)
    check_checkpoints(listing, records, report)
    listed |= {name for d in described.values() for name in d.entry.files}
    for name in sorted(n for n in listing.sizes if n not in listed and not _bookkeeping(n)):
        if family(name) not in families - set(described):  # an unlisted family is one problem, not one a file
            report.problem(
                listing.label(name),
                "no completion marker lists this file: a leftover of another run, or of a stage that did not "
                "finish; remove it",
            )


def _check_families(listing: Listing, families: set[str], described: dict[str, Described], report: Report) -> set[str]:
    """Every family a manifest lists is there and every family there is listed; returns the missing ones."""
    missing = set(described) - families
    for name in sorted(missing):
        report.problem(listing.label(name), f"listed in {_source(described[name])} but missing")
    for name in sorted(families - set(described)):
        report.problem(
            listing.label(name),
            "no manifest lists this file family: a leftover of another run, or the output of a stage that did "
            "not finish",
        )
    return missing


def check_stages(
    listing: Listing, stages: dict[str, _Read[StageManifest]], markers: dict[str, CompletionMarker], report: Report
) -> None:
    """Every stage manifest is complete (its marker exists and names its checksum) and adds up to its outputs."""
    for stem, read in sorted(stages.items()):
        where = listing.label(manifest.manifest_name(stem))
        marker = markers.get(stem)
        if marker is None:
            report.problem(where, "has no completion marker: its stage did not finish")
        elif marker.sha256 != hashlib.sha256(read.data).hexdigest():
            report.problem(where, "differs from the checksum its completion marker records")
        said, held = read.record.tokens_written, read.record.output_tokens
        if said != held:
            report.problem(where, f"counts {said} tokens written, its outputs list {held}")
        _check_contents(read.record, where, report)


def _check_contents(record: StageManifest, where: str, report: Report) -> None:
    """A stage's contents add up: what its counts say it wrote is what its outputs hold, and a stage that moves
    pieces whole wrote the pieces it read (records made before contents were are not checked)."""
    counts = record.counts
    listed = ContentsSum.total(entry.contents for entry in record.outputs)
    if counts.contents_out is not None and listed is not None and listed != counts.contents_out:
        report.problem(
            where, f"counts {counts.contents_out.value.describe()} written, its outputs list {listed.value.describe()}"
        )
    given, wrote = counts.contents_in, counts.contents_out
    if isinstance(record, RankManifest) and (not_chosen := record.counts.tokens_not_chosen) is not None:
        _check_chosen(record, not_chosen, where, report)
    if record.writes_what_it_read and given is not None and wrote is not None and given != wrote:
        report.problem(
            where,
            f"read {given.value.describe()} but wrote {wrote.value.describe()}: a shuffle that moves pieces whole "
            "must write each once",
        )


def _check_chosen(record: RankManifest, not_chosen: int, where: str, report: Report) -> None:
    """A rank that wrote a mixture's chosen documents only (``builds.choice``; its own check proved them against
    what it read): what it wrote and held back add up to what it held, and it wrote no more documents than it read."""
    c = record.counts
    given, wrote = c.contents_in, c.contents_out
    more = given is not None and wrote is not None and wrote.pieces > given.pieces
    if c.tokens_written + not_chosen != c.tokens or more:
        report.problem(
            where,
            f"held {c.tokens:,} tokens of {c.docs_written:,} documents, but wrote {c.tokens_written:,} tokens"
            f"{f' of {wrote.pieces:,} documents' if wrote else ''} and left {not_chosen:,} not chosen: a rank that "
            "writes the documents a mixture chose writes each of them once, and nothing else",
        )


def check_markers(
    listing: Listing,
    stages: dict[str, _Read[StageManifest]],
    markers: dict[str, CompletionMarker],
    missing: set[str],
    report: Report,
    files: bool = True,
) -> set[str]:
    """Every marker belongs to a stage manifest and lists its files, and (with ``files``) every file it lists is
    there with its size and checksum (a missing family is reported once, as such); returns the files the markers
    list."""
    listed: set[str] = set()
    for stem, marker in sorted(markers.items()):
        where, own = listing.label(manifest.marker_name(stem)), manifest.manifest_name(stem)
        if stem not in stages:
            report.problem(
                where, f"no stage manifest {own}: a marker copied from elsewhere, or its manifest was removed"
            )
            continue
        if marker.manifest != own:
            report.problem(where, f"names the manifest {marker.manifest}, not its own {own}")
        if marker.checked != stages[stem].record.checked:
            report.problem(where, f"records another check of the stage's own files than its manifest {own} does")
        for name in sorted(set(stages[stem].record.output_files()) - set(marker.files)):
            report.problem(listing.label(name), f"its manifest {own} lists it, its completion marker does not")
        listed |= set(marker.files)
        for name, info in sorted(marker.files.items() if files else ()):
            size = listing.size(name)
            if size is None:
                if family(name) not in missing:
                    report.problem(listing.label(name), f"listed by {manifest.marker_name(stem)} but missing")
            elif size != info.bytes or (
                name not in listing.vouched and listing.checksum(name, info.algorithm) != info.checksum
            ):
                report.problem(
                    listing.label(name),
                    f"differs from what {manifest.marker_name(stem)} records ({size} bytes, {info.algorithm} "
                    f"{listing.checksum(name, info.algorithm)[:12]}…, not {info.bytes} bytes, {info.checksum[:12]}…)",
                )
    return listed


def check_checkpoints(listing: Listing, records: Records, report: Report) -> None:
    """The merge's per-file checkpoints say where a resumed merge starts; its stage manifest owns them, as copies
    of its output entries: each must be there and equal to its entry, and no other may be."""
    owners = {
        entry.name.removesuffix(DS): (stem, entry)
        for stem, read in records.stages.items()
        if isinstance(read.record, MergeManifest)
        for entry in read.record.outputs
    }
    checkpoints = set(records.manifests) - set(records.stages)
    for stem in sorted(checkpoints | set(owners)):
        where = listing.label(manifest.manifest_name(stem))
        if stem not in owners:
            report.problem(where, "a merge checkpoint that no stage manifest lists: a leftover of an unfinished merge")
            continue
        owner, entry = owners[stem]
        what = f"the checkpoint of {entry.name}, which {manifest.manifest_name(owner)} lists"
        if stem not in checkpoints:
            report.problem(where, f"missing: {what} (a resumed merge would redo that file and every later one)")
        elif records.manifests[stem].record != entry:
            report.problem(where, f"differs from {what}: a resumed merge would start from it")


def in_a_run(listing: Listing) -> bool:
    """Whether the folder is a stage folder of a build's run (its parent holds the run's claim)."""
    if listing.folder.at_top:
        return False
    try:
        listing.folder.parent.read(RUN_CLAIM)
    except FileNotFoundError:
        return False
    return True


def _bookkeeping(name: str) -> bool:
    """The folders of records and attempts, and an attempt's lock file, which verify checks on their own or not
    at all (a lock file outlives a killed attempt until the next one)."""
    return name in BOOKKEEPING or (name.startswith(".") and name.endswith(".lock"))


def family(name: str) -> str:
    """The token file that names the family of a file: ``X.ds`` for ``X.ds.index``, ``X.bin`` for ``X.idx``."""
    if name.endswith(".idx"):
        return name.removesuffix(".idx") + MEGATRON
    head, dot_ds, _ = name.rpartition(DS + ".")
    return head + DS if dot_ds else name


def _source(described: Described) -> str:
    owner = described.listed_by
    if not isinstance(owner, StageManifest):
        return f"the merge checkpoint of {owner.name}"
    stem = owner.prefix
    return f"the {owner.stage} manifest{f' of {stem}' if stem else ''}"
