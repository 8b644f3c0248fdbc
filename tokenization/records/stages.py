"""The manifests each stage writes beside its files (a rank, a merge, a context shuffle, a count), their output
entries and counts, and the completion marker written last."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import orjson

from tokenization.records.cache import RankCache
from tokenization.records.codec import PROJECT, Record, RecordError, decoded, shown, unless_none
from tokenization.records.contents import ContentsSum
from tokenization.records.inputs import FileSum, HistogramRow, InputFile, RankCounts, SizedInput
from tokenization.records.mixtures import SourceCounts, SourceMix
from tokenization.records.params import ContextParams, MergeParams, RankParams, StageParams
from tokenization.records.tokenizer import MergeTokenizer, PadToken, TokenizerInfo


@dataclass(frozen=True, kw_only=True)
class PseudoEnds(Record):
    """Index entries that are chunk or window boundaries, not document ends: every ``every`` tokens up to ``until``
    (what ``verify`` must not mistake for document ends)."""

    every: int
    until: int


@dataclass(frozen=True, kw_only=True)
class OutputEntry(Record):
    """One published token file family: its ``.ds`` (or ``.bin``) name, tokens, index entries, files and contents
    (None: made before contents were recorded)."""

    name: str
    tokens: int
    index_entries: int
    files: dict[str, FileSum]
    pseudo_ends: PseudoEnds | Literal["unknown"] | None = None  # "unknown": its inputs' own indexes held some
    contents: ContentsSum | None = None


@dataclass(frozen=True, kw_only=True)
class MergeOutput(OutputEntry):
    """A merged file: also the units ``[units_start, units_end)`` of the merge's order it holds, under the
    fingerprint of the inputs and params. Each is also a file of its own, the checkpoint a resumed merge starts
    after (written untagged before version 1)."""

    KIND: ClassVar[str] = "merge-output"
    VERSION: ClassVar[int] = 3  # /2 named sha256 checksums, /1 had no contents
    UNTAGGED: ClassVar[bool] = True
    fingerprint: str
    units_start: int
    units_end: int


@dataclass(frozen=True, kw_only=True)
class ContextOutput(OutputEntry):
    """A context-shuffled file, and the merged file whose windows it holds."""

    source: str


@dataclass(frozen=True, kw_only=True)
class Throughput(Record):
    """Rates of the work itself, without loading the tokenizer (None when it took no measurable time)."""

    text_mb_per_s: float | None
    tokens_per_s: float | None


@dataclass(frozen=True, kw_only=True)
class StageRecord(Record):
    """What every stage's record holds: its stage, the library versions that decide the bytes, the config's params
    (never its storage options; each stage's of its own kind), how long it took and the peak memory of its process."""

    stage: str
    versions: dict[str, str]
    params: StageParams
    seconds: float
    peak_rss_mb: float


@dataclass(frozen=True, kw_only=True)
class SelfCheck(Record):
    """A stage's check of its own files on local disk, before it uploaded them (``stages.verify.OwnCheck``):
    verify's checks of every family it wrote, and each file's size and sha256 against what its writer recorded.
    ``vocab_size`` and ``eos_id``: what ids and document ends were checked against (None: not checked). Publish
    reads no byte of the files a stage vouches for this way (``families``: the ``.ds`` or ``.bin`` of each), when
    its marker carries the same check."""

    families: list[str]
    tokens: int
    vocab_size: int | None
    eos_id: int | None
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class StageManifest(StageRecord):
    """A stage's manifest: also its seed and the attempt that wrote it. ``counts``, ``outputs`` and
    ``tokens_written`` (what its counts say it wrote) are each stage's own."""

    seed: int
    attempt: str | None = None  # set when an attempt commits it
    checked: SelfCheck | None = None  # the stage's check of its own files; None: it made none

    if TYPE_CHECKING:  # fields of each stage's manifest, of its own kinds (the base has none)
        counts: RankCounts | MergeCounts | ContextCounts
        outputs: Sequence[OutputEntry]

        @property
        def tokens_written(self) -> int: ...

    @property
    def prefix(self) -> str | None:
        """What its files' names start with (the ``save_filename`` param), when they have one."""
        return None

    @property
    def tokenizer_sha256(self) -> str | None:
        """Of the tokenizer that made the stage's files, when its record says."""
        tokenizer = getattr(self, "tokenizer", None)
        return tokenizer and tokenizer.sha256

    @property
    def output_tokens(self) -> int:
        """Tokens in the files the stage published, as its outputs list them."""
        return sum(entry.tokens for entry in self.outputs)

    def output_files(self) -> dict[str, FileSum]:
        """Every file of the stage's output entries: what its completion marker lists."""
        return {name: info for entry in self.outputs for name, info in entry.files.items()}

    @property
    def cuts_pieces(self) -> bool:
        """Whether the stage cut its input's pieces (into chunks or windows): a stage that moves them whole wrote
        exactly the pieces it read."""
        return False

    @property
    def writes_what_it_read(self) -> bool:
        """Whether the stage wrote exactly the pieces it read, each once."""
        return not self.cuts_pieces


@dataclass(frozen=True, kw_only=True)
class RankManifest(StageManifest):
    """``ranks/_manifests/{rank}.json``: one rank's inputs, plan, tokenizer, counts and files."""

    KIND: ClassVar[str] = "rank-manifest"
    # /6 named sha256 checksums; /5 had no contents; /4 no tokenizer format; /3 no self-check; /2 no cache; /1 was /2
    # without the checks on reading
    VERSION: ClassVar[int] = 7
    params: RankParams
    rank: int
    world_size: int
    tokenizer: TokenizerInfo
    rendering: dict[str, Any] | None = None
    plan: str | None = None  # the digest of the build's plan; None outside a build, or before plans
    inputs: list[InputFile]
    skipped_inputs: list[str] = field(default_factory=list)
    input_bytes: int = 0
    counts: RankCounts
    outputs: list[OutputEntry]
    throughput: Throughput | None = None
    cache: RankCache | None = None  # None: the rank ran without a tokenization cache
    sources: list[SourceCounts] | None = field(default=None, metadata=unless_none())  # a mixture's, source by source

    @property
    def tokens_written(self) -> int:
        return self.counts.tokens_written

    @property
    def prefix(self) -> str | None:
        return self.params.save_filename

    @property
    def cuts_pieces(self) -> bool:
        return bool(self.params.shuffle_chunk_size)

    @property
    def writes_what_it_read(self) -> bool:
        """A rank of a mixture whose plan chose its documents writes the chosen ones, each once, and holds the
        others (its own check proved which, against what it read: ``stages.tokenize``)."""
        return super().writes_what_it_read and self.counts.tokens_not_chosen is None

    @property
    def num_buckets(self) -> int | None:
        """The buckets the rank scattered its documents into, from its params."""
        return self.params.num_buckets

    @property
    def saves_loss(self) -> bool:
        return self.params.save_loss


@dataclass(frozen=True, kw_only=True)
class MergeCounts(Record):
    """What the merge read and wrote: tokens written + tokens dropped = the inputs' tokens (+ those a mixture used
    again: ``tokens_repeated``; a mixture's dropped tokens are those of the documents it did not choose)."""

    input_files: int
    units: int
    index_entries: int
    tokens: int
    partial_chunk_tokens: int
    tokens_dropped: int
    resumed_files: int
    contents_in: ContentsSum | None = None  # of its input files, cut at their indexes (None: made before)
    contents_out: ContentsSum | None = None  # of its files
    tokens_repeated: int | None = field(default=None, metadata=unless_none())  # a mixture's
    sources: list[SourceMix] | None = field(default=None, metadata=unless_none())  # a mixture's, source by source

    @property
    def real_tokens(self) -> int:
        return self.tokens


@dataclass(frozen=True, kw_only=True)
class MergeManifest(StageManifest):
    """``merged/_manifests/{name}.json``: the merge (of everything, or of one bucket) and its files."""

    KIND: ClassVar[str] = "merge-manifest"
    VERSION: ClassVar[int] = 5  # /4 named sha256 checksums, /3 had no contents, /2 no self-check
    params: MergeParams
    save_filename: str
    bucket: int | None = None
    fingerprint: str
    tokenizer: MergeTokenizer
    inputs: list[SizedInput]
    counts: MergeCounts
    outputs: list[MergeOutput]

    @property
    def tokens_written(self) -> int:
        return self.counts.tokens

    @property
    def prefix(self) -> str | None:
        return self.save_filename

    @property
    def cuts_pieces(self) -> bool:
        return bool(self.params.shuffle_chunk_size)

    @property
    def writes_what_it_read(self) -> bool:
        """A mixture's merge writes the documents it chose, some more than once (its own check proved which)."""
        return super().writes_what_it_read and self.counts.sources is None


@dataclass(frozen=True, kw_only=True)
class ContextCounts(Record):
    """What a context shuffle wrote. Packed windows (``context_mode`` packed) also count their documents, whole or
    split into pieces, and their padding, which ``tokens`` includes; cut windows have none of either."""

    files: int
    windows: int
    tokens: int
    tail_tokens_kept: int
    tokens_dropped: int
    documents_whole: int = 0
    documents_split: int = 0
    split_pieces: int = 0  # the pieces the split documents were cut into
    padding_tokens: int = 0
    padding_histogram: list[int] = field(default_factory=list)  # windows by padding: 0, 1, 2-3, 4-7, ... tokens
    contents_in: ContentsSum | None = None  # of its input files, cut at their indexes (None: made before)
    contents_out: ContentsSum | None = None  # of its files: the input's pieces cut at window edges, and padding

    @property
    def real_tokens(self) -> int:
        """The documents' tokens, padding aside: what conservation counts."""
        return self.tokens - self.padding_tokens


@dataclass(frozen=True, kw_only=True)
class ContextManifest(StageManifest):
    """``context/_manifests/context_{shard}.json``: one context-shuffle task's files."""

    KIND: ClassVar[str] = "context-manifest"
    VERSION: ClassVar[int] = 6  # /5 named sha256 checksums, /4 had no contents, /3 no packing, /2 no self-check
    params: ContextParams
    inputs: list[str]
    counts: ContextCounts
    outputs: list[ContextOutput]
    pad: PadToken | None = None  # packed windows: what pads them

    @property
    def tokens_written(self) -> int:
        return self.counts.tokens

    @property
    def cuts_pieces(self) -> bool:
        return True  # at the windows' edges

    @property
    def context_window(self) -> int:
        """The tokens of each window the shuffle cut (its ``context_window`` param, which every version records)."""
        window = self.params.context_window
        if window is None or window < 1:
            raise ValueError(f"context_window {shown(window)} is not a window's tokens")
        return window


@dataclass(frozen=True, kw_only=True)
class CountedFile(Record):
    url: str
    bytes: int
    docs: int
    tokens: int
    empty: int
    rejected: int


@dataclass(frozen=True, kw_only=True)
class CountStats(StageRecord):
    """The token counter's stats JSON: totals, per input file, and the length histogram."""

    KIND: ClassVar[str] = "count"
    VERSION: ClassVar[int] = 3  # /2 had no tokenizer format
    tokenizer: TokenizerInfo
    rendering: dict[str, Any] | None
    docs: int
    tokens: int
    loss_tokens: int | None
    empty: int
    rejected: dict[str, int]
    docs_read: int
    blank_lines: int
    special_token_literals: dict[str, int]
    mean_tokens_per_doc: float
    max_tokens_per_doc: int
    files: list[CountedFile]
    length_histogram: list[HistogramRow]
    throughput: Throughput


STAGE_MANIFESTS: tuple[type[StageManifest], ...] = (RankManifest, MergeManifest, ContextManifest)


def stage_manifest(data: bytes, path: str) -> StageManifest | MergeOutput:
    """A file of a ``_manifests`` folder: a stage manifest of any stage, or a merge checkpoint, by its format (one
    read before with the same bytes: as it was decoded then, ``Record.loads``)."""
    kinds: tuple[type[StageManifest | MergeOutput], ...] = (*STAGE_MANIFESTS, MergeOutput)
    found, digest = decoded(kinds, data)
    if found is not None:
        return found
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecordError(path, f"not JSON ({exc})") from None
    tag = parsed.get("format") if isinstance(parsed, dict) else None
    for kind in kinds:
        if isinstance(tag, str) and tag.startswith(f"{PROJECT}/{kind.KIND}/"):
            return kind.loads(data, path, parsed, digest)
    if isinstance(parsed, dict) and tag is None:
        return MergeOutput.loads(data, path, parsed, digest)  # a checkpoint written before checkpoints had a tag
    formats = ", ".join(f"{PROJECT}/{kind.KIND}/N" for kind in kinds)
    raise RecordError(path, f"format {shown(tag)}, not one of {formats}")


@dataclass(frozen=True, kw_only=True)
class CompletionMarker(Record):
    """``_completions/{stem}.json``, written last: the attempt, its manifest's sha256, every published file with its
    size and checksum (BLAKE3; sha256 before version 3), and the stage's check of its own files, as its manifest
    records it (untagged before version 1; version 1 had no check)."""

    KIND: ClassVar[str] = "completion"
    VERSION: ClassVar[int] = 3
    UNTAGGED: ClassVar[bool] = True
    LABEL: ClassVar[str] = "completion marker"
    manifest: str
    sha256: str
    attempt: str
    files: dict[str, FileSum]
    checked: SelfCheck | None = None

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)
