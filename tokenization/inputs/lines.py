"""A JSON-lines file's bytes: decompressed (gzip by ISA-L, concatenated zstd frames), and read as lines of bounded
size, so that a line above the limit is quarantined from its start and size without ever being held whole."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import zstandard
from isal import igzip, isal_zlib

from tokenization.records import Rejected

READ_BUFFER = 1 << 20
# Inflated bytes a gzip file is read by: igzip's own buffer (8 KiB) reads a long line in 8 KiB pieces, 92 ms of CPU
# for the bench's 42 MB where 128 KiB takes 77 (1 MiB: 76). A read that meets a fault loses what it inflated: the
# error names the last good line all the same (``whole_gzip_lines``).
GZIP_BUFFER = 1 << 17
ZSTD_SLICE = 1 << 10  # compressed bytes inflated at once: <= 32 MiB out (RLE: 4 bytes, 128 KiB); 8% slower than 1 MiB
RAW_HEAD_BYTES = 1 << 10  # of a record too large to keep, the bytes its quarantine entry shows


class _ZstdFrames(io.RawIOBase):
    """Decompresses concatenated zstd frames, raising on a truncated last frame (zstandard's stream reader
    silently ends there, which would lose the tail of the file without a word). Compressed data goes in by
    ``ZSTD_SLICE`` bytes, as zstd returns all it inflates from its input at once: a small file that inflates to
    gigabytes is never held whole."""

    def __init__(self, raw: io.IOBase):
        self.raw = raw
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.in_frame = False
        self.compressed = b""  # read from ``raw``; fed up to ``offset``
        self.offset = 0
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            if self.frame.eof:  # the next frame starts in what the last slice left over
                self.offset -= len(self.frame.unused_data)
                self.frame, self.in_frame = zstandard.ZstdDecompressor().decompressobj(), False
            if self.offset == len(self.compressed):
                self.compressed, self.offset = self.raw.read(READ_BUFFER), 0
            piece = memoryview(self.compressed)[self.offset : self.offset + ZSTD_SLICE]
            if not piece:
                if self.in_frame:
                    raise EOFError("zstd stream ended in the middle of a frame")
                return 0
            self.offset += len(piece)
            self.in_frame = True
            self.pending = memoryview(self.frame.decompress(piece))
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def decompressed(raw: io.RawIOBase | io.BufferedIOBase, compression: str | None) -> io.BufferedIOBase:
    """The file's bytes, decompressed, from a reader whose ``readline`` takes a limit (a remote fsspec file's
    does not)."""
    if compression == "gzip":  # ISA-L inflates ~3x faster than zlib: the reader keeps up with the encoder
        return io.BufferedReader(igzip.GzipFile(fileobj=raw, mode="rb"), GZIP_BUFFER)
    return io.BufferedReader(_ZstdFrames(raw) if compression == "zstd" else raw, READ_BUFFER)


def skip(stream: io.BufferedIOBase, size: int) -> None:
    """Read ``size`` bytes of a stream that cannot seek, a buffer at a time, keeping none."""
    while size > 0 and (piece := stream.read(min(size, READ_BUFFER))):
        size -= len(piece)


def whole_gzip_lines(raw: IO[bytes]) -> int:
    """How many whole lines a gzip file's members give before its first fault (trailing garbage, a truncated or
    corrupt member), inflated a buffer at a time: the gzip reader raises with them unread when the fault comes in
    the read that inflated them."""
    lines, pending = 0, b""
    inflate = isal_zlib.decompressobj(31)
    try:
        while pending or (pending := raw.read(READ_BUFFER)):
            if inflate.eof:  # the next member
                inflate = isal_zlib.decompressobj(31)
            lines += inflate.decompress(pending, READ_BUFFER).count(b"\n")
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
    except isal_zlib.error:  # type: ignore[misc]  # (a class: its stubs say an instance, as above)
        pass
    return lines


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line above the limit, as far as it is kept."""

    head: bytes  # its first RAW_HEAD_BYTES
    size: int  # its bytes, newline excluded


def bounded_lines(stream: io.BufferedIOBase, limit: int) -> Iterator[bytes | bytearray | Oversized]:
    """The stream's lines, newline included; a line above ``limit`` bytes as an :class:`Oversized`. Lines are
    read by ``READ_BUFFER`` bytes at most, so that no more than ``limit`` (and a buffer) of a line is ever held:
    one line of a small compressed file may inflate to gigabytes."""
    chunk = min(READ_BUFFER, limit + 1)
    while line := stream.readline(chunk):
        yield _long_line(stream, line, limit) if len(line) == chunk and not line.endswith(b"\n") else line


def _long_line(stream: io.BufferedIOBase, start: bytes, limit: int) -> bytearray | Oversized:
    """The line that ``start`` begins, read on while it is within ``limit``; past it, its start and size."""
    line = bytearray(start)
    while len(line) - line.endswith(b"\n") <= limit:
        if line.endswith(b"\n") or not (piece := stream.readline(READ_BUFFER)):
            return line
        line += piece
    return _oversized(stream, line)


def _oversized(stream: io.BufferedIOBase, line: bytes | bytearray) -> Oversized:
    """Reads the rest of a line that ``line`` begins by ``READ_BUFFER`` bytes, keeping its first
    ``RAW_HEAD_BYTES`` only."""
    size, head = len(line), line[:RAW_HEAD_BYTES]
    while not line.endswith(b"\n") and (line := stream.readline(READ_BUFFER)):
        size += len(line)
        head += line[: RAW_HEAD_BYTES - len(head)]
    return Oversized(bytes(head).rstrip(b"\n"), size - line.endswith(b"\n"))


def too_large(url: str, line: int, head: bytes, size: int, limit: int) -> Rejected:
    """A record above the limit, quarantined with its start and its size: enough to find and judge it."""
    start = head[:RAW_HEAD_BYTES].decode("utf-8", "backslashreplace")
    return Rejected(url, line, "record_too_large", f"{start}... [{size} bytes, above max_record_bytes={limit}]")
