"""The merge: every rank file of a folder becomes one sequence of output files, globally reordered. One task.

* ``interleave`` (default) is datatrove's DocumentTokenizerMerger (``tokenization.orderings``): a seeded
  permutation of the list ``[f] * units_f`` over the sorted input files; each entry ``f`` takes the *next* unit of
  file ``f``, so the order inside a file is kept. Same inputs and seed, same bytes.
* ``shuffle`` is a true uniform permutation of every unit of every file. It holds the permutation of all units
  in memory: 8 bytes a unit, on top of the 8 bytes a unit of the loaded indexes.

Inputs are validated before anything is written. Output files are published one by one, each with a manifest
that records where in the ordering it ends; a merge killed at any point and run again with the same arguments
resumes after the last published file and produces the same bytes as an uninterrupted run.

Inputs may be remote, but they are read at random (a unit here, a unit there), so remote inputs are first
copied to the local working directory: run the merge on a worker with a large local disk.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import orjson

from tokenization import mixing, orderings
from tokenization.errors import UsageError
from tokenization.formats import names, sidecar
from tokenization.formats.checks import Checks, OwnCheck
from tokenization.formats.contents import Contents, ShuffleCheckFailed, check_kept
from tokenization.formats.ds import (
    SOURCE,
    SOURCE_DTYPE,
    Metadata,
    Observer,
    SplitWriter,
    TokenFile,
    TokenFileError,
    WrittenTokenFile,
)
from tokenization.formats.moves import move_units, sorted_union
from tokenization.formats.source_pool import MAX_OPEN_FILES, SourcePool, contents_of, uses_contents
from tokenization.options import Options, option, params
from tokenization.output import manifest
from tokenization.output.attempts import Attempt, attempt_at
from tokenization.output.manifest import Described, StageResult
from tokenization.progress import Progress, ProgressMode
from tokenization.records import (
    ContentsSum,
    FileSum,
    MergeCounts,
    MergeManifest,
    MergeOutput,
    MergeParams,
    MergeTokenizer,
    Mixture,
    PseudoEnds,
    RankManifest,
    Record,
    RecordError,
    SizedInput,
    SourceCounts,
    SourceMix,
)
from tokenization.storage.checksums import ALGORITHM, checksum
from tokenization.storage.files import StorageOptions, join, list_names, map_concurrently, meanwhile
from tokenization.storage.folder import Folder
from tokenization.wording import counted

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS_PER_FILE = 100_000_000_000  # datatrove's default: 100 GT
UNITS_PER_SLICE = 1 << 20  # ordering entries turned into byte moves at a time
IRRELEVANT_TO_BYTES = ("input", "output", "local_working_dir", "max_open_files", "storage_options", "choice")


@dataclass(frozen=True, kw_only=True)
class MergeOptions(Options):
    """Merge: how the rank files are ordered into merged files (merge and build share these)."""

    merge_mode: Literal["interleave", "shuffle", "bucketed"] = option(
        "interleave",
        title="Merge order",
        help="interleave: datatrove's random interleave of the rank files, each file's order kept (datatrove's "
        "bytes); shuffle: a uniform permutation of every unit of every file, in one task; bucketed: the same, in a "
        "task a bucket (of ranks tokenized with num_buckets)",
    )
    merge_max_tokens_per_file: int = option(
        DEFAULT_MAX_TOKENS_PER_FILE,
        minimum=1,
        title="Most tokens a merged file",
        help="close a merged file once it holds this many tokens, at the end of a document or chunk",
    )


@dataclass(frozen=True, kw_only=True)
class MergeConfig(MergeOptions):
    """The global merge: every rank file of a folder, reordered into one sequence of files."""

    input: str = option(flag="", help="folder or fsspec URL holding the rank .ds files (and their markers)")
    output: str = option(help="output folder or fsspec URL")
    save_filename: str = option(help="name of the merged dataset: files are NNN_{name}.ds")
    seed: int = option(0, minimum=0, help="ordering seed: the same seed gives the same bytes")
    bucket: int | None = option(None, minimum=0, help="with --merge-mode bucketed: the bucket this task merges")
    shuffle: bool = option(
        True,
        flag="--no-shuffle",
        help="reorder (--no-shuffle concatenates in file order)",
        flag_help="concatenate the files in file order (default: reorder them)",
    )
    shuffle_chunk_size: int | None = option(
        None, minimum=1, help="move fixed chunks of this many tokens instead of documents (default: documents)"
    )
    drop_last_chunk: bool = option(False, help="drop each file's partial last chunk, as datatrove does (counted)")
    save_loss: bool = option(False, help="merge the .ds.loss files too (every input must have one)")
    local_working_dir: str | None = option(
        None, help="local folder for staging and for copies of remote inputs (default: the system's temp)"
    )
    max_open_files: int = option(MAX_OPEN_FILES, minimum=1, help="input files held open at once")
    mixture: Mixture | None = option(
        None,
        cli=False,
        help="a build's mixture, read and checked once by the build (``BuildConfig.mixed``): the merge chooses and "
        "interleaves its sources (tokenization.mixing)",
    )
    choice: str | None = option(
        None,
        cli=False,
        help="a build's folder of the choice its plan made of the mixture's documents, where it made one: the ranks "
        "wrote only the chosen ones (tokenization.builds.choice)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.merge_mode == "bucketed") != (self.bucket is not None):
            raise UsageError("merge_mode bucketed and bucket go together: give both or neither")
        if self.merge_mode == "bucketed" and self.shuffle_chunk_size:
            raise UsageError("a bucketed merge moves documents: no shuffle_chunk_size")
        if self.mixture is not None and (self.shuffle_chunk_size or not self.shuffle):
            raise UsageError("a mixture's merge interleaves whole documents: no shuffle_chunk_size, no --no-shuffle")

    @property
    def stem(self) -> str:
        return names.merge_stem(self.save_filename, self.bucket)

    def file_name(self, number: int, width: int) -> str:
        return names.merged_file_name(self.save_filename, number, width, self.bucket)

    def owns(self, name: str) -> bool:
        """Whether a file (of any family member, of any attempt) is one of this merge's outputs."""
        prefix = names.merged_prefix(self.bucket)
        number, _, rest = name.removeprefix(prefix).partition("_")
        ours = rest == f"{self.save_filename}.ds" or rest.startswith(f"{self.save_filename}.ds.")
        return name.startswith(prefix) and number.isdigit() and len(number) >= 3 and ours


@dataclass
class MergeInputs:
    """The validated inputs: names, token size, tokenizer, and every file's index entries (concatenated)."""

    urls: list[str]
    token_size: int
    tokenizer: str
    tokenizer_sha256: str | None
    ends: np.ndarray  # all index entries, file after file
    offsets: np.ndarray  # file f's entries are ends[offsets[f]:offsets[f + 1]]
    sizes: list[int]
    pseudo_ends: bool  # some input's index holds chunk or window boundaries besides document ends
    sources: np.ndarray | None = None  # a mixture's: each index entry's source, file after file

    def file_ends(self, f: int) -> np.ndarray:
        return self.ends[self.offsets[f] : self.offsets[f + 1]]

    def tokens(self, f: int) -> int:
        ends = self.file_ends(f)
        return int(ends[-1]) if len(ends) else 0

    def lengths(self) -> np.ndarray:
        """Each index entry's tokens, file after file."""
        starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)[: len(self.ends)]
        starts[self.offsets[:-1][np.diff(self.offsets) > 0]] = 0  # each file's first entry starts at its token 0
        return self.ends.astype(np.int64) - starts


def validate_inputs(
    urls: list[str],
    save_loss: bool,
    entries: list[Described],
    storage_options: StorageOptions | None = None,
    sources: list[str] | None = None,
) -> MergeInputs:
    """Check every input before anything is written; a mix of token sizes or tokenizers is an error. ``entries``:
    those of the inputs that their manifests describe; ``storage_options`` open the URLs. A mixture's inputs
    (``sources``: its names) each hold a ``.source`` sidecar naming those sources, read too."""
    if not urls:
        raise TokenFileError("no .ds files to merge")
    listing = Folder(urls[0].rsplit("/", 1)[0], storage_options).sizes()  # the sizes of every file, not a HEAD each

    def opened(url: str) -> tuple[TokenFile, np.ndarray]:  # raises when a .metadata is missing: never assumed
        f = TokenFile(url, listing=listing, storage_options=storage_options)
        return f, np.asarray(f.ends, dtype=np.int64)

    read = map_concurrently(opened, urls)  # each input's metadata and index: requests in flight at once
    first = read[0][0]
    distinct = {e.tokenizer_sha256 for e in entries if e.tokenizer_sha256 is not None}
    if len(distinct) > 1:
        raise TokenFileError(f"inputs were tokenized with different tokenizers (sha256 {sorted(distinct)})")
    # a file names the tokenizer as typed: ranks tokenized by hand may name one tokenizer (one sha256) two ways
    pinned = len(distinct) == 1 and len(entries) == len(urls) and all(e.tokenizer_sha256 for e in entries)
    ends_list, sizes, sources_list = [], [], []
    for f, ends in read:
        if f.token_size != first.token_size:
            raise TokenFileError(f"{f.url}: token_size {f.token_size} differs from {first.url}'s {first.token_size}")
        if f.tokenizer != first.tokenizer and not pinned:
            raise TokenFileError(f"{f.url}: tokenizer {f.tokenizer!r} differs from {first.url}'s {first.tokenizer!r}")
        total = int(ends[-1]) if len(ends) else 0
        if f.num_tokens != total or f.size("") % f.token_size:
            raise TokenFileError(f"{f.url}: {f.size('')} bytes, but its index ends at token {total}")
        if len(ends) and (ends[0] < 0 or np.any(np.diff(ends) < 0)):
            raise TokenFileError(f"{f.url}.index: entries are not non-decreasing")
        if save_loss:
            if not f.exists(".loss"):
                raise TokenFileError(f"{f.url}.loss is missing (merge without save_loss, or re-tokenize with it)")
            if f.size(".loss") != total:
                raise TokenFileError(f"{f.url}.loss: {f.size('.loss')} bytes for {total} tokens")
        ends_list.append(ends)
        sizes.append(f.size(""))
        if sources is not None:
            sources_list.append(_sources_of(f, len(ends), sources))
    return MergeInputs(
        urls=urls,
        token_size=first.token_size,
        tokenizer=first.tokenizer,
        tokenizer_sha256=distinct.pop() if distinct else None,
        ends=np.concatenate(ends_list) if ends_list else np.empty(0, np.int64),
        offsets=np.concatenate([[0], np.cumsum([len(e) for e in ends_list])]).astype(np.int64),
        sizes=sizes,
        pseudo_ends=any(e.entry.pseudo_ends for e in entries),
        sources=np.concatenate(sources_list) if sources is not None else None,
    )


def _sources_of(f: TokenFile, entries: int, names: list[str]) -> np.ndarray:
    """A mixture's input's ``.source`` sidecar, checked: one source a document, of the mixture's sources."""
    found = f.sources
    named = list(f.metadata.sources) if f.metadata else []
    if found is None or named != names:
        why = "no .source sidecar" if found is None else f"sources {named}, not the mixture's {names}"
        raise TokenFileError(f"{f.url}: {why}: not a rank file of this mixture; tokenize it again")
    if len(found) != entries or (len(found) and int(found.max()) >= len(names)):
        raise TokenFileError(f"{f.url}.source: {len(found):,} entries for {entries:,} documents, or an unknown source")
    return np.asarray(found, dtype=np.int64)


@dataclass
class _Units:
    """How the merge cuts each file into units, and in which order they come."""

    inputs: MergeInputs
    chunk: int | None
    counts: np.ndarray  # full units per file (documents, or whole chunks)

    def bounds(self, files: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ranges of unit ``local[i]`` of file ``files[i]``."""
        if self.chunk:
            return local * self.chunk, (local + 1) * self.chunk
        g = self.inputs.offsets[files] + local
        ends = self.inputs.ends[g]
        starts = np.where(local > 0, self.inputs.ends[np.maximum(g - 1, 0)], 0)
        return starts, ends


def plan_ordering(config: MergeConfig, units: _Units) -> tuple[np.ndarray, np.ndarray | None]:
    """``(file_ids, perm)``: entry j of the output is unit ``perm[j]`` (global, file-major) in shuffle mode,
    else the next unit of file ``file_ids[j]``."""
    n_files = len(units.counts)
    dtype = np.uint16 if n_files <= np.iinfo(np.uint16).max + 1 else np.uint32
    file_ids = np.repeat(np.arange(n_files, dtype=dtype), units.counts)
    if not config.shuffle:
        return file_ids, None
    if config.merge_mode == "shuffle":
        return file_ids, orderings.merge_order(config.seed, len(file_ids))
    if config.bucket is not None:
        return file_ids, orderings.bucket_order(config.seed, config.bucket, len(file_ids))
    orderings.interleave(config.seed, file_ids)
    return file_ids, None


@dataclass(frozen=True)
class _Prepared:
    """Everything decided before a byte is written: the inputs, how they are cut into units, the totals, the
    width of the file numbers and the fingerprint a resumed merge must share."""

    inputs: MergeInputs
    units: _Units
    tokens: np.ndarray  # per input file
    tails: np.ndarray  # per input file: tokens after its last whole chunk (0 without chunks)
    keep_tails: bool
    total_tokens: int
    total_units: int
    width: int
    fingerprint: str
    recorded: list[ContentsSum | None]  # per input file: its contents, as its stage recorded them (None: unknown)
    mix: _Mixed | None = None  # a mixture's choice


@dataclass(frozen=True)
class _Mixed:
    """A mixture's choice in this merge (or bucket): how many times each input document is used (``uses``, file
    after file), the uses in output order (``order``: document ids), the source of each document, and what each
    source gave (``tokenization.mixing``)."""

    names: list[str]
    sources: np.ndarray
    uses: np.ndarray
    order: np.ndarray
    shares: list[SourceMix]


def _prepare(config: MergeConfig) -> _Prepared:
    given = config.folder(config.input)
    mixture = config.mixture
    if config.bucket is None:
        urls, described = manifest.token_files(given), manifest.output_entries(given)
    else:
        urls, described = _bucket_inputs(config, config.bucket)
    named = [url.removeprefix(given.url.rstrip("/") + "/") for url in urls]
    entries = [described[name] for name in named if name in described]
    source_names = mixture.names if mixture else None
    inputs = validate_inputs(urls, config.save_loss, entries, config.storage_options, source_names)
    if mixture is not None:
        _check_sidecars(inputs, named, described)
    recorded = [_recorded(described.get(name), config.save_loss) for name in named]
    chunk = config.shuffle_chunk_size
    tokens = np.array([inputs.tokens(f) for f in range(len(urls))], dtype=np.int64)
    counts = tokens // chunk if chunk else np.diff(inputs.offsets)
    tails = (tokens - counts * chunk) if chunk else np.zeros(len(urls), np.int64)
    keep_tails = bool(chunk) and not config.drop_last_chunk
    total_tokens = int(tokens.sum()) - (0 if keep_tails else int(tails.sum()))
    total_units = int(counts.sum()) + (int(np.count_nonzero(tails)) if keep_tails else 0)
    mix = None if mixture is None else _mixed(config, mixture, inputs, manifest.stage_records(given))
    if mix is not None:  # a mixture writes its uses
        total_units, total_tokens = len(mix.order), sum(share.tokens_chosen for share in mix.shares)
    most_files = min(-(-total_tokens // config.merge_max_tokens_per_file), total_units)  # every file holds >= 1 unit
    width = max(3, len(str(max(0, most_files - 1))))  # datatrove's 3 digits, wider only past 1,000 files
    units = _Units(inputs, chunk, counts)
    fingerprint = _fingerprint(config, inputs, width)
    prepared = (inputs, units, tokens, tails, keep_tails, total_tokens, total_units, width, fingerprint, recorded)
    return _Prepared(*prepared, mix=mix)


def _check_sidecars(inputs: MergeInputs, named: list[str], described: dict[str, Described]) -> None:
    """Each input's ``.source`` sidecar is the one its rank recorded (its marker's checksum): a byte changed to
    another valid source would move documents between sources, which the contents (each piece's source is in them)
    would find only once the merge had read every input; this says so first, naming the file."""
    sources = cast(np.ndarray, inputs.sources)
    for f, name in enumerate(named):
        held = sources[inputs.offsets[f] : inputs.offsets[f + 1]].astype(SOURCE_DTYPE).tobytes()
        recorded = described[name].entry.files.get(name + SOURCE) if name in described else None
        if recorded is None or checksum(held, recorded.algorithm) != recorded.checksum:
            raise TokenFileError(
                f"{inputs.urls[f]}{SOURCE}: not the sidecar its rank recorded (no record, or another checksum): "
                "tokenize that rank again"
            )


def _mixed(config: MergeConfig, mixture: Mixture, inputs: MergeInputs, records: Sequence[Record]) -> _Mixed:
    """The mixture's choice for this merge's documents: each source's target from every rank's tokens of it (a
    source too small is refused here, before a byte is written), or its bucket's part of it (every bucket at the
    mixture's shares: ``mixing.bucket_targets``); then the uses and their order (``tokenization.mixing``)."""
    ranks = [record for record in records if isinstance(record, RankManifest)]
    if not ranks or any(rank.sources is None for rank in ranks):
        raise TokenFileError(f"{config.input}: its ranks recorded no sources: they were not tokenized for a mixture")
    available = [
        sum(cast(list[SourceCounts], rank.sources)[s].tokens for rank in ranks) for s in range(len(mixture.sources))
    ]
    targets = mixing.budget(mixture, available)  # a source too small for its share is refused, by name
    if config.bucket is not None:
        held = np.array(
            [[cast(list[SourceCounts], rank.sources)[s].bucket_tokens for rank in ranks] for s in range(len(available))]
        )
        targets = mixing.bucket_targets(mixture, held.sum(axis=1), config.bucket)
    sources = cast(np.ndarray, inputs.sources)
    lengths = inputs.lengths()
    part = 0 if config.bucket is None else config.bucket + 1
    found = None if config.choice is None or part else mixing.read_choice(config.folder(config.choice))
    planned = None if found is None else mixing.joined(list(found.values()))
    if planned is not None:  # the ranks wrote the chosen documents: chosen again from all, as the plan chose
        sources, lengths = planned.sources, planned.lengths
    uses, shares = mixing.choose(mixture, targets, sources, lengths, config.seed, part)
    order = mixing.interleaved(sources, lengths, uses, orderings.mixture_draws(config.seed, part))
    if planned is None:
        return _Mixed(mixture.names, sources, uses, order, shares)
    held = _held(config, inputs, planned, uses)
    return _Mixed(mixture.names, sources[held], uses[held], (np.cumsum(uses > 0) - 1)[order], shares)


def _held(config: MergeConfig, inputs: MergeInputs, planned: mixing.RankChoice, uses: np.ndarray) -> np.ndarray:
    """The documents (of all the plan chose from) that the ranks wrote: exactly those of some use, as the plan chose
    them (its uses), the same tokens and sources, in the same order; else the merge stops before a byte moves."""
    held = np.flatnonzero(uses > 0)
    if not (
        np.array_equal(planned.uses, uses)
        and np.array_equal(inputs.lengths(), planned.lengths[held])
        and np.array_equal(cast(np.ndarray, inputs.sources), planned.sources[held])
    ):
        raise TokenFileError(
            f"{config.input}: its rank files do not hold the documents the plan chose ({len(inputs.ends):,} "
            f"documents, {len(held):,} chosen): tokenize the ranks again"
        )
    return held


def _recorded(described: Described | None, save_loss: bool) -> ContentsSum | None:
    """An input's contents as its stage recorded them, when they are what the merge reads: with its loss bytes
    exactly when the merge moves them (None: the file must be hashed)."""
    if described is None or (f"{described.entry.name}.loss" in described.entry.files) != save_loss:
        return None
    return described.entry.contents


def _bucket_inputs(config: MergeConfig, bucket: int) -> tuple[list[str], dict[str, Described]]:
    """The rank files of this merge's ``bucket`` (``config.bucket``), from its folder alone, and their entries, the
    only ones kept of the ranks' manifests; every rank must have scattered into the same buckets, this one among
    them."""
    within = names.bucket_folder(bucket)
    given = config.folder(config.input)
    records = manifest.stage_records(given, within)
    drawn = {record.num_buckets if isinstance(record, RankManifest) else None for record in records}
    num_buckets = next(iter(drawn)) if len(drawn) == 1 else None
    if num_buckets is None:
        found = ", ".join(map(str, sorted(drawn, key=str))) or "no manifests"
        raise TokenFileError(f"{config.input}: a bucketed merge needs ranks of one num_buckets, found {found}")
    if bucket >= num_buckets:
        raise UsageError(f"bucket {bucket} is outside 0..{num_buckets - 1}: the ranks drew {num_buckets} buckets")
    urls = manifest.token_files(given, within)
    if not urls:
        raise TokenFileError(
            f"{config.input}: no rank drew a document for bucket {bucket} of {num_buckets}: use fewer buckets"
        )
    return urls, manifest.entries_by_name(records)


class _Checkpoints:
    """The ``on_close`` of the merge's writer: publishes each finished file with a manifest that records where in
    the ordering it ends, which is where a resumed merge starts."""

    def __init__(self, attempt: Attempt, prepared: _Prepared, done: list[MergeOutput], own: OwnCheck | None):
        self.attempt, self.prepared, self.entries, self.own = attempt, prepared, list(done), own
        self.resumed_units = self.units_end

    @property
    def units_end(self) -> int:
        return self.entries[-1].units_end if self.entries else 0

    @property
    def tokens(self) -> int:
        return sum(entry.tokens for entry in self.entries)

    @property
    def contents(self) -> Contents:
        """Of the files published so far, this attempt's and those it resumed after."""
        # cast: each has its contents (this attempt's are made with them; resumed ones without are done again)
        return Contents.total(cast(ContentsSum, entry.contents).value for entry in self.entries)

    def _pseudo_ends(self, tokens: int) -> PseudoEnds | Literal["unknown"] | None:
        """The chunk ends in the index of the next file, of ``tokens`` tokens ("unknown": some input's index held
        chunk or window ends already)."""
        if self.prepared.inputs.pseudo_ends:
            return "unknown"
        chunk = self.prepared.units.chunk
        return manifest.pseudo_ends(self.tokens, tokens, chunk, int(self.prepared.units.counts.sum()) * (chunk or 0))

    def watch(self, path: Path) -> Observer:
        """The own check's observer of the next file as it is written: its length is not known yet, but any length
        past its end gives its chunk ends, and the whole stream's is one."""
        if self.own is None:  # the writer is given this observer only with an own check
            raise RuntimeError("the merge watches its files only with an own check")
        return self.own.watch(path, self._pseudo_ends(self.prepared.total_tokens))

    def __call__(self, written: WrittenTokenFile, units_written: int) -> None:
        units_end = self.resumed_units + units_written
        if (mix := self.prepared.mix) is not None:  # the file's uses are its documents: each one's source
            (written,) = sidecar.attach([written], mix.sources[mix.order[self.units_end : units_end]], mix.names)
        entry = manifest.output_entry(
            written,
            MergeOutput,
            fingerprint=self.prepared.fingerprint,
            units_start=self.units_end,
            units_end=units_end,
            pseudo_ends=self._pseudo_ends(written.tokens),
        )
        if self.own is not None:
            self.own.family(written.path.parent, entry)
        self.attempt.place_families([written])
        self.attempt.write(manifest.manifest_name(written.path.stem), entry.dumps())
        self.entries.append(entry)


def merge(
    config: MergeConfig, progress: ProgressMode = None, owner: str | None = None, checks: Checks | None = None
) -> StageResult[MergeCounts, MergeManifest]:
    """Run the merge, resuming when an earlier run of the same merge was interrupted. With ``checks`` (its files
    are the dataset: no context shuffle follows), each file is checked as it is written, before upload, as a
    context shuffle checks its own; the files an earlier attempt published are left to publish's reading."""
    started = time.time()
    prepared = _prepare(config)
    stem = config.stem
    own = OwnCheck(checks, f"merge {stem}") if checks is not None else None
    with attempt_at(config.folder(config.output), stem, config.local_working_dir, owner) as attempt:
        done = _completed_files(attempt, config, prepared.width, prepared.fingerprint)
        checkpoints = _Checkpoints(attempt, prepared, done, own)
        log.info(
            "merge %s: %d inputs, %d units, %d tokens; %s already done, resuming at unit %d",
            stem,
            len(prepared.inputs.urls),
            prepared.total_units,
            prepared.total_tokens,
            counted(len(done), "file"),
            checkpoints.units_end,
        )
        try:
            read = _move(config, prepared, attempt, checkpoints, progress)
        except ShuffleCheckFailed:  # a resumed merge would keep the files: none of them may be trusted
            _remove_outputs(attempt, config, keep=set())
            raise
        tails = int(prepared.tails.sum())
        mix = prepared.mix
        counts = MergeCounts(
            input_files=len(prepared.inputs.urls),
            units=prepared.total_units,
            index_entries=sum(e.index_entries for e in checkpoints.entries),
            tokens=checkpoints.tokens,
            partial_chunk_tokens=tails if prepared.keep_tails else 0,
            tokens_dropped=(0 if prepared.keep_tails else tails) if mix is None else _not_chosen(prepared, mix),
            resumed_files=len(done),
            contents_in=ContentsSum.of(read),
            contents_out=ContentsSum.of(checkpoints.contents),
            tokens_repeated=None if mix is None else _repeated(prepared, mix),
            sources=None if mix is None else mix.shares,
        )
        inputs = prepared.inputs
        record = MergeManifest(
            stage="merge",
            **manifest.provenance(config, time.time() - started, MergeParams),
            save_filename=config.save_filename,
            bucket=config.bucket,
            seed=config.seed,
            fingerprint=prepared.fingerprint,
            tokenizer=MergeTokenizer(
                name=inputs.tokenizer, sha256=inputs.tokenizer_sha256, token_size=inputs.token_size
            ),
            inputs=[SizedInput(url=u, bytes=s) for u, s in zip(inputs.urls, inputs.sizes, strict=True)],
            counts=counts,
            outputs=checkpoints.entries,
            checked=None if own is None else own.result(),
        )
        record = _commit(attempt, config, inputs, record)
    return StageResult(counts, record)


def _move(
    config: MergeConfig, prepared: _Prepared, attempt: Attempt, checkpoints: _Checkpoints, progress: ProgressMode
) -> Contents:
    """Move every unit not yet published, in the planned order, into files that publish themselves as they close;
    then check that the files hold every unit of the inputs once. Returns the contents of the inputs."""
    inputs, units = prepared.inputs, prepared.units
    done = len(checkpoints.entries)
    writer = SplitWriter(
        attempt.work,
        lambda sub: config.file_name(sub + done, prepared.width),
        tokenizer=inputs.tokenizer,
        token_size=inputs.token_size,
        save_loss=config.save_loss,
        max_tokens=config.merge_max_tokens_per_file,
        close_at_limit=True,
        on_close=checkpoints,
        observe=checkpoints.watch if checkpoints.own else None,
        keep_hashes=prepared.mix is not None,  # a mixture's: its sidecars give them their sources
    )
    inner = [inputs.file_ends(f) for f in range(len(inputs.urls))] if units.chunk else None
    mix = prepared.mix
    file_ids, perm = plan_ordering(config, units) if mix is None else (np.zeros(0, np.uint16), mix.order)
    resume, ordered = checkpoints.units_end, len(file_ids) if perm is None else len(perm)
    cursor = np.bincount(file_ids[:resume], minlength=len(inputs.urls)).astype(np.int64)
    pool = SourcePool(
        inputs.urls,
        inputs.token_size,
        config.save_loss,
        config.max_open_files,
        attempt.work / "inputs",
        config.storage_options,
    )
    with pool, Progress(f"merge {config.stem}", prepared.total_tokens, "tok", progress) as shown:
        pool.fetch(inputs.sizes)
        with meanwhile(_input_contents, prepared, pool) as contents:  # the inputs read again while their units move
            with writer:  # its end publishes the last file
                shown.update(checkpoints.tokens, units=resume, tokens=checkpoints.tokens)
                for a in range(min(resume, ordered), ordered, UNITS_PER_SLICE):
                    b = min(ordered, a + UNITS_PER_SLICE)
                    files, local = _slice_units(file_ids, perm, units, cursor, a, b)
                    starts, ends = units.bounds(files, local)
                    move_units(pool, files, starts, ends, writer, inner, progress=shown)
                if prepared.keep_tails:  # the partial last chunk of each file, in file order, after every full chunk
                    pending = np.flatnonzero(prepared.tails)[max(0, resume - ordered) :]
                    chunk_starts = units.counts[pending] * units.chunk
                    move_units(pool, pending, chunk_starts, prepared.tokens[pending], writer, inner, progress=shown)
            read, kept = contents.result()
    check_kept(f"merge {config.stem}", kept, checkpoints.contents)
    return read


def _input_contents(prepared: _Prepared, pool: SourcePool) -> tuple[Contents, Contents]:
    """What the merge read (its inputs cut at their indexes) and what its files must hold (cut into its units, the
    dropped tails aside): from the inputs' records when all hold them and the units are their documents, else hashed
    from the input files (datatrove's, or cut into chunks)."""
    chunk = prepared.units.chunk
    if prepared.mix is not None:
        return _mixed_contents(prepared, prepared.mix, pool)
    known = [recorded for recorded in prepared.recorded if recorded is not None]
    if not chunk and len(known) == len(prepared.recorded):
        read = Contents.total(recorded.value for recorded in known)
        return read, read
    read = kept = Contents()
    for f in range(len(prepared.inputs.urls)):
        ends, tokens = prepared.inputs.file_ends(f), int(prepared.tokens[f])
        if not chunk:
            (whole,) = contents_of(pool, f, (ends, tokens))
            read, kept = read + whole, kept + whole
            continue
        full = int(prepared.units.counts[f]) * chunk
        limit = tokens if prepared.keep_tails else full
        units = sorted_union(ends[ends <= limit], np.arange(chunk, full + 1, chunk))
        whole, cut = contents_of(pool, f, (ends, tokens), (units, limit))
        read, kept = read + whole, kept + cut
    return read, kept


def _mixed_contents(prepared: _Prepared, mix: _Mixed, pool: SourcePool) -> tuple[Contents, Contents]:
    """What a mixture's merge read (its inputs whole), and what its files must hold: each document as many times
    as it is used, each of its source, hashed from the input files (a document's hash is not in its rank's
    records)."""
    read = kept = Contents()
    offsets = prepared.inputs.offsets
    for f in range(len(prepared.inputs.urls)):
        uses, sources = (mine[offsets[f] : offsets[f + 1]] for mine in (mix.uses, mix.sources))
        whole, used = uses_contents(pool, f, prepared.inputs.file_ends(f), int(prepared.tokens[f]), uses, sources)
        read, kept = read + whole, kept + used
    return read, kept


def _not_chosen(prepared: _Prepared, mix: _Mixed) -> int:
    """The tokens of the documents a mixture did not use."""
    return int(prepared.inputs.lengths()[mix.uses == 0].sum())


def _repeated(prepared: _Prepared, mix: _Mixed) -> int:
    """The tokens a mixture wrote beyond each document's first use."""
    return int((prepared.inputs.lengths() * np.maximum(mix.uses - 1, 0)).sum())


def _commit(attempt: Attempt, config: MergeConfig, inputs: MergeInputs, record: MergeManifest) -> MergeManifest:
    """The dataset's metadata (datatrove's ``{name}.ds.metadata``: all files' tokens), then manifest and marker. A
    bucket task knows only its bucket's tokens, so a bucketed merge leaves the total to each file's metadata."""
    files = record.output_files()
    if config.bucket is None:
        named = tuple(share.name for share in record.counts.sources or [])
        meta = Metadata(inputs.tokenizer, inputs.token_size, record.counts.tokens, named).render().encode()
        attempt.write(f"{config.save_filename}.ds.metadata", meta)
        files[f"{config.save_filename}.ds.metadata"] = FileSum.of(len(meta), checksum(meta), ALGORITHM)
    return attempt.commit(record, files)


def _slice_units(
    file_ids: np.ndarray, perm: np.ndarray | None, units: _Units, cursor: np.ndarray, a: int, b: int
) -> tuple[np.ndarray, np.ndarray]:
    """Files and unit numbers within their file for ordering entries ``a..b``; advances ``cursor``."""
    if perm is not None:  # shuffle mode: a global unit id -> (file, unit in file)
        starts = np.concatenate([[0], np.cumsum(units.counts)])
        global_ids = perm[a:b]
        files = np.searchsorted(starts, global_ids, side="right") - 1
        return files, global_ids - starts[files]
    files = file_ids[a:b].astype(np.int64)
    by_file = np.argsort(files, kind="stable")
    sorted_files = files[by_file]
    firsts = np.searchsorted(sorted_files, sorted_files, side="left")
    rank = np.empty(len(files), dtype=np.int64)
    rank[by_file] = np.arange(len(files)) - firsts
    local = cursor[files] + rank
    cursor += np.bincount(files, minlength=len(cursor))
    return files, local


def _fingerprint(config: MergeConfig, inputs: MergeInputs, width: int) -> str:
    """Everything that decides the output bytes: a resumed run must agree on all of it."""
    plan = {
        "inputs": [[u.rsplit("/", 1)[-1], s] for u, s in zip(inputs.urls, inputs.sizes, strict=True)],
        "index_entries": len(inputs.ends),
        "params": {k: v for k, v in params(config).items() if k not in IRRELEVANT_TO_BYTES},
        "width": width,
        "numpy": np.__version__,
    }
    # a record among the params (the mixture) in its JSON, as the manifest records it
    options = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
    return hashlib.sha256(orjson.dumps(plan, default=Record.to_json, option=options)).hexdigest()


def _completed_files(attempt: Attempt, config: MergeConfig, width: int, fingerprint: str) -> list[MergeOutput]:
    """The output files a previous run of this same merge finished, in order; everything after them (and all of
    a different merge's files under this name) is removed. A damaged checkpoint is where the merge resumes."""
    fs, out_path = attempt.fs, attempt.out_path
    done: list[MergeOutput] = []
    while True:
        name = config.file_name(len(done), width)
        try:
            entry = MergeOutput.read(fs, join(out_path, manifest.manifest_name(name[: -len(".ds")])))
        except RecordError as exc:
            log.warning("%s: the merge resumes here", exc)
            break
        if not entry or entry.fingerprint != fingerprint or not _files_intact(fs, out_path, entry):
            break
        if entry.contents is None:  # written before contents were recorded: done again, so they are checked
            break
        done.append(entry)
    _remove_outputs(attempt, config, keep={n for e in done for n in e.files} | {f"{config.save_filename}.ds.metadata"})
    return done


def _remove_outputs(attempt: Attempt, config: MergeConfig, keep: set[str]) -> None:
    """Remove every file and checkpoint of this merge's outputs (of any attempt) but those in ``keep``."""
    fs, out_path = attempt.fs, attempt.out_path
    for name in list_names(fs, out_path):
        if config.owns(name) and name not in keep:
            attempt.remove(name)
    for name in list_names(fs, join(out_path, "_manifests")):
        family = name.removesuffix(".json") + ".ds"
        if config.owns(family) and family not in keep:
            attempt.remove(f"_manifests/{name}")


def _files_intact(fs: AbstractFileSystem, out_path: str, entry: MergeOutput) -> bool:
    for name, info in entry.files.items():
        path = join(out_path, name)
        if not fs.exists(path) or fs.size(path) != info.bytes:
            return False
    return True
