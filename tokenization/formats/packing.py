"""Best-Fit Decreasing packing of documents into training windows (Ding et al., 2024, "Fewer Truncations Improve
Language Modeling"): a document longer than a window is cut into window-sized pieces first, then every piece goes,
longest first, into the fullest window it still fits, or opens a new one.

Pieces are integers of at most ``capacity``, so windows are grouped by their room left, and pieces by their
length: the loop runs over lengths (at most ``capacity`` of them) and, within one, over the rooms it fills, each a
group of windows handled at once with numpy. Within a group the sequential rule is kept exactly: the window with
the least room that fits takes pieces until it has no room for another, before the next window does, since the
room it is left with is below every other candidate's. Memory: a few integers a piece and a window.

Ties (pieces of one length, windows of one room) are broken by a seeded permutation and by age, so the packing is
a pure function of the lengths, the capacity and the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenization import orderings
from tokenization.formats.moves import ranges


@dataclass(frozen=True)
class Pieces:
    """Documents cut to fit a window: piece ``i`` is tokens ``[starts[i], starts[i] + lengths[i])`` of the stream,
    in stream order. 12 bytes a piece."""

    starts: np.ndarray  # int64
    lengths: np.ndarray  # int32: a piece is at most a window
    whole: int  # documents that are one piece
    split: int  # documents longer than a window
    split_pieces: int  # the pieces those were cut into

    @property
    def ends(self) -> np.ndarray:
        return self.starts + self.lengths

    @classmethod
    def of_documents(cls, doc_ends: np.ndarray, capacity: int) -> Pieces:
        """Each document of an index (``doc_ends``, exclusive ends) whole when it fits ``capacity``, else cut into
        ``ceil(n / capacity)`` pieces: full windows, then the rest. An empty entry holds no token: no piece."""
        ends = np.asarray(doc_ends, dtype=np.int64)
        lengths = np.diff(ends, prepend=0)
        counts = -(-lengths // capacity)
        starts = np.repeat(ends - lengths, counts)
        piece_lengths = np.repeat(lengths.astype(np.int32), counts)
        long = np.flatnonzero(counts > 1)  # few: their pieces are fixed up apart
        firsts = (np.cumsum(counts) - counts)[long]
        cut = counts[long]
        within = ranges(np.zeros(len(long), np.int64), cut)  # each split document's pieces: 0, 1, ...
        at = np.repeat(firsts, cut) + within
        starts[at] += within * capacity
        piece_lengths[at] = np.minimum(capacity, piece_lengths[at] - within * capacity)
        split_pieces = int(cut.sum())
        return cls(starts, piece_lengths, len(starts) - split_pieces, len(long), split_pieces)


@dataclass(frozen=True)
class Packing:
    """Which window each piece went to (``windows[i]``), and the pieces in the order they were placed (``order``):
    a window holds its pieces in that order."""

    windows: np.ndarray
    order: np.ndarray
    count: int  # windows

    def fill(self, lengths: np.ndarray) -> np.ndarray:
        """Tokens each window holds."""
        return np.bincount(self.windows, weights=lengths, minlength=self.count).astype(np.int64)


@dataclass(frozen=True)
class PackedFile:
    """A token stream packed into windows, as units to move: source 0 is the stream, source 1 the padding (each
    window's padding its own range of it, so that no two units of one source overlap). In output order: a
    window's pieces in placement order, then its padding; the windows in a seeded random order."""

    source: np.ndarray  # int8
    starts: np.ndarray
    ends: np.ndarray
    pieces: Pieces
    windows: int
    padding: np.ndarray  # padding tokens of each window, in output order

    @property
    def padding_tokens(self) -> int:
        return int(self.padding.sum())


def pack(doc_ends: np.ndarray, capacity: int, rng: np.random.Generator) -> PackedFile:
    """The documents of an index packed into windows of ``capacity`` (Best-Fit Decreasing, ties drawn from
    ``rng``), then the windows shuffled with ``rng``. Peak memory: under 50 bytes a piece, buffers reused."""
    pieces = Pieces.of_documents(doc_ends, capacity)
    packing = best_fit_decreasing(pieces.lengths, capacity, seed=orderings.packing_draws(rng))
    count, n = packing.count, len(pieces.starts)
    position = np.empty(count, dtype=np.int64)
    position[orderings.shuffled(rng, count)] = np.arange(count)
    room = capacity - packing.fill(pieces.lengths)
    padded = np.flatnonzero(room)  # windows with padding
    # Units: the pieces in placement order, then each padded window's padding. Sorted stably by their window's
    # place, a window holds its pieces in placement order and its padding last.
    key = np.empty(n + len(padded), dtype=np.int64)
    np.take(packing.windows, packing.order, out=key[:n])
    np.take(position, key[:n], out=key[:n])
    key[n:] = position[padded]
    by_place = np.argsort(key, kind="stable")
    units = key  # its buffer, reused
    units[:n], units[n:] = packing.order, n + np.arange(len(padded))
    del key, packing
    np.take(units, by_place, out=by_place)
    units = by_place
    pads = units >= n
    starts = np.empty(len(units), dtype=np.int64)
    lengths = np.empty(len(units), dtype=np.int64)
    starts[~pads], lengths[~pads] = pieces.starts[units[~pads]], pieces.lengths[units[~pads]]
    pad_lengths = room[padded[units[pads] - n]]
    del units
    starts[pads], lengths[pads] = np.cumsum(pad_lengths) - pad_lengths, pad_lengths
    lengths += starts
    padding = np.zeros(count, dtype=np.int64)
    padding[position[padded]] = room[padded]
    return PackedFile(pads.view(np.int8), starts, lengths, pieces, count, padding)


def best_fit_decreasing(lengths: np.ndarray, capacity: int, seed: int) -> Packing:
    """Pack pieces of ``lengths`` (each 1..``capacity``) into windows of ``capacity``, Best-Fit Decreasing."""
    lengths = np.asarray(lengths)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"piece lengths must be 1..{capacity}, got {lengths.min()}..{lengths.max()}")
    shuffled = orderings.tie_order(seed, len(lengths))
    # longest first, ties in the seeded order: a stable sort of the room a piece leaves, in the smallest dtype
    # that holds it (a radix sort for windows under 65,536 tokens)
    leaves = (capacity - lengths[shuffled]).astype(np.min_scalar_type(capacity))
    order = shuffled[np.argsort(leaves, kind="stable")]
    del shuffled, leaves
    windows = np.empty(len(lengths), dtype=np.int64)
    rooms = _Rooms(capacity)
    sorted_lengths = lengths[order]
    firsts = np.flatnonzero(np.diff(sorted_lengths, prepend=-1))  # where each length's pieces start
    for a, b in zip(firsts, np.append(firsts[1:], len(order))[: len(firsts)], strict=True):
        windows[order[a:b]] = rooms.place(int(sorted_lengths[a]), int(b - a))
    return Packing(windows, order, rooms.opened)


class _Rooms:
    """Windows by the room they have left: for each room, a stack of groups of window ids (oldest first)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.count = np.zeros(capacity + 1, dtype=np.int64)  # windows with each room left
        self.groups: list[list[np.ndarray]] = [[] for _ in range(capacity + 1)]
        self.opened = 0

    def place(self, length: int, k: int) -> np.ndarray:
        """Place ``k`` pieces of ``length``, each in the window with the least room that fits it (opening windows
        when none does); returns the window of each, in placement order."""
        placed = []
        for room in np.flatnonzero(self.count[length:]) + length:
            if not k:
                break
            taken = self._take(int(room), length, k)
            placed.append(taken)
            k -= len(taken)
        if k:
            placed.append(self._open(length, k))
        return np.concatenate(placed) if placed else np.empty(0, np.int64)

    def _take(self, room: int, length: int, k: int) -> np.ndarray:
        """Up to ``k`` pieces into the windows with ``room`` left, oldest first: each takes as many as fit."""
        per = room // length
        windows = self._pop(room, min(int(self.count[room]), -(-k // per)))
        return self._fill(windows, room, length, k, per)

    def _open(self, length: int, k: int) -> np.ndarray:
        per = self.capacity // length
        n = -(-k // per)
        windows = np.arange(self.opened, self.opened + n, dtype=np.int64)
        self.opened += n
        return self._fill(windows, self.capacity, length, k, per)

    def _fill(self, windows: np.ndarray, room: int, length: int, k: int, per: int) -> np.ndarray:
        """``per`` pieces into each of ``windows`` (the last takes what is left of ``k``); each then moves to the
        room it has left."""
        k = min(k, len(windows) * per)
        taken = np.repeat(windows, per)[:k]
        last = k - (len(windows) - 1) * per
        self._push(room - per * length, windows[:-1] if last < per else windows)
        if last < per:
            self._push(room - last * length, windows[-1:])
        return taken

    def _pop(self, room: int, n: int) -> np.ndarray:
        """The ``n`` oldest windows with ``room`` left."""
        taken, groups = [], self.groups[room]
        while n:
            head = groups[0]
            taken.append(head[:n])
            if len(head) > n:
                groups[0] = head[n:]
                n = 0
            else:
                groups.pop(0)
                n -= len(head)
        self.count[room] -= sum(len(t) for t in taken)
        return np.concatenate(taken) if taken else np.empty(0, np.int64)

    def _push(self, room: int, windows: np.ndarray) -> None:
        if len(windows):
            self.groups[room].append(windows)
            self.count[room] += len(windows)
