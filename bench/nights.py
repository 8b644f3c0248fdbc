"""The next night's rows: what a nightly build costs when little changed, its inputs out of the page cache.

Three corpora of generated web text (``bench.text``): 8 files of ~24 MB, of which one gets a line more the next
night; the same text in 24 files of ~8 MB, two of one rank's getting a line more (where that rank's misses were
slow); and 100,000 one-line files, none changed. Each night is a whole build (``workloads.ours_build``) in a
process of its own, with the inputs dropped from the page cache before it (``POSIX_FADV_DONTNEED`` on each file:
``/proc/sys/vm/drop_caches`` needs root, and drops every other process's pages too); after the next night, the
unchanged files' pages back in the cache (``mincore``) say how much of them it read. The 8-file corpus is built
with and without a cache key (``TOKENIZATION_CACHE_KEY``): without one, each hit reads its sampled documents from
its input to be checked against them (``stages.tokenize.hits``). Each night's CPU time, its workers' included, is
measured beside its wall time: on a loaded machine the wall time says how busy the others were.
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
MANY = (24, 8_000_000)  # the same text in more files, two of them changed
SMALL_FILES = 100_000
SMOKE_LARGE, SMOKE_MANY, SMOKE_SMALL_FILES = (4, 200_000), (12, 70_000), 300
RANKS = 4  # ``workloads.ours_build``'s: files k, k + 4, ... of equal sizes are one rank's
HOUR = 3600
KEY = "a bench deployment's secret"
NEXT_NIGHT_COLUMNS = (
    ("next night", "build", "{}"),
    ("input files", "files", "{:,}"),
    ("first night (s)", "first_s", "{:.2f}"),
    ("next night (s)", "next_s", "{:.2f}"),
    ("next / first", "ratio", "{:.2f}x"),
    ("ranks / first night", "ranks_ratio", "{:.2f}x"),
    ("CPU, first night (s)", "first_cpu_s", "{:.1f}"),
    ("CPU, next night (s)", "next_cpu_s", "{:.1f}"),
    ("CPU next / first", "cpu_ratio", "{:.2f}x"),
    ("unchanged input read", "unchanged_read", "{:.0%}"),
    ("peak RSS, next night (MB)", "rss_mb", "{:.0f}"),
    ("peak RSS, a worker (MB)", "workers_rss_mb", "{:.0f}"),
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
    """The 8-file corpus without a key and with one, the 24-file corpus, then the 100,000-file corpus: each the best
    of ``repeats``, each night a whole build that ``measure`` runs in a process of its own."""
    large, changed, large_label = _large(work, smoke)
    many, many_bytes = SMOKE_MANY if smoke else MANY
    spread = work / "next-night-many"
    _made(spread, many, lambda path, k: write_file(path, 52, k, many_bytes))
    one_rank = [sorted(spread.iterdir())[k] for k in (RANKS, many - RANKS)]  # rank 0's second and last files
    label = f"{many} files of {many_bytes / 1e6:g} MB, two of a rank changed"
    rows = [
        _nights(work, base, large, repeats, measure, large_label, changed),
        _nights(work, base, large, repeats, measure, "the same, with a cache key", changed, key=KEY),
        _nights(work, base, spread, repeats, measure, label, one_rank),
        small_files_row(work, base, repeats, measure, smoke),
    ]
    for row in rows:
        print(row, flush=True)
    return rows


def _large(work: Path, smoke: bool) -> tuple[Path, list[Path], str]:
    """The 8-file corpus, made once; the file that changes the next night; the row's label."""
    files, text_bytes = SMOKE_LARGE if smoke else LARGE
    large = work / "next-night-large"
    _made(large, files, lambda path, k: write_file(path, 52, k, text_bytes))
    return large, [sorted(large.iterdir())[files // 2]], f"{files} files of {text_bytes / 1e6:g} MB, one changed"


def main() -> None:
    """The first row alone (8 files, one changed, no cache key), a pair of nights at a time, each pair printed:
    ``python -m bench.nights [--repeats N] [--work DIR]`` (the corpus is kept in DIR for the next call)."""
    import argparse

    from bench.run import EOS, SHARED, measure  # which imports this module

    parser = argparse.ArgumentParser(prog="python -m bench.nights", description=main.__doc__)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", default="/tmp/tokenization-bench-nights")
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2" / "tokenizer.json"))
    parser.add_argument("--smoke", action="store_true", help="4 files of 200 kB")
    args = parser.parse_args()
    work = Path(args.work)
    base = {"tokenizer": args.tokenizer, "eos": EOS, "text_key": "text"}
    corpus, changed, label = _large(work, args.smoke)
    for _ in range(args.repeats):
        print(orjson.dumps(_nights(work, base, corpus, 1, measure, label, changed)).decode(), flush=True)


def small_files_row(work: Path, base: dict, repeats: int, measure: Measure, smoke: bool = False) -> dict:
    """The 100,000-file corpus's row alone (``--only small-files``): a next night of one-line files, none changed,
    where a hit costs what a file costs, whatever its bytes."""
    small = work / "next-night-small"
    count = SMOKE_SMALL_FILES if smoke else SMALL_FILES
    _made(small, count, lambda path, k: path.write_bytes(orjson.dumps({"text": f"document {k}: {k * 7919 % 10007}"})))
    return _nights(work, base, small, repeats, measure, f"{count:,} one-line files, none changed", [])


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
    changed: list[Path],
    key: str | None = None,
) -> dict:
    """The first night and the next one (each of ``changed`` given a line more before it), each with the inputs out
    of the page cache; the best of ``repeats`` of the pair."""
    paths = sorted(corpus.iterdir())
    env = {"TOKENIZATION_CACHE_KEY": key} if key else {}
    best: dict | None = None
    for _ in range(repeats):
        builds = work / "next-night-builds"
        shutil.rmtree(builds, ignore_errors=True)
        originals = [path.read_bytes() for path in changed]
        args = base | {"corpus": str(corpus), "builds": str(builds), "out": str(work / "x")}
        dropped(paths)
        first = measure(workloads.ours_build, args | {"build_id": "first"}, env)
        for path, original in zip(changed, originals, strict=True):
            path.write_bytes(original + orjson.dumps({"text": "one more document"}) + b"\n")
        dropped(paths)
        following = measure(workloads.ours_build, args | {"build_id": "next"}, env)
        unchanged = [p for p in paths if p not in changed]
        read = sum(resident(p) for p in unchanged) / max(1, sum(p.stat().st_size for p in unchanged))
        for path, original in zip(changed, originals, strict=True):
            path.write_bytes(original)
            os.utime(path, (time.time() - HOUR, time.time() - HOUR))
        ranks = [_ranks_seconds(builds / night) for night in ("first", "next")]
        if len(missed := _missing_ranks(builds / "next")) > 1 and len(changed) > 1:
            raise RuntimeError(f"{label}: the changed files were tokenized by ranks {sorted(missed)}, not by one")
        row = {
            "build": label,
            "files": len(paths),
            "first_s": first["seconds"],
            "next_s": following["seconds"],
            "ratio": following["seconds"] / first["seconds"],
            "ranks_ratio": ranks[1] / ranks[0],
            "first_cpu_s": first["cpu_s"],
            "next_cpu_s": following["cpu_s"],
            "cpu_ratio": following["cpu_s"] / first["cpu_s"],
            "unchanged_read": read,
            "rss_mb": following["rss_mb"],
            "workers_rss_mb": following["workers_rss_mb"],
        }
        if best is None or row["next_s"] < best["next_s"]:
            best = row
    if best is None:
        raise ValueError("no repeat")
    return best


def _ranks_seconds(build: Path) -> float:
    """The tokenize stage's time: its ranks' seconds, summed, as the build record keeps them."""
    return float(orjson.loads((build / "_BUILD.json").read_bytes())["cache"]["tokenize_seconds"])


def _missing_ranks(build: Path) -> set[str]:
    """The ranks of a build that tokenized a file (a miss), by their manifests' names."""
    manifests = (build / "ranks" / "_manifests").glob("*.json")
    return {p.stem for p in manifests if not all(f["hit"] for f in orjson.loads(p.read_bytes())["cache"]["files"])}


if __name__ == "__main__":
    main()
