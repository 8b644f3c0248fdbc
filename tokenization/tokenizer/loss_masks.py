"""Loss bytes: 0 for every token whose characters overlap a no-loss range of its document (a prompt, a template's
own text), 1 elsewhere. A document is never cropped, and the ids placed around it (BOS, EOS) keep their loss.

A token's characters are those HF's ``Encoding`` gives it in its piece (``cutting.token_spans``); special tokens
never overlap a range, except one that a chat template wrote, which is a piece of its own (``special_held_out``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Encoding

from tokenization.tokenizer.cutting import Piece, Ranges, token_spans


def held_out(
    lengths: np.ndarray, encodings: dict[int, Encoding], pieces: list[Piece], no_loss: list[Any]
) -> np.ndarray:
    """Which of a group's tokens (``lengths`` a piece) carry no loss. ``encodings``: HF's of (at least) the pieces
    whose document has no-loss ranges, by their index in ``pieces``."""
    starts = np.cumsum(lengths) - lengths
    held = np.zeros(int(lengths.sum()), dtype=bool)
    for j, piece in enumerate(pieces):
        if no_loss[piece.doc]:
            held[starts[j] : starts[j] + lengths[j]] = no_loss_mask(encodings[j], piece, no_loss[piece.doc])
    return held


def special_held_out(specials: list[Piece], no_loss: list[Any]) -> list[bool]:
    """Whether each special-token piece carries no loss: like any other token, when its characters overlap a
    no-loss range."""
    return [bool(no_loss[p.doc]) and bool(overlapping([(p.start, p.end)], no_loss[p.doc])[0]) for p in specials]


def no_loss_mask(encoding: Encoding, piece: Piece, ranges: Ranges) -> np.ndarray:
    """Tokens of the piece's ``encoding`` whose span overlaps any ``[start, end)`` range of its document; special
    tokens never do. A token overlaps one when the ranges that start before its end reach past its beginning:
    O(log ranges) a token, as a document may have many ranges and many pieces."""
    spans = token_spans(encoding, piece)
    if not ranges:
        return np.zeros(len(spans), dtype=bool)
    return overlapping(spans, ranges) & (np.asarray(encoding.special_tokens_mask) == 0) & (spans[:, 1] > spans[:, 0])


def overlapping(spans: np.ndarray | list[tuple[int, int]], ranges: Ranges) -> np.ndarray:
    """Which ``[begin, end)`` spans overlap any of the (non-empty list of) ranges: those whose ranges that start
    before their end reach past their beginning."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    begin, end = spans[:, 0], spans[:, 1]
    bounds = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    bounds = bounds[np.argsort(bounds[:, 0])]
    reach = np.maximum.accumulate(bounds[:, 1])
    before = np.searchsorted(bounds[:, 0], end)  # how many ranges start before each span ends
    return (before > 0) & (reach[np.maximum(before - 1, 0)] > begin)
