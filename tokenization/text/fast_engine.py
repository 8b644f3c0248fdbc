"""The fast engine: gigatoken, a Rust BPE that loads a ``tokenizer.json`` itself (byte-level BPE, and SentencePiece
BPE with byte fallback) and returns a batch's ids as one flat uint32 array with offsets, with no per-token Python.

It always encodes special-token text as the special token, as HF does by default; under the "text" policy
``engines.CheckedEngine`` leaves pieces that hold such text to HF. Equivalence is not assumed: it checks a sample of
every run against HF. A tokenizer it cannot load (Falcon-7B: no single-byte token for some byte) is declined with
gigatoken's reason, also when it panics (``tokenizer_files.is_panic``).

gigatoken keeps every pre-token it has encoded in a cache that only dropping the tokenizer frees: text that never
repeats a pre-token (base64, hashes) grows it by ~7 bytes a character, 350 MB for one 50 MB document. The engine
therefore loads the tokenizer again after ``RELOAD_CHARS`` characters of long texts, the pieces of a cut document,
and hands the old one's memory back to the system (glibc keeps freed memory otherwise); a corpus of short documents
repeats its words and keeps its cache.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import gigatoken
import numpy as np

from tokenization.text.tokenizer_files import is_panic

log = logging.getLogger(__name__)

_pool_pid: int | None = None  # the process that started gigatoken's process-wide thread pool
RELOAD_CHARS = 1 << 24  # characters of long texts between reloads (0.2-0.5 s each): <= ~110 MB of cache
LONG_TEXT_CHARS = 1 << 17  # a text this long is a piece of a cut document (``cutting.PIECE_CHARS``)
T = TypeVar("T")


def _off_main_thread(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, on a thread of its own when this is the main thread. gigatoken calls back into
    Python (numpy, awkward), and a KeyboardInterrupt raised there, as one is in the main thread on Ctrl-C, is lost:
    it becomes a panic, or lists instead of arrays from then on. Waiting, the main thread gets it instead."""
    if threading.current_thread() is not threading.main_thread():
        return call(*args, **kwargs)
    thread = ThreadPoolExecutor(1, thread_name_prefix="gigatoken")  # one a call: a fork leaves none to reuse
    try:
        return thread.submit(call, *args, **kwargs).result()
    finally:
        thread.shutdown(wait=False)  # interrupted, the call ends on its own


class Unsupported(ValueError):
    """gigatoken cannot load the tokenizer; the message says why."""


class FastEngine:
    """Encodes texts to the tokenizer's ids (no BOS or EOS), on every core unless ``threads`` is 1; from several
    threads at once too (a call keeps the tokenizer it started with when another reloads it)."""

    def __init__(self, data: bytes, threads: int):
        self.threads = threads
        self._data = data
        self._reloading = threading.Lock()  # over the count of long characters, and the reload it leads to
        self._load()

    def _load(self) -> None:
        try:
            self._tokenizer = _off_main_thread(gigatoken.Tokenizer.from_json, self._data)
            _off_main_thread(self._tokenizer.encode_batch, ["warm up"], parallel=False)  # its lazy start is loading
        except BaseException as exc:  # gigatoken raises plain exceptions with its reason, or panics
            if not isinstance(exc, Exception) and not is_panic(exc):
                raise
            raise Unsupported(f"gigatoken cannot load it ({str(exc).splitlines()[0]})") from exc
        self._long_chars = 0  # characters of long texts encoded since loading

    def _reload(self) -> None:
        """A fresh tokenizer, without the cache; the old one's memory back to the system, where glibc allows."""
        self._load()
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only; ~10 ms
        if trim is not None:
            trim(0)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids end to end (uint32), and how many each text has."""
        if not texts:
            return np.empty(0, np.uint32), np.empty(0, np.int64)
        batch = _off_main_thread(self._tokenizer.encode_batch, texts, parallel=self._parallel())
        layout = batch.layout
        offsets = np.asarray(layout.offsets)
        ids = layout.content.data[offsets[0] : offsets[-1]]
        with self._reloading:
            self._long_chars += sum(len(text) for text in texts if len(text) >= LONG_TEXT_CHARS)
            if self._long_chars >= RELOAD_CHARS:  # the ids stay valid: numpy holds their buffer
                self._reload()
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
