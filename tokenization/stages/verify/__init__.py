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

The package: ``verify`` here reads the folder's families and decides what to trust; ``records`` reads its records
and holds them against its files and each other.
"""

from __future__ import annotations

import random

from tokenization.formats import DS, MEGATRON, token_file_names
from tokenization.formats.block_checks import Checks, Report
from tokenization.formats.checks import Listing, verify_dataset_metadata, verify_ds, verify_megatron
from tokenization.formats.names import rank_stem
from tokenization.output import manifest
from tokenization.output.runs import BUILD_MANIFEST, Layout
from tokenization.records import BuildRecord, OutputEntry, RankManifest, RecordError
from tokenization.stages.verify.records import (
    NO_STAGE_MANIFEST,
    Records,
    check_checkpoints,
    check_markers,
    check_records,
    check_stages,
    family,
    in_a_run,
    read_records,
)
from tokenization.storage.folder import Folder, StorageOptions
from tokenization.wording import counted


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
    records = read_records(listing, report)
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
        check_records(listing, records, {*ds_files, *bin_files}, described, report)
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
    if not in_a_run(listing):
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
    if left := [name for name in listing.sizes if family(name).endswith((DS, MEGATRON))]:
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
    records = read_records(listing, report)
    if records is None:
        return 0
    if not records.stages:
        report.problem(listing.url, NO_STAGE_MANIFEST)
    check_stages(listing, records.stages, records.markers, report)
    check_markers(listing, records.stages, records.markers, set(), report, files=False)
    check_checkpoints(listing, records, report)
    return len(records.stages)


def _build_checks(listing: Listing, report: Report) -> Checks:
    """In a stage folder of a build's run, the vocabulary size and EOS id that the build recorded (every rank takes
    them from the plan, and its manifest records them: rank 0's is read), said in a note; elsewhere, none. Without
    them, a build's dataset holding ids past its vocabulary would pass."""
    if not in_a_run(listing):
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


def _trusted(records: Records, checks: Checks, sample: int, report: Report) -> set[str]:
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
    listing, and their checksums are the marker's (``check_markers``)."""
    report.files += 1
    report.tokens += entry.tokens
    listing.vouched.update(entry.files)
