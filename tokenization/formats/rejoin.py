"""The proof of a one-file shuffle from its source's record, reading none of its bytes again: the pieces a unit's
edge cuts (``cut_pieces``), which its writer keeps, and their join back into the source's documents
(``rejoined_contents``)."""

from __future__ import annotations

import numpy as np

from tokenization.formats.contents import Contents, Pieces
from tokenization.formats.moves import sorted_union


def cut_pieces(cuts: np.ndarray, starts: np.ndarray, ends: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The numbers, in the stream they are written to, of the pieces of units ``[starts[i], ends[i])`` (in this
    order, each cut at ``cuts``) that are parts of a document a unit's edge cuts: a unit's first piece when it
    starts inside a document, its last when it ends inside one (at most two a unit). The other pieces are whole
    documents of the source cut at ``index``."""
    by = np.argsort(starts, kind="stable")
    lo, hi = unit_pieces(cuts, starts, ends, by)
    first = np.cumsum(hi - lo) - (hi - lo)
    inside = [(e > 0) & ~_entries(index, e, by) for e in (starts, ends)]  # 0 and the index entries start documents
    return sorted_union(first[inside[0]], (first + hi - lo - 1)[inside[1]])


def unit_pieces(cuts: np.ndarray, starts: np.ndarray, ends: np.ndarray, by: np.ndarray) -> tuple[np.ndarray, ...]:
    """The number of each unit's first piece, and of the first piece after it, of a stream cut at ``cuts``; units
    that do not overlap, in any order (windows in their shuffled order), searched in the order ``by`` sorts them:
    a key in random order misses the caches at each of its ~20 steps (2.8 s for 1.9 M windows over 3 M cuts), where
    sorted keys find each step near the last."""
    lo, hi = np.empty(len(starts), np.int64), np.empty(len(ends), np.int64)
    lo[by] = np.searchsorted(cuts, starts[by], side="right")
    hi[by] = np.searchsorted(cuts, ends[by], side="right")
    return lo, hi


def _entries(index: np.ndarray, positions: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Whether each position is an entry of the sorted ``index`` (searched in the order ``by`` sorts them)."""
    if not len(index):
        return np.zeros(len(positions), bool)
    at = np.empty(len(positions), np.int64)
    at[by] = np.searchsorted(index, positions[by])
    return np.asarray(index[np.minimum(at, len(index) - 1)]) == positions


def rejoined_contents(
    written: Contents,
    parts: Pieces,
    chosen: np.ndarray,
    cuts: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    tail: Pieces,
    index: np.ndarray,
) -> Contents | None:
    """What a source held, cut at its ``index``, from what a one-file shuffle wrote: ``written``, the contents of
    its units ``[starts[i], ends[i])`` in this order, each cut at ``cuts`` (sorted, unique, positive, every unit edge
    and index entry among them, to the source's end); ``parts``, the written pieces ``chosen``, which ``cut_pieces``
    names; ``tail``,
    the source's pieces after its last unit (a dropped tail). The parts and the tail go back to the source's order
    and are joined into its documents, which take the parts' place: the proof reads no byte of the source again,
    and holds two pieces a unit, not one a document. None when what was written cannot be these units' pieces."""
    lo, hi = unit_pieces(cuts, starts, ends, np.argsort(starts, kind="stable"))
    ahead = np.cumsum(hi - lo)  # the written pieces up to each unit's end
    del hi
    kept = int(ends.max()) if len(ends) else 0
    if written.pieces != (int(ahead[-1]) if len(ahead) else 0) or len(parts) != len(chosen):
        return None
    if len(tail) != len(cuts) - np.searchsorted(cuts, kept, side="right"):
        return None
    unit = np.searchsorted(ahead, chosen, side="right")
    numbers = lo[unit] + (chosen - np.concatenate([[0], ahead])[unit])  # each part's number in the source
    del lo, ahead, unit  # arrays of a unit or a part each: what the join holds at its peak is what bounds it
    numbers = np.concatenate([numbers, len(cuts) - np.arange(len(tail), 0, -1)])
    by_number = np.argsort(numbers, kind="stable")
    numbers, pieces = numbers[by_number], Pieces.concatenate([parts, tail]).take(by_number)
    del by_number
    if np.any(numbers[1:] == numbers[:-1]):
        return None
    document = np.searchsorted(index, cuts[numbers], side="left")  # each part's document (its id, up to a shift)
    del numbers
    return pieces.joined(np.flatnonzero(np.diff(document, prepend=-1))).replacing(written, parts)
