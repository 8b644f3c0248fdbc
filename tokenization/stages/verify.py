"""``verify``: check an output folder of ``.ds`` families or Megatron ``.bin/.idx`` pairs before anyone trains.

Every problem is reported with its file and, where it has one, the token offset. Files are streamed in large
blocks (tokens, loss bytes and checksums in one pass), so memory stays bounded by the block size and the index
arrays, and a gigabyte takes seconds.

Then every record is checked, since a build is only as trustworthy as the records that say what it holds: the
folder's manifests list the file families it must hold, so a family that is missing, a family that no manifest
lists, and counts that differ from what the files hold are problems. Each stage manifest needs its completion
marker (which records the manifest's sha256), each marker its stage manifest, and every file a marker lists must be
there with its size and sha256 (the dataset's ``{name}.ds.metadata`` and the quarantine included); a file that no
record lists (a lone ``.ds.index``, a leftover) is a problem, and so are the merge's per-file checkpoints unless
each equals the entry its stage manifest holds for it. A malformed record is one problem naming its file and field.

A stage checks its own files the same way before it uploads them (``OwnCheck``), and its manifest and marker say
so: each block as its writer writes it, then the family's index, metadata and sizes, so that no byte is read back.
``publish`` then reads no byte of them again (``vouched``): it checks the records, one listing's sizes, and the
books. The files are checked by the task that wrote them, so publishing costs the same whatever the dataset's
size. ``tokenization verify`` reads everything, unless asked to trust those checks and re-read a random sample
(``sample``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Generic, Literal, TypeVar, cast

import fsspec
import numpy as np

from tokenization.errors import TokenizationError
from tokenization.formats import DS, MEGATRON, token_file_names
from tokenization.formats.contents import Contents, ContentsHasher, within
from tokenization.formats.ds import (
    INDEX_DTYPE,
    LOSS_DTYPE,
    Metadata,
    Observer,
    TokenFileError,
    map_array,
    token_dtype,
)
from tokenization.formats.megatron import MegatronFile
from tokenization.formats.names import BUCKET_FOLDER, rank_stem
from tokenization.output import manifest
from tokenization.output.attempts import LEASES, STAGING
from tokenization.output.manifest import Described
from tokenization.output.runs import BUILD_MANIFEST, RUN_CLAIM, Layout
from tokenization.records import (
    BuildRecord,
    CompletionMarker,
    ContentsSum,
    MergeManifest,
    MergeOutput,
    OutputEntry,
    PseudoEnds,
    RankManifest,
    RecordError,
    SelfCheck,
    StageManifest,
    stage_manifest,
)
from tokenization.storage.files import in_batches, join, list_names, list_sizes, map_concurrently, open_fs, read_many

R = TypeVar("R")
BLOCK_BYTES = 64 << 20
MAX_REPORTED = 10  # problems of one kind reported per file, then a count
BOOKKEEPING = {manifest.MANIFESTS, manifest.COMPLETIONS, manifest.QUARANTINE, LEASES, STAGING}  # folders, not files


@dataclass
class Report:
    files: int = 0
    tokens: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, where: str, message: str, offset: int | None = None) -> None:
        self.problems.append(f"{where}{f' @ token {offset}' if offset is not None else ''}: {message}")

    def problems_at(self, where: str, message: str, offsets: np.ndarray) -> None:
        """Report the first few offsets where a check failed, and how many there were."""
        for offset in offsets[:MAX_REPORTED].tolist():
            self.problem(where, message, offset)
        if len(offsets) > MAX_REPORTED:
            self.problem(where, f"{message}: {len(offsets) - MAX_REPORTED} more like this")


@dataclass(frozen=True)
class Checks:
    """What a tokenizer lets verify check: ids below the vocabulary size, EOS at document ends (None: unchecked)."""

    vocab_size: int | None = None
    eos_id: int | None = None

    @classmethod
    def of(cls, tokenizer: str | None, eos_token: str | None) -> Checks:
        if not tokenizer:
            return cls()
        from tokenization.tokenizer.encoding import Encoder  # the tokenizer libraries: only where a tokenizer is named

        encoder = Encoder(tokenizer, eos_token=eos_token, no_eos=eos_token is None)
        return cls(encoder.vocab_size, encoder.eos_id)

    def made_by(self, check: SelfCheck) -> bool:
        """Whether a stage's own check checked at least what these checks ask."""
        return all(
            want is None or want == made
            for want, made in ((self.vocab_size, check.vocab_size), (self.eos_id, check.eos_id))
        )


def verify(
    url: str,
    tokenizer: str | None = None,
    eos_token: str | None = None,
    *,
    checks: Checks | None = None,
    vouched: bool = False,
    sample: int = 0,
) -> Report:
    """Check every token file directly inside ``url`` and every record of the folder; a problem-free report means
    the folder is usable. ``checks`` (else those of ``tokenizer``, else, in a build's run, those of the tokenizer
    the build recorded): what ids and document ends must be. With
    ``vouched``, the families whose stage checked them before upload (its manifest and marker say so, with at
    least ``checks``) are not read: their sizes are checked against the listing, their sha256 taken from the
    marker; except ``sample`` of them, chosen at random, which are read and checked all the same."""
    report = Report()
    if checks is None and tokenizer:
        checks = Checks.of(tokenizer, eos_token)
    folder = _Folder.open(url)
    if _removed_on_purpose(folder):
        return _verify_records_alone(folder, report)
    if checks is None:
        checks = _build_checks(folder, report)
    records = _read_records(folder, report)
    described = manifest.entries_by_name(read.record for read in records.manifests.values()) if records else {}
    ds_files, bin_files = token_file_names(folder.sizes, (DS,)), token_file_names(folder.sizes, (MEGATRON,))
    if not ds_files and not bin_files:
        report.problem(url, "no .ds or .bin files")
    entries = {name: d.entry for name, d in described.items()}
    trusted = _trusted(records, checks, sample, report) if vouched and records else set()
    for name in ds_files + bin_files:
        if name in trusted:
            _vouched(folder, entries[name], report)
        elif name in ds_files:
            _verify_ds(folder, name, entries.get(name), checks, report)
        else:
            _verify_megatron(folder, name, entries.get(name), checks, report)
    if skipped := len(trusted.intersection(ds_files + bin_files)):
        report.notes.append(f"{url}: {skipped} files not read again: their stages checked them before upload")
    _verify_dataset_metadata(folder, report)
    if records:  # after the token files: their checksums were taken while they were streamed
        _check_records(folder, records, {*ds_files, *bin_files}, described, report)
    return report


def _removed_on_purpose(folder: _Folder) -> bool:
    """Whether the folder is a stage folder of a published build whose record says publish removed its token files
    (``tokenization.builds.footprint``)."""
    if not _in_a_run(folder):
        return False
    parent, _, name = folder.path.rstrip("/").rpartition("/")
    where = join(folder.url.rpartition("/")[0], BUILD_MANIFEST)
    build = BuildRecord.read(folder.fs, join(parent, BUILD_MANIFEST), where)
    return build is not None and name in build.removed


def _verify_records_alone(folder: _Folder, report: Report) -> Report:
    """A stage folder whose token files were removed on purpose: its records are checked against each other (each
    stage manifest has its completion marker, with its checksum, and adds up), not against files that are gone; a
    note says why, and names token files still there (a removal cut short, which publishing again finishes)."""
    records = _read_records(folder, report)
    if records is not None:
        _check_stages(folder, records.stages, records.markers, report)
    stages = len(records.stages) if records else 0
    report.notes.append(
        f"{folder.url}: its token files were removed once the build was published, as its {BUILD_MANIFEST} says "
        f"(a build with keep_intermediate keeps them): only its records are checked ({stages} stage "
        f"manifest{'s' * (stages != 1)})"
    )
    if left := [name for name in folder.sizes if _family(name).endswith((DS, MEGATRON))]:
        report.notes.append(
            f"{folder.url}: {len(left)} token files not removed yet (a removal cut short): publishing the build "
            "again removes them"
        )
    return report


def _build_checks(folder: _Folder, report: Report) -> Checks:
    """In a stage folder of a build's run, the vocabulary size and EOS id that the build recorded (every rank takes
    them from the plan, and its manifest records them: rank 0's is read), said in a note; elsewhere, none. Without
    them, a build's dataset holding ids past its vocabulary would pass."""
    if not _in_a_run(folder):
        return Checks()
    run = Layout(folder.path.rstrip("/").rpartition("/")[0])
    name = manifest.manifest_name(rank_stem(0))
    try:
        rank, why = RankManifest.read(folder.fs, join(run.ranks, name)), "is missing"
    except RecordError:  # a verify of the ranks' folder says what is wrong with it
        rank, why = None, "is not a valid manifest"
    if rank is None:
        shown = join(run.ranks, name).removeprefix(f"{run.run_dir}/")  # the run's, wherever it is
        report.notes.append(
            f"{folder.url}: ids not checked against the build's tokenizer: the run's {shown} {why}; pass --tokenizer"
        )
        return Checks()
    vocab, eos = rank.tokenizer.vocab_size, rank.tokenizer.eos_id
    ends = "no EOS (the build added none)" if eos is None else f"EOS id {eos}"
    report.notes.append(f"{folder.url}: ids checked against the build's tokenizer: vocabulary {vocab:,}, {ends}")
    return Checks(vocab, eos)


class SelfCheckFailed(TokenizationError):
    """A stage's own files failed verify's checks before upload: nothing of the attempt is published."""


class OwnCheck:
    """A stage's check of the files it writes (``where`` names it), family by family before it uploads them, with
    verify's checks against ``checks``, and no byte read back: the writer shows it each block as it writes it
    (``watch``: ids, loss bytes, EOS before every document end), then ``family`` reads the family's index and
    metadata and checks each file's size against what its writer recorded, whose sha256 the writer took of the very
    bytes it wrote. ``result`` goes into the stage's manifest and marker."""

    def __init__(self, checks: Checks, where: str):
        self.checks, self.where = checks, where
        self.families: list[str] = []
        self.tokens = 0
        self.notes: list[str] = []
        self._watched: dict[str, _Watched] = {}

    def watch(self, path: Path, pseudo: PseudoEnds | Literal["unknown"] | None) -> Observer:
        """The observer for the writer of the family at ``path`` (``TokenFileWriter``'s ``observe``); ``pseudo``:
        its entries that are chunk or window boundaries, as its manifest entry will say."""
        watched = self._watched[path.name] = _Watched(self.checks, str(path), pseudo)
        return watched

    def family(self, folder: Path, entry: OutputEntry) -> None:
        """Check one written family (its files in ``folder``, under their output names, written while watched);
        SelfCheckFailed names the problems."""
        watched = self._watched.pop(entry.name)
        local, report = _Folder.open(str(folder)), watched.report
        frame = _ds_frame(local, entry.name, entry, self.checks, report)
        if frame is not None and frame.tokens != watched.tokens:
            report.problem(local.label(entry.name), f"holds {frame.tokens} tokens, its writer wrote {watched.tokens}")
        for name, info in sorted(entry.files.items()):
            size = local.size(name)
            if size is None:
                report.problem(local.label(name), "missing")
            elif size != info.bytes:
                report.problem(local.label(name), f"{size} bytes, its writer recorded {info.bytes}")
        if report.problems:
            shown = "; ".join(report.problems[:MAX_REPORTED])
            more = f" (and {len(report.problems) - MAX_REPORTED} more)" if len(report.problems) > MAX_REPORTED else ""
            raise SelfCheckFailed(
                f"{self.where}: {entry.name} fails verify before upload, so nothing is published: {shown}{more}"
            )
        self.families.append(entry.name)
        self.tokens += watched.tokens
        self.notes += [note.replace(local.label(entry.name), entry.name) for note in report.notes]

    def result(self) -> SelfCheck:
        c = self.checks
        return SelfCheck(
            families=self.families, tokens=self.tokens, vocab_size=c.vocab_size, eos_id=c.eos_id, notes=self.notes
        )


class _Watched:
    """One family's blocks checked as its writer writes them, on the writer's hashing thread, as verify checks the
    blocks it reads; an index entry at a block's start ends the block before, whose last token is kept."""

    def __init__(self, checks: Checks, label: str, pseudo: PseudoEnds | Literal["unknown"] | None):
        self.checks, self.label, self.pseudo = checks, label, pseudo
        self.report = Report()
        self.tokens = 0
        self._last = np.zeros(1, np.int64)

    def __call__(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None) -> None:
        offset, checks, report = self.tokens, self.checks, self.report
        _check_ids(tokens, offset, self.label, checks, report)
        if loss is not None:
            _check_loss(loss, offset, self.label, report)
        if checks.eos_id is not None:
            if offset == 0:
                ends = ends[ends > 0]  # an entry at 0 ends no document (the index check reports it)
            before = tokens[np.maximum(ends - 1, 0)] if len(tokens) else np.zeros(len(ends), np.int64)
            before = np.where(ends > 0, before, self._last[0])
            _check_eos(offset + ends, before, self.pseudo, offset == 0, self.label, checks, report)
        if len(tokens):
            self._last = tokens[-1:].astype(np.int64)
        self.tokens += len(tokens)


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


def _vouched(folder: _Folder, entry: OutputEntry, report: Report) -> None:
    """A family its stage checked before upload: counted from its entry; its files' sizes are checked against the
    listing, and their sha256 are the marker's (``_check_markers``)."""
    report.files += 1
    report.tokens += entry.tokens
    folder.vouched.update(entry.files)


@dataclass
class _Folder:
    """The folder being verified. One listing answers every size and existence question (a HEAD each on S3), and
    each file is hashed once, however many records list it."""

    fs: fsspec.AbstractFileSystem
    path: str
    url: str
    sizes: dict[str, int]  # the folder's own entries, by name
    digests: dict[str, str] = field(default_factory=dict)
    vouched: set[str] = field(default_factory=set)  # files whose sha256 is their marker's: not read (``verify``)
    subfolders: dict[str, dict[str, int]] = field(default_factory=dict)  # their entries, once one is asked about

    @classmethod
    def open(cls, url: str) -> _Folder:
        """The folder's listing; a rank folder's bucket folders are listed too (concurrently), and their files
        are the folder's, named ``bucket00007/...`` as the records name them."""
        fs, path = open_fs(url)
        sizes = list_sizes(fs, path)
        folders = [name for name in sizes if BUCKET_FOLDER.fullmatch(name)]
        listings = map_concurrently(lambda folder: list_sizes(fs, join(path, folder)), folders)
        for folder, listing in zip(folders, listings, strict=True):
            del sizes[folder]
            sizes |= {f"{folder}/{name}": size for name, size in listing.items()}
        return cls(fs, path, url.rstrip("/"), sizes)

    def label(self, name: str) -> str:
        return join(self.url, name)

    def size(self, name: str) -> int | None:
        """A file's size, None when it is absent; a file of another subfolder (the quarantine) lists that
        subfolder."""
        sub, _, base = name.rpartition("/")
        if not sub or name in self.sizes:
            return self.sizes.get(name)
        if sub not in self.subfolders:
            self.subfolders[sub] = list_sizes(self.fs, join(self.path, sub))
        return self.subfolders[sub].get(base)

    def sha256(self, name: str) -> str:
        """A file's sha256, streamed in blocks (memory stays bounded) unless it was taken already."""
        if name not in self.digests:
            digest = hashlib.sha256()
            for _ in _blocks(self.fs, join(self.path, name), np.dtype(np.uint8), digest, BLOCK_BYTES):
                pass
            self.digests[name] = digest.hexdigest()
        return self.digests[name]


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


def _read_records(folder: _Folder, report: Report) -> _Records | None:
    """Every record of the folder, each checked; None when one is malformed (each such is one problem): a folder
    whose records cannot be read cannot be checked against them."""
    manifests = _read_subfolder(folder, manifest.MANIFESTS, stage_manifest, report)
    markers = _read_subfolder(folder, manifest.COMPLETIONS, CompletionMarker.loads, report)
    if manifests is None or markers is None:
        return None
    return _Records(manifests, {stem: read.record for stem, read in markers.items()})


def _read_subfolder(
    folder: _Folder, sub: str, parse: Callable[[bytes, str], R], report: Report
) -> dict[str, _Read[R]] | None:
    """The records of ``sub`` by stem, with their bytes; None when one is malformed. A file there that is no
    record is a problem."""
    records: dict[str, _Read[R]] | None = {}
    names = sorted(list_names(folder.fs, join(folder.path, sub)))
    for name in names:
        if not name.endswith(".json"):
            report.problem(
                folder.label(f"{sub}/{name}"), f"not a record: only {sub}/{{stem}}.json files belong there; remove it"
            )
    for batch in in_batches([name for name in names if name.endswith(".json")]):
        read = read_many(folder.fs, [join(folder.path, sub, name) for name in batch])
        for name, data in zip(batch, read.values(), strict=True):
            if data is None:  # removed since the listing: a stage is writing this folder
                continue
            try:
                record = parse(data, folder.label(f"{sub}/{name}"))
            except RecordError as exc:
                report.problems.append(str(exc))
                records = None
                continue
            if records is not None:
                records[name.removesuffix(".json")] = _Read(data, record)
    return records


def _check_records(
    folder: _Folder, records: _Records, families: set[str], described: dict[str, Described], report: Report
) -> None:
    """The folder holds what its records say, and its records vouch for each other: every stage manifest has its
    completion marker, every marker its stage manifest, every file a marker lists is there with its size and
    sha256, every file there is listed, and the merge's checkpoints are its manifest's entries."""
    stages = records.stages
    if stages:
        missing = _check_families(folder, families, described, report)
    elif records.manifests or records.markers or _in_a_run(folder):
        report.problem(
            folder.url,
            f"no stage manifest in {manifest.MANIFESTS}/: the stage that writes this folder did not finish, or its "
            "manifest was removed; run that stage again",
        )
        missing = set()
    else:
        report.notes.append(f"{folder.url}: no manifests, so which files belong here cannot be checked")
        return
    _check_stages(folder, stages, records.markers, report)
    listed = _check_markers(folder, stages, records.markers, missing, report)
    _check_checkpoints(folder, records, report)
    listed |= {name for d in described.values() for name in d.entry.files}
    for name in sorted(n for n in folder.sizes if n not in listed and not _bookkeeping(n)):
        if _family(name) not in families - set(described):  # an unlisted family is one problem, not one a file
            report.problem(
                folder.label(name),
                "no completion marker lists this file: a leftover of another run, or of a stage that did not "
                "finish; remove it",
            )


def _check_families(folder: _Folder, families: set[str], described: dict[str, Described], report: Report) -> set[str]:
    """Every family a manifest lists is there and every family there is listed; returns the missing ones."""
    missing = set(described) - families
    for name in sorted(missing):
        report.problem(folder.label(name), f"listed in {_source(described[name])} but missing")
    for name in sorted(families - set(described)):
        report.problem(
            folder.label(name),
            "no manifest lists this file family: a leftover of another run, or the output of a stage that did "
            "not finish",
        )
    return missing


def _check_stages(
    folder: _Folder, stages: dict[str, _Read[StageManifest]], markers: dict[str, CompletionMarker], report: Report
) -> None:
    """Every stage manifest is complete (its marker exists and names its checksum) and adds up to its outputs."""
    for stem, read in sorted(stages.items()):
        where = folder.label(manifest.manifest_name(stem))
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
    if not record.cuts_pieces and given is not None and wrote is not None and given != wrote:
        report.problem(
            where,
            f"read {given.value.describe()} but wrote {wrote.value.describe()}: a shuffle that moves pieces whole "
            "must write each once",
        )


def _check_markers(
    folder: _Folder,
    stages: dict[str, _Read[StageManifest]],
    markers: dict[str, CompletionMarker],
    missing: set[str],
    report: Report,
) -> set[str]:
    """Every marker belongs to a stage manifest and lists its files, and every file it lists is there with its
    size and sha256 (a missing family is reported once, as such); returns the files the markers list."""
    listed: set[str] = set()
    for stem, marker in sorted(markers.items()):
        where, own = folder.label(manifest.marker_name(stem)), manifest.manifest_name(stem)
        if stem not in stages:
            report.problem(
                where, f"no stage manifest {own}: a marker copied from elsewhere, or its manifest was removed"
            )
            continue
        if marker.manifest != own:
            report.problem(where, f"names the manifest {marker.manifest}, not its own {own}")
        if marker.checked != stages[stem].record.checked:
            report.problem(where, f"records another check of the stage's own files than its manifest {own} does")
        files = marker.files
        for name in sorted(set(stages[stem].record.output_files()) - set(files)):
            report.problem(folder.label(name), f"its manifest {own} lists it, its completion marker does not")
        for name, info in sorted(files.items()):
            listed.add(name)
            size = folder.size(name)
            if size is None:
                if _family(name) not in missing:
                    report.problem(folder.label(name), f"listed by {manifest.marker_name(stem)} but missing")
            elif size != info.bytes or (name not in folder.vouched and folder.sha256(name) != info.sha256):
                report.problem(
                    folder.label(name),
                    f"differs from what {manifest.marker_name(stem)} records ({size} bytes, sha256 "
                    f"{folder.sha256(name)[:12]}…, not {info.bytes} bytes, {info.sha256[:12]}…)",
                )
    return listed


def _check_checkpoints(folder: _Folder, records: _Records, report: Report) -> None:
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
        where = folder.label(manifest.manifest_name(stem))
        if stem not in owners:
            report.problem(where, "a merge checkpoint that no stage manifest lists: a leftover of an unfinished merge")
            continue
        owner, entry = owners[stem]
        what = f"the checkpoint of {entry.name}, which {manifest.manifest_name(owner)} lists"
        if stem not in checkpoints:
            report.problem(where, f"missing: {what} (a resumed merge would redo that file and every later one)")
        elif records.manifests[stem].record != entry:
            report.problem(where, f"differs from {what}: a resumed merge would start from it")


def _in_a_run(folder: _Folder) -> bool:
    """Whether the folder is a stage folder of a build's run (its parent holds the run's claim)."""
    parent = folder.path.rstrip("/").rpartition("/")[0]
    if not parent:
        return False
    try:
        folder.fs.cat_file(join(parent, RUN_CLAIM))
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


@dataclass(frozen=True)
class _Frame:
    """What a ``.ds`` family's small files say: its index, token size and tokens, and whether its loss bytes, if
    it has any, go with its tokens."""

    ends: np.ndarray
    token_size: int
    tokens: int
    has_loss: bool
    aligned: bool


def _ds_frame(folder: _Folder, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> _Frame | None:
    """One ``.ds`` family's metadata and index, checked against its sizes and its manifest entry; None when the
    token size or the index cannot be known (a problem says why)."""
    label, path, sizes = folder.label(name), join(folder.path, name), folder.sizes
    size = sizes[name]
    meta = None
    if name + ".metadata" in sizes:
        try:
            meta = Metadata.parse(folder.fs.cat_file(path + ".metadata").decode("utf-8"), f"{label}.metadata")
        except (TokenFileError, UnicodeDecodeError) as exc:
            report.problem(f"{label}.metadata", str(exc))
    else:
        report.problem(f"{label}.metadata", "missing: the token size is unknown")
    if name + ".index" not in sizes:
        report.problem(f"{label}.index", "missing")
        return None
    try:
        index = map_array(folder.fs, path + ".index", INDEX_DTYPE, f"{label}.index", sizes[name + ".index"])
        ends = np.asarray(index, dtype=np.int64)
    except TokenFileError as exc:
        report.problem(f"{label}.index", str(exc))
        return None
    last = int(ends[-1]) if len(ends) else 0
    token_size = meta.token_size if meta else (size // last if last and size // last in (2, 4) else None)
    if token_size not in (2, 4):
        report.problem(label, f"token size {token_size} is neither 2 nor 4")
        return None
    tokens = size // token_size
    if size % token_size or tokens != last:
        report.problem(label, f"{size} bytes of {token_size}-byte tokens, but the index ends at token {last}")
    if meta and meta.token_count != tokens:
        report.problem(f"{label}.metadata", f"says {meta.token_count} tokens, the file holds {tokens}")
    _check_index(ends, label, checks, report)
    _check_counts(entry, tokens, len(ends), label, report)
    has_loss = name + ".loss" in sizes
    aligned = not has_loss or sizes[name + ".loss"] == tokens  # its loss bytes, if any, go with its tokens
    if not aligned:
        report.problem(f"{label}.loss", f"{sizes[name + '.loss']} bytes for {tokens} tokens")
    return _Frame(ends, token_size, tokens, has_loss, aligned)


def _verify_ds(folder: _Folder, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> None:
    """One ``.ds`` family, its checksums and contents taken as it streams."""
    report.files += 1
    frame = _ds_frame(folder, name, entry, checks, report)
    if frame is None:
        return
    label, path, ends, aligned = folder.label(name), join(folder.path, name), frame.ends, frame.aligned
    pseudo = None if entry is None else entry.pseudo_ends
    items = BLOCK_BYTES // frame.token_size  # tokens a block, and loss bytes
    digest, loss_digest, held = hashlib.sha256(), hashlib.sha256(), ContentsHasher()
    token_blocks = _blocks(folder.fs, path, token_dtype(frame.token_size), digest, items)
    loss_blocks: Iterator[tuple[int, np.ndarray | None]]
    if frame.has_loss and aligned:
        loss_blocks = _blocks(folder.fs, path + ".loss", LOSS_DTYPE, loss_digest, items)
    else:
        loss_blocks = repeat((0, None), -(-folder.sizes[name] // (items * frame.token_size)))
    for (offset, block), (_, loss) in zip(token_blocks, loss_blocks, strict=True):
        _check_tokens(block, offset, ends, pseudo, label, checks, report)
        if loss is not None:
            _check_loss(loss, offset, label, report)
        held.add(block, within(ends, offset, offset + len(block)), loss)
    folder.digests[name] = digest.hexdigest()
    if frame.has_loss and not aligned:  # read on its own, for its checksum and values
        for offset, loss in _blocks(folder.fs, path + ".loss", LOSS_DTYPE, loss_digest, items):
            _check_loss(loss, offset, label, report)
    if frame.has_loss:
        folder.digests[name + ".loss"] = loss_digest.hexdigest()
    if aligned:
        _check_held(entry, held.result(), label, report)
    report.tokens += frame.tokens


def _verify_megatron(folder: _Folder, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> None:
    report.files += 1
    label = folder.label(name)
    try:
        mg = MegatronFile(label)
    except TokenFileError as exc:
        report.problem(label, str(exc))
        return
    lengths = mg.lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    size, total = folder.sizes[name], int(ends[-1]) if len(ends) else 0
    if total * mg.dtype.itemsize != size:
        report.problem(label, f"{size} bytes, but the sequence lengths add up to {total} tokens")
    expected = (ends - lengths) * mg.dtype.itemsize
    report.problems_at(
        mg.url + ".idx", "byte pointer disagrees with the lengths", np.flatnonzero(mg.pointers != expected)
    )
    doc = mg.document_indices
    if len(doc) == 0 or doc[0] != 0 or doc[-1] != len(lengths) or np.any(np.diff(doc) < 0):
        report.problem(mg.url + ".idx", "document indices do not run from 0 to the sequence count")
    report.problems_at(label, "negative sequence length", np.flatnonzero(lengths < 0))
    _check_counts(entry, total, len(lengths), label, report)
    digest, held = hashlib.sha256(), ContentsHasher()
    for offset, block in _blocks(folder.fs, mg.bin_path, mg.dtype, digest, BLOCK_BYTES // mg.dtype.itemsize):
        _check_tokens(block, offset, ends, None if entry is None else entry.pseudo_ends, label, checks, report)
        held.add(block, within(ends, offset, offset + len(block)))
    folder.digests[name] = digest.hexdigest()
    _check_held(entry, held.result(), label, report)
    report.tokens += size // mg.dtype.itemsize


def _check_counts(entry: OutputEntry | None, tokens: int, entries: int, label: str, report: Report) -> None:
    """The tokens and index entries that the manifest records for this family, against the files."""
    if entry is None:
        return
    if entry.tokens != tokens:
        report.problem(label, f"holds {tokens} tokens, its manifest says {entry.tokens}")
    if entry.index_entries != entries:
        report.problem(label, f"its index holds {entries} entries, its manifest says {entry.index_entries}")


def _check_loss(loss: np.ndarray, offset: int, label: str, report: Report) -> None:
    report.problems_at(f"{label}.loss", "loss byte is neither 0 nor 1", offset + np.flatnonzero(loss > 1))


def _check_held(entry: OutputEntry | None, held: Contents, label: str, report: Report) -> None:
    """The pieces a family holds, hashed from its bytes, against those its writer recorded (when its record has
    them): a piece changed, lost or duplicated since, even with the sizes and checksums rewritten to match."""
    if entry is not None and entry.contents is not None and entry.contents.value != held:
        report.problem(label, f"holds {held.describe()}, its manifest records {entry.contents.value.describe()}")


def _check_index(ends: np.ndarray, label: str, checks: Checks, report: Report) -> None:
    if len(ends) and ends[0] < 0:
        report.problem(f"{label}.index", "negative first entry", 0)
    steps = np.diff(ends)
    report.problems_at(f"{label}.index", "entry smaller than the one before", ends[1:][steps < 0])
    if checks.eos_id is not None:
        report.problems_at(f"{label}.index", "empty document", ends[1:][steps == 0])


def _check_tokens(
    block: np.ndarray,
    offset: int,
    ends: np.ndarray,
    pseudo: PseudoEnds | Literal["unknown"] | None,
    label: str,
    checks: Checks,
    report: Report,
) -> None:
    """A block of a family read from its file, at token ``offset``: its ids, and the EOS before each document end
    of the family's index (``ends``) inside it."""
    _check_ids(block, offset, label, checks, report)
    if len(block):
        lo, hi = np.searchsorted(ends, [offset, offset + len(block)], side="right")
        doc_ends = ends[lo:hi]  # the entries whose last token is in this block
        _check_eos(doc_ends, block[doc_ends - 1 - offset], pseudo, offset == 0, label, checks, report)


def _check_ids(block: np.ndarray, offset: int, label: str, checks: Checks, report: Report) -> None:
    """Ids below the vocabulary size, in a block of tokens that starts at token ``offset``."""
    if checks.vocab_size is not None and len(block):
        report.problems_at(
            label,
            f"id beyond the vocabulary of {checks.vocab_size}",
            offset + np.flatnonzero(block >= checks.vocab_size),
        )


def _check_eos(
    entries: np.ndarray,
    last_tokens: np.ndarray,
    pseudo: PseudoEnds | Literal["unknown"] | None,
    first: bool,
    label: str,
    checks: Checks,
    report: Report,
) -> None:
    """EOS before every index entry that ends a document (``last_tokens``: the token before each of ``entries``);
    ``pseudo``: the entries that are chunk or window boundaries, or "unknown"; ``first``: of a family's first
    block, which notes an unchecked family once."""
    if checks.eos_id is None:
        return
    if pseudo == "unknown":
        if first:
            report.notes.append(f"{label}: EOS not checked (its index mixes document ends with moved chunk ends)")
        return
    if pseudo:  # chunk or window boundaries are not document ends
        real = (entries % pseudo.every != 0) | (entries > pseudo.until)
        entries, last_tokens = entries[real], last_tokens[real]
    report.problems_at(label, f"document ends without EOS {checks.eos_id}", entries[last_tokens != checks.eos_id])


def _blocks(fs, path: str, dtype: np.dtype, digest, items: int) -> Iterator[tuple[int, np.ndarray]]:
    """The file as consecutive arrays of ``items`` items, hashing the bytes on the way: a block is hashed on a
    thread of its own (sha256 releases the GIL) while it is checked and the next one read, so reading and hashing
    (each ~1.5 GB/s here) overlap instead of adding up."""
    step = items * dtype.itemsize
    offset = 0
    with fs.open(path, "rb", block_size=step) as handle, ThreadPoolExecutor(1, thread_name_prefix="hash") as hasher:
        hashed = None
        while data := handle.read(step):
            if hashed is not None:
                hashed.result()  # in order: one block at a time
            hashed = hasher.submit(digest.update, data)
            usable = len(data) // dtype.itemsize * dtype.itemsize
            yield offset, np.frombuffer(memoryview(data)[:usable], dtype)  # a view: no copy of the block
            offset += usable // dtype.itemsize
        if hashed is not None:
            hashed.result()


def _verify_dataset_metadata(folder: _Folder, report: Report) -> None:
    """A merged dataset's ``{name}.ds.metadata`` (with no ``{name}.ds``) counts the tokens of ``NNN_{name}.ds``."""
    names = set(folder.sizes)
    for meta_name in sorted(n for n in names if n.endswith(".ds.metadata") and n[: -len(".metadata")] not in names):
        stem = meta_name[: -len(".ds.metadata")]
        parts = [n for n in names if n.endswith(f"_{stem}.ds") and n.split("_", 1)[0].isdigit()]
        label = folder.label(meta_name)
        try:
            meta = Metadata.parse(folder.fs.cat_file(join(folder.path, meta_name)).decode("utf-8"), label)
        except (TokenFileError, UnicodeDecodeError) as exc:
            report.problem(label, str(exc))
            continue
        total = sum(folder.sizes[n] // meta.token_size for n in parts)
        if meta.token_count != total:
            report.problem(label, f"says {meta.token_count} tokens, its {len(parts)} files hold {total}")
