"""The threads a pass reads and encodes on (``Threads``), and reading ahead on one of them (``ReadAhead``), so that
reading, encoding and writing overlap with bounded memory (``documents.encoded_batches``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from queue import Full, Queue
from typing import Any, Generic, TypeVar

# Batches in the engine at once, on threads of their own: while one waits on the Python that frames its ids or on
# its slowest text, the other keeps the cores busy (Mistral-7B, 212 MB on 2 cores: 6.1 s, where one at a time took
# 8.3 s). A record larger than a batch is a batch that goes alone, so a huge document is never encoded beside another.
ENCODING_AT_ONCE = 2
T = TypeVar("T")


class Threads:
    """The threads that read and encode, one each, kept for as long as ``with`` holds them: a pass over a rank's
    files reads and encodes them all on the same two. A thread of its own for each file would leave each file's
    memory in an allocator arena of its own (glibc keeps up to eight arenas a core): 100 MB more for seven files."""

    def __init__(self) -> None:
        self.read = ThreadPoolExecutor(1, thread_name_prefix="read")
        self.encode = ThreadPoolExecutor(ENCODING_AT_ONCE, thread_name_prefix="encode")

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.read.shutdown()
        self.encode.shutdown()


class ReadAhead(Generic[T]):
    """``items``, produced ahead on the ``thread`` given (else one of its own) in chunks of ``chunk`` (by
    ``size``), at most ``depth`` of them waiting, so that reading overlaps with the caller's work and memory stays
    bounded. The producer's errors are raised where they are consumed; stopping early stops the producer. ``mark``
    is what ``where()`` said when the chunk being consumed was read (the reader's byte position, for progress that
    does not run ahead of the work)."""

    def __init__(
        self,
        items: Iterable[T],
        size: Callable[[T], int] = lambda _: 1,
        chunk: int = 256,
        depth: int = 4,
        where: Callable[[], int] = lambda: 0,
        thread: ThreadPoolExecutor | None = None,
    ):
        self.items, self.size, self.chunk, self.where, self.thread = items, size, chunk, where, thread
        self.queue: Queue[Any] = Queue(depth)
        self.stop = threading.Event()
        self.mark = 0
        self.read_all = False  # the producer has read the items to their end (some may wait in the queue yet)
        self._producing: Future[None] | None = None

    def start(self) -> None:
        """Start producing on the ``thread`` given, before the items are iterated (which would start it): a caller
        that never iterates them must ``close`` it."""
        if self.thread is None:
            raise ValueError("a read-ahead started before it is iterated needs a thread that outlives it")
        if self._producing is None:
            self._producing = self.thread.submit(self._produce)

    def close(self) -> None:
        """Stop producing, and wait for the producer to end (its errors reach the queue, never this)."""
        self.stop.set()
        if self._producing is not None:
            self._producing.result()

    def _put(self, item: object) -> bool:
        """Queue ``item`` once there is room; False when the consumer stopped, or is gone with the main thread (a
        Ctrl-C can leave its iterator unclosed, and the interpreter would wait for this thread forever)."""
        while not self.stop.is_set() and threading.main_thread().is_alive():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except Full:
                continue
        return False

    def _produce(self) -> None:
        group: list[Any] = []
        filled = 0
        try:
            for item in self.items:
                group.append(item)
                filled += self.size(item)
                if filled >= self.chunk:
                    if not self._put((group, self.where())):
                        return
                    group, filled = [], 0
            self.read_all = True
            self._put((group, self.where())) and self._put(_END)
        except BaseException as exc:  # the items before it first, then the error, which the consumer raises
            self._put((group, self.where())) and self._put(exc)

    def __iter__(self) -> Iterator[T]:
        with contextlib.ExitStack() as own:
            if self._producing is None:
                thread = self.thread or own.enter_context(ThreadPoolExecutor(1, thread_name_prefix="read"))
                self._producing = thread.submit(self._produce)
            try:
                while (got := self.queue.get()) is not _END:
                    if isinstance(got, BaseException):
                        raise got
                    group, self.mark = got
                    yield from group
            finally:
                self.close()


_END = object()


class ReadInline(ReadAhead[Any]):
    """``items`` as ``ReadAhead`` gives them, read on the caller's thread as they are consumed (``thread`` unused):
    for an input too small to pay for a thread's hand-offs."""

    def start(self) -> None:
        """Nothing to start: its items are read as they are consumed."""

    def __iter__(self) -> Iterator[T]:
        for item in self.items:
            self.mark = self.where()
            yield item
