"""The fork server a build's workers on one machine are forked from (``workers``): it imported the stages once, so
a worker starts in milliseconds, where a spawned one imported them again (0.5-1 s a process; a build starts one for
its ranks and one for its context shards with ``--parallel 2``, the build's own process taking the first of each).

The server's own start is an interpreter importing the stages: 0.3 s on a quiet machine, 1-3 s on a loaded one, all
before its first worker could begin when it is started then. ``start``, called first by whatever runs a whole build
(``tokenization build``), has it import on another core while the build's own process imports and plans: a next
night, which tokenizes little, is that much shorter. This module imports nothing heavy, so that calling it is the
first thing a command does.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver, get_context, resource_tracker
from multiprocessing.context import BaseContext
from types import FrameType

PRELOADED = ("tokenization.builds.run", "pyarrow.compute")  # what a worker imports: the stages, and what they load
# lazily (not awkward, which the fast engine goes without: ``fast_engine.flat_batch``)


def context() -> BaseContext:
    """The workers' context. The server is a process of its own, started fresh, so no thread pool of this one is
    inherited; it imports, and holds no tokenizer (a pool of HF's inherited by a fork would deadlock)."""
    workers = get_context("forkserver")
    workers.set_forkserver_preload(list(PRELOADED))
    return workers


def start() -> None:
    """Start the fork server now, without waiting for its imports: the first worker asked for waits for them (if
    the server is running already, nothing happens). Ctrl-C meanwhile is handled once it has started. The server is
    born with SIGINT blocked, and ignores it once it has imported: a Ctrl-C during its imports printed their
    KeyboardInterrupt. Multiprocessing's resource tracker is started first, since starting it unblocks SIGINT in
    the thread that does."""
    context()
    resource_tracker.ensure_running()
    with interrupts_blocked():
        forkserver.ensure_running()


@contextmanager
def interrupts_blocked() -> Iterator[None]:
    """SIGINT held back meanwhile, while the fork server starts, and handled once the block ends. Blocked in this
    thread, so the server started here is born with it blocked until it ignores it; each worker blocks it again as
    it starts (``workers._started``), and the threads that start workers block it for good (``workers._Calls``).
    Deferred: the process's other threads do not all block it, and one that takes it would have the
    KeyboardInterrupt raised here mid-start."""
    handler = signal.getsignal(signal.SIGINT)  # a Python handler is set in the main thread only
    deferred = handler if callable(handler) and threading.current_thread() is threading.main_thread() else None
    caught: list[tuple[int, FrameType | None]] = []
    if deferred is not None:
        signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if deferred is not None:
            signal.signal(signal.SIGINT, deferred)
            if caught:
                deferred(*caught[0])
