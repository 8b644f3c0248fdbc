"""What token files hold, whatever their order: ``Contents`` (the value a stage computes,
``tokenization.formats.contents`` hashes it) and ``ContentsSum`` (how records hold it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenization.records.codec import Record

MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Contents:
    """A stream's pieces (non-empty ones), tokens and the sum of its pieces' hashes mod 2^64. Adding two gives the
    contents of both streams, in any order."""

    pieces: int = 0
    tokens: int = 0
    sum: int = 0

    def __add__(self, other: Contents) -> Contents:
        return Contents(self.pieces + other.pieces, self.tokens + other.tokens, (self.sum + other.sum) & MASK)

    def times(self, n: int) -> Contents:
        """These contents ``n`` times over."""
        return Contents(self.pieces * n, self.tokens * n, (self.sum * n) & MASK)

    @classmethod
    def total(cls, parts: Iterable[Contents]) -> Contents:
        whole = cls()
        for part in parts:
            whole = whole + part
        return whole

    def describe(self) -> str:
        return f"{self.pieces:,} pieces, {self.tokens:,} tokens, sum {self.sum:016x}"


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
        present = [part for part in parts if part is not None]
        return None if len(present) < len(parts) else cls.of(Contents.total(part.value for part in present))
