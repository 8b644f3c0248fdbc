"""The tokenize stage: one rank's share of the input becomes shuffled ``.ds`` files, a manifest and a marker.

Pass 1 (``first_pass``) gives each input file's documents, in input order, as a segment in the local working
folder, encoded or taken from the tokenization cache. Pass 2 permutes the rank's documents, its segments' end to
end (then, optionally, fixed-size chunks), by moving bytes, never re-tokenizing. The permutations are datatrove's
(``tokenization.orderings``): one generator per rank, the document permutation drawn first and the chunk
permutation second, so the same seed gives the same bytes, whatever the cache held.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, cast

import numpy as np

from tokenization.errors import UsageError
from tokenization.formats import DS, MEGATRON, names
from tokenization.formats.contents import Contents, sourced
from tokenization.formats.ds import TokenFile, TokenFileWriter, WrittenTokenFile
from tokenization.formats.megatron import MegatronWriter
from tokenization.formats.moves import (
    written_contents,
)
from tokenization.formats.names import RankFileKind
from tokenization.inputs.content import Remembered, check_unchanged
from tokenization.inputs.listing import idle_ranks, list_input_files, shard, split_files
from tokenization.mixing import RankChoice
from tokenization.options import Options, option
from tokenization.output import known, manifest
from tokenization.output.attempts import Attempt, attempt_at
from tokenization.output.cache import Cache, chosen_location
from tokenization.output.manifest import StageResult
from tokenization.output.runs import RUN_CLAIM, PlanConflict
from tokenization.progress import ProgressMode
from tokenization.records import (
    CachedInput,
    ContentsSum,
    FileSum,
    InputFile,
    Mixture,
    OutputEntry,
    RankCache,
    RankManifest,
    RankParams,
    SourceCounts,
    TokenizerFacts,
)
from tokenization.rendering.renderer import Renderer
from tokenization.stages.tokenize.document_shuffle import second_pass
from tokenization.stages.tokenize.first_pass import FirstPass, quarantined
from tokenization.stages.tokenize.segments import CacheOwner, Reading, Segment, source_readings, total
from tokenization.storage.checksums import ALGORITHM, file_checksum
from tokenization.storage.locations import check_disjoint
from tokenization.tokenizer.counts import Counts, TooManyRejects
from tokenization.tokenizer.documents import DocumentOptions
from tokenization.tokenizer.encoding import Encoder
from tokenization.wording import counted

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RankOptions(Options):
    """Rank files: how each rank orders and writes its documents (tokenize and build share these)."""

    shuffle_documents: bool = option(
        True,
        flag="--no-shuffle",
        title="Shuffle documents within each rank",
        help="shuffle the documents of each rank (--no-shuffle keeps them in input order)",
        flag_help="keep each rank's documents in input order (default: shuffled with --seed)",
    )
    shuffle_chunk_size: int | None = option(
        None,
        minimum=1,
        title="Chunk shuffle size",
        help="after the documents, also shuffle chunks of this many tokens (default: no chunk shuffle)",
    )
    max_tokens_per_file: int | None = option(
        None,
        minimum=1,
        title="Most tokens a rank file",
        help="start a new rank file past this many tokens, at a document boundary (default: one file a rank)",
    )
    save_loss: bool = option(
        False,
        title="Write loss masks",
        help="write .ds.loss: 1 for a token that carries loss, 0 for one in a record's no_loss_ranges or outside "
        "its loss fields or roles",
    )
    num_buckets: int | None = option(
        None,
        minimum=1,
        maximum=65_536,
        title="Buckets of the global shuffle",
        help="scatter each rank's documents into this many bucket files, each document's bucket drawn uniformly, "
        "for a global shuffle that many merge tasks share (merge_mode bucketed); default: one shuffled sequence",
    )
    split_input_mb: int | None = option(
        None,
        minimum=1,
        title="Split big input files (MB)",
        help="let ranks share big input files: an uncompressed JSON-lines file of more than this many MB is cut "
        "into parts of about that size at line boundaries, a parquet file at row groups, and ranks take parts as "
        "they take files (default: whole files, as datatrove shards, which gives its bytes)",
    )
    output_format: Literal["ds", "megatron"] = option(
        "ds",
        flag="--format",
        title="Output format",
        help="ds: datatrove's .ds family (merged and context-shuffled by a build); megatron: .bin/.idx per rank",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.output_format == "megatron" and self.save_loss:
            raise UsageError("Megatron's indexed dataset has no loss mask: save_loss needs the ds format")
        if isinstance(self, DocumentOptions) and self.loss_fields and not self.save_loss:
            raise UsageError("loss_fields needs save_loss: without .ds.loss files the loss spans are lost")
        if self.num_buckets and (self.shuffle_chunk_size or self.output_format == "megatron"):
            raise UsageError("num_buckets moves whole documents into .ds buckets: no shuffle_chunk_size, no megatron")


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig(DocumentOptions, RankOptions):
    """One rank's parameters; defaults follow datatrove's DocumentTokenizer where they are sound."""

    inputs: list[str] = option(flag="", help="input files, folders or globs (.jsonl[.gz|.zst], .parquet); fsspec URLs")
    output: str = option(help="output folder or fsspec URL")
    seed: int = option(0, minimum=0, help="shuffle seed: the same seed gives the same bytes")
    rank: int = option(0, minimum=0, help="this task's rank: it tokenizes input files rank, rank + world size, ...")
    world_size: int = option(1, minimum=1, help="how many ranks share the input files")
    save_filename: str | None = option(None, help="prefix of the output names (default: none, {rank}_...)")
    drop_last_chunk: bool = option(False, help="drop the partial last chunk, as datatrove does (counted as dropped)")
    local_working_dir: str | None = option(
        None, help="local folder for the unshuffled pass (default: beside a local output, else the system's temp)"
    )
    cache: str | None = option(
        None,
        help="tokenization cache: a folder or fsspec URL where each input file's tokens are kept, so that a file "
        "tokenized before (the same bytes, tokenizer and settings) is not tokenized again; off: none (the default)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rank >= self.world_size:
            raise UsageError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.drop_last_chunk and not self.shuffle_chunk_size:
            raise UsageError("drop_last_chunk needs shuffle_chunk_size")

    @property
    def stem(self) -> str:
        return names.rank_stem(self.rank, self.save_filename)

    @property
    def kind(self) -> RankFileKind:
        """How the rank orders its files' documents, which their names say."""
        if self.num_buckets:
            return RankFileKind.BUCKET
        if self.shuffle_chunk_size:
            return RankFileKind.CHUNK_SHUFFLED
        return RankFileKind.DOC_SHUFFLED if self.shuffle_documents else RankFileKind.UNSHUFFLED

    def output_name(self, sub: int, source: str | None = None) -> str:
        suffix = MEGATRON if self.output_format == "megatron" else DS
        return names.rank_file_name(self.stem, sub, self.kind, suffix, source)

    def bucket_name(self, bucket: int, sub: int) -> str:
        return names.bucket_file_name(self.stem, sub, bucket)

    @property
    def writer_class(self) -> type:
        return MegatronWriter if self.output_format == "megatron" else TokenFileWriter

    @property
    def cache_location(self) -> str | None:
        return chosen_location(self.cache, None)


@dataclass(frozen=True)
class RankShare:
    """A rank's part of a build's plan (``tokenization.builds.plan``): exactly these files (or parts of files),
    never a new listing, read with the tokenizer and chat template the plan was made with; the plan's digest goes
    into the rank's manifest."""

    files: list[InputFile]
    plan: str
    tokenizer_sha256: str
    rendering_sha256: str | None
    run_dir: str  # the build's folder: the cache keeps the entries it uses while its _RUN.json is there
    tokenizer: TokenizerFacts | None = None  # what loading the tokenizer told the plan (None: a plan made before)
    mixture: Mixture | None = None  # a mixture's sources, and the source of each of ``files``
    sources: list[int] | None = None
    choice: RankChoice | None = None  # the documents the plan chose of a mixture, where it could (``builds.choice``)

    def readings(self, config: TokenizeConfig, encoder: Encoder) -> dict[str, Reading] | None:
        """How each file is read: with its mixture source's own text key and template, where it sets them."""
        if self.mixture is None or self.sources is None:
            return None
        by_source = source_readings(config, self.mixture, encoder)
        return {file.url: by_source[s] for file, s in zip(self.files, self.sources, strict=True)}

    def check(self, encoder: Encoder, renderer: Renderer | None) -> None:
        """Refuse to encode with a tokenizer or chat template that is no longer the planned one."""
        rendering = renderer and renderer.sha256
        for what, planned, now in (
            (f"tokenizer {encoder.name}", self.tokenizer_sha256, encoder.sha256),
            ("chat template", self.rendering_sha256, rendering),
        ):
            if planned != now:
                raise PlanConflict(
                    f"{what} changed since the build was planned (sha256 {now}, planned {planned}): a build encodes "
                    f"with what it planned; run the new one under a new build id"
                )


def _remembered(cache: Cache, config: TokenizeConfig, files: int) -> Remembered:
    """The rows ranks left of the input's files (``output.known``), read only when asked: when a file of a plan that
    records no sha256 of it (a file new to its plan) is found chmodded or copied, to tell whether its bytes are the
    planned ones. A rank's ``files`` bound the plan's: each rank holds every ``world_size``-th."""
    return lambda: known.recall(cache, config.inputs, (files + 1) * config.world_size).rows


def tokenize_rank(
    config: TokenizeConfig, progress: ProgressMode = None, owner: str | None = None, share: RankShare | None = None
) -> StageResult[Counts, RankManifest]:
    """Run one rank end to end: its ``share`` of a build's plan, or else rank ``config.rank`` of a listing of
    ``config.inputs``. Re-running a rank replaces its output completely; a second attempt at the same rank while
    one runs is refused (``owner`` names this attempt's caller in that message)."""
    started = time.time()
    encoder = config.encoder(None if share is None else share.tokenizer)  # fails before any data is read
    renderer = config.renderer(encoder)  # so does a chat template that cannot be read
    location = config.cache_location
    if share is None:
        check_disjoint(config.inputs, config.output)
        if location:
            check_disjoint(config.inputs, location, "cache")
        listing = list_input_files(config.inputs, config.storage_options)
        readings = None
        shared = split_files(listing.files, config.split_input_mb)
        idle_ranks(config.world_size, shared, config.split_input_mb)
        files, skipped = shard(shared, config.rank, config.world_size), listing.skipped
        user, keeps = config.output, config.folder(config.output).url_of(manifest.manifest_name(config.stem))
    else:
        share.check(encoder, renderer)
        files, skipped = share.files, []
        readings = share.readings(config, encoder)
        user, keeps = share.run_dir, config.folder(share.run_dir).url_of(RUN_CLAIM)
    cache = Cache(config.folder(location)) if location else None
    remembered = None if cache is None else _remembered(cache, config, len(files))
    check_unchanged(files, config.storage_options, remembered)  # fails before any work on a file not as listed
    log.info(
        "rank %d/%d: %s, %d bytes",
        config.rank,
        config.world_size,
        counted(len(files), "input file"),
        sum(f.span_bytes for f in files),
    )
    with attempt_at(config.folder(config.output), config.stem, config.local_working_dir, owner) as attempt:
        first = FirstPass(
            config,
            save_loss=config.save_loss,
            encoder=encoder,
            renderer=renderer,
            attempt=attempt,
            where=f"rank {config.rank}",
            cache=None if cache is None else CacheOwner(cache, user, keeps, config.stem, config.inputs),
            readings=readings,
        )
        try:  # rejected records are published even when they fail the rank: they are what a user must look at
            segments = first.run(files, progress)
        except TooManyRejects:
            attempt.place(quarantined(attempt.work), manifest.quarantine_name(config.stem))
            raise
        encoder.release()  # pass 2 has the memory budget's room
        counts = total(segments)
        log.info("rank %d: pass 1 done, %d documents, %d tokens", config.rank, counts.docs_written, counts.tokens)
        source_names = share.mixture.names if share is not None and share.mixture is not None else None
        if source_names is not None and config.output_format != "megatron":  # its files' sidecars name the sources
            counts.contents = Contents.total(sourced(s.counts.contents, s.source) for s in segments)
        choice = None if share is None or source_names is None else share.choice
        written = second_pass(config, encoder, segments, counts, attempt.work, source_names, choice)
        log.info("rank %d: pass 2 done, %s, %s", config.rank, counted(len(written), "file"), config.kind)
        counts.tokens_written = sum(w.tokens for w in written)
        not_chosen = None if choice is None else counts.tokens - counts.tokens_written
        # nor one that changed while it was read; a hit was not read whole (a sample at most, which a change fails):
        # what it gave is the planned bytes' tokens, so only the encoded files are looked at again
        check_unchanged([s.file for s in segments if s.encoded], config.storage_options, remembered)
        seconds = round(time.time() - started, 3)  # the manifest's and the rates' figure: work, not publishing
        taken = [s.cached.taken() for s in segments if s.cached is not None]  # the rates are of encoding alone
        encoded_text, encoded_tokens = (
            counts.text_bytes - sum(t for t, _ in taken),
            counts.tokens - sum(n for _, n in taken),
        )
        record = RankManifest(
            stage="tokenize",
            **manifest.provenance(config, seconds, RankParams),
            rank=config.rank,
            world_size=config.world_size,
            seed=config.seed,
            tokenizer=encoder.describe(),
            rendering=None if renderer is None else renderer.describe(),
            plan=None if share is None else share.plan,
            inputs=files,
            skipped_inputs=skipped,
            input_bytes=sum(f.span_bytes for f in files),
            counts=replace(
                counts.record(), contents_out=ContentsSum.of(written_contents(written)), tokens_not_chosen=not_chosen
            ),
            outputs=_outputs(config, counts, written),
            throughput=manifest.throughput(seconds, encoder.load_seconds, encoded_text, encoded_tokens),
            # cast: with a cache, every segment says how the cache served it (``FirstPass``)
            cache=RankCache(location=location, files=cast("list[CachedInput]", [s.cached for s in segments]))
            if location
            else None,
            sources=None
            if source_names is None
            else _source_counts(segments, source_names, written, config.num_buckets),
        )
        record = _publish(config, attempt, written, record, quarantined(attempt.work))
    log.info("rank %d: %s published to %s", config.rank, counted(len(written), "file"), config.output)
    return StageResult(counts, record)


def _outputs(config: TokenizeConfig, counts: Counts, written: list[WrittenTokenFile]) -> list[OutputEntry]:
    """The manifest's entry of each file; chunk ends in an index are not document ends: say where, for verify."""
    chunk = config.shuffle_chunk_size
    full = (counts.tokens - counts.partial_chunk_tokens - counts.tokens_dropped) if chunk else 0
    starts = (np.cumsum([w.tokens for w in written]) - [w.tokens for w in written]).tolist()  # a rank may have none
    return [
        manifest.output_entry(w, pseudo_ends=manifest.pseudo_ends(start, w.tokens, chunk, full))
        for w, start in zip(written, starts, strict=True)
    ]


def _source_counts(
    segments: list[Segment], sources: list[str], written: list[WrittenTokenFile], num_buckets: int | None
) -> list[SourceCounts]:
    """Each source's documents and tokens in this rank (every source, with none too), and with buckets its tokens
    in each, from the bucket files' sidecars."""
    by_source = [total([s for s in segments if s.source == number]) for number in range(len(sources))]
    in_buckets = np.zeros((len(sources), num_buckets or 0), np.int64)
    for family in written if num_buckets else []:
        file = TokenFile(str(family.path))
        lengths = np.diff(np.asarray(file.ends, dtype=np.int64), prepend=0)
        held = np.bincount(cast(np.ndarray, file.sources), weights=lengths, minlength=len(sources))
        in_buckets[:, names.bucket_in(family.folder)] += held.astype(np.int64)
    return [
        SourceCounts(
            name=name,
            docs_read=c.docs_read,
            docs_written=c.docs_written,
            empty=c.empty,
            quarantined=sum(c.rejected.values()),
            tokens=c.tokens,
            bucket_tokens=in_buckets[number].tolist() if num_buckets else None,
        )
        for number, (name, c) in enumerate(zip(sources, by_source, strict=True))
    ]


def _publish(
    config: TokenizeConfig, attempt: Attempt, written: list[WrittenTokenFile], record: RankManifest, quarantine: Path
) -> RankManifest:
    """Replace the rank's previous output with the new files and its quarantine, then commit the manifest (as
    written, with the attempt). Its earlier files are found in one listing of the rank folder; those in bucket
    folders are replaced by name (the same plan names the same files), and one there under another name is a file
    that no marker lists, which the bucket's merge refuses, naming it."""
    keep = {w.published(f.name) for w in written for f in w.files}
    pattern = names.rank_file_pattern(config.stem)
    for name in attempt.output.list():
        if pattern.fullmatch(name) and name not in keep:
            attempt.remove(name)
    attempt.place_families(written)
    files = record.output_files()
    bad = manifest.quarantine_name(config.stem)
    if quarantine.stat().st_size:
        files[bad] = FileSum.of(quarantine.stat().st_size, file_checksum(quarantine), ALGORITHM)
        attempt.place(quarantine, bad)
    else:
        attempt.remove(bad)
    return attempt.commit(record, files)
