"""The one byte-moving engine shared by the document, chunk and window shuffles and by the merge.

A *unit* is a contiguous token range ``[start, end)`` of one source file: a document, a fixed-size chunk or a
context window. :func:`move_units` writes units in a given order over bounded blocks: it reads a block's units
with large or batched ``pread`` calls straight into their places (or puts them in order with Arrow's ``take``),
and rebuilds the index: every unit end becomes an entry, and the source index entries that fall strictly inside a
moved unit move with it. No Python runs per unit or per token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from tokenization.formats import native
from tokenization.formats.contents import Contents
from tokenization.formats.ds import LOSS_DTYPE, SplitWriter, TokenFile, WrittenTokenFile
from tokenization.formats.source_pool import SourcePool
from tokenization.progress import Progress

if TYPE_CHECKING:
    import pyarrow as pa  # imported where a block is gathered: a stage's start (--help) goes without it

BLOCK_TOKENS = 1 << 22  # tokens gathered per write: 8-16 MiB of output; 1 Mi-token blocks took 25% longer
# A source's units in a block are read as one span when it is at most this many times what they hold, else with
# one pread each: a pread costs ~2 us (a page-cache lookup) plus its copy, so reading 2x the bytes in one call is
# cheaper than one call a unit as soon as units are a few hundred bytes. (Memory maps cost more here: ~6-20 us a
# scattered unit in faults and in dropping the pages again to keep resident memory flat.)
SPAN_READ_MAX_WASTE = 2
GATHERED_AT_ONCE = 2  # blocks gathered at once, each on a thread, where no file is closed meanwhile (``move_units``)

T = TypeVar("T")


class Units(NamedTuple):
    """Units (documents, chunks, windows) of several source files: unit ``i`` is tokens ``[starts[i], ends[i])`` of
    source ``source[i]``; ``move_units(pool, *units, writer)`` writes them in this order."""

    source: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def documents(cls, paths: Sequence[str], token_size: int) -> Units:
        """Every document of these local families, file after file, as their indexes end them."""
        ends = [np.asarray(TokenFile(path, token_size).ends, dtype=np.int64) for path in paths]
        counts = [len(e) for e in ends]
        source = np.repeat(np.arange(len(paths), dtype=np.int64), counts)
        starts = [starts_of(e) for e in ends]
        joined = (np.concatenate(parts) if parts else np.empty(0, np.int64) for parts in (starts, ends))
        return cls(source, *joined)

    def take(self, order: np.ndarray) -> Units:
        """The units in ``order``."""
        return Units(self.source[order], self.starts[order], self.ends[order])


def written_contents(written: Sequence[WrittenTokenFile]) -> Contents:
    """What these files hold together, as their writers hashed it."""
    return Contents.total(w.contents for w in written)


def starts_of(ends: np.ndarray) -> np.ndarray:
    """The start of each unit of an index (exclusive ends): 0, then each end but the last. An empty index has no
    unit, so no start."""
    ends = np.asarray(ends, dtype=np.int64)
    return np.concatenate([[0], ends])[: len(ends)]


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    total = int(lengths.sum())
    out_starts = np.cumsum(lengths) - lengths
    index = np.arange(total, dtype=np.int64)
    index += np.repeat(np.asarray(starts, dtype=np.int64) - out_starts, lengths)
    return index


def prefix_end(ends: np.ndarray, count: int) -> int:
    """Where the first ``count`` units of an index end (0 for none): the tokens kept when the rest are dropped."""
    return int(ends[count - 1]) if count else 0


def fixed_units(total: int, size: int) -> tuple[np.ndarray, int]:
    """End offsets of ``size``-token units over ``total`` tokens, the partial tail included as a last unit,
    and the number of full units."""
    full = total // size
    ends = np.arange(1, full + 1, dtype=np.int64) * size
    if total % size:
        ends = np.append(ends, total)
    return ends, full


def move_units(
    pool: SourcePool,
    source: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    writer: SplitWriter,
    inner: Sequence[np.ndarray] | None = None,
    block_tokens: int = BLOCK_TOKENS,
    progress: Progress | None = None,
) -> None:
    """Write unit ``i`` = ``pool[source[i]][starts[i]:ends[i]]`` for every i, in order, to ``writer``.

    ``inner[s]`` (sorted) are the index entries of source ``s`` to carry along, such as document ends inside
    chunks. A unit longer than ``block_tokens`` is copied in slices, so memory is bounded by the block size,
    not by the largest unit. Blocks are gathered on threads of their own while the caller hands the one before
    to the writer (``_ahead``): the reads, one a unit in a shuffle, are most of the caller's work, and they release
    the GIL. Two are gathered at once where the pool never closes a file (``SourcePool.closes_files``): one
    gathering thread was busy ~75% of a context shuffle, the writing and hashing threads waiting on it.
    """
    depth = 1 if pool.closes_files else GATHERED_AT_ONCE
    for block in _ahead(_blocks(pool, source, starts, ends, inner, block_tokens), depth):
        writer.write(block.tokens, block.unit_ends, block.entries, block.loss)
        if progress is not None:
            progress.advance(len(block.tokens), units=block.units, tokens=len(block.tokens))


class _Block(NamedTuple):
    """What ``move_units`` hands its writer at once: tokens, the unit ends and index entries in them, loss bytes
    (or None), and how many units end in it."""

    tokens: np.ndarray
    unit_ends: np.ndarray
    entries: np.ndarray
    loss: np.ndarray | None
    units: int


def _blocks(
    pool: SourcePool,
    source: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    inner: Sequence[np.ndarray] | None,
    block_tokens: int,
) -> Iterator[Callable[[], _Block]]:
    """``move_units``' blocks, in order, each as the call that gathers it: whole units of at most ``block_tokens``
    tokens, or slices of a longer one."""
    source = np.asarray(source)  # any integer type: packed windows name their two sources in a byte
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out_ends = np.cumsum(ends - starts)
    a = 0
    while a < len(starts):
        base = int(out_ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(out_ends, base + block_tokens, side="right")))
        if b == a + 1 and out_ends[a] - base > block_tokens:
            yield from _long_unit(pool, int(source[a]), int(starts[a]), int(ends[a]), inner, block_tokens)
        else:
            yield partial(_gathered, pool, source[a:b], starts[a:b], ends[a:b], out_ends[a:b] - base, inner)
        a = b


def _ahead(makers: Iterator[Callable[[], T]], depth: int) -> Iterator[T]:
    """What ``makers`` make, in order, each made on a thread of its own while the caller uses the ones before (at
    most ``depth`` ahead); an error making one is raised where the caller asks for it."""
    with ThreadPoolExecutor(depth, thread_name_prefix="gather") as threads:
        pending = deque(threads.submit(make) for make in islice(makers, depth))
        while pending:
            item = pending.popleft().result()
            if (make := next(makers, None)) is not None:
                pending.append(threads.submit(make))
            yield item


def _gathered(
    pool: SourcePool,
    source: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    rel_ends: np.ndarray,
    inner: Sequence[np.ndarray] | None,
) -> _Block:
    """Read one block of units, one source file at a time, in output order: straight into the block's buffers
    (``_copied``), by the C helper, or without it where every source's units lie apart (a shuffle's: one ``preadv``
    a unit, as they would be read anyway, but no second copy and no new buffer); else read as spans and put in order
    with Arrow's ``take`` (one memcpy a unit, looped in C: 0.2 us a unit, read included, where a Python loop of
    slices cost ~1 us)."""
    out_starts = rel_ends - (ends - starts)
    by_source = np.argsort(source, kind="stable")
    ids, firsts = np.unique(source[by_source], return_index=True)
    groups = list(zip(ids.tolist(), np.split(by_source, firsts[1:]), strict=True))
    moved = [rel_ends]
    if inner is not None:
        moved += [_moved_inner_ends(inner[s], starts[g], ends[g], out_starts[g]) for s, g in groups]
    lib = native.helper()
    if lib is not None or not any(_spanned(starts[g], ends[g]) for _, g in groups):  # no tk_copy is needed
        tokens, loss = _copied(lib, pool, groups, starts, ends, out_starts, int(rel_ends[-1]))
    else:
        tokens, loss = _taken(pool, groups, starts, ends, len(by_source))
    index = rel_ends if inner is None else np.sort(np.concatenate(moved))
    return _Block(tokens.view(pool.dtype), rel_ends, index, loss, len(starts))


def _copied(
    lib: Any,
    pool: SourcePool,
    groups: list[tuple[int, np.ndarray]],
    starts: np.ndarray,
    ends: np.ndarray,
    out_starts: np.ndarray,
    total: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The block's tokens and loss bytes (or None) as uint8 arrays of the pool's ``blocks``, each source's units
    in their places: read straight there by ``tk_pread`` (one ``preadv`` a run of units that lie end to end, as a
    merge's do: no copy but the kernel's; without the helper, one a unit), or read as one span where they lie close
    together but apart (``_spanned``) and copied there by ``tk_copy`` (``lib``: the helper, never None then)."""
    sizes = (pool.dtype.itemsize, LOSS_DTYPE.itemsize)
    tokens = pool.blocks[0].take(total * sizes[0])
    outs = [tokens, pool.blocks[1].take(total * sizes[1]) if pool.with_loss else None]
    for s, group in groups:
        first, last, to = starts[group], ends[group], out_starts[group]
        if np.array_equal(first[1:], last[:-1]) or not _spanned(first, last):
            pool.read_into(s, first, last, outs, to)
            continue
        lo = int(first.min())
        lengths = last - first
        for data, out, n in zip(pool.read(s, lo, int(last.max())), outs, sizes, strict=True):
            if data is not None and out is not None:
                offsets = [np.ascontiguousarray(a * n, dtype=np.int64) for a in (first - lo, lengths, to)]
                args = (data.ctypes.data, data.nbytes, *(a.ctypes.data for a in offsets[:2]), len(group))
                if lib.tk_copy(*args, out.ctypes.data, out.nbytes, offsets[2].ctypes.data) != 0:
                    raise ValueError(f"a unit of source {s} lies outside what was read of it")
    return tokens, outs[1]


def _taken(
    pool: SourcePool, groups: list[tuple[int, np.ndarray]], starts: np.ndarray, ends: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The block's tokens and loss bytes (or None) as uint8 arrays, put in order by Arrow's ``take``."""
    parts = [_read_units(pool, s, starts[group], ends[group]) for s, group in groups]
    flat = np.concatenate([group for _, group in groups])
    order = np.empty(count, np.int64)
    order[flat] = np.arange(count)  # output unit j is unit order[j] of the parts, end to end
    tokens, loss = (_in_order([p[k] for p in parts], order) for k in (0, 1))
    if tokens is None:
        raise RuntimeError("a block's tokens were not read")  # _read_units reads them always; loss only if kept
    return tokens, loss


def _read(
    pool: SourcePool, s: int, starts: np.ndarray, ends: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray | None], np.ndarray]:
    """One source's units of a block: its bytes read (tokens, loss bytes or None) and where each unit starts in
    them, in items: read as one span when they lie close together (a merge's interleave reads each file in order),
    else with one ``pread`` each, end to end."""
    if _spanned(starts, ends):
        lo = int(starts.min())
        return pool.read(s, lo, int(ends.max())), starts - lo
    lengths = ends - starts
    return pool.read_each(s, starts, ends), np.cumsum(lengths) - lengths


def _spanned(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether one source's units of a block are read as one span: when it holds at most ``SPAN_READ_MAX_WASTE``
    times their tokens (a merge's interleave reads each file in order; a shuffle's units lie far apart)."""
    return int(ends.max()) - int(starts.min()) <= SPAN_READ_MAX_WASTE * int((ends - starts).sum())


def _read_units(pool: SourcePool, s: int, starts: np.ndarray, ends: np.ndarray) -> list[pa.LargeBinaryArray | None]:
    """One source's units of a block, as [tokens, loss bytes or None], each one binary array of the units in the
    given order."""
    found, at = _read(pool, s, starts, ends)
    sizes = (pool.dtype.itemsize, LOSS_DTYPE.itemsize)
    stop = at + (ends - starts)
    return [None if d is None else _units(d, at * n, stop * n) for d, n in zip(found, sizes, strict=True)]


def _units(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.LargeBinaryArray:
    """Bytes ``data[starts[k]:ends[k]]`` for every k, as one binary array: zero-copy when the units lie end to
    end in this order, else gathered by ``take``. A unit given more than once (a mixture's repeats) is gathered once
    and taken as often; Arrow trusts the offsets, so units that otherwise overlap are refused."""
    import pyarrow as pa

    buffer = pa.py_buffer(data)
    if np.array_equal(starts[1:], ends[:-1]):
        return _binary(np.append(starts, ends[-1]), buffer)
    by_start = np.lexsort((ends, starts))  # an empty unit before the one that starts where it does
    s, e = starts[by_start], ends[by_start]
    first = np.ones(len(by_start), bool)
    first[1:] = (s[1:] != s[:-1]) | (e[1:] != e[:-1])
    if not first.all():
        distinct = by_start[first]
        position = np.empty_like(by_start)
        position[by_start] = np.cumsum(first) - 1  # each unit's place among the distinct ones, in sorted order
        return _units(data, starts[distinct], ends[distinct]).take(pa.array(position))
    bounds = np.column_stack([starts[by_start], ends[by_start]]).ravel()  # entry 2k: unit; 2k + 1: gap after it
    if np.any(bounds[1:] < bounds[:-1]):
        raise ValueError("units of one source overlap")
    rank = np.empty_like(by_start)
    rank[by_start] = np.arange(len(by_start))
    return _binary(bounds, buffer).take(pa.array(2 * rank))


def _binary(offsets: np.ndarray, data: pa.Buffer) -> pa.LargeBinaryArray:
    import pyarrow as pa

    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), data])


def _in_order(parts: list[pa.LargeBinaryArray | None], order: np.ndarray) -> np.ndarray | None:
    """The bytes of unit ``order[0]``, ``order[1]``, ... of the parts (end to end), as one uint8 array."""
    import pyarrow as pa

    if parts[0] is None:
        return None
    whole = parts[0] if len(parts) == 1 else pa.concat_arrays(parts).take(pa.array(order))
    _, offsets, data = whole.buffers()
    first, last = np.frombuffer(offsets, np.int64)[[whole.offset, whole.offset + len(whole)]]
    return np.frombuffer(data, np.uint8)[first:last]


def _moved_inner_ends(inner: np.ndarray, starts: np.ndarray, ends: np.ndarray, out_starts: np.ndarray) -> np.ndarray:
    """The source entries strictly inside each unit, moved to the unit's new place (in no particular order)."""
    by_start = np.argsort(starts)  # sorted keys: each binary search starts where the last one ended, 2x faster
    starts, ends, out_starts = starts[by_start], ends[by_start], out_starts[by_start]
    lo = np.searchsorted(inner, starts, side="right")
    hi = np.searchsorted(inner, ends, side="left")
    counts = hi - lo
    return inner[ranges(lo, counts)].astype(np.int64) + np.repeat(out_starts - starts, counts)


def _long_unit(
    pool: SourcePool, s: int, start: int, end: int, inner: Sequence[np.ndarray] | None, block_tokens: int
) -> Iterator[Callable[[], _Block]]:
    """One unit too large for a block as consecutive slices, each the call that reads it; it stays one unit for
    file splitting."""
    for piece_start in range(start, end, block_tokens):
        yield partial(_slice, pool, s, piece_start, min(end, piece_start + block_tokens), end, inner)


def _slice(
    pool: SourcePool, s: int, piece_start: int, piece_end: int, end: int, inner: Sequence[np.ndarray] | None
) -> _Block:
    """Tokens ``[piece_start, piece_end)`` of source ``s``, a slice of the long unit that ends at ``end``."""
    entries = np.empty(0, dtype=np.int64)
    if inner is not None:
        lo, hi = np.searchsorted(inner[s], [piece_start, piece_end], side="right")
        entries = inner[s][lo:hi].astype(np.int64)
        entries = entries[entries < end] - piece_start
    unit_ends = np.array([piece_end - piece_start] if piece_end == end else [], dtype=np.int64)
    tokens, loss = pool.read(s, piece_start, piece_end)
    return _Block(tokens, unit_ends, np.concatenate([entries, unit_ends]), loss, len(unit_ends))


def permute_units(
    pool: SourcePool,
    ends: np.ndarray,
    order: np.ndarray,
    writer: SplitWriter,
    inner_ends: np.ndarray | None = None,
    block_tokens: int = BLOCK_TOKENS,
    progress: Progress | None = None,
) -> None:
    """Write the units of source 0, cut by ``ends``, in the order ``order`` (the one-file shuffles)."""
    ends = np.asarray(ends, dtype=np.int64)
    starts = starts_of(ends)
    inner = None if inner_ends is None else [np.asarray(inner_ends, dtype=np.int64)]
    move_units(pool, np.zeros(len(order), np.int64), starts[order], ends[order], writer, inner, block_tokens, progress)
