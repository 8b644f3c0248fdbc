"""The one byte-moving engine shared by the document, chunk and window shuffles and by the merge.

A *unit* is a contiguous token range ``[start, end)`` of one source file: a document, a fixed-size chunk or a
context window. :func:`move_units` writes units in a given order, gathering tokens (and loss bytes) with
vectorised numpy indexing over bounded blocks, and rebuilds the index: every unit end becomes an entry, and the
source index entries that fall strictly inside a moved unit move with it.
"""

from __future__ import annotations

import contextlib
import mmap
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenization.formats.ds import LOSS_DTYPE, SplitWriter, TokenFile, token_dtype
from tokenization.storage import is_local, open_fs

BLOCK_TOKENS = 1 << 22  # tokens gathered per write: 8-16 MiB of output, ~32 MiB of index arithmetic
MAX_OPEN_FILES = 128
SLICE_COPY_MIN_MEAN = 64  # mean unit length (tokens) from which per-unit slice copies beat one fancy-index gather


class SourcePool:
    """Source token files, memory-mapped on demand, at most ``max_open`` at a time (least recently used first
    out), so the number of open files stays bounded whatever the number of inputs. Remote files are copied to
    ``cache_dir`` once, with large sequential reads, because the moves read them at random."""

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
        self._open: OrderedDict[int, tuple[np.ndarray, np.ndarray | None]] = OrderedDict()
        self._maps: dict[int, list[np.memmap]] = {}

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        if i in self._open:
            self._open.move_to_end(i)
            return self._open[i]
        while len(self._open) >= self.max_open:
            evicted, _ = self._open.popitem(last=False)
            self._maps.pop(evicted, None)
        source = TokenFile(self._local(i), self.token_size)
        maps = [source.tokens] + ([source.loss] if self.with_loss else [])
        self._maps[i] = [m for m in maps if isinstance(m, np.memmap)]
        arrays = (np.asarray(maps[0]), np.asarray(maps[1]) if self.with_loss else None)  # np.memmap slicing is slow
        self._open[i] = arrays
        return arrays

    def release_pages(self) -> None:
        """Drop the mapped pages read so far from this process (they stay in the page cache), so that resident
        memory stays flat however much of the inputs the moves have touched."""
        for maps in self._maps.values():
            for m in maps:
                with contextlib.suppress(AttributeError, ValueError, OSError):
                    m._mmap.madvise(mmap.MADV_DONTNEED)

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
            local.parent.mkdir(parents=True, exist_ok=True)
            suffixes = ["", ".metadata"] + ([".loss"] if self.with_loss else [])
            for suffix in suffixes:
                if suffix != ".metadata" or fs.exists(path + suffix):
                    fs.get_file(path + suffix, str(local) + suffix)
        return str(local)

    def close(self) -> None:
        self._open.clear()
        self._maps.clear()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


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
        src_tokens, src_loss = pool.get(int(s))
        _gather(tokens, src_tokens, out_starts[group], starts[group], lengths[group])
        if loss is not None:
            _gather(loss, src_loss, out_starts[group], starts[group], lengths[group])
        if inner is not None:
            moved.append(_moved_inner_ends(inner[s], starts[group], ends[group], out_starts[group]))
    index = rel_ends if inner is None else np.sort(np.concatenate(moved))
    writer.write(tokens, rel_ends, index, loss)


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
    tokens, loss = pool.get(s)
    for piece_start in range(start, end, block_tokens):
        piece_end = min(end, piece_start + block_tokens)
        entries = np.empty(0, dtype=np.int64)
        if inner is not None:
            lo, hi = np.searchsorted(inner[s], [piece_start, piece_end], side="right")
            entries = inner[s][lo:hi].astype(np.int64)
            entries = entries[entries < end] - piece_start
        unit_ends = np.array([piece_end - piece_start] if piece_end == end else [], dtype=np.int64)
        writer.write(
            np.asarray(tokens[piece_start:piece_end]),
            unit_ends,
            np.concatenate([entries, unit_ends]),
            None if loss is None else np.asarray(loss[piece_start:piece_end]),
        )


def permute_units(
    pool: SourcePool,
    ends: np.ndarray,
    order: np.ndarray,
    writer: SplitWriter,
    inner_ends: np.ndarray | None = None,
    block_tokens: int = BLOCK_TOKENS,
) -> None:
    """Write the units of source 0, cut by ``ends``, in the order ``order`` (the one-file shuffles)."""
    ends = np.asarray(ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    inner = None if inner_ends is None else [np.asarray(inner_ends, dtype=np.int64)]
    move_units(pool, np.zeros(len(order), np.int64), starts[order], ends[order], writer, inner, block_tokens)
