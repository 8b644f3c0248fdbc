"""A build's books: which rank shards are complete, documents in = out, and tokens from stage to stage.

Every figure comes from the manifests and markers on storage, never from what a task said it did.
"""

from __future__ import annotations

import hashlib
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import reduce
from typing import Any, TypeVar, cast

import numpy as np
import orjson

from tokenization.builds.plan import unread_or_reread
from tokenization.formats.ds import named_by_content
from tokenization.formats.names import BUCKET_FOLDER, rank_stem
from tokenization.output import manifest
from tokenization.output.runs import BuildError
from tokenization.records import (
    CacheSummary,
    CompletionMarker,
    Conservation,
    ContentsSum,
    ContextCounts,
    ContextManifest,
    InputFile,
    MergeCounts,
    MergeManifest,
    Mixture,
    PlanReading,
    RankManifest,
    RecordError,
    SourceAccount,
    StageSummary,
    TokenizeSummary,
    stage_manifest,
)
from tokenization.storage.checksums import checksum
from tokenization.storage.concurrent import in_batches, map_concurrently
from tokenization.storage.folder import Folder
from tokenization.wording import counted

C = TypeVar("C", MergeCounts, ContextCounts)


UNMARKED = "no completion marker"  # a rank not done yet (any other reason: one done whose shard is damaged)


def incomplete_ranks(ranks: Folder, num_ranks: int, plan: str | None = None) -> dict[int, str]:
    """Every rank of ``0..num_ranks-1`` whose shard is not complete yet, with the reason. While markers are missing
    this costs one listing, whatever the number of ranks; once all are there, each marker and manifest is read once:
    a shard is complete when its manifest has the checksum its marker records, was made under the build's ``plan``
    (its digest, when given), and every file the marker lists is there with its size. A marker of a rank outside
    the run is an error, never ignored."""
    listed = {name.removesuffix(".json") for name in ranks.sub(manifest.COMPLETIONS).list() if name.endswith(".json")}
    expected = {rank_stem(rank): rank for rank in range(num_ranks)}
    if strangers := sorted(listed - set(expected)):
        raise BuildError(f"{ranks.url} holds shards that are not ranks of this {num_ranks}-rank run: {strangers}")
    if unmarked := {rank: UNMARKED for stem, rank in expected.items() if stem not in listed}:
        return unmarked
    listed_files = _ListedFiles.of(ranks)
    status = {}
    for batch in in_batches(list(expected)):  # a batch's markers, then their manifests, read concurrently
        markers = ranks.read_many([manifest.marker_name(stem) for stem in batch])
        read = zip(batch, markers.items(), strict=True)
        named = {stem: _marker(data, ranks.url_of(name)) for stem, (name, data) in read}
        manifests = ranks.read_many([m.manifest for m in named.values() if isinstance(m, CompletionMarker)])
        for stem, marker in named.items():
            status[expected[stem]] = _shard_status(ranks, marker, manifests, listed_files, plan)
    return {rank: why for rank, why in status.items() if why is not None}


def _marker(data: bytes | None, where: str) -> CompletionMarker | str:
    """A rank's marker, or why it cannot be used: its one line, when it is damaged."""
    if data is None:
        return UNMARKED
    try:
        return CompletionMarker.loads(data, where)
    except RecordError as exc:
        return str(exc)


@dataclass(frozen=True)
class _ListedFiles:
    """Every file of a rank folder with its size (its own, its quarantine's and each bucket folder's), kept as one
    8-byte digest of name and size a file, sorted: 8 bytes a file, where a listing of R x B x 3 names held ~0.7 kB
    each (1.15 GB at 1,024 ranks x 512 buckets). Two files share a digest with odds of 2^-64 a pair."""

    digests: np.ndarray  # uint64, sorted

    @classmethod
    def of(cls, folder: Folder) -> _ListedFiles:
        """One listing of the folder, then its subfolders' listings a batch at a time, concurrently."""
        top = folder.sizes()
        folders = [manifest.QUARANTINE, *(name for name in top if BUCKET_FOLDER.fullmatch(name))]
        digests = [_digests(top.items())]
        for batch in in_batches(folders):
            listings = map_concurrently(lambda name: folder.sub(name).sizes(), batch)
            for sub, listing in zip(batch, listings, strict=True):
                digests.append(_digests((f"{sub}/{name}", size) for name, size in listing.items()))
        return cls(np.sort(np.concatenate(digests)))

    def first_missing(self, sizes: dict[str, int]) -> str | None:
        """The first of these files (name relative to the folder: size) that the folder does not hold with that
        size, looked up all at once; None when it holds them all."""
        wanted = _digests(sizes.items())
        at = np.minimum(np.searchsorted(self.digests, wanted), max(len(self.digests) - 1, 0))
        held = self.digests[at] == wanted if len(self.digests) else np.zeros(len(wanted), bool)
        return None if held.all() else list(sizes)[int(np.argmin(held))]


def _digest(name: str, size: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\n{size}".encode(), digest_size=8).digest(), "little")


def _digests(files: Iterable[tuple[str, int]]) -> np.ndarray:
    return np.fromiter((_digest(name, size) for name, size in files), dtype=np.uint64)


def _shard_status(
    ranks: Folder,
    marker: CompletionMarker | str,
    manifests: dict[str, bytes | None],
    listed_files: _ListedFiles,
    plan: str | None,
) -> str | None:
    """Why a rank's shard is not complete, or None, from its marker (or why it has none) and the manifests read.
    A damaged marker or manifest is such a reason, said in its one line: tokenizing the rank again replaces both."""
    if isinstance(marker, str):
        return marker
    data = manifests.get(marker.manifest)
    if data is None:
        return f"{ranks.url_of(marker.manifest)} is missing: its completion marker names it"
    if hashlib.sha256(data).hexdigest() != marker.sha256:
        return f"{ranks.url_of(marker.manifest)} is not the manifest its completion marker records (sha256)"
    if plan is not None:
        try:
            made_under = RankManifest.loads(data, ranks.url_of(marker.manifest)).plan
        except RecordError as exc:
            return str(exc)
        if made_under != plan:
            return f"tokenized under another plan ({made_under}, not {plan})"
    missing = listed_files.first_missing({name: info.bytes for name, info in marker.files.items()})
    return missing and f"{missing} is missing or not the size its completion marker records"


def conservation(rank_manifests: list[RankManifest], planned: list[InputFile] | None = None) -> Conservation:
    """Documents in = documents out + empty + quarantined, summed over the ranks; given the ``planned`` files, the
    books hold only if the ranks read exactly those, each once (else ``inputs_problem`` says how not)."""
    counts = [m.counts for m in rank_manifests]
    rejected: Counter[str] = Counter()
    for c in counts:
        rejected.update(c.rejected)
    quarantined = sum(rejected.values())
    docs_in, docs_out, empty = (sum(getattr(c, k) for c in counts) for k in ("docs_read", "docs_written", "empty"))
    read = (entry for m in rank_manifests for entry in m.inputs)
    problem = None if planned is None else unread_or_reread(planned, read)
    not_chosen = [c.tokens_not_chosen for c in counts if c.tokens_not_chosen is not None]
    return Conservation(
        docs_in=docs_in,
        docs_out=docs_out,
        empty=empty,
        quarantined=quarantined,
        rejected_by_reason=dict(sorted(rejected.items())),
        tokens=sum(c.tokens_written for c in counts),
        tokens_dropped=sum(c.tokens_dropped for c in counts),
        inputs_problem=problem,
        holds=docs_in == docs_out + empty + quarantined and problem is None,
        tokens_not_chosen=sum(not_chosen) if not_chosen else None,
    )


def cache_summary(rank_manifests: list[RankManifest], plan: PlanReading | None = None) -> CacheSummary | None:
    """What the tokenization cache did for the ranks (None when they ran without one): the files it served and
    those tokenized, the input bytes and tokens reused, and the ranks' time, of which encoding; what the ``plan``
    read to tell the files' content, and the input bytes the ranks read (to encode misses, or check hits)."""
    caches = [m.cache for m in rank_manifests if m.cache is not None]
    if not caches:
        return None
    served = [f for cache in caches for f in cache.files]
    hits = [f for f in served if f.hit]
    grown = [f.appended_lines for f in served if f.appended_lines is not None]
    corrected = {f.url for f in served if f.content is not None}  # a split file's parts name it once
    return CacheSummary(
        location=caches[0].location,
        files_hit=len(hits),
        files_missed=len(served) - len(hits),
        bytes_reused=sum(f.reused()[0] for f in served),  # a grown file's earlier bytes too
        bytes_total=sum(m.input_bytes for m in rank_manifests),
        tokens_reused=sum(f.reused()[1] for f in served),
        tokenize_seconds=round(sum(m.seconds for m in rank_manifests), 3),
        encode_seconds=round(sum(f.seconds for f in served if not f.hit), 3),
        plan=plan,
        input_bytes_read=None
        if any(f.input_read is None for f in served)
        else sum(f.bytes for f in served if f.input_read),
        files_grown=len(grown) or None,
        lines_encoded=sum(grown) if grown else None,
        rows_corrected=len(corrected) or None,
    )


def tokenize_summary(ranks: list[RankManifest], balance: Conservation, input_files: int) -> TokenizeSummary:
    """The tokenize stage's books: the documents' (``conservation``) and the contents the ranks read and wrote."""
    return TokenizeSummary(
        ranks=len(ranks),
        input_files=input_files,
        **asdict(balance),
        contents_in=ContentsSum.total(rank.counts.contents_in for rank in ranks),
        contents_out=ContentsSum.total(rank.counts.contents_out for rank in ranks),
    )


def stage_counts(folder: Folder, kind: type[C]) -> C | None:
    """The counts (of this ``kind``) of every completed stage manifest of a folder (the merge's one, or all context
    shards'), summed; None when the folder holds none."""
    markers = manifest.completion_markers(folder)
    counts: list[C] = []
    for batch in in_batches([marker.manifest for marker in markers.values()]):
        for name, data in folder.read_many(batch).items():  # a batch's manifests at once: one per task of a stage
            where = folder.url_of(name)
            if data is None:
                raise RecordError(where, "missing, though its completion marker names it")
            record = stage_manifest(data, where)
            if not isinstance(record, MergeManifest | ContextManifest):
                raise RecordError(where, f"a {type(record).__name__}, not a merge or context-shuffle manifest")
            if not isinstance(record.counts, kind):
                raise RecordError(where, f"a {type(record).__name__}, in a folder of {kind.__name__} manifests")
            counts.append(record.counts)
    if not counts:
        return None
    # each field's total has the field's type (``_total``)
    totals: dict[str, Any] = {f.name: _total([getattr(c, f.name) for c in counts]) for f in fields(counts[0])}
    return kind(**totals)


def _total(values: list[Any]) -> int | list[Any] | ContentsSum | None:
    """Counts summed; histograms (lists of counts) class by class; contents added (None when a task recorded none)."""
    if values and isinstance(values[0], list):  # a histogram's classes, a mixture's sources: each added
        width = max(map(len, values))
        return [reduce(operator.add, [v[k] for v in values if k < len(v)]) for k in range(width)]
    if values and (values[0] is None or isinstance(values[0], ContentsSum)):
        return ContentsSum.total(values)
    return sum(values)


def contents_flow(tokenize: TokenizeSummary, stages: StageSummary, chunked: bool) -> None:
    """Every piece from stage to stage: the ranks' documents are the pieces they read, written whole (or, with
    ``chunked``, cut into chunks), the merge read what the ranks wrote and wrote it whole, and the context shuffle
    read what the merge wrote (each stage checked its own cut before it published). A link that does not hold
    raises, naming it; one whose records predate contents is not checked."""
    read = tokenize.contents_in
    if read is not None and read.pieces != tokenize.docs_out:
        raise BuildError(f"the ranks wrote {tokenize.docs_out:,} documents, but read {read.value.describe()}")
    merge, context = stages.merge, stages.context_shuffle
    merge_in, merge_out = (None, None) if merge is None else (merge.contents_in, merge.contents_out)
    mixed = merge is not None and merge.sources is not None  # it wrote what it chose (its own check), not all
    chose = tokenize.tokens_not_chosen is not None
    context_in = None if context is None else context.contents_in
    links = [
        # ranks that wrote only a mixture's chosen documents proved what they wrote against what they read themselves
        ("the ranks read", read, "they wrote", None if chunked or chose else tokenize.contents_out),
        ("the ranks wrote", tokenize.contents_out, "the merge read", merge_in),
        ("the merge read", merge_in, "it wrote", None if mixed else merge_out),
        ("the merge wrote", merge_out, "the context shuffle read", context_in),
    ]
    for what, given, other, taken in links:
        if given is not None and taken is not None and given != taken:
            raise BuildError(
                f"{other} {taken.value.describe()}, but {what} {given.value.describe()}: a piece was lost, "
                "duplicated or changed on the way"
            )


def token_flow(rank_tokens: int, stages: StageSummary, dataset_tokens: int) -> dict[str, int]:
    """Tokens from stage to stage: what each stage was given = what it wrote + what it dropped, and the dataset's
    files hold what the last stage wrote. A stage that does not add up raises, naming it: a leftover file merged
    in, or a file lost on the way, must never pass for a build."""
    flow = {"tokenize": rank_tokens}
    given = rank_tokens
    written = given
    for stage, counts in (("merge", stages.merge), ("context_shuffle", stages.context_shuffle)):
        if counts is None:
            continue
        repeated = (counts.tokens_repeated or 0) if isinstance(counts, MergeCounts) else 0  # a mixture's uses again
        if counts.real_tokens + counts.tokens_dropped != given + repeated:
            padding = counts.tokens - counts.real_tokens
            again = f" ({repeated} of them used again)" if repeated else ""
            raise BuildError(
                f"{stage} wrote {counts.real_tokens} tokens{again} (and {padding} of padding) and dropped "
                f"{counts.tokens_dropped}, but was given {given}"
                if padding
                else f"{stage} wrote {counts.tokens} tokens{again} and dropped {counts.tokens_dropped}, but was given "
                f"{given}"
            )
        flow[stage] = given = counts.real_tokens
        written = counts.tokens
    if dataset_tokens != written:
        raise BuildError(f"the dataset's files hold {dataset_tokens} tokens, its manifests say {written}")
    return flow


def nothing_read(rank_manifests: list[RankManifest], inputs: list[str]) -> str | None:
    """Why the build holds no document when its ranks read no record from its ``inputs`` (every file empty, or
    blank lines only), else None: a nightly build must fail, saying so, rather than publish an empty dataset. (A
    rank that read records and wrote none failed already, naming their reasons and publishing its quarantine.)"""
    if any(m.counts.docs_read for m in rank_manifests):
        return None
    files = {f.url: f.size for m in rank_manifests for f in m.inputs}
    blank = sum(m.counts.blank_lines for m in rank_manifests)
    held = f"{counted(blank, 'blank line')} and no record" if blank else "no record"
    return (
        f"no document was read from the input ({', '.join(inputs)}): its {counted(len(files), 'file')} "
        f"({sum(files.values()):,} bytes) held {held} (empty files, or blank lines only); a build publishes no "
        "empty dataset"
    )


def rank_manifests(ranks: Folder, num_ranks: int) -> list[RankManifest]:
    """Every rank's manifest, checked (``RecordError`` names a damaged one; a missing one is a BuildError), each
    without its output entries (``outputs`` empty): the books and the report never need them, and a bucketed
    rank's are most of its manifest (~2 kB a bucket), so what is held stays small however many buckets there are.
    Read a batch at a time, concurrently."""
    found = []
    for batch in in_batches(list(range(num_ranks))):
        read = ranks.read_many([manifest.manifest_name(rank_stem(rank)) for rank in batch])
        for rank, (name, data) in zip(batch, read.items(), strict=True):
            if data is None:
                raise BuildError(f"{ranks.url_of(name)}: missing, so rank {rank} is not complete")
            found.append(replace(RankManifest.loads(data, ranks.url_of(name)), outputs=[]))
    return found


def dataset_digest(dataset: Folder, tokenizer_sha256: str | None) -> str:
    """One sha256 for a whole dataset, from the checksums its manifests record (each of the algorithm its record
    names: BLAKE3 in this version's records, so a build's digest differs from one of the same bytes published
    before, whose records named sha256), but for each ``.ds.metadata``, which it takes as naming the tokenizer by
    ``tokenizer_sha256`` (``ds.named_by_content``), hashed with its record's algorithm: equal digests, equal bytes
    but for how the tokenizer's path was typed. Without a sha256 (or for a metadata file that cannot be read), the
    checksums as recorded: the digest of the bytes themselves, which builds published before recorded."""
    entries = manifest.output_entries(dataset)
    files = {name: info for d in entries.values() for name, info in d.entry.files.items()}
    sums = {name: info.checksum for name, info in files.items()}
    if tokenizer_sha256 is not None:
        named = [name for name in sums if name.endswith(".metadata")]
        for batch in in_batches(named):
            for name, data in dataset.read_many(batch).items():
                if data is not None:
                    sums[name] = checksum(named_by_content(data, tokenizer_sha256), files[name].algorithm)
    return hashlib.sha256(orjson.dumps(sorted(sums.items()))).hexdigest()


def mixture_accounts(
    ranks: list[RankManifest], merged: MergeCounts | None, mixture: Mixture | None
) -> list[SourceAccount] | None:
    """A mixture's books, source by source (None for a build of one input): the documents its ranks read = chosen +
    not chosen + empty + quarantined, and what the merge found of it is what the ranks wrote. A source that does
    not add up raises, naming it. Megatron output is not merged: every document written is its source's, which
    Megatron-LM draws at its weight (its share is then its target)."""
    if mixture is None:
        return None
    accounts = []
    for number, (source, target) in enumerate(zip(mixture.sources, mixture.shares, strict=True)):
        counted = [cast(list[Any], rank.sources)[number] for rank in ranks if rank.sources is not None]
        read = {f: sum(getattr(c, f) for c in counted) for f in ("docs_read", "docs_written", "empty", "quarantined")}
        tokens = sum(c.tokens for c in counted)
        mix = None if merged is None or merged.sources is None else merged.sources[number]
        if len(counted) != len(ranks) or (mix is not None and read["docs_written"] != mix.docs_available):
            found = "no count" if mix is None else f"{mix.docs_available:,}"
            raise BuildError(
                f"mixture source {source.name!r}: the ranks wrote {read['docs_written']:,} of its documents, the "
                f"merge found {found}"
            )
        written = read["docs_written"]
        account = SourceAccount(
            name=source.name,
            target=target,
            share=target if mix is None or merged is None else round(mix.tokens_chosen / merged.tokens, 6),
            docs_read=read["docs_read"],
            docs_chosen=written if mix is None else mix.docs_chosen,
            docs_not_chosen=0 if mix is None else mix.docs_available - mix.docs_chosen,
            empty=read["empty"],
            quarantined=read["quarantined"],
            docs_repeated=0 if mix is None else mix.docs_repeated,
            uses=written if mix is None else mix.uses,
            tokens_available=tokens if mix is None else mix.tokens_available,
            tokens_chosen=tokens if mix is None else mix.tokens_chosen,
        )
        if not account.holds:
            raise BuildError(f"mixture source {source.name!r}: its documents are not conserved: {account}")
        accounts.append(account)
    return accounts
