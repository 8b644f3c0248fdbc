"""The proof of a one-file shuffle from its source's record, reading none of its bytes again: the pieces a unit's
edge cuts (``cut_pieces``), which its writer keeps, and their join back into the source's documents
(``rejoined_contents``).

Both walk the source's cuts (its index entries and its units' edges, ``Cuts``) in spans of positions, never whole:
what the plan holds beside the index is an array or two a unit and a kept piece, and a span's cuts, not arrays of
the source's pieces (at 4 M documents in one file, ~76 bytes a document had made the shuffle's peak 300 MB); the
join holds a span's cuts and a bucket of the kept pieces, which wait on disk (``formats.kept``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tokenization.formats.contents import Contents, Pieces, sorted_union
from tokenization.formats.kept import KeptReader
from tokenization.records.contents import MASK

SPAN = 1 << 18  # index entries (and unit edges) a span of cuts holds at most: 2-4 MiB of its arrays, about 3 ms


class Span(NamedTuple):
    """The cuts in positions ``(lo, hi]`` (sorted, unique), how many cuts come before them, and the index entries in
    the span with how many come before them (at or below ``lo``)."""

    lo: int
    hi: int
    cuts: np.ndarray
    before: int
    entries: np.ndarray
    entries_before: int


@dataclass(frozen=True)
class Cuts:
    """The cuts of a stream, never held whole: its index entries (``index``, sorted) and its units' edges (``edges``,
    sorted, unique), above 0, each once; walked in spans of at most ``span`` entries and ``span`` edges."""

    index: np.ndarray
    edges: np.ndarray
    span: int = SPAN

    @property
    def end(self) -> int:
        """The last cut (0 for none)."""
        return int(max(self.index[-1:].max(initial=0), self.edges[-1:].max(initial=0)))

    def spans(self) -> Iterator[Span]:
        """The spans of positions that tile ``(0, end]``, in order."""
        index, edges = self.index, self.edges
        lo, entries, ahead, before = 0, int(np.searchsorted(index, 0, side="right")), 0, 0
        while entries < len(index) or ahead < len(edges):
            ends = [a[k + self.span - 1] for a, k in ((index, entries), (edges, ahead)) if k + self.span <= len(a)]
            hi = max(lo, int(min(ends)) if ends else self.end)
            upto = int(np.searchsorted(index, hi, side="right"))
            edges_upto = int(np.searchsorted(edges, hi, side="right"))
            if upto <= entries and edges_upto == ahead:  # an index out of order (a damaged file): one entry on, so
                upto = entries + 1  # that the walk ends; the proof fails, and the file read again names it
            inside = index[entries:upto]
            cuts = sorted_union(inside, edges[ahead:edges_upto])
            yield Span(lo, hi, cuts, before, inside, entries)
            lo, entries, ahead, before = hi, upto, edges_upto, before + len(cuts)

    def every(self) -> np.ndarray:
        """All the cuts, as one array (for a proof that reads the stream again, and hashes it at them)."""
        return np.concatenate([s.cuts for s in self.spans()] or [np.zeros(0, np.int64)])

    def after(self, position: int) -> np.ndarray:
        """The cuts above ``position``: few when it is where the last unit ends (a dropped tail's)."""
        index, edges = (a[np.searchsorted(a, position, side="right") :] for a in (self.index, self.edges))
        return sorted_union(index, edges)

    def count(self, *runs: np.ndarray) -> list[np.ndarray]:
        """How many cuts are at or below each position of each run: the number of the piece that starts there (of
        none, past the end). The cuts are walked once for all the runs, each searched in sorted order (a run that is
        not is sorted here first)."""
        orders = [None if _ascending(run) else np.argsort(run, kind="stable") for run in runs]
        pairs = zip(runs, orders, strict=True)
        ordered = [np.asarray(run if by is None else run[by], dtype=np.int64) for run, by in pairs]
        counted = [np.zeros(len(run), np.int64) for run in ordered]
        every = 0
        for span in self.spans():
            for run, found in zip(ordered, counted, strict=True):
                a, b = np.searchsorted(run, [span.lo, span.hi], side="right")
                found[a:b] = span.before + np.searchsorted(span.cuts, run[a:b], side="right")
            every = span.before + len(span.cuts)
        for run, found, by in zip(ordered, counted, orders, strict=True):
            found[np.searchsorted(run, self.end, side="right") :] = every
            if by is not None:
                found[by] = found.copy()
        return counted


def _ascending(positions: np.ndarray) -> bool:
    return not np.any(positions[1:] < positions[:-1])


class PieceCounts(NamedTuple):
    """What the proof expects of a one-file shuffle's units: the pieces they hold as written; the source's pieces
    up to the last unit's end (``through``); all its pieces (``every``)."""

    written: int
    through: int
    every: int


class CutPlan(NamedTuple):
    """Which pieces of a one-file shuffle's units its writer keeps: ``chosen``, their numbers as written (sorted),
    and ``numbers``, theirs in the source (one each); and the ``counts`` the proof expects."""

    chosen: np.ndarray
    numbers: np.ndarray
    counts: PieceCounts


def cut_pieces(cuts: Cuts, starts: np.ndarray, ends: np.ndarray) -> CutPlan:
    """The pieces of units ``[starts[i], ends[i])`` (in this order, each cut at ``cuts``) that are parts of a
    document a unit's edge cuts: a unit's first piece when it starts inside a document, its last when it ends
    inside one (at most two a unit). The other pieces are whole documents of the source cut at ``cuts.index``."""
    by = np.argsort(starts, kind="stable")
    kept = int(ends.max()) if len(ends) else 0
    lo, hi, after = unit_pieces(cuts, starts, ends, by, kept, cuts.end)
    count = hi - lo
    first = np.cumsum(count) - count  # each unit's first piece as written
    inside = [(e > 0) & ~_entries(cuts.index, e, by) for e in (starts, ends)]  # 0 and the entries start documents
    del by
    chosen = np.concatenate([first[inside[0]], (first + count - 1)[inside[1]]])
    numbers = np.concatenate([lo[inside[0]], (hi - 1)[inside[1]]])
    order = np.argsort(chosen, kind="stable")
    chosen, numbers = chosen[order], numbers[order]
    once = np.concatenate([[True], chosen[1:] != chosen[:-1]]) if len(chosen) else np.zeros(0, bool)
    through, every = (int(n) for n in after)
    return CutPlan(chosen[once], numbers[once], PieceCounts(int(count.sum()), through, every))


def unit_pieces(cuts: Cuts, starts: np.ndarray, ends: np.ndarray, by: np.ndarray, *more: int) -> list[np.ndarray]:
    """The number of each unit's first piece, and of the first piece after it, of a stream cut at ``cuts`` (and of
    the pieces that start at the positions ``more``); units that do not overlap, in any order (windows in their
    shuffled order), searched in the order ``by`` sorts them: a key in random order misses the caches at each of its
    ~20 steps (2.8 s for 1.9 M windows over 3 M cuts), where sorted keys find each step near the last."""
    lo, hi = np.empty(len(starts), np.int64), np.empty(len(ends), np.int64)
    lo[by], hi[by], after = cuts.count(starts[by], ends[by], np.array(more, np.int64))
    return [lo, hi, after]


def _entries(index: np.ndarray, positions: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Whether each position is an entry of the sorted ``index`` (searched in the order ``by`` sorts them)."""
    if not len(index):
        return np.zeros(len(positions), bool)
    at = np.empty(len(positions), np.int64)
    at[by] = np.searchsorted(index, positions[by])
    return np.asarray(index[np.minimum(at, len(index) - 1)]) == positions


def rejoined_contents(
    written: Contents, parts: KeptReader, counts: PieceCounts, cuts: Cuts, tail: Pieces
) -> Contents | None:
    """What a source held, cut at its ``cuts.index``, from what a one-file shuffle wrote: ``written``, the contents
    of its units, each cut at ``cuts`` (every unit edge among them, to the source's end); ``parts``, the written
    pieces its plan names (``cut_pieces``), in the source's order; ``tail``, the source's pieces after its last unit
    (a dropped tail). The parts and the tail are joined into the source's documents, which take the parts' place, a
    span of the cuts at a time: the proof reads no byte of the source again, and holds a span's parts, not one a
    document. None when what was written cannot be these units' pieces."""
    if written.pieces != counts.written or len(tail) != counts.every - counts.through:  # tail: through, through + 1..
        return None
    joined = _joined(parts, tail, cuts, counts.through)
    if joined is None or not parts.whole():
        return None
    out, into = joined
    return Contents(
        written.pieces - out.pieces + into.pieces,
        written.tokens - out.tokens + into.tokens,
        (written.sum - out.sum + into.sum) & MASK,
    )


def _sliced(pieces: Pieces, start: int, stop: int) -> Pieces:
    """Pieces ``start`` up to ``stop``, not copied."""
    scale = None if pieces.scale is None else pieces.scale[start:stop]
    return Pieces(pieces.sums[start:stop], pieces.weighted[start:stop], pieces.lengths[start:stop], scale)


def _joined(parts: KeptReader, tail: Pieces, cuts: Cuts, through: int) -> tuple[Contents, Contents] | None:
    """The contents of the parts, and of the parts and the tail (the source's pieces from number ``through`` on)
    joined into their documents, a span of the cuts at a time; the last document of a span is held open, one
    piece, until a span's pieces belong to another. None when two parts have one number."""
    out = done = Contents()
    held = document = None
    for span in cuts.spans():
        first, last = span.before, span.before + len(span.cuts)  # the numbers of the span's pieces
        numbers, given = parts.below(last)
        if np.any(numbers[1:] == numbers[:-1]) or np.any(numbers < first):
            return None
        out += given.contents()
        t = np.arange(max(first, through), max(last, through)) - through  # the tail's pieces in the span
        pieces = Pieces.concatenate([p for p in (held, given, tail.take(t)) if p is not None])
        ending = span.cuts[np.concatenate([numbers, t + through]) - first]  # where each piece ends
        documents = span.entries_before + np.searchsorted(span.entries, ending)
        if document is not None:
            documents = np.concatenate([document, documents])
        if not len(pieces):
            continue
        joined = pieces.joined(np.flatnonzero(np.diff(documents, prepend=-1)))
        done += _sliced(joined, 0, len(joined) - 1).contents()
        held, document = _sliced(joined, len(joined) - 1, len(joined)), documents[-1:]
    return out, done + (held.contents() if held is not None else Contents())
