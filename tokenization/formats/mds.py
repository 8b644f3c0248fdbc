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

from tokenization.storage.folder import Folder

INDEX = "index.json"
SIZE_LIMIT = 1 << 26  # MDSWriter's default shard size, 64 MiB: a shard is built whole in memory, then put
HASH = "sha1"  # each shard's, in the index; streaming knows sha1 without an extra package (xxhash's need one)
SHARD = re.compile(r"shard\.\d{5}\.mds")
_SHAPE_DTYPES = tuple(np.dtype(f"<u{size}") for size in (1, 2, 4, 8))  # k = 0..3 in a shape's first byte


@dataclass(frozen=True)
class Column:
    """A 1-D array column of a fixed dtype, its length free (``ndarray:uint16``)."""

    name: str
    dtype: np.dtype

    @property
    def encoding(self) -> str:
        return f"ndarray:{self.dtype.name}"


def encode_sample(arrays: list[np.ndarray]) -> bytes:
    """One sample: its 1-D arrays, non-empty and little-endian, in the order of their columns' names."""
    data = [_ndarray(array) for array in arrays]
    return np.array([len(datum) for datum in data], "<u4").tobytes() + b"".join(data)


def _ndarray(values: np.ndarray) -> bytes:
    """An ``ndarray:DTYPE`` value: its shape's byte, its shape, its values (little-endian)."""
    length = len(values)
    k = 0 if length < 1 << 8 else 1 if length < 1 << 16 else 2 if length < 1 << 32 else 3
    return bytes([1 << 2 | k]) + np.array([length], _SHAPE_DTYPES[k]).tobytes() + values.tobytes()


class MdsWriter:
    """Writes samples into shards of at most ``size_limit`` bytes, each put whole, then ``index.json`` (``finish``).

    A shard is a file of ``out`` only once it is whole (``Folder.put``); the index that names a set of shards
    appears only after all of them, so a reader never sees half a dataset. The writer removes an older index
    first, and after the new one the shards it does not name.
    """

    def __init__(self, out: Folder, columns: list[Column], size_limit: int = SIZE_LIMIT):
        if not 0 < size_limit < 1 << 32:  # a shard's offsets are uint32
            raise ValueError(f"an MDS shard's size limit is 1 to 2**32 - 1 bytes, not {size_limit}")
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
        self._samples: list[bytes] = []
        self._size = self._empty_size
        out.remove(INDEX)

    @property
    def _empty_size(self) -> int:
        return 4 + 4 + len(self._config_json)  # the sample count, the offset after the last, the config

    def write(self, arrays: dict[str, np.ndarray]) -> None:
        """Add a sample: an array for each column, by name."""
        sample = encode_sample([np.asarray(arrays[column.name], column.dtype) for column in self.columns])
        size = len(sample) + 4  # its offset
        if self._samples and self._size + size > self.config["size_limit"]:
            self._flush()
        self._samples.append(sample)
        self._size += size

    @property
    def samples(self) -> int:
        """The samples in the shards put so far."""
        return sum(shard["samples"] for shard in self.shards)

    def finish(self) -> str:
        """Put the last shard and the index; remove older shards the index does not name. The index's sha256."""
        if self._samples:
            self._flush()
        index = json.dumps({"shards": self.shards, "version": 2}, sort_keys=True).encode()
        self.out.put(INDEX, index)
        named = {shard["raw_data"]["basename"] for shard in self.shards}
        for name in self.out.list():
            if SHARD.fullmatch(name) and name not in named:
                self.out.remove(name)
        return hashlib.sha256(index).hexdigest()

    def _flush(self) -> None:
        count = len(self._samples)
        sizes = np.fromiter(map(len, self._samples), np.int64, count)
        start = 4 + 4 * (count + 1) + len(self._config_json)
        offsets = start + np.concatenate([[0], np.cumsum(sizes)])
        data = b"".join(
            [np.uint32(count).tobytes(), offsets.astype("<u4").tobytes(), self._config_json, *self._samples]
        )
        name = f"shard.{len(self.shards):05}.mds"
        self.out.put(name, data)
        digest = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        raw = {"basename": name, "bytes": len(data), "hashes": {HASH: digest}}
        self.shards.append({"samples": count, "raw_data": raw, "zip_data": None, **self.config})
        self._samples, self._size = [], self._empty_size
