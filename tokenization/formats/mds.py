"""mosaicml streaming's MDS format, written with numpy: what ``streaming.StreamingDataset`` and litdata read.

A dataset is a folder of shards and ``index.json``, which lists them and is written last: a reader that finds the
index finds every shard it names. The bytes are those streaming 0.13's ``MDSWriter(columns=..., hashes=["sha1"])``
writes for the same samples (``tests/stages/test_export_mds.py`` holds it):

* ``shard.00000.mds``: a uint32 sample count n; n + 1 uint32 offsets of the samples from the file's start; the
  shard's config as JSON (sorted keys); the samples. A shard ends before the sample that would take it past
  ``size_limit`` bytes, counting 4 bytes more a sample for its offset (``MDSWriter``'s rule; unlike it, a sample
  larger than the limit gets a shard of its own rather than an empty shard before it).
* a sample: a uint32 size for each column (every column here varies in size), then the columns' bytes, columns
  in the order of their names.
* an ``ndarray:DTYPE`` column (its dtype fixed, its shape not): one byte ``ndim << 2 | k``, the shape as
  uint8, 16, 32 or 64 (k = 0 to 3, the narrowest that holds the largest dimension), then the values.
* ``index.json``: ``{"shards": [...], "version": 2}``, each shard's config with ``samples`` and ``raw_data``
  (``basename``, ``bytes``, ``hashes``: the sha1 a reader checks with ``validate_hash="sha1"``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenization.storage.folder import TEMPORARY_MARK, Folder

INDEX = "index.json"
SIZE_LIMIT = 1 << 26  # MDSWriter's default shard size, 64 MiB: a shard is built whole in memory, then put
SHARD_LIMIT = (1 << 32) - 1  # the largest size limit: a shard's offsets are uint32 (MDSWriter refuses 2**32 too)
HASH = "sha1"  # each shard's, in the index; streaming knows sha1 without an extra package (xxhash's need one)
SHARD = re.compile(r"shard\.\d{5}\.mds")
# What a writer killed while it put a shard or the index leaves behind (``files.temporary_name``)
LEFTOVER = re.compile(rf"\.(shard\.\d{{5}}\.mds|index\.json){re.escape(TEMPORARY_MARK)}[0-9a-f]+")
_SHAPE_DTYPES = tuple(np.dtype(f"<u{size}") for size in (1, 2, 4, 8))  # k = 0..3 in a shape's first byte
_SHAPE_LIMITS = np.array([1 << 8, 1 << 16, 1 << 32])  # a length below the k-th needs shape dtype k
SHORT_RUN = 64  # bytes a piece on average, at most, that one numpy scatter copies (its index: 16 bytes a byte)
Run = tuple[np.ndarray, np.ndarray, np.ndarray]  # a piece of each sample: their bytes, each one's size and start


@dataclass(frozen=True)
class Column:
    """A 1-D array column of a fixed dtype, its length free (``ndarray:uint16``)."""

    name: str
    dtype: np.dtype

    @property
    def encoding(self) -> str:
        return f"ndarray:{self.dtype.name}"


def _heads(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The head of each 1-D ``ndarray:DTYPE`` value of these lengths (its shape's byte, then its shape), one after
    another in one byte array, and the size of each."""
    if len(lengths) and lengths.min() < 1:
        raise ValueError("an MDS ndarray value holds at least one item")
    k = np.searchsorted(_SHAPE_LIMITS, lengths, side="right")  # the narrowest shape dtype that holds the length
    sizes = 1 + (1 << k)
    offsets = np.cumsum(sizes) - sizes
    heads = np.empty(int(sizes.sum()), np.uint8)
    heads[offsets] = 1 << 2 | k  # ndim 1
    for code in np.unique(k):
        which = k == code
        shape = lengths[which].astype(_SHAPE_DTYPES[code]).view(np.uint8).reshape(-1, 1 << code)
        heads[(offsets[which] + 1)[:, None] + np.arange(1 << code)] = shape
    return heads, sizes


class MdsWriter:
    """Writes samples into shards of at most ``size_limit`` bytes, each put whole, then ``index.json`` (``finish``).

    A shard is a file of ``out`` only once it is whole (``Folder.put``); the index that names a set of shards
    appears only after all of them, so a reader never sees half a dataset. The writer removes an older index
    first, and after the new one the shards it does not name and the temporary files of a writer killed there.
    """

    def __init__(self, out: Folder, columns: list[Column], size_limit: int = SIZE_LIMIT):
        if not 0 < size_limit <= SHARD_LIMIT:
            raise ValueError(f"an MDS shard's size limit is 1 to {SHARD_LIMIT:,} bytes, not {size_limit:,}")
        self.out = out
        self.columns = sorted(columns, key=lambda column: column.name)
        self.config: dict[str, Any] = {
            "column_encodings": [column.encoding for column in self.columns],
            "column_names": [column.name for column in self.columns],
            "column_sizes": [None] * len(self.columns),
            "compression": None,
            "format": "mds",
            "hashes": [HASH],
            "size_limit": size_limit,
            "version": 2,
        }
        self._config_json = json.dumps(self.config, sort_keys=True).encode()
        self.shards: list[dict[str, Any]] = []
        self._samples = np.empty(0, np.uint8)  # the samples of the shard being filled, as the shard holds them
        self._used = 0  # its bytes so far
        self._sizes: list[np.ndarray] = []  # each of its samples' size
        self._size = self._empty_size  # the shard's size so far, as MDSWriter counts it
        out.remove(INDEX)

    @property
    def _empty_size(self) -> int:
        return 4 + 4 + len(self._config_json)  # the sample count, the offset after the last, the config

    def write(self, values: dict[str, np.ndarray], lengths: dict[str, np.ndarray]) -> None:
        """Add samples, many at once: for each column (by name) its values, one sample's after another, and the
        length of each sample's. Each sample's pieces are copied to their place in the shard: a 2,049-token window
        encoded alone, as a bytes object, cost ~16 us (4.6x cp + sync)."""
        runs = self._runs(values, lengths)
        sizes = np.sum([run_sizes for _, run_sizes, _ in runs], axis=0)
        room = np.cumsum(sizes + 4)  # each sample with its offset
        start = 0
        while start < len(sizes):
            taken = room[start - 1] if start else 0
            fits = taken + self.config["size_limit"] - self._size  # (below taken: the shard is full already)
            end = max(start, int(np.searchsorted(room, fits, side="right")))
            if end == start:  # the next sample does not fit: a new shard, or this one alone
                if self._sizes:
                    self._flush()
                    continue
                end = start + 1
            self._place(runs, sizes, start, end)
            self._size += int(room[end - 1] - taken)
            start = end

    def _runs(self, values: dict[str, np.ndarray], lengths: dict[str, np.ndarray]) -> list[Run]:
        """Each sample's pieces, in the order a sample holds them, as runs: its header (each column's size), then
        each column's head and values."""
        pieces: list[tuple[np.ndarray, np.ndarray]] = []
        for column in self.columns:
            length = np.asarray(lengths[column.name], np.int64)
            data = np.ascontiguousarray(values[column.name], column.dtype)
            if len(data) != length.sum():
                raise ValueError(f"column {column.name}: {len(data):,} values, {length.sum():,} in its samples")
            pieces += [_heads(length), (data.view(np.uint8), length * column.dtype.itemsize)]
        datums = np.stack([pieces[i][1] + pieces[i + 1][1] for i in range(0, len(pieces), 2)], axis=1)
        header = np.ascontiguousarray(datums, "<u4").view(np.uint8).reshape(-1)
        pieces.insert(0, (header, np.full(len(datums), 4 * len(self.columns), np.int64)))
        return [(data, sizes, np.cumsum(sizes) - sizes) for data, sizes in pieces]

    def _place(self, runs: list[Run], sizes: np.ndarray, start: int, end: int) -> None:
        """Copy samples ``start`` to ``end`` (excluded) after the shard's samples so far."""
        taken = sizes[start:end]
        need = self._used + int(taken.sum())
        if need > len(self._samples):  # a shard's worth, once; more only for a sample larger than a shard
            grown = np.empty(max(need, self.config["size_limit"]), np.uint8)
            grown[: self._used] = self._samples[: self._used]
            self._samples = grown
        at = self._used + np.cumsum(taken) - taken  # where each sample starts
        for data, run_sizes, run_starts in runs:
            run = run_sizes[start:end]
            _copy_runs(self._samples, at, data, run_starts[start:end], run)
            at += run
        self._used = need
        self._sizes.append(taken)

    @property
    def samples(self) -> int:
        """The samples in the shards put so far."""
        return sum(shard["samples"] for shard in self.shards)

    def finish(self) -> str:
        """Put the last shard and the index; remove older shards the index does not name, and what a writer killed
        here left. The index's sha256."""
        if self._sizes:
            self._flush()
        index = json.dumps({"shards": self.shards, "version": 2}, sort_keys=True).encode()
        self.out.put(INDEX, index)
        named = {shard["raw_data"]["basename"] for shard in self.shards}
        for name in self.out.list():
            if (SHARD.fullmatch(name) and name not in named) or LEFTOVER.fullmatch(name):
                self.out.remove(name)
        return hashlib.sha256(index).hexdigest()

    def _flush(self) -> None:
        sizes = np.concatenate(self._sizes)
        start = 4 + 4 * (len(sizes) + 1) + len(self._config_json)
        offsets = start + np.concatenate([[0], np.cumsum(sizes)])
        prefix = np.uint32(len(sizes)).tobytes() + offsets.astype("<u4").tobytes() + self._config_json
        data = b"".join([prefix, self._samples.data[: self._used]])
        name = f"shard.{len(self.shards):05}.mds"
        self.out.put(name, data)
        digest = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        raw = {"basename": name, "bytes": len(data), "hashes": {HASH: digest}}
        self.shards.append({"samples": len(sizes), "raw_data": raw, "zip_data": None, **self.config})
        self._used, self._sizes, self._size = 0, [], self._empty_size


def _copy_runs(out: np.ndarray, at: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """``out[at[i] : at[i] + lengths[i]] = data[starts[i] : ...]`` for every i: short runs (headers, shapes, a
    window's document ends) in one numpy scatter, long ones (a window's tokens) a copy each, ~0.2 us and memcpy."""
    if lengths.sum() <= SHORT_RUN * len(lengths):
        inner = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[np.repeat(at, lengths) + inner] = data[np.repeat(starts, lengths) + inner]
        return
    target, source = out.data, data.data
    for to, start, length in zip(at.tolist(), starts.tolist(), lengths.tolist(), strict=True):
        target[to : to + length] = source[start : start + length]
