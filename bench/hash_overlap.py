"""Whether a stage's file checksum runs beside the bytes' moving: a file written through ``HashedFile`` (as every
stage writes its token files) in 64 MiB blocks, each made by the caller as a gather makes it. Prints the process's
CPU (user + sys) and wall, each thread's CPU, and how much of the hash thread's wall time ran while the write thread
was writing: the overlap, which the machine's load does not change the way it changes wall time.

    python -m bench.hash_overlap [blake3|sha256] [MiB] [FILE]
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenization.formats.hashed_file import HashedFile
from tokenization.storage.checksums import ALGORITHM, Hasher, hasher

BLOCK = 64 << 20


class _Timed:
    """A hasher whose updates are timed (``spans``: their wall intervals; ``cpu``: their thread's CPU)."""

    def __init__(self, inner: Hasher, spans: list[tuple[float, float]], cpu: list[float]):
        self.inner = inner
        self.update = _timed(inner.update, spans, cpu)

    def hexdigest(self) -> str:
        return self.inner.hexdigest()


def _timed(call: Callable, spans: list[tuple[float, float]], cpu: list[float]) -> Callable:
    def run(*args: object) -> None:
        wall, own = time.perf_counter(), time.thread_time()
        call(*args)
        cpu[0] += time.thread_time() - own
        spans.append((wall, time.perf_counter()))

    return run


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def main(algorithm: str, mib: int, path: Path) -> None:
    hashing: list[tuple[float, float]] = []
    writing: list[tuple[float, float]] = []
    hash_cpu, write_cpu = [0.0], [0.0]
    block = np.random.default_rng(0).integers(0, 50_000, BLOCK // 2, dtype=np.uint16)
    f = HashedFile(path, durable=True)
    f.digest = _Timed(hasher(algorithm), hashing, hash_cpu)
    f._append = _timed(f._append, writing, write_cpu)  # type: ignore[method-assign]
    before, start, own = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.thread_time()
    for _ in range(mib * (1 << 20) // BLOCK):
        f.write(block.copy())
    caller = time.thread_time() - own
    f.close()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    path.unlink()
    hashed = sum(end - begin for begin, end in hashing)
    print(
        f"{algorithm}: {mib} MiB: wall {wall:.2f} s, process CPU {cpu:.2f} s; the caller {caller:.2f}, the write "
        f"thread {write_cpu[0]:.2f}, the hash thread {hash_cpu[0]:.2f} ({hash_cpu[0] / (mib << 20) * 1e9:.2f} ns a "
        f"byte); the hash thread's wall {hashed:.2f} s, {_overlap(hashing, writing) / hashed:.0%} of it while a write "
        "ran"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else ALGORITHM,
        int(args[1]) if len(args) > 1 else 1024,
        Path(args[2] if len(args) > 2 else "hash_overlap.bin"),
    )
