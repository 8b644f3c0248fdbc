"""The one byte-moving engine shared by the document, chunk and window shuffles and by the merge.

A *unit* is a contiguous token range ``[start, end)`` of one source file: a document, a fixed-size chunk or a
context window. :func:`move_units` writes units in a given order, gathering tokens (and loss bytes) with
vectorised numpy indexing over bounded blocks, and rebuilds the index: every unit end becomes an entry, and the
source index entries that fall strictly inside a moved unit move with it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenization.formats.ds import LOSS_DTYPE, SplitWriter, TokenFile, TokenFileError, token_dtype
from tokenization.progress import Progress
from tokenization.storage import is_local, open_fs, writing

BLOCK_TOKENS = 1 << 22  # tokens gathered per write: 8-16 MiB of output, ~32 MiB of index arithmetic
MAX_OPEN_FILES = 128
SLICE_COPY_MIN_MEAN = 64  # mean unit length (tokens) from which per-unit slice copies beat one fancy-index gather
PREAD_MIN_MEAN = 1024  # mean unit length (tokens) from which one pread a unit costs little next to its copy
SPAN_READ_MAX_WASTE = 2  # units are read as one span when it is at most this many times what they hold


class SourcePool:
    """Source token files, opened on demand, at most ``max_open`` at a time (least recently used first out), so
    the number of open files stays bounded whatever the number of inputs. Remote files are copied to
    ``cache_dir`` once, with large sequential reads, because the moves read them at random.

    Units are read with ``pread`` into private buffers where that is cheap (dense spans, long units), and
    gathered from memory maps where it is not (many short units far apart). A page-cache fault maps a whole
    folio (up to 2 MiB on current kernels), so mapped reads make resident memory grow with the file; ``read``
    keeps it flat.
    """

    def __init__(
        self,
        urls: Sequence[str],
        token_size: int,
        with_loss: bool,
        max_open: int = MAX_OPEN_FILES,
        cache_dir: Path | None = None,
    ):
        self.urls = list(urls)
        self.token_size = token_size
        self.dtype = token_dtype(token_size)
        self.with_loss = with_loss
        self.max_open = max_open
        self.cache_dir = cache_dir
        self._open: OrderedDict[int, _Source] = OrderedDict()

    def _source(self, i: int) -> _Source:
        if i in self._open:
            self._open.move_to_end(i)
            return self._open[i]
        while len(self._open) >= self.max_open:
            self._open.popitem(last=False)[1].close()
        self._open[i] = _Source(self._local(i), self.token_size, self.with_loss)
        return self._open[i]

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Source ``i``'s tokens and loss bytes, memory-mapped."""
        return self._source(i).mapped()

    def read(self, i: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and loss bytes) ``[start, stop)`` of source ``i``, read into new arrays."""
        source = self._source(i)
        tokens = np.empty(stop - start, self.dtype)
        source.pread(0, tokens, start)
        loss = None
        if self.with_loss:
            loss = np.empty(stop - start, LOSS_DTYPE)
            source.pread(1, loss, start)
        return tokens, loss

    def read_units(self, i: int, tokens: np.ndarray, loss: np.ndarray | None, out_starts, starts, lengths) -> None:
        """``tokens[o:o+n] = source[s:s+n]`` for every unit, one ``pread`` each, straight into the output."""
        source = self._source(i)
        for o, s, n in zip(out_starts.tolist(), starts.tolist(), lengths.tolist(), strict=True):
            source.pread(0, tokens[o : o + n], s)
            if loss is not None:
                source.pread(1, loss[o : o + n], s)

    def release_pages(self) -> None:
        """Drop the mapped pages read so far from this process (they stay in the page cache)."""
        for source in self._open.values():
            source.release_pages()

    @property
    def open_count(self) -> int:
        return len(self._open)

    def _local(self, i: int) -> str:
        fs, path = open_fs(self.urls[i])
        if is_local(fs):
            return path
        if self.cache_dir is None:
            raise ValueError(f"{self.urls[i]} is remote: a local cache_dir is needed to read it at random")
        local = self.cache_dir / f"{i:06d}" / path.rsplit("/", 1)[-1]
        if not local.exists():
            suffixes = ["", ".metadata"] + ([".loss"] if self.with_loss else [])
            for suffix in suffixes:
                if suffix != ".metadata" or fs.exists(path + suffix):
                    with writing(f"{local}{suffix}"):
                        local.parent.mkdir(parents=True, exist_ok=True)
                        fs.get_file(path + suffix, str(local) + suffix)
        return str(local)

    def close(self) -> None:
        for source in self._open.values():
            source.close()
        self._open.clear()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


class _Source:
    """One open source: a descriptor for its tokens and one for its loss bytes, and maps made on first use."""

    def __init__(self, path: str, token_size: int, with_loss: bool):
        self.file = TokenFile(path, token_size)
        self.paths = [path] + ([path + ".loss"] if with_loss else [])
        self.fds = [os.open(p, os.O_RDONLY) for p in self.paths]
        self.with_loss = with_loss
        self._mapped: tuple[np.ndarray, np.ndarray | None] | None = None
        self._maps: list[np.memmap] = []

    def pread(self, which: int, out: np.ndarray, start: int) -> None:
        """Fill ``out`` from item ``start`` of file ``which`` (0 tokens, 1 loss); a short file is an error."""
        view = memoryview(out).cast("B")
        offset = start * out.itemsize
        while len(view):
            got = os.preadv(self.fds[which], [view], offset)
            if got == 0:
                raise TokenFileError(f"{self.paths[which]}: ends before byte {offset + len(view)}")
            view, offset = view[got:], offset + got

    def mapped(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self._mapped is None:
            maps = [self.file.tokens] + ([self.file.loss] if self.with_loss else [])
            self._maps = [m for m in maps if isinstance(m, np.memmap)]
            # plain ndarray views: np.memmap slicing is slow
            self._mapped = (np.asarray(maps[0]), np.asarray(maps[1]) if self.with_loss else None)
        return self._mapped

    def release_pages(self) -> None:
        for m in self._maps:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                m._mmap.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds, self._mapped, self._maps = [], None, []


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    total = int(lengths.sum())
    out_starts = np.cumsum(lengths) - lengths
    index = np.arange(total, dtype=np.int64)
    index += np.repeat(np.asarray(starts, dtype=np.int64) - out_starts, lengths)
    return index


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
    not by the largest unit.
    """
    source = np.asarray(source, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out_ends = np.cumsum(ends - starts)
    a = 0
    while a < len(starts):
        base = int(out_ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(out_ends, base + block_tokens, side="right")))
        if b == a + 1 and out_ends[a] - base > block_tokens:
            _copy_long_unit(pool, int(source[a]), int(starts[a]), int(ends[a]), writer, inner, block_tokens)
        else:
            _copy_block(pool, source[a:b], starts[a:b], ends[a:b], out_ends[a:b] - base, writer, inner)
        pool.release_pages()
        if progress is not None:
            progress.advance(int(out_ends[b - 1]) - base, units=b - a, tokens=int(out_ends[b - 1]) - base)
        a = b


def _copy_block(pool, source, starts, ends, rel_ends, writer, inner) -> None:
    """Gather one block of units, one source file at a time, into a contiguous output buffer."""
    lengths = ends - starts
    out_starts = rel_ends - lengths
    tokens = np.empty(int(rel_ends[-1]), dtype=pool.dtype)
    loss = np.empty(len(tokens), dtype=LOSS_DTYPE) if pool.with_loss else None
    moved = [rel_ends]
    by_source = np.argsort(source, kind="stable")
    ids, firsts = np.unique(source[by_source], return_index=True)
    for s, group in zip(ids, np.split(by_source, firsts[1:]), strict=True):
        _copy_from(pool, int(s), tokens, loss, out_starts[group], starts[group], lengths[group])
        if inner is not None:
            moved.append(_moved_inner_ends(inner[s], starts[group], ends[group], out_starts[group]))
    index = rel_ends if inner is None else np.sort(np.concatenate(moved))
    writer.write(tokens, rel_ends, index, loss)


def _copy_from(pool, s: int, tokens, loss, out_starts, starts, lengths) -> None:
    """One source's units of a block, by the cheapest read: one ``pread`` of their span when they lie close
    together (a merge's interleave reads each file in order), one ``pread`` each when they are long, and a
    gather from the memory map for many short units far apart."""
    lo, hi = int(starts.min()), int((starts + lengths).max())
    if hi - lo <= SPAN_READ_MAX_WASTE * int(lengths.sum()):
        span_tokens, span_loss = pool.read(s, lo, hi)
        _gather(tokens, span_tokens, out_starts, starts - lo, lengths)
        if loss is not None:
            _gather(loss, span_loss, out_starts, starts - lo, lengths)
    elif lengths.mean() >= PREAD_MIN_MEAN:
        pool.read_units(s, tokens, loss, out_starts, starts, lengths)
    else:
        src_tokens, src_loss = pool.get(s)
        _gather(tokens, src_tokens, out_starts, starts, lengths)
        if loss is not None:
            _gather(loss, src_loss, out_starts, starts, lengths)


def _gather(out: np.ndarray, src: np.ndarray, out_starts: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """``out[o:o+n] = src[s:s+n]`` for every unit. Short units go through one vectorised fancy-index gather;
    longer ones are cheaper as one memcpy each (index arithmetic costs ~10 ns a token, a slice ~0.3 us a unit)."""
    if len(lengths) and lengths.mean() < SLICE_COPY_MIN_MEAN:
        out[ranges(out_starts, lengths)] = src[ranges(starts, lengths)]
        return
    for o, s, n in zip(out_starts.tolist(), starts.tolist(), lengths.tolist(), strict=True):
        out[o : o + n] = src[s : s + n]


def _moved_inner_ends(inner: np.ndarray, starts: np.ndarray, ends: np.ndarray, out_starts: np.ndarray) -> np.ndarray:
    """The source entries strictly inside each unit, moved to the unit's new place."""
    lo = np.searchsorted(inner, starts, side="right")
    hi = np.searchsorted(inner, ends, side="left")
    counts = hi - lo
    return inner[ranges(lo, counts)].astype(np.int64) + np.repeat(out_starts - starts, counts)


def _copy_long_unit(pool, s: int, start: int, end: int, writer, inner, block_tokens: int) -> None:
    """Stream one unit too large for a block as consecutive slices; it stays one unit for file splitting."""
    for piece_start in range(start, end, block_tokens):
        piece_end = min(end, piece_start + block_tokens)
        entries = np.empty(0, dtype=np.int64)
        if inner is not None:
            lo, hi = np.searchsorted(inner[s], [piece_start, piece_end], side="right")
            entries = inner[s][lo:hi].astype(np.int64)
            entries = entries[entries < end] - piece_start
        unit_ends = np.array([piece_end - piece_start] if piece_end == end else [], dtype=np.int64)
        tokens, loss = pool.read(s, piece_start, piece_end)
        writer.write(tokens, unit_ends, np.concatenate([entries, unit_ends]), loss)


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
    starts = np.concatenate([[0], ends[:-1]])
    inner = None if inner_ends is None else [np.asarray(inner_ends, dtype=np.int64)]
    move_units(pool, np.zeros(len(order), np.int64), starts[order], ends[order], writer, inner, block_tokens, progress)
