"""The fast engine: gigatoken, a Rust BPE that loads a ``tokenizer.json`` itself (byte-level BPE, and SentencePiece
BPE with byte fallback) and returns a batch's ids as one flat uint32 array with offsets, with no per-token Python.

It always encodes special-token text as the special token, as HF does by default; under the "text" policy
``Encoder`` leaves documents that hold such text to HF. Equivalence is not assumed: ``Encoder`` checks a sample of
every run against HF. A tokenizer it cannot load (Falcon-7B: no single-byte token for some byte) is declined with
gigatoken's reason.
"""

from __future__ import annotations

import logging
import os

import gigatoken
import numpy as np

log = logging.getLogger(__name__)

_pool_pid: int | None = None  # the process that started gigatoken's process-wide thread pool


class Unsupported(ValueError):
    """gigatoken cannot load the tokenizer; the message says why."""


class FastEngine:
    """Encodes texts to the tokenizer's ids (no BOS or EOS), on every core unless ``threads`` is 1."""

    def __init__(self, data: bytes, threads: int):
        try:
            self._tokenizer = gigatoken.Tokenizer.from_json(data)
        except Exception as exc:  # gigatoken raises plain exceptions with its reason
            raise Unsupported(f"gigatoken cannot load it ({str(exc).splitlines()[0]})") from exc
        self.threads = threads
        self._tokenizer.encode_batch(["warm up"], parallel=False)  # its lazy start (~1 s) counts as loading

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids end to end (uint32), and how many each text has."""
        if not texts:
            return np.empty(0, np.uint32), np.empty(0, np.int64)
        batch = self._tokenizer.encode_batch(texts, parallel=self._parallel())
        layout = batch.layout
        offsets = np.asarray(layout.offsets)
        ids = layout.content.data[offsets[0] : offsets[-1]]
        return ids, np.diff(offsets)

    def _parallel(self) -> bool:
        """Whether to use the thread pool: a pool that a parent process started has no threads after a fork, and
        waiting on it would hang, so a forked child whose parent used it encodes on its own thread."""
        global _pool_pid
        if self.threads < 2:
            return False
        if _pool_pid is None:
            _pool_pid = os.getpid()
        if _pool_pid != os.getpid():
            log.warning("gigatoken's thread pool was started before this process forked: encoding on one thread")
            return False
        return True
