"""The fast engine: gigatoken, a Rust BPE that loads a ``tokenizer.json`` itself (byte-level BPE, and SentencePiece
BPE with byte fallback) and returns a batch's ids as one flat uint32 array with offsets, with no per-token Python.

It always encodes special-token text as the special token, as HF does by default; under the "text" policy
``engines.CheckedEngine`` leaves pieces that hold such text to HF. Equivalence is not assumed: it checks a sample of
every run against HF. A tokenizer it cannot load (Falcon-7B: no single-byte token for some byte) is declined with
gigatoken's reason, also when it panics (``tokenizer_files.is_panic``).

gigatoken keeps every pre-token it has encoded in a cache that only dropping the tokenizer frees: text that never
repeats a pre-token (random words, hashes, base64, names and numbers at web scale) grows it by 7-13 bytes a
character, without bound (3.4 GB for one rank of 363 MB). The engine therefore keeps the process within a memory
budget (``MemoryBudget``): after each call it reads the process's resident memory, and once the next calls could
take it past the budget it loads the tokenizer again, dropping the cache, and hands the old one's memory back to
the system (glibc keeps freed memory otherwise). Text that repeats its words keeps its cache; the ids never change.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tokenization.tokenizer.loading import TokenizerError, is_panic

if TYPE_CHECKING:
    import gigatoken

log = logging.getLogger(__name__)

_pool_pid: int | None = None  # the process that started gigatoken's process-wide thread pool
# A rank's process: the interpreter, numpy and Arrow, HF's tokenizer and the fast engine's tables take 150-450 MB
# (GPT-2 to Llama 3), batches in flight ~100 MB; what is left of 1 GiB holds the fast engine's cache.
DEFAULT_MEMORY_BUDGET_MB = 1024
# What the cache may grow by a character encoded, at most (random 5-12 letter words: 12.5; base64: ~7), and the
# characters that may be in the engine between two looks at the process's memory (``pipeline.ENCODING_AT_ONCE``
# calls of ``encoding.FAST_GROUP_CHARS``): the budget keeps that much room, ~110 MB.
CACHE_BYTES_PER_CHAR = 13
CHARS_BETWEEN_LOOKS = 2 << 22
# A reload is worth it only when the engine has grown this much since it was loaded: below, what fills the
# budget is not its cache (a rank whose other memory alone passes the budget would reload at every call).
MIN_GROWTH = 64 << 20
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


class _AwkwardUnimported:
    """While entered (by any number of threads), ``import awkward`` fails unless awkward is imported already.

    gigatoken hands a batch's ids back as an ``awkward.Array`` when it can import awkward, and else as a list of
    numpy views of one flat array (its documented fallback): the same ids, without importing awkward, which takes
    ~0.17 s of CPU (it imports pyarrow), an eighth of a GPT-2 tokenize row. Where the caller imported awkward
    already, nothing changes. While a call encodes, another thread of this process that imports awkward for the
    first time gets ``ModuleNotFoundError``: no stage does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._blocked = False  # whether this put the None in ``sys.modules`` that makes the import fail

    def __enter__(self) -> None:
        with self._lock:
            self._inside += 1
            if self._inside == 1 and AWKWARD not in sys.modules:
                sys.modules[AWKWARD] = None  # type: ignore[assignment]  # import's documented "not importable"
                self._blocked = True

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._blocked:
                self._blocked = False
                if sys.modules.get(AWKWARD, ...) is None:
                    del sys.modules[AWKWARD]


AWKWARD = "awkward"
_awkward_unimported = _AwkwardUnimported()


def flat_batch(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """A batch from ``encode_batch`` as its ids end to end (uint32) and how many each text has: from an
    ``awkward.Array``'s buffers, or from the numpy views that gigatoken returns without awkward (views of one flat
    array, which is taken as it is rather than copied)."""
    if isinstance(batch, list):
        lengths = np.fromiter(map(len, batch), np.int64, len(batch))
        total = int(lengths.sum())
        base = batch[0].base if batch else None
        if isinstance(base, np.ndarray) and base.dtype == np.uint32 and base.ndim == 1 and base.size == total:
            return base, lengths
        return (np.concatenate(batch) if batch else np.empty(0, np.uint32)), lengths
    layout = batch.layout
    offsets = np.asarray(layout.offsets)
    return layout.content.data[offsets[0] : offsets[-1]], np.diff(offsets)


class Unsupported(ValueError):
    """gigatoken cannot load the tokenizer; the message says why."""


def resident_bytes() -> int | None:
    """The process's resident memory now, but for the pages of files it maps (Linux's ``/proc/self/statm``: resident
    less shared, ~10 us), or None where it cannot be read. A mapped file's pages are the page cache's, which the
    kernel drops at need: counted, a rank's hits and pass 2's sources, read through maps, made the engine reload
    its cache between the misses of a next night."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def give_back_memory() -> None:
    """Hand freed memory back to the system, where glibc allows (~10 ms): it keeps it for the process otherwise."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


@dataclass(frozen=True)
class MemoryBudget:
    """The resident memory a rank's process may hold (``limit``, bytes). The cache is a hash table, which grows by
    doubling: at its next resize it may take as much again as it holds (seen: +380 MB in one call, at 700 MB). So
    the engine reloads once what the process holds, plus what the engine has grown by since it was loaded, plus
    ``room`` (what the next calls may add) would pass the limit; and only when it has grown by ``MIN_GROWTH``. Where
    the process's memory cannot be read, it reloads every ``chars_between_reloads`` characters instead, the most the
    limit could hold, repeated or not."""

    limit: int

    @property
    def room(self) -> int:
        return CACHE_BYTES_PER_CHAR * CHARS_BETWEEN_LOOKS

    @property
    def chars_between_reloads(self) -> int:
        return max(CHARS_BETWEEN_LOOKS, self.limit // 4 // CACHE_BYTES_PER_CHAR)

    def exceeded(self, resident: int | None, since_load: int | None, chars: int) -> bool:
        """Whether the engine should reload now: ``resident`` (None: unknown) against the limit, with what the
        process held just after loading (``since_load``) and the ``chars`` encoded since."""
        if resident is None or since_load is None:
            return chars >= self.chars_between_reloads
        grown = resident - since_load
        return grown >= MIN_GROWTH and resident + grown + self.room > self.limit


class FastEngine:
    """Encodes texts to the tokenizer's ids (no BOS or EOS), on every core unless ``threads`` is 1, keeping its
    process within ``budget``; from several threads at once too (a reload waits for the calls under way).
    ``reloads`` and ``reload_seconds`` say what the budget cost."""

    def __init__(self, data: bytes, threads: int, budget: MemoryBudget | None = None):
        self.threads, self.budget = threads, budget or MemoryBudget(DEFAULT_MEMORY_BUDGET_MB << 20)
        self._data = data
        # Over the tokenizer, the calls encoding with it (``_busy``) and a reload waiting for them (``_draining``):
        # a reload frees the old cache before the new one grows, and no call starts meanwhile, so the process never
        # holds two caches (a call still encoding with the old one would keep it, and grow it, past the budget).
        self._state = threading.Condition()
        self._busy, self._draining = 0, False
        self.reloads, self.reload_seconds = 0, 0.0
        self._load()

    def _load(self) -> None:
        import gigatoken  # here, not at the top: a command's start (its --help) goes without it (0.1-0.15 s)

        try:
            self._tokenizer: gigatoken.Tokenizer | None = _off_main_thread(gigatoken.Tokenizer.from_json, self._data)
            with _awkward_unimported:  # its lazy start is loading
                _off_main_thread(self._tokenizer.encode_batch, ["warm up"], parallel=False)
        except BaseException as exc:  # gigatoken raises plain exceptions with its reason, or panics
            if not isinstance(exc, Exception) and not is_panic(exc):
                raise
            raise Unsupported(f"gigatoken cannot load it ({str(exc).splitlines()[0]})") from exc
        self._chars = 0  # characters encoded since loading
        self._loaded_at = resident_bytes()  # what the process held with an empty cache

    def _reload(self) -> None:
        """A fresh tokenizer, without the cache; the old one's memory back to the system."""
        started = time.perf_counter()
        self._tokenizer = None  # the old one's cache freed before the new one is built
        give_back_memory()
        self._load_again()
        self.reloads += 1
        self.reload_seconds += time.perf_counter() - started
        log.info(
            "gigatoken reloaded (%d so far): the process held more than its memory budget of %d MB allows",
            self.reloads,
            self.budget.limit >> 20,
        )

    def _load_again(self) -> None:
        """The tokenizer loaded again, as it was loaded before: a failure now (memory ran out, say) is no reason to
        encode with HF, but an error."""
        try:
            self._load()
        except Unsupported as exc:
            raise TokenizerError(f"the fast engine could not load its tokenizer again: {exc}") from None

    def release(self) -> None:
        """Drop the tokenizer and its cache, their memory back to the system (the next call loads it again), unless
        the process holds so little that the budget's ``room`` still fits: then what follows has that room already,
        and dropping the cache and handing its pages back would only cost time (up to ~15 ms of the bench's
        GPT-2 rank, 42 MB of text)."""
        with self._state:
            self._state.wait_for(lambda: not self._busy)
            if (resident := resident_bytes()) is not None and resident + self.budget.room <= self.budget.limit:
                return
            self._tokenizer = None
            give_back_memory()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids end to end (uint32), and how many each text has."""
        if not texts:
            return np.empty(0, np.uint32), np.empty(0, np.int64)
        with self._state:
            self._state.wait_for(lambda: not self._draining)
            if self._tokenizer is None:  # released
                self._load_again()
            tokenizer = self._tokenizer
            if tokenizer is None:  # loading it again sets it, or raises
                raise TokenizerError("the fast engine has no tokenizer after loading it")
            self._busy += 1
        try:
            with _awkward_unimported:
                batch = _off_main_thread(tokenizer.encode_batch, texts, parallel=self._parallel())
        finally:
            del tokenizer
            with self._state:
                self._busy -= 1
                self._state.notify_all()
        ids, lengths = flat_batch(batch)
        with self._state:
            self._chars += sum(map(len, texts))
            if not self._draining and self.budget.exceeded(resident_bytes(), self._loaded_at, self._chars):
                self._draining = True  # the ids stay valid
                try:
                    self._state.wait_for(lambda: not self._busy)
                    self._reload()
                finally:
                    self._draining = False
                    self._state.notify_all()
        return ids, lengths

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
