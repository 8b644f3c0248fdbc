"""Progress of a long stage, as a person watching it needs it: percent done, documents, tokens, tokens/s, ETA.

On a terminal it is a tqdm bar. In a task log, where a redrawn bar collapses into one line, it is a log line every
N seconds, the first as the stage starts and the next ones sooner (``FIRST_GAP`` seconds, then twice that, ... up
to N), so that a stage shorter than N shows more than its final line. Stages take ``progress``: ``None`` picks by
whether stderr is a terminal (lines every ``DEFAULT_SECONDS``), ``True`` a bar, a number a line every that many
seconds, ``False`` nothing, and a ``Relay`` sends it to a parent process, which shows the sum of its workers'
(``Gathered``): one bar, not one a worker.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from tqdm import tqdm

log = logging.getLogger("tokenization.progress")

DEFAULT_SECONDS = 30.0
FIRST_GAP = 2.0  # seconds from a stage's first progress line to its second; each gap after doubles, up to N
RELAY_SECONDS = 0.5  # a worker's progress reaches its parent at most this often: a put is ~10 us, a redraw more


class Relay:
    """Where a worker process's ``Progress`` goes instead of a terminal: ``(key, done, total, counts)`` put on a
    queue that the parent's ``Gathered`` reads, at most every ``RELAY_SECONDS`` and once at the end."""

    def __init__(self, queue: Queue[Any], key: str):
        self.queue, self.key = queue, key
        self._sent = float("-inf")

    def send(self, progress: Progress, final: bool = False) -> None:
        if final or time.monotonic() - self._sent >= RELAY_SECONDS:
            self.queue.put((self.key, progress.done, progress.total, dict(progress.counts)))
            self._sent = time.monotonic()


ProgressMode = bool | float | Relay | None


class Progress:
    """Work done out of ``total`` (in ``unit``: ``B`` of input or ``tok`` of output), with counts alongside. Used
    with ``with``: the bar is closed on errors too, and the last line says done only when the stage is."""

    def __init__(self, desc: str, total: int, unit: str, mode: ProgressMode = None):
        self.desc, self.total, self.unit = desc, max(int(total), 0), unit
        self.started = time.monotonic()
        self.done = 0
        self.counts: dict[str, int] = {}
        self.relay = mode if isinstance(mode, Relay) else None
        if mode is None:
            mode = True if sys.stderr.isatty() else DEFAULT_SECONDS
        self.bar: tqdm[Any] | None = None
        if mode is True:  # tqdm is imported only for a bar: a task log's stage starts without it
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit=unit, unit_scale=True, desc=desc)
        self.interval = None if isinstance(mode, bool | Relay) else float(mode)
        self._gap = min(FIRST_GAP, self.interval or 0)
        self._next_line = self.started  # the first line as soon as there is work to show
        if self.interval is not None and self.total:
            self._log_line()

    def update(self, done: int, **counts: int) -> None:
        """Set the work done so far and the running counts (``docs=``, ``tokens=``)."""
        self.done, self.counts = int(done), counts
        if self.relay is not None:
            self.relay.send(self)
        elif self.bar is not None:
            self.bar.update(self.done - self.bar.n)
            self.bar.set_postfix(self._postfix(), refresh=False)
        elif self.interval is not None and time.monotonic() >= self._next_line and self.total:
            self._log_line()

    def _log_line(self) -> None:
        """A line now; the next after the current gap, and each gap twice the one before, up to the interval."""
        log.info("%s", self.line())
        self._next_line = time.monotonic() + self._gap
        self._gap = min(2 * self._gap, cast(float, self.interval))

    def advance(self, amount: int, **counts: int) -> None:
        """Add ``amount`` of work and these increments to the counts."""
        self.update(self.done + amount, **{k: self.counts.get(k, 0) + counts.get(k, 0) for k in counts | self.counts})

    def grow(self, total: int) -> None:
        """A new total: work whose size was not known when this began."""
        self.total = int(total)
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def line(self) -> str:
        """``rank 3: 41.7% of 1.2 GB, 12,345 docs, 45,678,901 tokens, 1.52 Mtok/s, ETA 0:02:13``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        fraction = self.done / self.total if self.total else 1.0
        eta = timedelta(seconds=round(elapsed * (1 - fraction) / fraction)) if fraction > 0 else "unknown"
        parts = [f"{self.desc}: {100 * fraction:.1f}% of {_size(self.total, self.unit)}"]
        parts += [f"{n:,} {name}" for name, n in self.counts.items()]
        if "tokens" in self.counts:
            parts.append(f"{self.counts['tokens'] / elapsed / 1e6:.2f} Mtok/s")
        parts.append(f"ETA {eta}")
        return ", ".join(parts)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.relay is not None:
            if exc_type is None:
                self.relay.send(self, final=True)
        elif self.bar is not None:
            self.bar.close()
        elif self.interval is not None and exc_type is None:
            log.info("%s (done in %.1fs)", self.line(), time.monotonic() - self.started)

    def _postfix(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        postfix = {name: f"{n:,}" for name, n in self.counts.items()}
        if "tokens" in self.counts:
            postfix["tok/s"] = f"{self.counts['tokens'] / elapsed:,.0f}"
        return postfix


class Gathered:
    """Worker processes' progress, each relayed on ``queue`` (``Relay``), summed into one ``Progress`` here by a
    thread of its own. ``total``: all the workers' work, when known up front; else the sum of the totals they
    report, which grows as they start."""

    def __init__(self, desc: str, unit: str, mode: ProgressMode, queue: Queue[Any], total: int | None = None):
        self.queue, self.fixed = queue, total is not None
        self.progress = Progress(desc, total or 0, unit, mode)
        self._reader = threading.Thread(target=self._read, name="progress", daemon=True)

    def __enter__(self) -> Gathered:
        self._reader.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not KeyboardInterrupt:  # else the workers were stopped, maybe mid-message: the reader (a
            self.queue.put(None)  # daemon) is left; this comes after every worker's last message, as they exited
            self._reader.join()
        self.progress.__exit__(exc_type, exc, tb)

    def _read(self) -> None:
        latest: dict[str, tuple[int, int, dict[str, int]]] = {}
        while (message := self._next()) is not None:
            key, done, total, counts = message
            latest[key] = (done, total, counts)
            if not self.fixed:
                self.progress.grow(sum(total for _, total, _ in latest.values()))
            summed: Counter[str] = Counter()
            for _, _, each in latest.values():
                summed.update(each)
            self.progress.update(sum(done for done, _, _ in latest.values()), **summed)

    def _next(self) -> tuple[str, int, int, dict[str, int]] | None:
        """The next message; None at the end, or once no process can send one: after Ctrl-C the reader is left, and
        the build's own process, which relays its own step's progress too, closes its end of the queue as it exits."""
        try:
            return cast(tuple[str, int, int, dict[str, int]] | None, self.queue.get())
        except (EOFError, OSError):
            return None


def _size(amount: int, unit: str) -> str:
    if unit == "B":
        for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if amount >= scale:
                return f"{amount / scale:.1f} {name}"
        return f"{amount} B"
    return f"{amount:,} {unit}"
