"""The one byte-moving engine shared by the document, chunk and window shuffles and by the merge.

A *unit* is a contiguous token range ``[start, end)`` of one source file: a document, a fixed-size chunk or a
context window. :func:`move_units` writes units in a given order over bounded blocks: it reads a block's units
with large or batched ``pread`` calls, puts them in order with Arrow's ``take`` (one memcpy a unit, looped in C),
and rebuilds the index: every unit end becomes an entry, and the source index entries that fall strictly inside a
moved unit move with it. No Python runs per unit or per token.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from functools import partial
from itertools import repeat
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from tokenization.formats import native
from tokenization.formats.contents import READ_BLOCK, Contents, Pieces, stream_contents, stream_uses
from tokenization.formats.ds import LOSS_DTYPE, SplitWriter, TokenFile, TokenFileError, WrittenTokenFile, token_dtype
from tokenization.progress import Progress
from tokenization.storage.concurrent import files_at_once, map_concurrently
from tokenization.storage.folder import StorageOptions, file_at, writing

if TYPE_CHECKING:
    import pyarrow as pa  # imported where a block is gathered: a stage's start (--help) goes without it

BLOCK_TOKENS = 1 << 22  # tokens gathered per write: 8-16 MiB of output; 1 Mi-token blocks took 25% longer
MAX_OPEN_FILES = 128
# A source's units in a block are read as one span when it is at most this many times what they hold, else with
# one pread each: a pread costs ~2 us (a page-cache lookup) plus its copy, so reading 2x the bytes in one call is
# cheaper than one call a unit as soon as units are a few hundred bytes. (Memory maps cost more here: ~6-20 us a
# scattered unit in faults and in dropping the pages again to keep resident memory flat.)
SPAN_READ_MAX_WASTE = 2
BLOCK_ROUND = 1 << 20  # block buffers are made in whole MiB, so that one serves blocks of slightly other sizes

T = TypeVar("T")


class Blocks:
    """Buffers of blocks of bytes, each used again once nothing holds it (no view of it is alive: its reference
    count says so), so that a block's bytes go to pages already mapped. A new buffer of a few MiB costs the
    kernel's faults and the zeroing of its pages (huge pages here): ~7% of a context shuffle's CPU, and on the
    thread that moves the bytes. A writer holds a block until its threads have written and hashed it: a few are in
    use at once; past ``keep`` buffers, a block gets a new one."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._made: list[np.ndarray] = []
        self._idle = _references([np.empty(0, np.uint8)])[0]  # a buffer only the list holds, on this Python

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` uint8 bytes nothing else holds (their content left as it was)."""
        for buffer, references in zip(self._made, _references(self._made), strict=True):
            if references == self._idle and buffer.nbytes >= nbytes:
                return buffer[:nbytes]
        buffer = np.empty(-(-nbytes // BLOCK_ROUND) * BLOCK_ROUND, np.uint8)
        if len(self._made) < self.keep:
            self._made.append(buffer)
        return buffer[:nbytes]


def _references(arrays: list[np.ndarray]) -> list[int]:
    """Each array's reference count, as counted here (``Blocks`` compares it with an idle buffer's)."""
    return [sys.getrefcount(a) for a in arrays]


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


class SourcePool:
    """Source token files, opened on demand, at most ``max_open`` at a time (least recently used first out), so
    the number of open files stays bounded whatever the number of inputs. Remote files are copied to
    ``cache_dir`` once, with large sequential reads, because the moves read them at random.

    Units are read with ``pread`` into private buffers, never mapped: resident memory stays that of a block. Loss
    bytes are read on a thread of their own while the tokens are read (``pread`` releases the GIL): scattered
    units cost ~2 us a call, and this halves the wait for them. Used with ``with``, which closes every file, stops
    the thread and deletes the cache, on errors too.
    """

    def __init__(
        self,
        urls: Sequence[str],
        token_size: int,
        with_loss: bool,
        max_open: int = MAX_OPEN_FILES,
        cache_dir: Path | None = None,
        storage_options: StorageOptions | None = None,
    ):
        self.urls = list(urls)
        self.storage_options = storage_options
        self.token_size = token_size
        self.dtype = token_dtype(token_size)
        self.with_loss = with_loss
        self.max_open = max_open
        self.cache_dir = cache_dir
        self._open: OrderedDict[int, _Source] = OrderedDict()
        self._checked: set[int] = set()  # sources whose files were checked once: opening one again is two opens
        self._fetching = threading.Lock()  # a remote source is copied once, whichever thread asks first
        self._loss_reader = ThreadPoolExecutor(1, thread_name_prefix="read-loss") if with_loss else None
        self.blocks = (Blocks(), Blocks())  # for the tokens and the loss bytes of the blocks gathered

    def _source(self, i: int) -> _Source:
        if i in self._open:
            self._open.move_to_end(i)
            return self._open[i]
        while len(self._open) >= self.max_open:
            self._open.popitem(last=False)[1].close()
        self._open[i] = self.private(i)
        return self._open[i]

    def private(self, i: int) -> _Source:
        """Source ``i`` opened with descriptors of its own, outside the pool's: the caller closes it. A thread may
        read it while another moves units through the pool, which closes its least recently used files."""
        path = self._local(i)
        if i not in self._checked:
            TokenFile(path, self.token_size)  # raises when the file is missing or its metadata gives another size
            self._checked.add(i)
        return _Source(path, self.token_size, self.with_loss)

    def read(self, i: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and loss bytes) ``[start, stop)`` of source ``i``, read into new arrays."""
        return self._both(self._source(i).pread_span, start, stop)

    def read_each(self, i: int, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and loss bytes) of every unit ``[starts[k], ends[k])`` of source ``i``, end to end in this order,
        one ``pread`` a unit."""
        return self._both(self._source(i).pread_each, starts, ends)

    def read_into(
        self, i: int, starts: np.ndarray, ends: np.ndarray, outs: Sequence[np.ndarray | None], to: np.ndarray
    ) -> None:
        """Tokens (and loss bytes) of every unit ``[starts[k], ends[k])`` of source ``i`` into the bytes ``outs[0]``
        (and ``outs[1]``) at item ``to[k]``, one ``pread`` a unit straight into its place."""
        self._both(self._source(i).pread_into, starts, ends, outs, to)

    def _both(self, read: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
        """``read(0, *args)`` (the tokens) here while ``read(1, *args)`` (the loss bytes) runs on the loss thread."""
        loss = self._loss_reader.submit(read, 1, *args) if self._loss_reader else None
        return read(0, *args), loss.result() if loss else None

    @property
    def open_count(self) -> int:
        return len(self._open)

    def fetch(self, sizes: Sequence[int]) -> None:
        """Copy every remote source to the cache now (``sizes``: their ``.ds`` bytes), several at once
        (``files_at_once``)."""
        map_concurrently(self._local, range(len(self.urls)), workers=files_at_once(max(sizes, default=1)))

    def _local(self, i: int) -> str:
        folder, name = file_at(self.urls[i], self.storage_options)
        if folder.local is not None:
            return folder.path_of(name)
        if self.cache_dir is None:
            raise ValueError(f"{self.urls[i]} is remote: a local cache_dir is needed to read it at random")
        local = self.cache_dir / f"{i:06d}" / name
        with self._fetching:
            if not local.exists():  # the tokens and loss bytes: the pool is given the token size, not the metadata
                for suffix in [""] + [".loss"] * self.with_loss:
                    with writing(f"{local}{suffix}"):
                        local.parent.mkdir(parents=True, exist_ok=True)
                        folder.fetch(name + suffix, Path(f"{local}{suffix}"))
        return str(local)

    def __enter__(self) -> SourcePool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loss_reader is not None:
            self._loss_reader.shutdown()
        for source in self._open.values():
            source.close()
        self._open.clear()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


class _Source:
    """One open source: a descriptor for its tokens and one for its loss bytes."""

    def __init__(self, path: str, token_size: int, with_loss: bool):
        self.paths = [path] + ([path + ".loss"] if with_loss else [])
        self.dtypes = [token_dtype(token_size), LOSS_DTYPE]
        self.fds = [os.open(p, os.O_RDONLY) for p in self.paths]

    def pread_span(self, which: int, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` of file ``which`` (0 tokens, 1 loss) in a new array; a short file is an error."""
        out = np.empty(stop - start, self.dtypes[which])
        # numpy declares ndarray's buffer protocol (__buffer__) for Python 3.12 and later only
        view, offset = memoryview(out).cast("B"), start * out.itemsize  # type: ignore[arg-type]
        while len(view):
            got = os.preadv(self.fds[which], [view], offset)
            if got == 0:
                raise TokenFileError(f"{self.paths[which]}: ends before byte {offset + len(view)}")
            view, offset = view[got:], offset + got
        return out

    def pread_each(self, which: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Items ``[starts[k], ends[k])`` of file ``which`` (0 tokens, 1 loss) end to end, as bytes (``pread_into``)."""
        lengths = ends - starts
        outs = [np.empty(int(lengths.sum()) * self.dtypes[which].itemsize, np.uint8)] * 2
        self.pread_into(which, starts, ends, outs, np.cumsum(lengths) - lengths)
        return outs[which]

    def pread_into(
        self, which: int, starts: np.ndarray, ends: np.ndarray, outs: Sequence[np.ndarray | None], to: np.ndarray
    ) -> None:
        """Items ``[starts[k], ends[k])`` of file ``which`` (0 tokens, 1 loss) into the bytes ``outs[which]`` at item
        ``to[k]``, each read straight into its place: by the C helper's ``tk_pread``, a block's reads in one call
        without the GIL, else one ``preadv`` each looped by ``map`` in C (2.5 us a 4 kB unit, where a ``pread`` a
        unit and joining their bytes took 9 us); a short file is an error."""
        out, size = outs[which], self.dtypes[which].itemsize
        if out is None:
            raise ValueError(f"{self.paths[which]}: no buffer to read into")
        places, lengths = (np.ascontiguousarray(a * size, dtype=np.int64) for a in (to, ends - starts))
        lib = native.helper()
        if lib is not None:
            fds = np.full(len(starts), self.fds[which], np.intc)
            offsets = np.ascontiguousarray(starts * size, dtype=np.int64)
            args = (a.ctypes.data for a in (fds, offsets, lengths, places))
            got = lib.tk_pread(*args, len(fds), out.ctypes.data)
            if got < 0:
                raise OSError(-got, os.strerror(-got), self.paths[which])
        else:
            # numpy declares ndarray's buffer protocol (__buffer__) for Python 3.12 and later only
            views = map(memoryview(out).__getitem__, map(slice, places.tolist(), (places + lengths).tolist()))  # type: ignore[arg-type]
            got = sum(map(os.preadv, repeat(self.fds[which]), zip(views), (starts * size).tolist()))
        if got != int(lengths.sum()):
            raise TokenFileError(f"{self.paths[which]}: ends before byte {int(ends.max()) * size}")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def contents_of(
    pool: SourcePool, i: int, *spans: tuple[np.ndarray, int], sources: Sequence[np.ndarray | None] | None = None
) -> list[Contents]:
    """The contents of source ``i`` for each span ``(cuts, tokens)``: its first ``tokens`` tokens cut at ``cuts``
    (``formats.contents.stream_contents``; each piece of its mixture source where ``sources`` gives a span's, one a
    cut), read once in large ``pread`` blocks with descriptors of its own, so that a stage hashes its inputs on a
    thread of their own while it moves their units (``SourcePool.private``)."""
    with closing(pool.private(i)) as source:
        return stream_contents(partial(_read_both, pool, source), spans, sources=sources)


def uses_contents(
    pool: SourcePool, i: int, cuts: np.ndarray, tokens: int, uses: np.ndarray, sources: np.ndarray | None = None
) -> tuple[Contents, Contents]:
    """Source ``i``'s contents cut at ``cuts``, and those of its pieces each taken ``uses`` times, each piece of its
    mixture source where ``sources`` gives them (``formats.contents.stream_uses``), read as ``contents_of`` reads."""
    with closing(pool.private(i)) as source:
        return stream_uses(partial(_read_both, pool, source), cuts, tokens, uses, sources=sources)


def pieces_contents(
    pool: SourcePool,
    i: int,
    starts: np.ndarray,
    ends: np.ndarray,
    sources: np.ndarray | None = None,
    block: int = READ_BLOCK,
) -> Contents:
    """The contents of these pieces of source ``i`` (piece ``k`` its tokens ``[starts[k], ends[k])``, of the mixture
    source ``sources[k]`` where given), as if they stood end to end: read in blocks, these pieces only, with
    descriptors of its own (a rank that moves a mixture's chosen documents hashes them, never the others)."""
    lengths = np.asarray(ends, dtype=np.int64) - starts
    cuts = np.cumsum(lengths)

    def read(start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        k = np.arange(np.searchsorted(cuts, start, side="right"), np.searchsorted(cuts, stop, side="left") + 1)
        k = k[k < len(cuts)]
        before = cuts[k] - lengths[k]
        spans = starts[k] + np.maximum(start - before, 0), starts[k] + np.minimum(stop - before, lengths[k])
        tokens = source.pread_each(0, *spans).view(source.dtypes[0])
        return tokens, source.pread_each(1, *spans).view(source.dtypes[1]) if pool.with_loss else None

    with closing(pool.private(i)) as source:
        total = int(cuts[-1]) if len(cuts) else 0
        (contents,) = stream_contents(read, [(cuts, total)], block, None if sources is None else [sources])
    return contents


def _read_both(pool: SourcePool, source: _Source, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Tokens ``[start, stop)`` of a private source, and their loss bytes when the pool moves them."""
    return source.pread_span(0, start, stop), source.pread_span(1, start, stop) if pool.with_loss else None


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


def sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted entries of two sorted index arrays, each once: ``np.union1d``'s result, whose hashing took 1.4 s
    for 1.1 million document ends and 0.2 million window ends (numpy 2.4), where sorting the two runs takes 6 ms."""
    both = np.concatenate([np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)])
    both.sort(kind="stable")  # a merge of the two runs
    return both[np.concatenate([[True], both[1:] != both[:-1]])] if len(both) else both


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
    not by the largest unit. Each block is gathered on a thread of its own while the caller hands the one before
    to the writer (``_ahead``): the reads, one a unit in a shuffle, are most of the caller's work, and they release
    the GIL.
    """
    for block in _ahead(_blocks(pool, source, starts, ends, inner, block_tokens)):
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
) -> Iterator[_Block]:
    """``move_units``' blocks, in order: whole units of at most ``block_tokens`` tokens, or slices of a longer one."""
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
            yield _gathered(pool, source[a:b], starts[a:b], ends[a:b], out_ends[a:b] - base, inner)
        a = b


def _ahead(items: Iterator[T]) -> Iterator[T]:
    """``items``, each made on a thread of its own while the caller uses the one before (at most one ahead); an
    error making one is raised where the caller asks for it."""
    with ThreadPoolExecutor(1, thread_name_prefix="gather") as thread:
        following = thread.submit(next, items, None)
        while (item := following.result()) is not None:
            following = thread.submit(next, items, None)
            yield item


def _gathered(
    pool: SourcePool,
    source: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    rel_ends: np.ndarray,
    inner: Sequence[np.ndarray] | None,
) -> _Block:
    """Read one block of units, one source file at a time, then put them in output order: by the C helper's
    ``tk_copy`` straight into the block's buffers (one call a source, no Python a unit), else with Arrow's ``take``
    (one memcpy a unit, looped in C: 0.2 us a unit, read included, where a Python loop of slices cost ~1 us)."""
    out_starts = rel_ends - (ends - starts)
    by_source = np.argsort(source, kind="stable")
    ids, firsts = np.unique(source[by_source], return_index=True)
    groups = list(zip(ids.tolist(), np.split(by_source, firsts[1:]), strict=True))
    moved = [rel_ends]
    if inner is not None:
        moved += [_moved_inner_ends(inner[s], starts[g], ends[g], out_starts[g]) for s, g in groups]
    lib = native.helper()
    if lib is not None:
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
    in their places: read straight there, one ``pread`` a unit, or read as one span where they lie close together
    (``_spanned``) and copied there by ``tk_copy``."""
    sizes = (pool.dtype.itemsize, LOSS_DTYPE.itemsize)
    tokens = pool.blocks[0].take(total * sizes[0])
    outs = [tokens, pool.blocks[1].take(total * sizes[1]) if pool.with_loss else None]
    for s, group in groups:
        first, last, to = starts[group], ends[group], out_starts[group]
        if not _spanned(first, last):
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
) -> Iterator[_Block]:
    """One unit too large for a block as consecutive slices; it stays one unit for file splitting."""
    for piece_start in range(start, end, block_tokens):
        piece_end = min(end, piece_start + block_tokens)
        entries = np.empty(0, dtype=np.int64)
        if inner is not None:
            lo, hi = np.searchsorted(inner[s], [piece_start, piece_end], side="right")
            entries = inner[s][lo:hi].astype(np.int64)
            entries = entries[entries < end] - piece_start
        unit_ends = np.array([piece_end - piece_start] if piece_end == end else [], dtype=np.int64)
        tokens, loss = pool.read(s, piece_start, piece_end)
        yield _Block(tokens, unit_ends, np.concatenate([entries, unit_ends]), loss, len(unit_ends))


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
