"""Records of the tokenization cache: an entry and its marker, how a rank used the cache, and the summaries a
build and its cleaning report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokenization.records.codec import Record, unless_none
from tokenization.records.inputs import FileSum, InputFile, RankCounts


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
    input_read: bool | None = field(default=None, metadata=unless_none())  # whether it was read (None: before)
    # a miss that grew by lines appended since its earlier bytes' entry (``inputs.grown``): the lines encoded, its
    # other documents taken from that entry; None: encoded whole, or a hit
    appended_lines: int | None = field(default=None, metadata=unless_none())
    # and of its bytes, text bytes and tokens, those of the earlier documents, taken from that entry, not encoded
    reused_text_bytes: int | None = field(default=None, metadata=unless_none())
    reused_tokens: int | None = field(default=None, metadata=unless_none())
    reused_bytes: int | None = field(default=None, metadata=unless_none())  # None: before it was recorded
    # a miss whose bytes' sha256 is not the one its plan took from a remembered row (a row forged or damaged): its
    # content identity as its rank read it (``sha256=...``), the one its key covers; None: the plan's is
    content: str | None = field(default=None, metadata=unless_none())

    def taken(self) -> tuple[int, int]:
        """The text bytes and tokens of the file that the cache gave rather than its rank encoded: a hit's all, a
        grown file's earlier ones; what rates of encoding leave out."""
        if self.hit:
            return self.text_bytes, self.tokens
        return self.reused_text_bytes or 0, self.reused_tokens or 0

    def reused(self) -> tuple[int, int]:
        """The input bytes and tokens of the file that the cache gave: a hit's all, a grown file's earlier ones."""
        if self.hit:
            return self.bytes, self.tokens
        return self.reused_bytes or 0, self.reused_tokens or 0


@dataclass(frozen=True, kw_only=True)
class RankCache(Record):
    """Where a rank's tokenization cache is, and how it served each of the rank's input files, in input order."""

    location: str
    files: list[CachedInput]


@dataclass(frozen=True, kw_only=True)
class CacheEntry(Record):
    """``{cache}/entries/{key}.json``, an entry's marker, written last and only where none is: the data folder that
    holds the entry's files, each file's size and checksum (a reader checks them all before it uses any), the input
    file's counts, and what the entry was made from (``described``: what its key covers); ``inline``: a small
    entry's files again, by name (base64), so that a hit of it is this one read (/3 and older have none)."""

    KIND: ClassVar[str] = "cache-entry"
    VERSION: ClassVar[int] = 4  # /3 held no file inline, /2 named sha256 checksums, /1's counts had no contents
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
    signature: str | None = field(default=None, metadata=unless_none())  # with a key only (``output.signing``)
    inline: dict[str, str] | None = field(default=None, metadata=unless_none())

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())


@dataclass(frozen=True, kw_only=True)
class KnownInputs(Record):
    """``{cache}/inputs/{key}.json``: what the plans of one input (``inputs``, the specs as given) found of its local
    files: a row a file, by URL, of its size, mtime, change time, inode and device, when it was hashed, and its
    sha256 (``inputs.content.with_content``), so that only the files that changed are read, by their ranks. A memo,
    rewritten whole by each plan, and ``{key}.rank.{who}.json`` beside it of the rows a rank hashed, which the next
    plan merges into it (``output.known``): a row is used only when all it holds is what the file's ``stat`` says
    now."""

    KIND: ClassVar[str] = "known-inputs"
    LABEL: ClassVar[str] = "record of known input files"
    inputs: list[str]
    files: dict[str, str]
    signature: str | None = field(default=None, metadata=unless_none())  # with a key only (``output.signing``)


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
class PlanReading(Record):
    """How a build told its local input files' content: the files its plan listed, those it recognised unchanged
    from what an earlier night remembered (no byte read), and those new or changed, which their ranks hashed (the
    plan reads none), with their bytes."""

    files_listed: int
    files_recognised: int
    files_hashed: int
    bytes_hashed: int


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
    plan: PlanReading | None = field(default=None, metadata=unless_none())  # None: a build before plans remembered
    input_bytes_read: int | None = field(default=None, metadata=unless_none())  # by the ranks, of their input files
    # of the misses, those that grew by lines appended since their earlier bytes' entry (``inputs.grown``), and the
    # lines of theirs encoded; None: no file did
    files_grown: int | None = field(default=None, metadata=unless_none())
    lines_encoded: int | None = field(default=None, metadata=unless_none())
    # the local files whose remembered row named another sha256 than their bytes' (forged or damaged), found by their
    # ranks' hashing and corrected for the next night; None: none was
    rows_corrected: int | None = field(default=None, metadata=unless_none())

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
class CacheCleaning(Record):
    """Cache entries removed (because no build still there used them, or by a prune) and the bytes freed."""

    entries: int
    bytes: int
