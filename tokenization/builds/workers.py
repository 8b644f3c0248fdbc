"""The processes a build's steps run in on one machine (``Build.run``): forked from a fork server that imported the
stages once, Ctrl-C kept from them while they start and handled here, their progress relayed to one bar, and each
step profiled when ``TOKENIZATION_PROFILE`` names a folder."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from contextlib import contextmanager
from multiprocessing.queues import Queue
from typing import TYPE_CHECKING, Any, Literal

from tokenization.builds import forkserver
from tokenization.output.manifest import StageResult
from tokenization.progress import Gathered, ProgressMode, Relay
from tokenization.wording import counted

if TYPE_CHECKING:
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
    """Run ``step`` once per argument tuple in up to ``parallel`` fresh processes (``forkserver``), logging each
    as it completes; the first failure cancels what has not started. Their progress is shown summed, as one
    bar (``total``: their work, in the step's unit, when known). The workers never see Ctrl-C (a terminal sends
    it to every process of the group, and each would print its traceback): interrupted, this process stops
    them, mid-step."""
    if not calls:
        return
    context = forkserver.context()
    queue = context.Queue()
    unit = "B" if step == "tokenize" else "tok"
    desc = f"{step.replace('_', ' ')}: {len(calls)} {STEP_TASKS[step]}{'s' * (len(calls) > 1)}"
    with (
        Gathered(desc, unit, progress, queue, total),
        ProcessPoolExecutor(
            min(parallel, len(calls)), mp_context=context, initializer=_started, initargs=(queue, dict(os.environ))
        ) as pool,
    ):
        try:
            with forkserver.interrupts_blocked():  # the workers start as the calls are submitted
                futures = {pool.submit(_run_step, build, step, args): args for args in calls}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        except KeyboardInterrupt:
            _stop(pool)
            raise
        for future in pending:
            future.cancel()
        for future in list(done) + list(pending):
            if not future.cancelled():
                result = future.result()  # raises the step's error
                log.info(
                    "%s %s: %s tokens in %s, %.1fs",
                    step,
                    futures[future][0],
                    f"{result.tokens:,}",
                    counted(len(result.outputs), "file"),
                    result.seconds,
                )


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


def _run_step(build: Build, step: str, args: tuple[Any, ...]) -> StageResult[Any, Any]:
    """One step in a worker process, its progress relayed to the parent's bar (several would share one
    terminal); profiled when ``PROFILE`` names a folder (``profiled``)."""
    build.entered(build.config.threads)
    progress = Relay(_relayed, f"{step} {args}") if _relayed is not None else False
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
