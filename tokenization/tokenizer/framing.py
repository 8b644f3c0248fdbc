"""A batch's ids placed by index arithmetic, never a Python call per token: the pieces' ids end to end, the
special-token pieces that a chat template wrote placed between them, and each document framed by the head (BOS)
and tail (EOS) that its tokenizer's post-processor would add (``encoding.Encoder.encode_prepared``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tokenization.tokenizer.cutting import Piece
from tokenization.tokenizer.loss_masks import special_held_out

if TYPE_CHECKING:
    import numpy.typing as npt


def with_special_pieces(
    pieces: list[Piece], body: np.ndarray, lengths: np.ndarray, held_out: np.ndarray | None, no_loss: list[Any] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The ids, lengths and held-out tokens of all ``pieces`` from those of their text pieces: each special piece
    is its one token."""
    special = np.fromiter((p.token is not None for p in pieces), dtype=bool, count=len(pieces))
    every = np.ones(len(pieces), dtype=np.int64)
    every[~special] = lengths
    places = np.zeros(int(every.sum()), dtype=bool)
    places[(np.cumsum(every) - every)[special]] = True
    specials = [p for p in pieces if p.token is not None]
    ids = np.empty(len(places), dtype=body.dtype)
    ids[places] = [p.token for p in specials]
    ids[~places] = body
    if held_out is None:
        return ids, every, None
    if no_loss is None:
        raise ValueError("held-out tokens without the no-loss ranges that hold them out")
    held = np.empty(len(places), dtype=bool)
    held[~places] = held_out
    held[places] = special_held_out(specials, no_loss)
    return ids, every, held


def joined(arrays: list[np.ndarray], dtype: npt.DTypeLike) -> np.ndarray:
    """``arrays`` end to end, as ``dtype``, also when there are none."""
    return np.concatenate(arrays, dtype=dtype, casting="same_kind") if arrays else np.empty(0, dtype=dtype)


def framed(body: np.ndarray, body_lengths: np.ndarray, head: list[int], tail: list[int]) -> np.ndarray:
    """Each document's run of ``body`` between ``head`` and ``tail``. The body's places are marked in a byte mask
    and filled in one masked copy (~1 ns a token; index arrays would cost 16 bytes a token)."""
    if not head and not tail:
        return body
    if not head and len(body_lengths) == 1 and body.flags.owndata:  # one document (a huge one is a batch alone):
        body.resize(len(body) + len(tail), refcheck=False)  # its tail goes after it, in place (realloc: no copy)
        body[len(body) - len(tail) :] = tail
        return body
    lengths = body_lengths + len(head) + len(tail)
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=body.dtype)
    body_places = np.ones(len(out), dtype=bool)
    starts = ends - lengths
    places = [(starts + k, v) for k, v in enumerate(head)] + [(ends - len(tail) + k, v) for k, v in enumerate(tail)]
    for where, value in places:
        out[where] = value
        body_places[where] = False
    out[body_places] = body
    return out
