"""The processes a build's steps run in on one machine (``Build.run``): the build's own, and workers forked from a
fork server that imported the stages once, Ctrl-C kept from them while they start and handled here, their progress
relayed to one bar, and each step profiled when ``TOKENIZATION_PROFILE`` names a folder."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from multiprocessing.context import BaseContext
from multiprocessing.queues import Queue
from typing import TYPE_CHECKING, Any, Literal

from tokenization.builds import forkserver
from tokenization.output.manifest import StageResult
from tokenization.progress import Gathered, ProgressMode, Relay
from tokenization.wording import counted

if TYPE_CHECKING:
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

log = logging.getLogger(__name__)


def in_processes(
    build: Build,
    step: Literal["tokenize", "merge", "context_shuffle"],
    calls: list[tuple[Any, ...]],
    parallel: int,
    progress: ProgressMode,
    total: int | None = None,
) -> None:
    """Run ``step`` once per argument tuple, up to ``parallel`` at once, taken in the order given: by this process
    and by up to ``parallel - 1`` fresh processes (``forkserver``), each taking the next call once it is free. This
    process takes the first: it has imported the stages and made the plan, where a worker waits for the fork server's
    imports (a next night's rank of the changed file started 0.1 s sooner), and it has nothing else to do meanwhile.
    Each call is logged as it completes; the first failure leaves the calls not started undone, and is raised once the
    ones under way end. Their progress is shown summed, as one bar (``total``: their work, in the step's unit, when
    known). The workers never see Ctrl-C (a terminal sends it to every process of the group, and each would print its
    traceback): interrupted, this process stops them, mid-step, once none is being started."""
    if not calls:
        return
    workers = min(parallel, len(calls)) - 1
    if workers:
        forkserver.start()  # here, if not started yet: the threads that start its workers never take Ctrl-C
    context = forkserver.context()
    queue = context.Queue()
    unit = "B" if step == "tokenize" else "tok"
    desc = f"{step.replace('_', ' ')}: {len(calls)} {STEP_TASKS[step]}{'s' * (len(calls) > 1)}"
    with Gathered(desc, unit, progress, queue, total), _pool(workers, context, queue) as pool:
        calls_left = _Calls(step, calls)
        here = calls_left.next()  # the first: taken before any worker may take it
        feeders = [threading.Thread(target=calls_left.feed, args=(pool, build), daemon=True) for _ in range(workers)]
        try:
            for feeder in feeders:
                feeder.start()
            while here is not None:
                calls_left.run(here, partial(_step, build, step, here, Relay(queue, f"{step} {here}")))
                here = calls_left.next()
            for feeder in feeders:
                feeder.join()
        except KeyboardInterrupt:
            calls_left.stop()
            if pool is not None:
                _stop(pool)
            raise
    calls_left.raise_failure()


@contextmanager
def _pool(workers: int, context: BaseContext, queue: Queue[Any]) -> Iterator[ProcessPoolExecutor | None]:
    """The pool of ``workers`` processes (none for 0), each started with ``_started``."""
    if not workers:
        yield None
        return
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_started, initargs=(queue, dict(os.environ))
    ) as pool:
        yield pool


class _Calls:
    """A step's calls not taken yet, taken in order by this process and by a thread for each worker (``feed``), which
    submits its worker's calls one at a time. The first failure stops the taking, and is kept to be raised."""

    def __init__(self, step: str, calls: list[tuple[Any, ...]]):
        self.step = step
        self._todo = deque(calls)
        self._lock = threading.Lock()  # held while a call is taken, and while a worker's is submitted: see ``stop``
        self._failures: list[BaseException] = []
        self._stopped = False

    def next(self) -> tuple[Any, ...] | None:
        with self._lock:
            return self._taken()

    def _taken(self) -> tuple[Any, ...] | None:
        """The next call, the lock held; none once one failed or the calls are stopped."""
        return None if self._stopped or self._failures or not self._todo else self._todo.popleft()

    def stop(self) -> None:
        """No call is taken from now on, once none is being submitted (a worker started meanwhile, its process
        forked but not yet the pool's, would outlive the pool's stop, and then print the traceback of its
        semaphores' FileNotFoundError, its parent gone)."""
        with self._lock:
            self._stopped = True

    def feed(self, pool: ProcessPoolExecutor, build: Build) -> None:
        """A worker's calls: the next one taken and submitted (which starts the worker, the first time), then its
        result waited for, until none is left. SIGINT is blocked in this thread: the main thread takes it."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        while True:
            with self._lock:  # taken and submitted at once: ``stop`` waits for both
                if (args := self._taken()) is None:
                    return
                try:
                    future = pool.submit(_run_step, build.config, build.claimed.spec.to_json(), self.step, args)
                except BaseException as exc:  # a pool broken or stopped meanwhile
                    self._failures.append(exc)
                    return
            self.run(args, future.result)

    def run(self, args: tuple[Any, ...], call: Callable[[], StageResult[Any, Any]]) -> None:
        """``call()``, logged as it completes; its failure kept (the first is raised at the end: ``raise_failure``)."""
        try:
            result = call()
        except Exception as exc:
            with self._lock:
                self._failures.append(exc)
            return
        log.info(
            "%s %s: %s tokens in %s, %.1fs",
            self.step,
            args[0],
            f"{result.tokens:,}",
            counted(len(result.outputs), "file"),
            result.seconds,
        )

    def raise_failure(self) -> None:
        if self._failures:
            raise self._failures[0]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the workers at once, in the middle of their steps: their attempts' files stay for the next run of
    the build, which resumes or clears them (``tokenization.output.attempts``)."""
    for process in list(pool._processes.values()):  # Python 3.14's terminate_workers(), before it
        process.terminate()
    pool.shutdown(cancel_futures=True)


STEP_TASKS = {"tokenize": "rank", "merge": "bucket", "context_shuffle": "shard"}
_relayed: Queue[Any] | None = None  # in a worker process: where its step's progress goes


def _started(queue: Queue[Any], environ: dict[str, str]) -> None:
    """A worker's start: SIGINT blocked for good, the parent's environment as it is now (the server's is that of
    when it started), and where its progress goes."""
    global _relayed
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    os.environ.clear()
    os.environ.update(environ)
    _relayed = queue


def _run_step(config: BuildConfig, spec: dict[str, Any], step: str, args: tuple[Any, ...]) -> StageResult[Any, Any]:
    """One step in a worker process, its progress relayed to the parent's bar (several would share one
    terminal). The worker is handed the build as an Airflow task is, its config and its spec, and reads the run's
    claim itself (``Build.of``, as every step reads it again): the build pickled whole, its plan of 100,000 files,
    took ~0.65 s to unpickle for 10,000, a call, where its claim is read once a worker."""
    from tokenization.builds.run import Build  # imported already: the fork server preloads it

    build = Build.of(config, spec, "the build's worker")
    return _step(build, step, args, Relay(_relayed, f"{step} {args}") if _relayed is not None else False)


def _step(build: Build, step: str, args: tuple[Any, ...], progress: ProgressMode) -> StageResult[Any, Any]:
    """One step, in a worker or in this process; profiled when ``PROFILE`` names a folder (``profiled``)."""
    build.entered(build.config.threads)
    with profiled(os.environ.get(PROFILE), f"{step}-{'-'.join(map(str, args))}"):
        return getattr(build, step)(*args, progress=progress)


PROFILE = "TOKENIZATION_PROFILE"


@contextmanager
def profiled(folder: str | None, name: str) -> Iterator[None]:
    """The block under cProfile, its statistics written to ``{folder}/{name}-{pid}.prof`` (``pstats`` reads it)
    when ``folder`` is given. A build's workers are forked from a fork server: py-spy, which follows children,
    does not reach them, and their threads' waits are all a sampler of the parent would see."""
    if not folder:
        yield
        return
    import cProfile  # only when asked for

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{name}-{os.getpid()}.prof")
        profiler.dump_stats(f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
        log.info("%s: profile written to %s", name, path)
