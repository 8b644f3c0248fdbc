"""A mixture: one build of several sources at chosen token shares (``tokenization.mixing`` chooses and orders the
documents). The spec, as a build's plan records it, and what each source gave: available, chosen, repeated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

from tokenization.records.codec import Record, unless_none


@dataclass(frozen=True, kw_only=True)
class MixtureSource(Record):
    """One source: its ``name``, its ``input`` (a folder, glob or URL, read as ``tokenization build`` reads its
    input), its share of the total (``weight``, normalized over the sources), how many times its documents may be
    used at most (``max_repetition``: 1 never repeats one), and its own reading settings, when they differ."""

    name: str
    input: str
    weight: float
    max_repetition: float = 1.0
    text_key: str | None = field(default=None, metadata=unless_none())
    template: str | None = field(default=None, metadata=unless_none())


@dataclass(frozen=True, kw_only=True)
class Mixture(Record):
    """The sources and the budget in tokens (EOS included; None: the largest the weights allow within each
    source's ``max_repetition``)."""

    LABEL: ClassVar[str] = "mixture"
    tokens: int | None = None
    sources: list[MixtureSource]

    @property
    def names(self) -> list[str]:
        return [source.name for source in self.sources]

    @property
    def shares(self) -> list[float]:
        """Each source's target share of the tokens: its weight over the sum of the weights."""
        total = math.fsum(source.weight for source in self.sources)
        return [source.weight / total for source in self.sources]


@dataclass(frozen=True, kw_only=True)
class SourceCounts(Record):
    """A source's documents in a rank: read, written, empty and quarantined (read = written + empty +
    quarantined), and the tokens written (in each bucket too, when the rank scattered them: every bucket's merge
    splits the mixture's budget by what each bucket holds of each source)."""

    name: str
    docs_read: int
    docs_written: int
    empty: int
    quarantined: int
    tokens: int
    bucket_tokens: list[int] | None = field(default=None, metadata=unless_none())  # its tokens in each bucket


@dataclass(frozen=True, kw_only=True)
class SourceMix(Record):
    """What the merge took of a source: its documents and tokens available (written by the ranks), the documents
    it chose (used at least once), those it used more than once, its uses (documents written, a repeated one as
    often as it is used) and their tokens; with the source's target share of the tokens."""

    name: str
    target: float
    docs_available: int
    tokens_available: int
    docs_chosen: int
    docs_repeated: int
    uses: int
    tokens_chosen: int

    def __add__(self, other: SourceMix) -> SourceMix:
        """Two buckets' figures of one source, added."""
        return replace(
            self,
            **{f: getattr(self, f) + getattr(other, f) for f in ADDED},
        )


ADDED = ("docs_available", "tokens_available", "docs_chosen", "docs_repeated", "uses", "tokens_chosen")


@dataclass(frozen=True, kw_only=True)
class SourceAccount(Record):
    """A source in a mixture's build record: its documents read by the ranks = chosen + not chosen + empty +
    quarantined, how many were used more than once and how often in all (``uses``), its tokens available and
    written, and the share of the dataset's tokens it reached against its target."""

    name: str
    target: float
    share: float
    docs_read: int
    docs_chosen: int
    docs_not_chosen: int
    empty: int
    quarantined: int
    docs_repeated: int
    uses: int
    tokens_available: int
    tokens_chosen: int

    @property
    def holds(self) -> bool:
        return self.docs_read == self.docs_chosen + self.docs_not_chosen + self.empty + self.quarantined


@dataclass(frozen=True, kw_only=True)
class SourceShare(Record):
    """A source's share of a published mixture's tokens against its target: what the builds page shows of it."""

    name: str
    target: float
    share: float
