"""What a token stream holds, whatever its order: the proof that a shuffle is a permutation.

A *piece* is the tokens between two consecutive index entries: a document, or the part of one inside a chunk or a
window. Every shuffle moves pieces whole, so the multiset of pieces is what each stage must keep. A piece hashes to
64 bits from its tokens, its loss bytes and their positions in it, and a stream's :class:`Contents` is its number of
(non-empty) pieces, its number of tokens and the sum of its pieces' hashes modulo 2^64: no reordering changes it,
and a piece lost, duplicated, cut elsewhere or altered changes it (but for odds of 2^-64), whatever the bug.

A piece's hash mixes its length with two sums over its tokens: of ``y = (2 * token + loss + 1) ** 2`` and of
``i * y`` (``i``: the position in the piece), which a segmented sum (``np.add.reduceat``) gives for every piece of a
block at once. The weights are computed once for any number of ways to cut the same tokens (a stage's input cut at
its index, and at its index and its windows' edges). Cost model: seven numpy passes over 64-bit words a token, in
chunks of ``CHUNK`` tokens whose two buffers stay in a core's cache (~1.8-2 ns a token here), and ~15 ns a piece.

A mixture's piece also has a source (its ``.source`` sidecar's entry, ``formats.sidecar``), which is part of what it
holds: once its hash is made, it is multiplied by its source's odd factor (``factors``), so that a piece moved to
another source, or two pieces' sources swapped, changes the sum (but for odds of 2^-63). A step per piece, after the
per-token part, and linear: the pieces of one source add up first (a rank's input file, all of one source, is its
contents' sum times the factor, ``sourced``). Pieces without a source keep their hash: builds without a mixture keep
their contents.

Where the C helper runs (``formats.native``), one pass of it gives each piece's two sums, and with them the checks a
writer or verify makes of the same block (``Found``): ids beyond the vocabulary, loss bytes above 1, the token before
each index entry. Either way the pieces' hashes and their sum are made here, per block, from those sums.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from tokenization.errors import TokenizationError
from tokenization.formats import native
from tokenization.records.contents import MASK, Contents

# Tokens whose weights the numpy path makes and sums at once: its two 512 KiB buffers stay in a core's cache, and a
# chunk costs ~8 numpy calls besides its arithmetic (a block hashed in 16, 32, 64, 128 and 256 Ki-token chunks here:
# 2.3, 2.1, 1.8, 2.4 and 2.8 ns a token; 3.0 when each sub-block of 256 Ki tokens was a part of its own).
CHUNK = 1 << 16
SUB_BLOCK = 1 << 18  # a damaged index's tokens are hashed in parts of this many, as they always were: see hash_parts
READ_BLOCK = 1 << 22  # tokens read at once when a file is hashed
C_BLOCK = 1 << 30  # tokens the C helper takes at once: it counts a piece's positions in 32 bits
_U64 = np.uint64
_POSITIONS = np.arange(SUB_BLOCK, dtype=_U64)
_SEEDS = tuple(_U64(k) for k in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93))


class ShuffleCheckFailed(TokenizationError):
    """A stage wrote other pieces than it read: a bug, caught before anything of the stage was published."""


def check_kept(where: str, read: Contents, written: Contents) -> None:
    """Refuse a stage's output unless it holds the pieces its input held (``where`` names the stage)."""
    if read != written:
        raise ShuffleCheckFailed(
            f"{where} wrote other pieces than it read ({written.describe()}; it read {read.describe()}): a bug, "
            "so nothing of it is published; please report it with this line"
        )


class Found(NamedTuple):
    """What the pass that hashed a block found in it, for the checks of the block (``formats.checks``): its largest
    id and its largest loss byte (0 for none), and the token before each index entry of the block (0 before an entry
    at its start)."""

    id_top: int
    loss_top: int
    before: np.ndarray


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, in place: every input bit reaches every output bit."""
    x ^= x >> _U64(30)
    x *= _SEEDS[1]
    x ^= x >> _U64(27)
    x *= _SEEDS[2]
    x ^= x >> _U64(31)
    return x


def factors(sources: np.ndarray) -> np.ndarray:
    """Each source's factor (odd, so that multiplying by it loses nothing of a hash), one a piece."""
    return _mix(np.asarray(sources, dtype=_U64) + _SEEDS[2]) | _U64(1)


def sourced(contents: Contents, source: int) -> Contents:
    """Contents of pieces that are all of one ``source``, with it."""
    return Contents(contents.pieces, contents.tokens, (contents.sum * int(factors(np.array([source]))[0])) & MASK)


def of_sources(contents: Contents, hashes: np.ndarray, sources: np.ndarray) -> Contents:
    """``contents``, each index entry's piece of its source (one an entry, in order): ``hashes`` are the entries'
    (``ContentsHasher.entry_hashes``), kept by a writer that learns its entries' sources once it has written them."""
    scale = np.ones(len(hashes), _U64)
    given = np.asarray(sources, dtype=np.int64)[: len(hashes)]
    scale[: len(given)] = factors(given)
    return replace(contents, sum=int((hashes * scale).sum(dtype=_U64)))


def _weights(tokens: np.ndarray, loss: np.ndarray | None, y: np.ndarray, yj: np.ndarray) -> None:
    """Each token's ``y = (2 * token + loss + 1) ** 2`` and ``j * y`` (``j``: its position in the sub-block), into
    buffers of its length: new arrays of megabytes each time cost more than the arithmetic (each is mapped, faulted
    in and unmapped again: 11 ns a token)."""
    np.copyto(y, tokens, casting="unsafe")
    y <<= _U64(1)
    y += _U64(1) if loss is None else loss + np.uint8(1)
    y *= y
    np.multiply(y, _POSITIONS[: len(y)], out=yj)


def _piece_hashes(sums: np.ndarray, weighted: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each piece's 64-bit hash, from its two sums and its length."""
    h = _mix(lengths ^ _SEEDS[3])
    h ^= sums
    h = _mix(h + _SEEDS[0])
    h ^= weighted
    return _mix(h + _SEEDS[0])


@dataclass(frozen=True)
class Pieces:
    """Some of a stream's non-empty pieces, one by one: each one's two sums and its length, which its hash is made
    of, and a mixture's its source's factor (``scale``: None without). A stage that cuts its input's pieces smaller (at
    window edges, say) keeps those it cut as it writes them, so that they can be put back in the input's order and
    joined into the input's pieces, whose contents the input's records hold: its proof then reads no input byte
    again. (24 bytes a piece; 32 with its source.)"""

    sums: np.ndarray
    weighted: np.ndarray
    lengths: np.ndarray
    scale: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def concatenate(cls, parts: Sequence[Pieces]) -> Pieces:
        sums, weighted, lengths = (
            np.concatenate([getattr(p, f) for p in parts] or [np.zeros(0, _U64)]) for f in _PIECE_FIELDS
        )
        scaled = [p.scale for p in parts if p.scale is not None]
        if scaled and len(scaled) < len(parts):
            raise ValueError("pieces with their sources joined to pieces without: a bug")
        return cls(sums, weighted, lengths, np.concatenate(scaled) if scaled else None)

    def with_sources(self, sources: np.ndarray | None) -> Pieces:
        """These pieces, each of its source (one a piece; None: without)."""
        return replace(self, scale=None if sources is None else factors(sources))

    def take(self, order: np.ndarray) -> Pieces:
        """The pieces in ``order``."""
        scale = None if self.scale is None else self.scale[order]
        return Pieces(self.sums[order], self.weighted[order], self.lengths[order], scale)

    def joined(self, firsts: np.ndarray) -> Pieces:
        """Consecutive pieces joined end to end: piece k of the result is pieces ``firsts[k]`` up to ``firsts[k +
        1]`` (the last, up to the end); ``firsts`` starts at 0 and increases. (The parts of a piece share its
        source: the first's is the joined piece's.)"""
        if not len(self):
            return self
        before = np.cumsum(self.lengths) - self.lengths  # where each piece starts in the stream
        offsets = before - np.repeat(before[firsts], np.diff(np.append(firsts, len(self))))
        weighted = self.weighted + offsets * self.sums  # positions counted from the joined piece's start
        sums, weighted, lengths = (np.add.reduceat(a, firsts) for a in (self.sums, weighted, self.lengths))
        return Pieces(sums, weighted, lengths, None if self.scale is None else self.scale[firsts])

    def _hashes(self) -> np.ndarray:
        hashes = _piece_hashes(self.sums, self.weighted, self.lengths)
        return hashes if self.scale is None else hashes * self.scale

    def contents(self) -> Contents:
        return Contents(len(self), int(self.lengths.sum()), int(self._hashes().sum(dtype=_U64)))

    def times(self, uses: np.ndarray) -> Contents:
        """The contents of these pieces, each taken ``uses`` times (a mixture's: some twice, say)."""
        counts = np.asarray(uses, dtype=_U64)
        return Contents(
            int(counts.sum()), int((self.lengths * counts).sum()), int((self._hashes() * counts).sum(dtype=_U64))
        )


_PIECE_FIELDS = ("sums", "weighted", "lengths")


class ContentsHasher:
    """Hashes a stream given in consecutive parts, each with its index entries; a piece may span parts. With
    ``keep`` (the numbers of pieces in the stream, sorted; None: none) it keeps those pieces (``kept_pieces``), or
    hands them, in order, to ``into`` (``formats.kept``: a writer's, to disk). With
    ``sources`` (one an index entry, in order) each piece is of its entry's source; with ``hashes`` it keeps each
    entry's hash (``entry_hashes``), to give it its source once that is known (``formats.sidecar``). (Its sums are
    one-element arrays: numpy warns when a scalar wraps around, never when an array does.)"""

    def __init__(
        self,
        keep: np.ndarray | None = None,
        sources: np.ndarray | None = None,
        hashes: bool = False,
        into: Callable[[Pieces], None] | None = None,
    ) -> None:
        self.pieces = 0
        self.tokens = 0
        self._entries = 0  # pieces closed, empty ones too: the index entries hashed
        self._sum = np.zeros(1, _U64)
        self._open = (np.zeros(1, _U64), np.zeros(1, _U64), np.zeros(1, _U64))  # the piece not closed: sums, length
        self._keep = None if keep is None else np.asarray(keep, dtype=np.int64)
        self._kept: list[Pieces] = []
        self._into = into
        self._sources = None if sources is None else np.asarray(sources, dtype=np.int64)
        self._hashes: list[np.ndarray] | None = [] if hashes else None

    def add(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None = None) -> None:
        """The next tokens of the stream (and their loss bytes), with the index entries among them (relative to
        ``tokens``, sorted, each in ``[0, len(tokens)]``)."""
        hash_parts([self], tokens, loss, [ends])

    def checked(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None = None) -> Found:
        """``add``, and what the block holds for its checks (``Found``)."""
        return hash_parts([self], tokens, loss, [ends], check=True)

    def result(self) -> Contents:
        """The stream's contents; tokens after its last index entry count as one more piece."""
        self._close(*self._open)
        self._open = (np.zeros(1, _U64), np.zeros(1, _U64), np.zeros(1, _U64))
        return Contents(self.pieces, self.tokens, int(self._sum[0]))

    def _take(self, sa: np.ndarray, sb: np.ndarray, n: np.ndarray, tokens: int) -> None:
        """The segments of ``tokens`` tokens between their index entries: each one's two sums (positions counted from
        its start) and length; the first continues the piece left open, the last is left open."""
        self.tokens += tokens
        open_a, open_b, open_n = self._open
        sb[:1] += open_b + open_n * sa[:1]  # the first piece continues the one left open
        sa[:1] += open_a
        n[:1] += open_n
        self._open = (sa[-1:], sb[-1:], n[-1:])
        self._close(sa[:-1], sb[:-1], n[:-1])

    def _close(self, sa: np.ndarray, sb: np.ndarray, n: np.ndarray) -> None:
        """Add finished pieces; an empty one (two equal index entries) holds nothing and is not counted."""
        kept = n > 0
        first, self._entries = self._entries, self._entries + len(n)
        if not kept.all():
            sa, sb, n = sa[kept], sb[kept], n[kept]
        hashes = _piece_hashes(sa, sb, n)
        scaled = None
        if self._sources is not None:  # a piece past the last entry that has a source (tokens after the index): none
            given = self._sources[first : first + len(kept)]
            scaled = np.ones(len(n), _U64)
            scaled[: np.count_nonzero(kept[: len(given)])] = factors(given[kept[: len(given)]])
            hashes *= scaled
        if self._keep is not None:
            lo, hi = np.searchsorted(self._keep, [self.pieces, self.pieces + len(n)])
            chosen = self._keep[lo:hi] - self.pieces
            chosen_pieces = Pieces(sa[chosen], sb[chosen], n[chosen], None if scaled is None else scaled[chosen])
            if self._into is not None:
                self._into(chosen_pieces)
            else:
                self._kept.append(chosen_pieces)
        if self._hashes is not None:
            every = np.zeros(len(kept), _U64)
            every[kept] = hashes
            self._hashes.append(every)
        self.pieces += len(n)
        self._sum += hashes.sum(dtype=_U64, keepdims=True)

    def entry_hashes(self) -> np.ndarray:
        """Each index entry's piece's hash (0 for an empty one), in order, once ``result`` was taken."""
        if self._hashes is None:
            raise RuntimeError("a contents hasher keeps its entries' hashes only when asked (hashes=True)")
        return np.concatenate(self._hashes or [np.zeros(0, _U64)])

    @property
    def keeps(self) -> bool:
        return self._keep is not None

    @property
    def keeps_hashes(self) -> bool:
        return self._hashes is not None

    def kept_pieces(self) -> Pieces:
        """The pieces it was asked to keep and has closed, in order (joined into one, which it keeps instead)."""
        self._kept = [Pieces.concatenate(self._kept)]
        return self._kept[0]


def within(cuts: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The cuts that fall in a part ``[start, stop)`` of a stream, relative to it: those in ``(start, stop]``, and
    for the first part also those at 0 (they close the piece left open before it)."""
    lo = np.searchsorted(cuts, start, side="right" if start else "left")
    hi = np.searchsorted(cuts, stop, side="right")
    return cuts[lo:hi] - start


def hash_parts(
    hashers: Sequence[ContentsHasher],
    tokens: np.ndarray,
    loss: np.ndarray | None,
    ends: Sequence[np.ndarray],
    check: bool = False,
) -> Found:
    """Add the same tokens to several hashers, each cutting them at its own ``ends``: the weights, which are the
    cost, are computed once (in C, one pass a hasher). With ``check``, what the block holds for its checks, the
    token before each entry of ``ends[0]`` among it; without, an empty ``Found``."""
    ends = [np.asarray(e, dtype=np.int64) for e in ends]
    orderly = all(_orderly(e, len(tokens)) for e in ends)
    # A damaged index that verify reads never reaches the helper: numpy's values of it, which the report names, made
    # in the sub-blocks they always were (a segmented sum over entries out of order depends on where a part ends).
    lib = native.helper() if orderly else None
    step = C_BLOCK if orderly else SUB_BLOCK
    found = [Found(0, 0, np.zeros(0, np.int64))]
    for start in range(0, max(len(tokens), 1), step):  # once when empty: entries at 0 still close open pieces
        stop = min(len(tokens), start + step)
        part, part_loss = tokens[start:stop], None if loss is None else loss[start:stop]
        cuts = [within(c, start, stop) for c in ends]
        if lib is not None:
            segments = _c_segments(lib, part, part_loss, cuts, found)
        else:
            segments = _numpy_segments(part, part_loss, cuts, CHUNK if orderly else len(part))
        for hasher, (sa, sb, n) in zip(hashers, segments, strict=True):
            hasher._take(sa, sb, n, len(part))
    if not check:
        return found[0]
    if lib is not None:
        before = np.concatenate([f.before for f in found])
        return Found(max(f.id_top for f in found), max(f.loss_top for f in found), before)
    return _numpy_found(tokens, loss, ends[0])


def _orderly(cuts: np.ndarray, tokens: int) -> bool:
    """Whether index entries are sorted and within ``[0, tokens]``, as the helper takes them."""
    return not len(cuts) or (cuts[0] >= 0 and cuts[-1] <= tokens and not np.any(cuts[1:] < cuts[:-1]))


def _lengths(cuts: np.ndarray, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts and lengths of the segments that ``cuts`` cut ``tokens`` tokens into (one more than the cuts)."""
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    return starts, (np.append(cuts, tokens) - starts).astype(_U64)


def _c_segments(
    lib: ctypes.CDLL, tokens: np.ndarray, loss: np.ndarray | None, cuts: Sequence[np.ndarray], found: list[Found]
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each cutting's segment sums, a pass of the helper's ``tk_scan`` each (``scan.c``); the first pass's findings
    are appended to ``found``."""
    tokens = np.ascontiguousarray(tokens)
    if tokens.dtype not in (np.uint16, np.uint32):
        tokens = tokens.astype(np.uint32)  # the ids of any integer type, as the numpy path takes them
    loss = None if loss is None else np.ascontiguousarray(loss, dtype=np.uint8)
    pointer = None if loss is None else loss.ctypes.data
    for k, c in enumerate(cuts):
        c = np.ascontiguousarray(c, dtype=np.int64)
        sums, weighted = np.empty(len(c) + 1, _U64), np.empty(len(c) + 1, _U64)
        before, tops = np.zeros(len(c), _U64), np.zeros(2, _U64)
        done = lib.tk_scan(
            tokens.ctypes.data,
            tokens.itemsize,
            pointer,
            len(tokens),
            c.ctypes.data,
            len(c),
            sums.ctypes.data,
            weighted.ctypes.data,
            before.ctypes.data,
            tops.ctypes.data,
        )
        if done:
            raise RuntimeError(f"the C helper refused a block ({done}): its entries are not sorted within it")
        if k == 0:
            found.append(Found(int(tops[0]), int(tops[1]), before.astype(np.int64)))
        yield sums, weighted, _lengths(c, len(tokens))[1]


def _numpy_segments(
    tokens: np.ndarray, loss: np.ndarray | None, cuts: Sequence[np.ndarray], chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each cutting's segment sums. The weights are made ``chunk`` tokens at a time (``_weights``), once for every
    cutting, in two buffers that stay in the cache, and summed there by segment: the chunks' edges cut the segments
    further, into parts whose sums are added up once the block is done (a few numpy calls a chunk, none a segment)."""
    size = len(tokens)
    edges = np.arange(0, size, chunk)
    plans = []
    for c in cuts:
        starts, n = _lengths(c, size)
        full = n > 0  # the non-empty segments tile the block
        parts = starts[full] if len(edges) < 2 else sorted_union(starts[full], edges)
        plans.append((starts, n, full, parts, np.append(np.searchsorted(parts, edges), len(parts))))
    sums = [np.empty((2, len(parts)), _U64) for *_, parts, _ in plans]
    y, yj = np.empty((2, min(size, chunk)), _U64)
    for k, lo in enumerate(edges.tolist()):
        hi = min(size, lo + chunk)
        _weights(tokens[lo:hi], None if loss is None else loss[lo:hi], y[: hi - lo], yj[: hi - lo])
        for (*_, parts, at), (sa, sb) in zip(plans, sums, strict=True):
            first, last = at[k], at[k + 1]
            local = parts[first:last] - lo
            np.add.reduceat(y[: hi - lo], local, out=sa[first:last])
            np.add.reduceat(yj[: hi - lo], local, out=sb[first:last])
    for (starts, n, full, parts, _), (part_a, part_b) in zip(plans, sums, strict=True):
        if len(edges) > 1:  # the parts' positions from their chunk's start to the block's, then a sum a segment
            part_b += (parts - parts % chunk).astype(_U64) * part_a
            firsts = np.searchsorted(parts, starts[full])
            part_a, part_b = np.add.reduceat(part_a, firsts), np.add.reduceat(part_b, firsts)
        sa, sb = np.zeros(len(starts), _U64), np.zeros(len(starts), _U64)
        sa[full], sb[full] = part_a, part_b
        sb -= starts.astype(_U64) * sa  # positions counted from each segment's start
        yield sa, sb, n


def sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted entries of two sorted index arrays, each once: ``np.union1d``'s result, whose hashing took 1.4 s
    for 1.1 million document ends and 0.2 million window ends (numpy 2.4), where sorting the two runs takes 6 ms."""
    both = np.concatenate([np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)])
    both.sort(kind="stable")  # a merge of the two runs
    return both[np.concatenate([[True], both[1:] != both[:-1]])] if len(both) else both


def _numpy_found(tokens: np.ndarray, loss: np.ndarray | None, cuts: np.ndarray) -> Found:
    """``Found`` of a block, a numpy pass a check."""
    id_top = int(tokens.max()) if len(tokens) else 0
    loss_top = int(loss.max()) if loss is not None and len(loss) else 0
    before = np.zeros(len(cuts), np.int64)
    if len(tokens):
        inside = cuts > 0
        before[inside] = tokens[cuts[inside] - 1]
    return Found(id_top, loss_top, before)


def stream_contents(
    read: Callable[[int, int], tuple[np.ndarray, np.ndarray | None]],
    spans: Sequence[tuple[np.ndarray, int]],
    block: int = READ_BLOCK,
    sources: Sequence[np.ndarray | None] | None = None,
) -> list[Contents]:
    """The contents of a stream that ``read(start, stop)`` gives (tokens, loss bytes or None), once for each span
    ``(cuts, tokens)``: its first ``tokens`` tokens cut at ``cuts`` (sorted, within ``[0, tokens]``), each piece
    of its source where ``sources`` gives a span's (one a cut). The stream is read once, in blocks, and each block
    hashed once for the spans that reach its end."""
    hashers = [ContentsHasher(sources=given) for given in (sources or [None] * len(spans))]
    cuts = [np.asarray(c, dtype=np.int64) for c, _ in spans]
    longest = max((n for _, n in spans), default=0)
    for start in range(0, longest, block):
        stop = min(longest, start + block)
        tokens, loss = read(start, stop)
        for end in sorted({min(stop, n) for _, n in spans if n > start}):  # one, but where a span ends inside
            group = [k for k, (_, n) in enumerate(spans) if min(stop, n) == end]
            part = slice(0, end - start)
            hash_parts(
                [hashers[k] for k in group],
                tokens[part],
                None if loss is None else loss[part],
                [within(cuts[k], start, end) for k in group],
            )
    return [h.result() for h in hashers]


def contents_each(tokens: np.ndarray, loss: np.ndarray | None, cuts: np.ndarray, firsts: np.ndarray) -> list[Contents]:
    """The contents of streams laid end to end in ``tokens`` (and ``loss``), each its own: ``cuts`` are their index
    entries, sorted, relative to ``tokens``, each stream's last at its own end (so that no piece runs from one into
    the next), and ``firsts`` where each stream's entries start among them (every stream has one at least). Hashed
    in one pass, as one stream is, and summed a stream at a time: many small streams (a rank's cache hits of
    one-line files) cost a pass, not a pass each."""
    hasher = ContentsHasher(hashes=True)
    hasher.add(tokens, cuts, loss)
    hasher.result()
    hashes = hasher.entry_hashes()[: len(cuts)]
    lengths = np.diff(cuts, prepend=0)
    sums = np.add.reduceat(hashes, firsts)  # modulo 2^64, as a stream's sum is
    pieces = np.add.reduceat((lengths > 0).astype(np.int64), firsts)
    ends = np.append(cuts[firsts[1:] - 1], cuts[-1]) if len(firsts) else firsts
    sizes = np.diff(ends, prepend=0)
    return [Contents(int(p), int(n), int(h)) for p, n, h in zip(pieces, sizes, sums, strict=True)]


def stream_uses(
    read: Callable[[int, int], tuple[np.ndarray, np.ndarray | None]],
    cuts: np.ndarray,
    tokens: int,
    uses: np.ndarray,
    block: int = READ_BLOCK,
    sources: np.ndarray | None = None,
) -> tuple[Contents, Contents]:
    """The contents of a stream's first ``tokens`` tokens cut at ``cuts`` (as ``stream_contents``, each piece of
    its source where ``sources`` gives them), and of its pieces each taken ``uses`` times (one a piece): what a
    mixture's merge read, and what its files must hold."""
    uses = np.asarray(uses, dtype=np.int64)
    hasher = ContentsHasher(keep=np.flatnonzero(uses), sources=sources)
    cuts = np.asarray(cuts, dtype=np.int64)
    for start in range(0, tokens, block):
        stop = min(tokens, start + block)
        part, loss = read(start, stop)
        hash_parts([hasher], part, loss, [within(cuts, start, stop)])
    whole = hasher.result()
    return whole, hasher.kept_pieces().times(uses[uses > 0])
