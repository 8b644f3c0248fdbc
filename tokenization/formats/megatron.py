"""Megatron-LM's indexed dataset: ``X.bin`` (raw tokens) and ``X.idx``, as megatron-core's IndexedDataset reads.

``X.idx`` is a 34-byte header (``MMIDIDX\\x00\\x00``, uint64 version 1, uint8 dtype code, uint64 sequence
count N, uint64 document-index count N + 1) followed by columns, not records: int32 sequence lengths[N],
int64 byte pointers[N] into ``X.bin``, int64 document indices[N + 1]. Every index entry of the stream (a
document, or a chunk or window piece) is one sequence and one document. uint16 (code 8) is used where the
``.ds`` family uses 2-byte tokens, int32 (code 4) otherwise.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tokenization.formats.contents import ContentsHasher
from tokenization.formats.ds import TokenFileError, WrittenTokenFile, map_array
from tokenization.formats.hashed_file import FinishOrAbandon, HashedFile, written_whole
from tokenization.storage.folder import StorageOptions, file_at

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")
CODES: dict[int, tuple[int, np.dtype]] = {2: (8, np.dtype("<u2")), 4: (4, np.dtype("<i4"))}
DTYPES: dict[int, np.dtype] = {
    8: np.dtype("<u2"),
    4: np.dtype("<i4"),
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    5: np.dtype("<i8"),
}


class MegatronWriter(FinishOrAbandon):
    """Appends documents to ``X.bin`` and writes ``X.idx`` on close; the same interface as TokenFileWriter.

    Memory: 4 bytes a sequence for the lengths, until close.
    """

    def __init__(self, path: Path, *, tokenizer: str, token_size: int, save_loss: bool, expected_tokens: int = 0):
        if save_loss:
            raise TokenFileError("Megatron's indexed dataset has no loss mask: use the .ds format to save loss")
        self.path = Path(path)
        self.code, self.dtype = CODES[token_size]
        self.tokens = 0
        self._bin = HashedFile(self.path, expected=expected_tokens * token_size)
        self._lengths: list[np.ndarray] = []
        self._last_end = 0
        self.contents = ContentsHasher()
        self.written: WrittenTokenFile | None = None

    @property
    def index_entries(self) -> int:
        return sum(len(x) for x in self._lengths)

    def write(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None = None) -> None:
        ends = np.asarray(ends, dtype=np.int64) + self.tokens
        self._bin.write(tokens.astype(self.dtype, copy=False))
        lengths = np.diff(ends, prepend=self._last_end)
        if len(ends):
            self._last_end = int(ends[-1])
        if len(lengths) and lengths.max() > np.iinfo(np.int32).max:
            raise TokenFileError(f"{self.path}: a sequence of {lengths.max()} tokens does not fit Megatron's int32")
        self._lengths.append(lengths.astype(np.int32))
        self.contents.add(tokens, ends - self.tokens)
        self.tokens += len(tokens)

    def close(self) -> WrittenTokenFile:
        if self._last_end != self.tokens:
            raise TokenFileError(f"{self.path}: {self.tokens - self._last_end} tokens after the last sequence end")
        files = [self._bin.close()]
        lengths = np.concatenate(self._lengths) if self._lengths else np.empty(0, np.int32)
        n = len(lengths)
        pointers = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= self.dtype.itemsize
        idx = b"".join(
            [
                HEADER.pack(MAGIC, VERSION, self.code, n, n + 1),
                lengths.astype("<i4").tobytes(),
                pointers.astype("<i8").tobytes(),
                np.arange(n + 1, dtype="<i8").tobytes(),
            ]
        )
        idx_path = self.path.with_suffix(".idx")
        with open(idx_path, "wb") as handle:
            handle.write(idx)
        files.append(written_whole(idx_path.name, idx))
        self.written = WrittenTokenFile(self.path, self.tokens, n, tuple(files), self.contents.result())
        return self.written

    def abandon(self) -> None:
        """Release ``X.bin`` without writing ``X.idx``: the pair never reads as finished."""
        self._bin.abandon()


class MegatronFile:
    """Reads ``X.bin`` + ``X.idx`` (local or any fsspec URL) and checks the header."""

    def __init__(self, url: str, storage_options: StorageOptions | None = None):
        self.url = url.removesuffix(".bin").removesuffix(".idx")
        self.folder, self.name = file_at(self.url, storage_options)
        for suffix in (".bin", ".idx"):
            if not self.folder.exists(self.name + suffix):
                raise TokenFileError(f"{self.url}{suffix} is missing")
        data = self.folder.read(self.name + ".idx")
        if len(data) < HEADER.size:
            raise TokenFileError(f"{self.url}.idx: {len(data)} bytes is shorter than the header")
        magic, version, code, n, d = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION or code not in DTYPES:
            raise TokenFileError(
                f"{self.url}.idx: not a Megatron index (magic {magic!r}, version {version}, code {code})"
            )
        if len(data) != HEADER.size + 4 * n + 8 * n + 8 * d:
            raise TokenFileError(f"{self.url}.idx: {len(data)} bytes, expected {HEADER.size + 12 * n + 8 * d}")
        self.dtype = DTYPES[code]
        offset = HEADER.size
        self.lengths = np.frombuffer(data, "<i4", n, offset)
        self.pointers = np.frombuffer(data, "<i8", n, offset + 4 * n)
        self.document_indices = np.frombuffer(data, "<i8", d, offset + 12 * n)

    @property
    def num_tokens(self) -> int:
        return self.folder.size(self.name + ".bin") // self.dtype.itemsize

    @property
    def tokens(self) -> np.ndarray:
        return map_array(self.folder, self.name + ".bin", self.dtype, self.url + ".bin")
