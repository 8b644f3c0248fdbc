"""``verify``: check an output folder of ``.ds`` families or Megatron ``.bin/.idx`` pairs before anyone trains.

Each family is held to ``tokenization.formats.checks`` (ids, EOS, index, loss bytes, contents, streamed in large
blocks with their checksums, so a gigabyte takes seconds). This module is the audit of a folder's records against
its files and against each other: every problem is reported with its file and, where it has one, the token offset.

Every record is checked, since a build is only as trustworthy as the records that say what it holds: the
folder's manifests list the file families it must hold, so a family that is missing, a family that no manifest
lists, and counts that differ from what the files hold are problems. Each stage manifest needs its completion
marker (which records the manifest's sha256), each marker its stage manifest, and every file a marker lists must be
there with its size and checksum (the dataset's ``{name}.ds.metadata`` and the quarantine included); a file that no
record lists (a lone ``.ds.index``, a leftover) is a problem, and so are the merge's per-file checkpoints unless
each equals the entry its stage manifest holds for it. A malformed record is one problem naming its file and field.

A stage checks its own files with the same checks before it uploads them (``formats.checks.OwnCheck``), and its
manifest and marker say so: each block as its writer writes it, then the family's index, metadata and sizes, so
that no byte is read back. ``publish`` then reads no byte of them again (``vouched``): it checks the records, one
listing's sizes, and the books. The files are checked by the task that wrote them, so publishing costs the same
whatever the dataset's size. ``tokenization verify`` reads everything, unless asked to trust those checks and
re-read a random sample (``sample``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from tokenization.formats import DS, MEGATRON, token_file_names
from tokenization.formats.block_checks import Checks, Report
from tokenization.formats.checks import Listing, verify_dataset_metadata, verify_ds, verify_megatron
from tokenization.formats.names import rank_stem
from tokenization.output import manifest
from tokenization.output.attempts import STAGING
from tokenization.output.leases import LEASES
from tokenization.output.manifest import Described
from tokenization.output.runs import BUILD_MANIFEST, RUN_CLAIM, Layout
from tokenization.records import (
    BuildRecord,
    CompletionMarker,
    ContentsSum,
    MergeManifest,
    MergeOutput,
    OutputEntry,
    RankManifest,
    RecordError,
    StageManifest,
    stage_manifest,
)
from tokenization.storage.concurrent import in_batches
from tokenization.storage.folder import Folder, StorageOptions
from tokenization.wording import counted

R = TypeVar("R")


BOOKKEEPING = {manifest.MANIFESTS, manifest.COMPLETIONS, manifest.QUARANTINE, LEASES, STAGING}  # folders, not files
_NO_STAGE_MANIFEST = (
    f"no stage manifest in {manifest.MANIFESTS}/: the stage that writes this folder did not finish, or its manifest "
    "was removed; run that stage again"
)


def verify(
    folder: Folder,
    tokenizer: str | None = None,
    eos_token: str | None = None,
    *,
    checks: Checks | None = None,
    vouched: bool = False,
    sample: int = 0,
) -> Report:
    """Check every token file directly inside ``folder`` and every record of the folder; a problem-free report means
    the folder is usable. ``checks`` (else those of ``tokenizer``, else, in a build's run, those of the tokenizer
    the build recorded): what ids and document ends must be. With
    ``vouched``, the families whose stage checked them before upload (its manifest and marker say so, with at
    least ``checks``) are not read: their sizes are checked against the listing, their checksums taken from the
    marker; except ``sample`` of them, chosen at random, which are read and checked all the same."""
    report = Report()
    if checks is None and tokenizer:
        checks = tokenizer_checks(tokenizer, eos_token, folder.options)
    listing = Listing.of(folder)
    if _removed_on_purpose(listing):
        return _verify_records_alone(listing, report)
    if checks is None:
        checks = _build_checks(listing, report)
    records = _read_records(listing, report)
    described = manifest.entries_by_name(read.record for read in records.manifests.values()) if records else {}
    ds_files, bin_files = token_file_names(listing.sizes, (DS,)), token_file_names(listing.sizes, (MEGATRON,))
    if not ds_files and not bin_files:
        report.problem(folder.url, "no .ds or .bin files")
    entries = {name: d.entry for name, d in described.items()}
    trusted = _trusted(records, checks, sample, report) if vouched and records else set()
    for name in ds_files + bin_files:
        if name in trusted:
            _vouched(listing, entries[name], report)
        elif name in ds_files:
            verify_ds(listing, name, entries.get(name), checks, report)
        else:
            verify_megatron(listing, name, entries.get(name), checks, report)
    if skipped := len(trusted.intersection(ds_files + bin_files)):
        report.notes.append(
            f"{folder.url}: {counted(skipped, 'file')} not read again: their stages checked them before upload"
        )
    verify_dataset_metadata(listing, report)
    if records:  # after the token files: their checksums were taken while they were streamed
        _check_records(listing, records, {*ds_files, *bin_files}, described, report)
    return report


def tokenizer_checks(tokenizer: str, eos_token: str | None, storage_options: StorageOptions | None = None) -> Checks:
    """What a tokenizer lets verify check: ids below its vocabulary size, and its EOS at document ends (when the
    build wrote one)."""
    from tokenization.tokenizer.encoding import Encoder  # the tokenizer libraries: only where a tokenizer is named

    encoder = Encoder(tokenizer, eos_token=eos_token, no_eos=eos_token is None, storage_options=storage_options)
    return Checks(encoder.vocab_size, encoder.eos_id)


def _removed_on_purpose(listing: Listing) -> bool:
    """Whether the folder is a stage folder of a published build whose record says publish removed its token files
    (``tokenization.builds.footprint``)."""
    if not _in_a_run(listing):
        return False
    run = listing.folder.parent
    build = BuildRecord.read(run, BUILD_MANIFEST)
    return build is not None and listing.folder.name in build.removed


def _verify_records_alone(listing: Listing, report: Report) -> Report:
    """A stage folder whose token files were removed on purpose: its records are checked against each other
    (``check_records_alone``), not against files that are gone; a note says why, and names token files still there
    (a removal cut short, which publishing again finishes)."""
    stages = check_records_alone(listing, report)
    report.notes.append(
        f"{listing.url}: its token files were removed once the build was published, as its {BUILD_MANIFEST} says "
        f"(a build with keep_intermediate keeps them): only its records are checked ({stages} stage "
        f"manifest{'s' * (stages != 1)})"
    )
    if left := [name for name in listing.sizes if _family(name).endswith((DS, MEGATRON))]:
        report.notes.append(
            f"{listing.url}: {counted(len(left), 'token file')} not removed yet (a removal cut short): "
            "publishing the build again removes them"
        )
    return report


def check_records_alone(listing: Listing, report: Report) -> int:
    """A stage folder's records against each other, none against its files: it has a stage manifest, each has its
    completion marker with its checksum and adds up, each marker its manifest and the manifest's files, and the
    merge's checkpoints are its manifest's entries (what a stage folder whose token files are gone still proves);
    returns the stage manifests found."""
    records = _read_records(listing, report)
    if records is None:
        return 0
    if not records.stages:
        report.problem(listing.url, _NO_STAGE_MANIFEST)
    _check_stages(listing, records.stages, records.markers, report)
    _check_markers(listing, records.stages, records.markers, set(), report, files=False)
    _check_checkpoints(listing, records, report)
    return len(records.stages)


def _build_checks(listing: Listing, report: Report) -> Checks:
    """In a stage folder of a build's run, the vocabulary size and EOS id that the build recorded (every rank takes
    them from the plan, and its manifest records them: rank 0's is read), said in a note; elsewhere, none. Without
    them, a build's dataset holding ids past its vocabulary would pass."""
    if not _in_a_run(listing):
        return Checks()
    run = listing.folder.parent
    ranks = run.sub(Layout.RANKS)
    name = manifest.manifest_name(rank_stem(0))
    try:
        rank, why = RankManifest.read(ranks, name), "is missing"
    except RecordError:  # a verify of the ranks' folder says what is wrong with it
        rank, why = None, "is not a valid manifest"
    if rank is None:
        shown = f"{Layout.RANKS}/{name}"  # the run's, wherever it is
        report.notes.append(
            f"{listing.url}: ids not checked against the build's tokenizer: the run's {shown} {why}; pass --tokenizer"
        )
        return Checks()
    vocab, eos = rank.tokenizer.vocab_size, rank.tokenizer.eos_id
    ends = "no EOS (the build added none)" if eos is None else f"EOS id {eos}"
    report.notes.append(f"{listing.url}: ids checked against the build's tokenizer: vocabulary {vocab:,}, {ends}")
    return Checks(vocab, eos)


def _trusted(records: _Records, checks: Checks, sample: int, report: Report) -> set[str]:
    """The families that stages checked before upload, with at least ``checks``, as both their manifest and their
    marker say; minus ``sample`` of them, chosen at random, to be read all the same."""
    trusted = set()
    for stem, read in records.stages.items():
        own, marker = read.record.checked, records.markers.get(stem)
        if own is not None and marker is not None and marker.checked == own and checks.made_by(own):
            trusted |= set(own.families) & {entry.name for entry in read.record.outputs}
            report.notes += own.notes
    return trusted - set(random.sample(sorted(trusted), min(sample, len(trusted))))


def _vouched(listing: Listing, entry: OutputEntry, report: Report) -> None:
    """A family its stage checked before upload: counted from its entry; its files' sizes are checked against the
    listing, and their checksums are the marker's (``_check_markers``)."""
    report.files += 1
    report.tokens += entry.tokens
    listing.vouched.update(entry.files)


@dataclass(frozen=True)
class _Read(Generic[R]):
    """A record and the bytes it was read from (a marker records their sha256)."""

    data: bytes
    record: R


@dataclass
class _Records:
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


def _read_records(listing: Listing, report: Report) -> _Records | None:
    """Every record of the listing, each checked; None when one is malformed (each such is one problem): a listing
    whose records cannot be read cannot be checked against them."""
    manifests = _read_subfolder(listing, manifest.MANIFESTS, stage_manifest, report)
    markers = _read_subfolder(listing, manifest.COMPLETIONS, CompletionMarker.loads, report)
    if manifests is None or markers is None:
        return None
    return _Records(manifests, {stem: read.record for stem, read in markers.items()})


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


def _check_records(
    listing: Listing, records: _Records, families: set[str], described: dict[str, Described], report: Report
) -> None:
    """The folder holds what its records say, and its records vouch for each other: every stage manifest has its
    completion marker, every marker its stage manifest, every file a marker lists is there with its size and
    sha256, every file there is listed, and the merge's checkpoints are its manifest's entries."""
    stages = records.stages
    if stages:
        missing = _check_families(listing, families, described, report)
    elif records.manifests or records.markers or _in_a_run(listing):
        report.problem(listing.url, _NO_STAGE_MANIFEST)
        missing = set()
    else:
        report.notes.append(f"{listing.url}: no manifests, so which files belong here cannot be checked")
        return
    _check_stages(listing, stages, records.markers, report)
    listed = _check_markers(listing, stages, records.markers, missing, report)
    _check_checkpoints(listing, records, report)
    listed |= {name for d in described.values() for name in d.entry.files}
    for name in sorted(n for n in listing.sizes if n not in listed and not _bookkeeping(n)):
        if _family(name) not in families - set(described):  # an unlisted family is one problem, not one a file
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


def _check_stages(
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


def _check_markers(
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
                if _family(name) not in missing:
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


def _check_checkpoints(listing: Listing, records: _Records, report: Report) -> None:
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


def _in_a_run(listing: Listing) -> bool:
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


def _family(name: str) -> str:
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
