"""The packed context windows' padding (``context_mode: packed``): its contents, the file it is read from, the
counts and the histogram of it that the context shuffle's record gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenization.formats.contents import Contents, ContentsHasher
from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileWriter
from tokenization.formats.moves import BLOCK_TOKENS
from tokenization.formats.packing import PackedFile


def padding_contents(padding: np.ndarray, pad_id: int, dtype: np.dtype) -> Contents:
    """What the padding of packed windows holds: a piece of pad ids at loss 0 in each window that has some."""
    lengths, windows = np.unique(padding[padding > 0], return_counts=True)
    each = Contents()
    for n, times in zip(lengths.tolist(), windows.tolist(), strict=True):
        hasher = ContentsHasher()
        hasher.add(np.full(n, pad_id, dtype), np.array([n]), np.zeros(n, LOSS_DTYPE))
        each += hasher.result().times(times)
    return each


def padding_file(path: Path, source: TokenFile, pad_id: int, tokens: int) -> str:
    """A token file of ``tokens`` pad ids at loss 0, which the packed windows' padding is read from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with TokenFileWriter(path, tokenizer=source.tokenizer, token_size=source.token_size, save_loss=True) as w:
        for start in range(0, tokens, BLOCK_TOKENS):
            n = min(BLOCK_TOKENS, tokens - start)
            w.write(np.full(n, pad_id, dtype=source.dtype), np.array([n]), np.zeros(n, dtype=LOSS_DTYPE))
    return str(path)


def packed_counts(packed: PackedFile) -> dict[str, int]:
    """A packed file's documents, whole or split (with their pieces), and its padding."""
    pieces = packed.pieces
    return {
        "documents_whole": pieces.whole,
        "documents_split": pieces.split,
        "split_pieces": pieces.split_pieces,
        "padding_tokens": packed.padding_tokens,
    }


def padding_classes(window: int) -> int:
    """Classes of the padding histogram: 0, 1, 2-3, 4-7, ..., up to a window."""
    return int(window).bit_length() + 1


def padding_class(padding: np.ndarray) -> np.ndarray:
    """Each window's class: 0 for no padding, else 1 + floor(log2(padding))."""
    padding = np.asarray(padding, dtype=np.int64)
    return np.where(padding > 0, np.floor(np.log2(np.maximum(padding, 1))).astype(np.int64) + 1, 0)
