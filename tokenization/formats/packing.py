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


@dataclass(frozen=True)
class Pieces:
    """Documents cut to fit a window: piece ``i`` is tokens ``[starts[i], ends[i])`` of the stream, and belongs to
    document ``docs[i]``."""

    starts: np.ndarray
    ends: np.ndarray
    docs: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    @classmethod
    def of_documents(cls, doc_ends: np.ndarray, capacity: int) -> Pieces:
        """Each document of an index (``doc_ends``, exclusive ends) whole when it fits ``capacity``, else cut into
        ``ceil(n / capacity)`` pieces: full windows, then the rest."""
        ends = np.asarray(doc_ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]])
        counts = -(-(ends - starts) // capacity)  # an empty entry holds no token: no piece
        docs = np.repeat(np.arange(len(ends), dtype=np.int64), counts)
        first = np.cumsum(counts) - counts  # each document's first piece
        offset = (np.arange(len(docs), dtype=np.int64) - first[docs]) * capacity
        piece_starts = starts[docs] + offset
        return cls(piece_starts, np.minimum(piece_starts + capacity, ends[docs]), docs)


@dataclass(frozen=True)
class Packing:
    """Which window each piece went to (``windows[i]``), and in what order pieces were placed (``placed[i]``: the
    rank of piece ``i`` in placement order): a window holds its pieces in that order."""

    windows: np.ndarray
    placed: np.ndarray
    count: int  # windows

    def fill(self, lengths: np.ndarray) -> np.ndarray:
        """Tokens each window holds."""
        return np.bincount(self.windows, weights=lengths, minlength=self.count).astype(np.int64)


@dataclass(frozen=True)
class PackedFile:
    """A token stream packed into windows, as units to move: source 0 is the stream, source 1 the padding (each
    window's padding its own range of it, so that no two units of one source overlap). In output order: a
    window's pieces in placement order, then its padding; the windows in a seeded random order."""

    source: np.ndarray
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
    ``rng``), then the windows shuffled with ``rng``."""
    pieces = Pieces.of_documents(doc_ends, capacity)
    packing = best_fit_decreasing(pieces.lengths, capacity, seed=int(rng.integers(2**63)))
    position = np.empty(packing.count, dtype=np.int64)
    position[rng.permutation(packing.count)] = np.arange(packing.count)
    room = capacity - packing.fill(pieces.lengths)
    padded = np.flatnonzero(room)  # windows with padding
    order = np.lexsort(
        (
            np.concatenate([packing.placed, np.zeros(len(padded), np.int64)]),
            np.concatenate([2 * position[packing.windows], 2 * position[padded] + 1]),  # a window's padding last
        )
    )
    source = np.concatenate([np.zeros(len(pieces.docs), np.int64), np.ones(len(padded), np.int64)])[order]
    lengths = np.concatenate([pieces.lengths, room[padded]])[order]
    starts = np.concatenate([pieces.starts, np.zeros(len(padded), np.int64)])[order]
    pads = source == 1
    starts[pads] = np.cumsum(lengths[pads]) - lengths[pads]
    padding = np.zeros(packing.count, dtype=np.int64)
    padding[position[padded]] = room[padded]
    return PackedFile(source, starts, starts + lengths, pieces, packing.count, padding)


def best_fit_decreasing(lengths: np.ndarray, capacity: int, seed: int) -> Packing:
    """Pack pieces of ``lengths`` (each 1..``capacity``) into windows of ``capacity``, Best-Fit Decreasing."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"piece lengths must be 1..{capacity}, got {lengths.min()}..{lengths.max()}")
    shuffled = np.random.default_rng(seed).permutation(len(lengths))
    order = shuffled[np.argsort(-lengths[shuffled], kind="stable")]  # longest first, ties in seeded order
    windows = np.empty(len(lengths), dtype=np.int64)
    rooms = _Rooms(capacity)
    sorted_lengths = lengths[order]
    firsts = np.flatnonzero(np.diff(sorted_lengths, prepend=-1))  # where each length's pieces start
    for a, b in zip(firsts, np.append(firsts[1:], len(order))[: len(firsts)], strict=True):
        windows[order[a:b]] = rooms.place(int(sorted_lengths[a]), int(b - a))
    placed = np.empty(len(lengths), dtype=np.int64)
    placed[order] = np.arange(len(lengths), dtype=np.int64)
    return Packing(windows, placed, rooms.opened)


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
