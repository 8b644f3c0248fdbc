"""What a rank's reading came to, record by record (``Counts``), and the limits on rejected records it is held to
(``RejectTally``): shared by ``tokenize``, ``count`` and build, so that all three count the same documents.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import orjson

from tokenization.errors import TokenizationError
from tokenization.formats.contents import Contents
from tokenization.records import ContentsSum, HistogramRow, RankCounts, Rejected

HISTOGRAM_BUCKETS = 48  # powers of two: [1, 2), [2, 4), ... up to 2**47 tokens
DEFAULT_MAX_REJECTS = 1000  # records: a rank fails as soon as it has rejected more than this
DEFAULT_MAX_REJECT_FRACTION = 0.01  # of the records read: checked when the rank has read them all
TOP_REASONS = 3  # reject reasons named in an error


class TooManyRejects(TokenizationError):
    """A rank rejected more records than its limits allow, or wrote none of the records it read."""


@dataclass
class Counts:
    """What happened to every record this rank read: docs_read = docs_written + empty + sum(rejected)."""

    docs_read: int = 0
    docs_written: int = 0
    empty: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    blank_lines: int = 0
    text_bytes: int = 0
    tokens: int = 0
    tokens_written: int = 0
    tokens_dropped: int = 0
    loss_tokens: int = 0  # tokens that carry loss, when loss bytes are computed
    partial_chunk_tokens: int = 0
    longest: int = 0  # tokens in the longest document
    special_token_literals: Counter[str] = field(default_factory=Counter)
    length_buckets: np.ndarray = field(default_factory=lambda: np.zeros(HISTOGRAM_BUCKETS, dtype=np.int64))
    contents: Contents = field(default_factory=Contents)  # of the documents written (``formats.contents``)

    @classmethod
    def of(cls, record: RankCounts) -> Counts:
        """The counts a record holds (a cached file's), to add up with others."""
        return cls(
            **{name: getattr(record, name) for name in _TAKEN},
            loss_tokens=record.loss_tokens or 0,
            contents=record.contents_in.value if record.contents_in else Contents(),
            rejected=Counter(record.rejected),
            special_token_literals=Counter(record.special_token_literals),
            length_buckets=histogram_buckets(record.length_histogram),
        )

    def add(self, other: Counts) -> None:
        """Add another file's counts to these: a rank's are the sum of its files'."""
        for name in _NAMES:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            else:
                setattr(self, name, max(mine, theirs) if name == "longest" else mine + theirs)

    def add_lengths(self, lengths: np.ndarray) -> None:
        """Count documents of these token lengths in power-of-two buckets: [1, 2), [2, 4), ..."""
        lengths = lengths[lengths > 0]
        if len(lengths):
            self.longest = max(self.longest, int(lengths.max()))
            buckets = np.minimum(np.log2(np.maximum(lengths, 1)).astype(int), HISTOGRAM_BUCKETS - 1)
            np.add.at(self.length_buckets, buckets, 1)

    def record(self) -> RankCounts:
        """The counts as a manifest records them."""
        data = asdict(self)
        del data["length_buckets"], data["contents"]
        return RankCounts(
            **data
            | {
                "contents_in": ContentsSum.of(self.contents),
                "length_histogram": histogram_rows(self.length_buckets),
                "rejected": dict(sorted(self.rejected.items())),
                "rejected_total": sum(self.rejected.values()),
                "special_token_literals": dict(sorted(self.special_token_literals.items())),
                "special_token_literals_total": sum(self.special_token_literals.values()),
            }
        )


# Counts' fields, worked out once (a rank of 25,000 cache hits makes and adds up 50,000 of them)
_NAMES = tuple(f.name for f in fields(Counts))
_TAKEN = tuple(
    name
    for name in _NAMES
    if name not in {"rejected", "special_token_literals", "length_buckets", "loss_tokens", "contents"}
)  # as a record holds them (``Counts.of``)


def histogram_buckets(rows: list[HistogramRow]) -> np.ndarray:
    """The power-of-two buckets that a record's histogram rows give (``histogram_rows``' inverse)."""
    buckets = np.zeros(HISTOGRAM_BUCKETS, dtype=np.int64)
    for row in rows:
        buckets[row.min_tokens.bit_length() - 1] = row.docs
    return buckets


def histogram_rows(buckets: np.ndarray) -> list[HistogramRow]:
    """The buckets from the first to the last non-empty one."""
    nonzero = np.flatnonzero(buckets)
    if not len(nonzero):
        return []
    return [
        HistogramRow(min_tokens=2**k, max_tokens=2 ** (k + 1) - 1, docs=int(buckets[k]))
        for k in range(nonzero[0], nonzero[-1] + 1)
    ]


class RejectTally:
    """Counts rejected records by reason, failing the pass as soon as there are more than ``max_rejects``; once
    every record is read, ``check`` fails it if the reject fraction is too high or if records were read but none
    written (a wrong text key rejects them all; such a rank must never look complete). ``before``: the tally of
    the files read before this one, whose rejects count towards the limit too."""

    def __init__(
        self,
        where: str,
        source: str,
        max_rejects: int | None = DEFAULT_MAX_REJECTS,
        max_fraction: float | None = DEFAULT_MAX_REJECT_FRACTION,
        before: RejectTally | None = None,
    ):
        self.where, self.source = where, source
        self.max_rejects, self.max_fraction = max_rejects, max_fraction
        self.before = before
        self.reasons: Counter[str] = Counter()
        self.first: dict[str, Rejected] = {}

    def __call__(self, item: Rejected) -> None:
        self.reasons[item.reason] += 1
        self.first.setdefault(item.reason, item)
        rejected = self.total
        if self.max_rejects is not None and rejected > self.max_rejects:
            raise TooManyRejects(
                f"{self.where}: {rejected} rejected records exceed max_rejects={self.max_rejects}; "
                f"latest: {item.file} line {item.line}: {item.reason}; by reason: {self._reasons()}; "
                f"{self.source}{self._keys_hint()}"
            )

    @property
    def total(self) -> int:
        return sum(self.reasons.values()) + (self.before.total if self.before else 0)

    def next_file(self) -> RejectTally:
        """The tally of the next file: its rejects are added to these by ``add`` once the file is done."""
        return RejectTally(self.where, self.source, self.max_rejects, self.max_fraction, before=self)

    def add(self, other: RejectTally) -> None:
        self.reasons.update(other.reasons)
        for reason, item in other.first.items():
            self.first.setdefault(reason, item)

    def check(self, counts: Counts) -> None:
        """The limits that need the whole pass (``counts``): some document written, and the reject fraction."""
        c = counts
        rejected = self.total
        if c.docs_read and not c.docs_written:
            what = f"{rejected} rejected ({self._reasons()})" if rejected else f"all {c.empty} were empty"
            raise TooManyRejects(
                f"{self.where}: read {c.docs_read} records but wrote none: {what}; {self.source}{self._keys_hint()}"
            )
        if self.max_fraction is not None and c.docs_read and rejected / c.docs_read > self.max_fraction:
            raise TooManyRejects(
                f"{self.where}: {rejected} of {c.docs_read} records rejected ({rejected / c.docs_read:.2%}), above "
                f"max_reject_fraction={self.max_fraction}: {self._reasons()}{self._keys_hint()}"
            )

    def _all(self) -> tuple[Counter[str], dict[str, Rejected]]:
        """The reasons and first examples of this file and of those before it."""
        if self.before is None:
            return self.reasons, self.first
        reasons, first = self.before._all()
        return reasons + self.reasons, self.first | first  # the earliest example of a reason first

    def _reasons(self) -> str:
        reasons, first = self._all()
        top = reasons.most_common(TOP_REASONS)
        example = first[top[0][0]]
        return f"{', '.join(f'{reason} {n}' for reason, n in top)}; first: {example.file} line {example.line}"

    def _keys_hint(self) -> str:
        """The fields a record had when a field was missing: usually the one the user meant is among them."""
        missing = next((item for reason, item in self._all()[1].items() if reason.startswith("missing_")), None)
        if missing is None:
            return ""
        try:
            record = orjson.loads(missing.raw)
        except orjson.JSONDecodeError:
            return ""
        if not isinstance(record, dict):
            return ""
        return f"; its records have the fields {', '.join(record)}"
