"""The pieces a one-file shuffle's writer keeps for its proof (``formats.rejoin``), on disk rather than in memory.

The writer keeps the pieces that window edges cut, two a window at most, in the order it writes them (shuffled); the
proof needs them in the source's order, a span of it at a time. Held in memory they were 24 bytes a piece, and a
second copy while they were joined at close: the one part of a shuffle's peak that grew with a file's documents
beside its index. So each piece goes, as it is hashed, to a bucket file by its number in the source (``width``
numbers a bucket, 64 files at most), and the proof reads the buckets back in order, one at a time, each sorted
once: what is held is a bucket, not the file's pieces. The numbers the writer keeps by, and their numbers in the
source, are held only while it writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokenization.formats.contents import Pieces, factors

RECORD = np.dtype([("number", "<i8"), ("rank", "<i8"), ("sums", "<u8"), ("weighted", "<u8"), ("lengths", "<u8")])
BUCKET = 1 << 18  # source numbers a bucket spans at least: at most 10 MiB of records read back at once
FILES = 64  # bucket files at most, open at once while the writer writes


class KeptPieces:
    """The pieces numbered ``chosen`` (sorted) of a stream as written, whose numbers in their source are ``numbers``
    (one each), kept in ``folder`` (made afresh here: a crashed attempt's files are not appended to; removed by
    ``remove``) as the writer hashes them (``add``, in order); ``count``, the source's pieces, sizes the buckets."""

    def __init__(self, folder: Path, chosen: np.ndarray, numbers: np.ndarray, count: int) -> None:
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.chosen: np.ndarray | None = chosen
        self._numbers: np.ndarray | None = numbers
        self.width = max(BUCKET, -(-count // FILES))
        self._files: dict[int, BinaryIO] = {}
        self.asked = len(chosen)
        self._added = 0
        self._scale: np.ndarray | None = None  # a mixture's: each kept piece's source factor, by rank

    def __len__(self) -> int:
        return self._added

    def add(self, pieces: Pieces) -> None:
        """The next pieces kept (the writer's ``ContentsHasher`` calls it as it closes them), each to its bucket."""
        if self._numbers is None:
            raise RuntimeError("pieces kept after the writer was done: a bug")
        records = np.empty(len(pieces), RECORD)
        records["number"] = self._numbers[self._added : self._added + len(pieces)]
        records["rank"] = np.arange(self._added, self._added + len(pieces))
        records["sums"], records["weighted"], records["lengths"] = pieces.sums, pieces.weighted, pieces.lengths
        self._added += len(pieces)
        buckets = records["number"] // self.width
        records = records[np.argsort(buckets, kind="stable")]
        buckets.sort()
        bounds = np.flatnonzero(np.diff(buckets)) + 1
        for a, b in zip(np.append(0, bounds), np.append(bounds, len(records)), strict=True):
            if a < b:
                self._file(int(buckets[a])).write(records[a:b].tobytes())

    def _file(self, bucket: int) -> BinaryIO:
        if bucket not in self._files:
            self._files[bucket] = (self.folder / f"{bucket:06d}").open("ab")
        return self._files[bucket]

    def sealed(self, written_sources: np.ndarray | None = None) -> None:
        """The writer is done: its files closed, the numbers it kept by let go; ``written_sources``, a mixture's,
        the source of every piece written (the kept ones' give them theirs)."""
        if written_sources is not None and self.chosen is not None:
            self._scale = factors(np.asarray(written_sources)[self.chosen])
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self.chosen = self._numbers = None

    def reader(self) -> KeptReader:
        """The kept pieces in the order of their numbers in the source, once the writer is done."""
        if self._files:
            raise RuntimeError("kept pieces read while their writer writes: a bug")
        return KeptReader(self.folder, self.width, self._scale, self.asked == self._added)

    def remove(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


class KeptReader:
    """Walks kept pieces in the order of their numbers in the source, a bucket file read at a time."""

    def __init__(self, folder: Path, width: int, scale: np.ndarray | None, complete: bool) -> None:
        self._buckets = sorted(int(p.name) for p in folder.iterdir())
        self._folder, self._width, self._scale, self._complete = folder, width, scale, complete
        self._kept = sum((folder / f"{b:06d}").stat().st_size // RECORD.itemsize for b in self._buckets)
        self._held = np.zeros(0, RECORD)  # read, sorted, not yet given
        self.given = 0

    def below(self, number: int) -> tuple[np.ndarray, Pieces]:
        """The pieces not given yet whose numbers are below ``number``, sorted by them: their numbers and sums."""
        while self._buckets and self._buckets[0] * self._width < number:
            path = self._folder / f"{self._buckets.pop(0):06d}"
            read = np.fromfile(path, RECORD)
            path.unlink()
            read = read[np.argsort(read["number"], kind="stable")]
            self._held = np.concatenate([self._held, read]) if len(self._held) else read
        cut = int(np.searchsorted(self._held["number"], number))
        given, self._held = self._held[:cut], self._held[cut:]
        self.given += len(given)
        scale = None if self._scale is None else self._scale[given["rank"]]
        sums, weighted, lengths = (np.ascontiguousarray(given[f]) for f in ("sums", "weighted", "lengths"))
        return np.ascontiguousarray(given["number"]), Pieces(sums, weighted, lengths, scale)

    def whole(self) -> bool:
        """Whether every piece asked for was kept, and given: none numbered past every number asked for."""
        return self._complete and self.given == self._kept
