"""The one byte-moving engine that document, chunk and window shuffles share.

A source token array is cut into contiguous *units* (documents, fixed-size chunks, context windows) by their
end offsets. :func:`permute_units` writes the units in a given order, gathering tokens (and loss bytes) with
vectorised numpy indexing over bounded blocks, and rebuilds the index: every unit end becomes an entry, and
the source index entries that fall strictly inside a moved unit move with it.
"""

from __future__ import annotations

import numpy as np

from tokenization.formats.ds import SplitWriter

BLOCK_TOKENS = 1 << 22  # tokens gathered per write: 8-16 MiB of output, ~32 MiB of index arithmetic


def unit_starts(ends: np.ndarray) -> np.ndarray:
    starts = np.empty(len(ends), dtype=np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1]
    return starts


def gather(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``src[starts[i] : starts[i] + lengths[i]]`` for every i, in one vectorised gather."""
    total = int(lengths.sum())
    out_starts = np.cumsum(lengths) - lengths
    index = np.arange(total, dtype=np.int64)
    index += np.repeat(starts - out_starts, lengths)
    return src[index]


def fixed_units(total: int, size: int) -> tuple[np.ndarray, int]:
    """End offsets of ``size``-token units over ``total`` tokens, the partial tail included as a last unit,
    and the number of full units."""
    full = total // size
    ends = np.arange(1, full + 1, dtype=np.int64) * size
    if total % size:
        ends = np.append(ends, total)
    return ends, full


def permute_units(
    tokens: np.ndarray,
    loss: np.ndarray | None,
    ends: np.ndarray,
    order: np.ndarray,
    writer: SplitWriter,
    inner_ends: np.ndarray | None = None,
    block_tokens: int = BLOCK_TOKENS,
) -> None:
    """Write the units ``order[0], order[1], ...`` of ``tokens`` to ``writer``.

    ``ends`` are the units' exclusive end offsets in source order; ``inner_ends`` (sorted) are source index
    entries to carry along, such as document ends inside chunks. Units longer than ``block_tokens`` are
    copied in slices, so memory is bounded by the block size, not by the largest unit.
    """
    ends = np.asarray(ends, dtype=np.int64)
    starts = unit_starts(ends)
    lengths = (ends - starts)[order]
    out_ends = np.cumsum(lengths)
    a = 0
    while a < len(order):
        base = int(out_ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(out_ends, base + block_tokens, side="right")))
        units = order[a:b]
        if b == a + 1 and lengths[a] > block_tokens:
            _copy_long_unit(tokens, loss, int(starts[units[0]]), int(ends[units[0]]), writer, inner_ends, block_tokens)
        else:
            src_starts, unit_lengths = starts[units], lengths[a:b]
            rel_ends = out_ends[a:b] - base
            index = rel_ends
            if inner_ends is not None:
                index = np.sort(
                    np.concatenate(
                        [rel_ends, _moved_inner_ends(inner_ends, src_starts, ends[units], rel_ends - unit_lengths)]
                    )
                )
            writer.write(
                gather(tokens, src_starts, unit_lengths),
                rel_ends,
                index,
                None if loss is None else gather(loss, src_starts, unit_lengths),
            )
        a = b


def _moved_inner_ends(inner: np.ndarray, starts: np.ndarray, ends: np.ndarray, out_starts: np.ndarray) -> np.ndarray:
    """The source entries strictly inside each unit, moved to the unit's new place."""
    lo = np.searchsorted(inner, starts, side="right")
    hi = np.searchsorted(inner, ends, side="left")
    counts = hi - lo
    picked = gather(inner, lo, counts).astype(np.int64)
    return picked + np.repeat(out_starts - starts, counts)


def _copy_long_unit(
    tokens: np.ndarray,
    loss: np.ndarray | None,
    start: int,
    end: int,
    writer: SplitWriter,
    inner_ends: np.ndarray | None,
    block_tokens: int,
) -> None:
    """Stream one unit too large for a block as consecutive slices; it stays one unit for file splitting."""
    pieces = range(start, end, block_tokens)
    for piece_start in pieces:
        piece_end = min(end, piece_start + block_tokens)
        inner = np.empty(0, dtype=np.int64)
        if inner_ends is not None:
            lo, hi = np.searchsorted(inner_ends, [piece_start, piece_end], side="right")
            inner = inner_ends[lo:hi].astype(np.int64)
            inner = inner[inner < end] - piece_start
        last = piece_end == end
        unit_ends = np.array([piece_end - piece_start] if last else [], dtype=np.int64)
        writer.write(
            np.asarray(tokens[piece_start:piece_end]),
            unit_ends,
            np.concatenate([inner, unit_ends]),
            None if loss is None else np.asarray(loss[piece_start:piece_end]),
        )
