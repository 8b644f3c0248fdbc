"""Records of what a rank read: its input files (whole or a part), their sums, the records it quarantined, and
its counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, cast

from tokenization.records.codec import Record, json_name, unless_none
from tokenization.records.contents import ContentsSum

Algorithm = Literal["blake3", "sha256"]  # a file checksum's, as records name it (``storage.checksums``)


@dataclass(frozen=True, kw_only=True)
class FileSum(Record):
    """A published file's size and checksum: what a completion marker vouches for. The field names the algorithm
    (``storage.checksums``): ``blake3`` in records of this version, ``sha256`` in older ones (and each is checked
    with its own); exactly one is there."""

    bytes: int
    blake3: str | None = field(default=None, metadata=unless_none())
    sha256: str | None = field(default=None, metadata=unless_none())

    def __post_init__(self) -> None:
        if (self.blake3 is None) == (self.sha256 is None):
            raise ValueError("names no checksum, or two (blake3 or sha256: one)")

    @classmethod
    def of(cls, size: int, checksum: str, algorithm: Algorithm) -> FileSum:
        """A file's sum, made with ``algorithm`` (a writer's: ``storage.checksums.ALGORITHM``)."""
        return cls(bytes=size, **{algorithm: checksum})

    @property
    def algorithm(self) -> Algorithm:
        return "blake3" if self.blake3 is not None else "sha256"

    @property
    def checksum(self) -> str:
        return cast(str, self.blake3 or self.sha256)


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
    bytes are (``inputs.content.difference``)."""

    url: str
    size: int = field(metadata=json_name("bytes"))
    identity: str = ""  # rank manifests before plans were fixed held none
    part: FilePart | None = field(default=None, metadata=unless_none())  # None: the whole file
    # a local file that changed since the last night: its size and sha256 then (``{size},{sha256}``), for its rank to
    # tell whether it only grew by lines appended (``inputs.grown``); None: new, unchanged, or not known
    earlier: str | None = field(default=None, metadata=unless_none())

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
    # a mixture's rank whose documents the plan chose (``builds.choice``): the tokens of those no source uses, which
    # it held and did not write (its files hold ``tokens_written``); None: it wrote every document
    tokens_not_chosen: int | None = field(default=None, metadata=unless_none())


@dataclass(frozen=True, kw_only=True)
class SizedInput(Record):
    url: str
    bytes: int
