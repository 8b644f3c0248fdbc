"""The next night's rows: what a nightly build costs when little changed, its inputs out of the page cache.

Two corpora of generated web text (``bench.text``): 8 files of ~24 MB, of which one gets a line more the next
night, and 100,000 one-line files, none changed. Each night is a whole build (``workloads.ours_build``) in a
process of its own, with the inputs dropped from the page cache before it (``POSIX_FADV_DONTNEED``); after the next
night, the unchanged files' pages back in the cache (``mincore``) say how much of them it read. The 8-file corpus is
built with and without a cache key (``TOKENIZATION_CACHE_KEY``): without one, each hit reads its input file again
to be checked against it (``stages.hits``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bench import workloads
from bench.text import file_name, write_file
from bench.workloads import Workload

LARGE = (8, 24_000_000)  # files, bytes of text each
SMALL_FILES = 100_000
SMOKE_LARGE, SMOKE_SMALL_FILES = (4, 200_000), 300
HOUR = 3600
KEY = "a bench deployment's secret"
NEXT_NIGHT_COLUMNS = (
    ("next night", "build", "{}"),
    ("input files", "files", "{:,}"),
    ("first night (s)", "first_s", "{:.2f}"),
    ("next night (s)", "next_s", "{:.2f}"),
    ("next / first", "ratio", "{:.2f}x"),
    ("unchanged input read", "unchanged_read", "{:.0%}"),
    ("peak RSS, next night (MB)", "rss_mb", "{:.0f}"),
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def dropped(paths: list[Path]) -> None:
    """The files' pages out of the page cache: written back once (``sync``; an ``fdatasync`` a file flushes the
    disk's cache each time, minutes for 100,000 files), then each file's clean pages dropped."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: Path) -> int:
    """The bytes of the file in the page cache (``mincore`` of a mapping that touches no page)."""
    size = path.stat().st_size
    if not size:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector):
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            return min(size, sum(page & 1 for page in vector) * mmap.PAGESIZE)
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


Measure = Callable[[Workload, dict, dict[str, str] | None], dict]  # ``bench.run.measure``


def next_night_rows(work: Path, base: dict, repeats: int, measure: Measure, smoke: bool = False) -> list[dict]:
    """The 8-file corpus without a key and with one, then the 100,000-file corpus: each the best of ``repeats``,
    each night a whole build that ``measure`` runs in a process of its own."""
    files, text_bytes = SMOKE_LARGE if smoke else LARGE
    large = work / "next-night-large"
    _made(large, files, lambda path, k: write_file(path, 52, k, text_bytes))
    small = work / "next-night-small"
    count = SMOKE_SMALL_FILES if smoke else SMALL_FILES
    _made(small, count, lambda path, k: path.write_bytes(orjson.dumps({"text": f"document {k}: {k * 7919 % 10007}"})))
    changed = sorted(large.iterdir())[files // 2]
    rows = [
        _nights(work, base, large, repeats, measure, f"{files} files of {text_bytes / 1e6:g} MB, one changed", changed),
        _nights(work, base, large, repeats, measure, "the same, with a cache key", changed, key=KEY),
        _nights(work, base, small, repeats, measure, f"{count:,} one-line files, none changed", None),
    ]
    for row in rows:
        print(row, flush=True)
    return rows


def _made(folder: Path, files: int, write: Callable[[Path, int], object]) -> None:
    """The corpus, once, its files last modified an hour ago (a plan remembers what it hashed of older ones)."""
    if folder.exists():
        return
    folder.mkdir(parents=True)
    then = time.time() - HOUR
    for k in range(files):
        path = folder / file_name(k)
        write(path, k)
        os.utime(path, (then, then))


def _nights(
    work: Path,
    base: dict,
    corpus: Path,
    repeats: int,
    measure: Measure,
    label: str,
    changed: Path | None,
    key: str | None = None,
) -> dict:
    """The first night and the next one (``changed`` given a line more before it), each with the inputs out of the
    page cache; the best of ``repeats`` of the pair."""
    paths = sorted(corpus.iterdir())
    env = {"TOKENIZATION_CACHE_KEY": key} if key else {}
    best: dict | None = None
    for _ in range(repeats):
        builds = work / "next-night-builds"
        shutil.rmtree(builds, ignore_errors=True)
        original = changed.read_bytes() if changed else b""
        args = base | {"corpus": str(corpus), "builds": str(builds), "out": str(work / "x")}
        dropped(paths)
        first = measure(workloads.ours_build, args | {"build_id": "first"}, env)
        if changed:
            changed.write_bytes(original + orjson.dumps({"text": "one more document"}) + b"\n")
        dropped(paths)
        following = measure(workloads.ours_build, args | {"build_id": "next"}, env)
        unchanged = [p for p in paths if p != changed]
        read = sum(resident(p) for p in unchanged) / max(1, sum(p.stat().st_size for p in unchanged))
        if changed:
            changed.write_bytes(original)
            os.utime(changed, (time.time() - HOUR, time.time() - HOUR))
        row = {
            "build": label,
            "files": len(paths),
            "first_s": first["seconds"],
            "next_s": following["seconds"],
            "ratio": following["seconds"] / first["seconds"],
            "unchanged_read": read,
            "rss_mb": following["rss_mb"],
        }
        if best is None or row["next_s"] < best["next_s"]:
            best = row
    if best is None:
        raise ValueError("no repeat")
    return best
