"""The records stages leave on storage, as code: the contract between the stages, and between a build and its
readers (accounting, the report, publish, the sensor, XCom, the builds page, verify).

Each kind is a frozen dataclass. ``to_json`` gives its JSON object; ``from_json`` reads one back, checking its
``format`` tag (``corpus-tokenization/{kind}/{version}``) and the type of every field, so that a damaged or foreign
record is one ``RecordError`` naming the file and the field, never a ``KeyError`` deep inside a stage:

- a record of this version's format must hold every field, and nothing else (a flipped bit in a key is caught);
- a record of an older format this project wrote is read with the defaults of the fields it did not have yet;
- a newer or a foreign format is refused: read it with the version that wrote it.

Nested records (a manifest's output entries, its counts) carry no tag of their own; a record that is also a file
of its own (a merge output entry is its checkpoint) carries one there. A field whose JSON name differs from its
Python name says so in its metadata (``json_name``); a field added where its absence must keep meaning what it
meant (a plan's digest is of its JSON) is written only when it is not None (``unless_none``).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import fsspec
import orjson

from tokenization.formats.contents import Contents
from tokenization.io.errors import TokenizationError

PROJECT = "corpus-tokenization"
JSON_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object"}


class RecordError(TokenizationError, ValueError):
    """A record (a manifest, a completion marker, a build record) that cannot be read as one: truncated, not a JSON
    object, of another format, or a field missing, unknown or of the wrong type. One line names the file and the
    field, never a traceback."""

    def __init__(self, path: str, what: str, kind: str = "manifest"):
        super().__init__(f"{path}: not a valid {kind}: {what}")


R = TypeVar("R", bound="Record")


def json_name(name: str) -> dict:
    """Field metadata: the field is called ``name`` in JSON."""
    return {"json_name": name}


def unless_none() -> dict:
    """Field metadata: the field is left out of the JSON while it is None, and read as None when absent."""
    return {"unless_none": True}


class Record:
    """A record kind (mixed into a frozen dataclass). ``KIND`` and ``VERSION`` make its format tag (every older
    version is read); ``UNTAGGED`` says whether files written before the kind had a tag are read (as version 0);
    ``LABEL`` is what a message calls it."""

    KIND: ClassVar[str | None] = None  # None: a part of other records, with no tag and no file of its own
    VERSION: ClassVar[int] = 1
    UNTAGGED: ClassVar[bool] = False
    LABEL: ClassVar[str] = "manifest"

    @classmethod
    def format_tag(cls) -> str:
        return f"{PROJECT}/{cls.KIND}/{cls.VERSION}"

    def to_json(self) -> dict:
        data = _encode(self)
        return {"format": self.format_tag(), **data} if self.KIND else data

    def dumps(self) -> bytes:
        """The record's bytes: indented, keys sorted, so equal records are equal files."""
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls: type[R], data: object, path: str) -> R:
        """The record in ``data`` (read from ``path``, which messages name), checked."""
        if not isinstance(data, dict):
            raise RecordError(path, f"the file is {_shown(data)}, not an object", cls.LABEL)
        strict = cls.KIND is None or _version(cls, data, path) == cls.VERSION
        fields_of = {k: v for k, v in data.items() if k != "format"} if cls.KIND else data
        return _decode_record(cls, fields_of, _Reading(path, cls.LABEL, strict), "")

    @classmethod
    def loads(cls: type[R], data: bytes, path: str) -> R:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise RecordError(path, f"not JSON ({exc})", cls.LABEL) from None
        return cls.from_json(parsed, path)

    @classmethod
    def read(cls: type[R], fs: fsspec.AbstractFileSystem, path: str, label: str | None = None) -> R | None:
        """The record at ``path`` (``label``: the location messages name), or None when there is no such file."""
        try:
            data = fs.cat_file(path)
        except FileNotFoundError:
            return None
        return cls.loads(data, label or path)


@dataclass(frozen=True)
class _Reading:
    path: str
    label: str
    strict: bool  # this version's format: every field present, no other

    def error(self, at: str, what: str) -> RecordError:
        return RecordError(self.path, f"{at or 'the file'} {what}", self.label)


def _version(cls: type[Record], data: dict, path: str) -> int:
    tag = data.get("format")
    family = f"{PROJECT}/{cls.KIND}"
    if tag is None and cls.UNTAGGED:
        return 0
    if not isinstance(tag, str) or not tag.startswith(family + "/") or not tag[len(family) + 1 :].isdigit():
        raise RecordError(path, f"format {_shown(tag)}, not {family}/N", cls.LABEL)
    version = int(tag[len(family) + 1 :])
    if version > cls.VERSION:
        raise RecordError(
            path,
            f"format {tag} is newer than this version of {PROJECT} reads ({cls.format_tag()}): upgrade to read it",
            cls.LABEL,
        )
    return version


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _name(f: dataclasses.Field) -> str:
    return f.metadata.get("json_name", f.name)


def _decode_record(cls: type, data: dict, reading: _Reading, at: str) -> Any:
    hints = _hints(cls)
    values = {}
    known = set()
    for f in dataclasses.fields(cls):
        key = _name(f)
        known.add(key)
        where = f"{at}.{key}" if at else key
        if key in data:
            values[f.name] = _decode(hints[f.name], data[key], reading, where)
        elif f.metadata.get("unless_none"):
            values[f.name] = None
        elif reading.strict or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
            raise reading.error(where, "is missing")
    if reading.strict and (unknown := sorted(set(data) - known)):
        raise reading.error(f"{at}.{unknown[0]}" if at else unknown[0], "is not a field of this format")
    try:
        return cls(**values)
    except ValueError as exc:  # the record's own check of its values (``__post_init__``)
        raise reading.error(at, str(exc)) from None


def _decode(hint: Any, value: object, reading: _Reading, at: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return None
        # the option of the value's JSON kind (an object, a string...), so that its own error is the one told
        fitting = [option for option in options if _fits(option, value)] or options[-1:]
        return _decode(fitting[0], value, reading, at)
    if hint is Any:
        return value
    if origin is Literal:
        if value not in get_args(hint):
            raise reading.error(at, f"is {_shown(value)}, not one of {', '.join(map(_shown, get_args(hint)))}")
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise reading.error(at, f"is {_shown(value)}, not an object")
        return _decode_record(hint, value, reading, at)
    if origin is list:
        if not isinstance(value, list):
            raise reading.error(at, f"is {_shown(value)}, not an array")
        (item,) = get_args(hint)
        return [_decode(item, v, reading, f"{at}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise reading.error(at, f"is {_shown(value)}, not an object")
        _, item = get_args(hint)
        return {k: _decode(item, v, reading, f"{at}[{orjson.dumps(k).decode()}]") for k, v in value.items()}
    expected = (int, float) if hint is float else hint
    if not isinstance(value, expected) or (isinstance(value, bool) and hint is not bool):
        raise reading.error(at, f"is {_shown(value)}, not {JSON_TYPES[hint]}")
    return value


def _fits(hint: Any, value: object) -> bool:
    """Whether ``value`` is of the JSON kind that ``hint`` reads (its fields unchecked)."""
    origin = get_origin(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in get_args(hint)
    if dataclasses.is_dataclass(hint) or origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    return isinstance(value, (int, float) if hint is float else hint) and not (
        isinstance(value, bool) and hint is not bool
    )


def _encode(value: object) -> Any:
    if dataclasses.is_dataclass(value):
        return {
            _name(f): _encode(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("unless_none") and getattr(value, f.name) is None)
        }
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _shown(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:40] + "…"


# The parts records share.


@dataclass(frozen=True, kw_only=True)
class FileSum(Record):
    """A published file's size and sha256: what a completion marker vouches for."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class FilePart(Record):
    """Part ``index`` (from 0) of the ``count`` parts that ranks share a big input file in (``split_input_mb``):
    nominally bytes ``[size * index // count, size * (index + 1) // count)``. Of a JSON-lines file it is the lines
    that start in that range; of a parquet file, row groups ``[groups * index // count, groups * (index + 1) //
    count)``."""

    index: int
    count: int


@dataclass(frozen=True)
class InputFile(Record):
    """One input file as a listing saw it, or a ``part`` of one. ``identity`` tells a later look whether it is
    still the same file: ``etag=...`` on an object store (S3's ETag is a digest of the content),
    ``mtime_ns=...,ctime_ns=...,ino=...`` locally, to which a plan adds ``,sha256=...`` of the bytes (plans made
    before have none): a file whose inode or change time differs, its size and mtime kept, is the same file if its
    bytes are (``sources.difference``)."""

    url: str
    size: int = field(metadata=json_name("bytes"))
    identity: str = ""  # rank manifests before plans were fixed held none
    part: FilePart | None = field(default=None, metadata=unless_none())  # None: the whole file

    @property
    def name(self) -> str:
        """How messages and the report name it."""
        return self.url if self.part is None else f"{self.url} (part {self.part.index + 1} of {self.part.count})"

    @property
    def span(self) -> tuple[int, int]:
        """The bytes it covers, nominally: the whole file, or its part's share of them."""
        if self.part is None:
            return 0, self.size
        index, count = self.part.index, self.part.count
        return self.size * index // count, self.size * (index + 1) // count

    @property
    def span_bytes(self) -> int:
        """What reading it costs, nominally: progress and a rank's share are measured in these."""
        start, end = self.span
        return end - start


@dataclass(frozen=True)
class Rejected(Record):
    """A quarantined record: one line of ``_quarantine/{stem}.jsonl``, naming its file, line and reason."""

    file: str
    line: int
    reason: str
    raw: str


@dataclass(frozen=True, kw_only=True)
class PseudoEnds(Record):
    """Index entries that are chunk or window boundaries, not document ends: every ``every`` tokens up to ``until``
    (what ``verify`` must not mistake for document ends)."""

    every: int
    until: int


@dataclass(frozen=True, kw_only=True)
class ContentsSum(Record):
    """What token files hold, whatever their order (``tokenization.formats.contents``): their non-empty pieces (the
    tokens between two index entries), their tokens, and the sum of the pieces' hashes, in 16 hex digits. Each stage
    records those of what it read and of what it wrote; equal sums prove a shuffle kept every piece once."""

    pieces: int
    tokens: int
    sum: str

    def __post_init__(self) -> None:
        if len(self.sum) != 16 or self.sum.strip("0123456789abcdef"):
            raise ValueError(f"sum {self.sum[:40]!r} is not 16 hex digits")

    @classmethod
    def of(cls, contents: Contents) -> ContentsSum:
        return cls(pieces=contents.pieces, tokens=contents.tokens, sum=f"{contents.sum:016x}")

    @property
    def value(self) -> Contents:
        return Contents(self.pieces, self.tokens, int(self.sum, 16))

    @classmethod
    def total(cls, parts: Iterable[ContentsSum | None]) -> ContentsSum | None:
        """What these add up to; None when one of them is None (a record made before contents were)."""
        parts = list(parts)
        return None if None in parts else cls.of(Contents.total(part.value for part in parts))


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
    VERSION: ClassVar[int] = 2  # /1 had no contents
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
class TokenizerInfo(Record):
    """The tokenizer as a stage used it: what decides the ids, and how it was encoded."""

    name: str
    sha256: str  # of its tokenizer.json: for a converted file, of the conversion
    vocab_size: int
    token_size: int
    format: str = "tokenizer.json"  # of the file given: "sentencepiece" and "tiktoken" are converted to tokenizer.json
    eos_token: str | None
    eos_id: int | None
    eos_source: str | None = None
    bos_ids: list[int] = field(default_factory=list)
    special_text: str = "text"
    engine: str = "hf"
    engine_note: str | None = None
    self_checked_docs: int = 0
    load_seconds: float | None = None
    memory_budget_mb: int | None = None  # the resident memory the fast engine kept its process within
    engine_reloads: int = 0  # times it dropped its cache to stay within it
    engine_reload_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TokenizerFacts(Record):
    """What loading a tokenizer (the file of this ``sha256``) told a build's plan, with the build's EOS settings:
    a rank of the build takes them from the plan, and loads the tokenizer itself only when it encodes a file."""

    sha256: str
    vocab_size: int
    special_tokens: list[str] = field(repr=False)  # out of a plan's log line: some tokenizers have hundreds
    eos_token: str | None
    eos_id: int | None
    eos_source: str | None
    bos_ids: list[int]
    tail_ids: list[int]


@dataclass(frozen=True, kw_only=True)
class HistogramRow(Record):
    min_tokens: int
    max_tokens: int
    docs: int


@dataclass(frozen=True, kw_only=True)
class RankCounts(Record):
    """What happened to every record a rank read: docs_read = docs_written + empty + the rejected."""

    docs_read: int
    docs_written: int
    empty: int
    rejected: dict[str, int]
    rejected_total: int = 0
    tokens: int
    tokens_written: int
    tokens_dropped: int
    blank_lines: int = 0
    text_bytes: int = 0
    loss_tokens: int | None = None  # None: made before ranks counted them
    partial_chunk_tokens: int = 0
    longest: int = 0
    special_token_literals: dict[str, int] = field(default_factory=dict)
    special_token_literals_total: int = 0
    length_histogram: list[HistogramRow] = field(default_factory=list)
    contents_in: ContentsSum | None = None  # of the documents pass 1 encoded or took from the cache (None: before)
    contents_out: ContentsSum | None = None  # of the rank's files (None in a cache entry's counts, and before)


@dataclass(frozen=True, kw_only=True)
class CachedInput(Record):
    """One input file of a rank as the tokenization cache served it: a hit (its first pass taken from the cache)
    or a miss (tokenized, then stored), under the key of everything that decides it."""

    url: str
    key: str
    hit: bool
    bytes: int  # the input file's (a part's share of them, for a part)
    text_bytes: int  # of its documents' text
    tokens: int  # of its documents, EOS included
    seconds: float  # encoding it (a miss), or fetching and checking it (a hit)


@dataclass(frozen=True, kw_only=True)
class RankCache(Record):
    """Where a rank's tokenization cache is, and how it served each of the rank's input files, in input order."""

    location: str
    files: list[CachedInput]


@dataclass(frozen=True, kw_only=True)
class CacheEntry(Record):
    """``{cache}/entries/{key}.json``, an entry's marker, written last and only where none is: the data folder that
    holds the entry's files, each file's size and sha256 (a reader checks them all before it uses any), the input
    file's counts, and what the entry was made from (``described``: what its key covers)."""

    KIND: ClassVar[str] = "cache-entry"
    VERSION: ClassVar[int] = 2  # /1's counts had no contents
    LABEL: ClassVar[str] = "cache entry"
    key: str
    data: str
    files: dict[str, FileSum]
    counts: RankCounts
    source: InputFile
    content: str
    described: dict[str, Any]
    created: float
    encode_seconds: float

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


@dataclass(frozen=True, kw_only=True)
class CacheUse(Record):
    """``{cache}/uses/{owner}/{stem}.json``: the entries a rank uses, written before it looks any up. Until it is
    ``finished`` it is in flight, and no cleaning removes them; after, they are kept while ``keeps`` (its build's
    ``_RUN.json``) exists."""

    KIND: ClassVar[str] = "cache-use"
    LABEL: ClassVar[str] = "cache use"
    owner: str
    keeps: str
    stem: str
    keys: list[str]
    started: float
    finished: float | None


@dataclass(frozen=True, kw_only=True)
class CacheFolder(Record):
    """``{cache}/_CACHE.json``: the folder is a tokenization cache. Written when the cache is made (or a cache of an
    earlier version, which had none, is adopted); cleaning removes nothing under a folder without it."""

    KIND: ClassVar[str] = "cache"
    LABEL: ClassVar[str] = "cache's own file"
    created: float


@dataclass(frozen=True, kw_only=True)
class StageRecord(Record):
    """What every stage's record holds: its stage, the library versions that decide the bytes, the config's params
    (never its storage options), how long it took and the peak memory of its process."""

    stage: str
    versions: dict[str, str]
    params: dict[str, Any]
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

    @property
    def prefix(self) -> str | None:
        """What its files' names start with (the ``save_filename`` param), when they have one."""
        return self.params.get("save_filename")

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
        return bool(self.params.get("shuffle_chunk_size"))


@dataclass(frozen=True, kw_only=True)
class RankManifest(StageManifest):
    """``ranks/_manifests/{rank}.json``: one rank's inputs, plan, tokenizer, counts and files."""

    KIND: ClassVar[str] = "rank-manifest"
    # /5 had no contents; /4 no tokenizer format; /3 no self-check; /2 no cache; /1 was /2 without the checks on reading
    VERSION: ClassVar[int] = 6
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

    @property
    def tokens_written(self) -> int:
        return self.counts.tokens_written

    @property
    def num_buckets(self) -> int | None:
        """The buckets the rank scattered its documents into, from its params."""
        return self.params.get("num_buckets")

    @property
    def saves_loss(self) -> bool:
        return bool(self.params.get("save_loss"))


@dataclass(frozen=True, kw_only=True)
class MergeCounts(Record):
    """What the merge read and wrote: tokens written + tokens dropped = the inputs' tokens."""

    input_files: int
    units: int
    index_entries: int
    tokens: int
    partial_chunk_tokens: int
    tokens_dropped: int
    resumed_files: int
    contents_in: ContentsSum | None = None  # of its input files, cut at their indexes (None: made before)
    contents_out: ContentsSum | None = None  # of its files

    @property
    def real_tokens(self) -> int:
        return self.tokens


@dataclass(frozen=True, kw_only=True)
class MergeTokenizer(Record):
    name: str
    sha256: str | None
    token_size: int


@dataclass(frozen=True, kw_only=True)
class SizedInput(Record):
    url: str
    bytes: int


@dataclass(frozen=True, kw_only=True)
class MergeManifest(StageManifest):
    """``merged/_manifests/{name}.json``: the merge (of everything, or of one bucket) and its files."""

    KIND: ClassVar[str] = "merge-manifest"
    VERSION: ClassVar[int] = 4  # /3 had no contents, /2 no self-check
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
class PadToken(Record):
    """The token that pads packed windows (loss 0): the tokenizer's pad token, else its EOS."""

    id: int
    token: str | None  # its text, when the task was told it


@dataclass(frozen=True, kw_only=True)
class ContextManifest(StageManifest):
    """``context/_manifests/context_{shard}.json``: one context-shuffle task's files."""

    KIND: ClassVar[str] = "context-manifest"
    VERSION: ClassVar[int] = 5  # /4 had no contents, /3 no packing, /2 no self-check
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
    """A file of a ``_manifests`` folder: a stage manifest of any stage, or a merge checkpoint, by its format."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecordError(path, f"not JSON ({exc})") from None
    tag = parsed.get("format") if isinstance(parsed, dict) else None
    for kind in (*STAGE_MANIFESTS, MergeOutput):
        if isinstance(tag, str) and tag.startswith(f"{PROJECT}/{kind.KIND}/"):
            return kind.from_json(parsed, path)
    if isinstance(parsed, dict) and tag is None:
        return MergeOutput.from_json(parsed, path)  # a checkpoint written before checkpoints had a tag
    kinds = ", ".join(f"{PROJECT}/{kind.KIND}/N" for kind in (*STAGE_MANIFESTS, MergeOutput))
    raise RecordError(path, f"format {_shown(tag)}, not one of {kinds}")


@dataclass(frozen=True, kw_only=True)
class CompletionMarker(Record):
    """``_completions/{stem}.json``, written last: the attempt, its manifest's sha256, every published file with its
    size and sha256, and the stage's check of its own files, as its manifest records it (untagged before version 1;
    version 1 had no check)."""

    KIND: ClassVar[str] = "completion"
    VERSION: ClassVar[int] = 2
    UNTAGGED: ClassVar[bool] = True
    LABEL: ClassVar[str] = "completion marker"
    manifest: str
    sha256: str
    attempt: str
    files: dict[str, FileSum]
    checked: SelfCheck | None = None

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_SORT_KEYS)


# A build's own records: its claim and plan, and the record that declares it complete.


@dataclass(frozen=True, kw_only=True)
class PlannedTokenizer(Record):
    sha256: str
    eos_token: str | None


@dataclass(frozen=True, kw_only=True)
class PlannedInputs(Record):
    files: list[InputFile]
    skipped: list[str]
    hidden: int


@dataclass(frozen=True, kw_only=True)
class PlanRecord(Record):
    """What decides a build's bytes, fixed once (``tokenization.builds.plan``): its digest is in every rank manifest."""

    params: dict[str, Any]
    seed: int
    tokenizer: PlannedTokenizer
    rendering_sha256: str | None
    inputs: PlannedInputs


@dataclass(frozen=True, kw_only=True)
class RunClaim(Record):
    """``{run}/_RUN.json``, written before anything else: which run owns the folder, since when, and its plan
    (version 1 held no plan, so no build of it can be resumed, though it still owns its folder)."""

    KIND: ClassVar[str] = "run"
    VERSION: ClassVar[int] = 2
    UNTAGGED: ClassVar[bool] = True  # version 1's claims were written without a tag
    LABEL: ClassVar[str] = "run claim"
    run_id: str
    claimed: float
    plan: PlanRecord | None = None


@dataclass(frozen=True, kw_only=True)
class Conservation(Record):
    """Documents in = documents out + empty + quarantined, over the ranks, and whether the ranks read exactly the
    plan's files (``inputs_problem`` says how not)."""

    docs_in: int
    docs_out: int
    empty: int
    quarantined: int
    rejected_by_reason: dict[str, int]
    tokens: int
    tokens_dropped: int
    inputs_problem: str | None = None
    holds: bool


@dataclass(frozen=True, kw_only=True)
class TokenizeSummary(Conservation):
    ranks: int
    input_files: int
    contents_in: ContentsSum | None = None  # the ranks' (None: a build made before contents were recorded)
    contents_out: ContentsSum | None = None


@dataclass(frozen=True, kw_only=True)
class StageSummary(Record):
    """The tokenize stage's books, and the summed counts of the merge's and the context shuffle's manifests."""

    tokenize: TokenizeSummary
    merge: MergeCounts | None = None
    context_shuffle: ContextCounts | None = None


@dataclass(frozen=True, kw_only=True)
class Arrived(Record):
    files: int
    first: list[str]


@dataclass(frozen=True, kw_only=True)
class BuildInputs(Record):
    """The build's account of its input: the files its plan holds, and what its listing left out."""

    spec: str | None
    files: int
    bytes: int
    skipped: int | None = None
    hidden: int | None = None
    arrived_after_plan: Arrived | None = None  # builds before plans were fixed kept no such list


@dataclass(frozen=True, kw_only=True)
class BuildTokenizer(Record):
    name: str
    sha256: str
    eos: str | None


@dataclass(frozen=True, kw_only=True)
class VerifySummary(Record):
    ok: bool
    files: int
    tokens: int
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class CacheSummary(Record):
    """What the tokenization cache did for a build: the input files it served (hits) and those tokenized (misses),
    the input bytes and tokens it reused, and the ranks' time, summed, of which encoding the misses."""

    location: str
    files_hit: int
    files_missed: int
    bytes_reused: int
    bytes_total: int
    tokens_reused: int
    tokenize_seconds: float
    encode_seconds: float

    @property
    def reused(self) -> float | None:
        """The share of the input's bytes whose tokens came from the cache."""
        return self.bytes_reused / self.bytes_total if self.bytes_total else None


@dataclass(frozen=True, kw_only=True)
class CacheSize(Record):
    """A tokenization cache's size, from its entries' markers: its entries, their files' bytes and the tokens they
    hold."""

    location: str
    entries: int
    bytes: int
    tokens: int

    @property
    def bytes_per_token(self) -> float | None:
        return self.bytes / self.tokens if self.tokens else None


@dataclass(frozen=True, kw_only=True)
class FolderBytes(Record):
    """One of a build's stage folders (``ranks``, ``merged``, ``context``) once the build is published: the bytes it
    holds, and those of the token files publish removed from it (its records stay)."""

    name: str
    held: int
    removed: int


@dataclass(frozen=True, kw_only=True)
class Footprint(Record):
    """What a published build takes on storage: each stage folder's bytes, in the order the stages write them, and
    its tokenization cache's size (None: no cache, or one that could not be measured)."""

    folders: list[FolderBytes]
    cache: CacheSize | None

    @property
    def held(self) -> int:
        return sum(folder.held for folder in self.folders)

    @property
    def removed(self) -> int:
        return sum(folder.removed for folder in self.folders)


@dataclass(frozen=True, kw_only=True)
class ReportFiles(Record):
    html: str
    json: str


@dataclass(frozen=True, kw_only=True)
class BuildRecord(Record):
    """``{run}/_BUILD.json``, written last by publish: its presence means the build is complete, and every figure
    a person or a scheduler looks at comes from it."""

    KIND: ClassVar[str] = "build"
    # /5 had no removed or footprint; /4 no contents; /3 no packing counts; /2 no cache; /1 the same, unchecked
    VERSION: ClassVar[int] = 6
    LABEL: ClassVar[str] = "build record"
    run_id: str | None = None
    plan: str | None = None  # the plan's digest; builds before plans were fixed had none
    dataset: str
    input: str
    seed: int
    tokenizer: BuildTokenizer
    params: dict[str, Any]
    inputs: BuildInputs | None = None
    started: str
    finished: str | None = None
    wall_seconds: float | None = None
    conservation: Conservation
    token_flow: dict[str, int] = field(default_factory=dict)
    tokens: int
    digest: str
    files: list[str]
    stages: StageSummary
    verify: VerifySummary
    report: ReportFiles | None = None  # where publish wrote the report (None: a build made before reports)
    cache: CacheSummary | None = None  # None: built without a tokenization cache
    removed: list[str] = field(default_factory=list)  # stage folders whose token files publish removes (records stay)
    footprint: Footprint | None = None  # None: a build made before footprints were measured

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The values of these params (None for one that the version which made the build did not have)."""
        return {name: self.params.get(name) for name in names}

    @property
    def renders_records(self) -> bool:
        """Whether records were rendered (by a template, or as chat messages) before they were encoded."""
        return bool(self.params.get("template") or self.params.get("messages_key"))


@dataclass(frozen=True, kw_only=True)
class BuildSummary(Record):
    """A published build in a few figures, from its build record: for XCom, the Asset event and the builds page
    (``latest``: the run folder ``{output}/LATEST`` names; ``deleted``: complete builds retention deleted;
    ``reused``: the share of the input whose tokens came from the cache; ``footprint``: what it takes on storage).
    Untagged before version 1; version 1 had no footprint."""

    KIND: ClassVar[str] = "build-summary"
    VERSION: ClassVar[int] = 2
    UNTAGGED: ClassVar[bool] = True
    LABEL: ClassVar[str] = "build summary"
    dataset: str
    digest: str
    tokens: int
    docs: int
    rejects: int
    files: int
    verified: bool
    latest: str
    deleted: list[str]
    seed: int
    tokenizer: str
    input: str
    reused: float | None = None
    footprint: Footprint | None = None


@dataclass(frozen=True, kw_only=True)
class CacheCleaning(Record):
    """Cache entries removed (because no build still there used them, or by a prune) and the bytes freed."""

    entries: int
    bytes: int


@dataclass(frozen=True, kw_only=True)
class Retention(Record):
    """The complete builds a publish deleted, keeping the newest ``keep``, and the cache entries that only they
    used: the report lists them."""

    keep: int
    deleted: list[str]
    cache: CacheCleaning | None = None
