"""The checksum a record gives each file it vouches for, and the algorithm that made it.

Records written since the stages' record versions of BLAKE3 (``records.FileSum``) name ``blake3``; older ones name
``sha256``, and are still read and checked with it. BLAKE3 because it pays here: on 1 GiB, 0.21 ns of CPU a byte
against sha256's 0.74 with SHA-NI, so a 2-byte token and its loss byte cost 0.6 ns to checksum instead of 2.2, which
was as much as the one pass of contents and checks. One thread a hasher (``max_threads`` 1): a stage hashes on a
thread of its own beside the thread that writes, which is the second core's work; more would take the core that
moves the bytes. By hand: ``b3sum FILE`` (Debian's ``b3sum``), or ``sha256sum FILE`` for an older record.

What identifies an *input* stays sha256 (a plan's ``sha256=`` of a local file, the cache's keys, the marker's
checksum of its manifest): those values are compared with what earlier plans and caches recorded, so another
algorithm would make every plan see its files changed and every cache entry miss once, for small files or files
hashed once a change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from blake3 import blake3

if TYPE_CHECKING:
    import fsspec

BLAKE3: Final = "blake3"  # the names records give them (``records.FileSum``)
SHA256: Final = "sha256"
ALGORITHM: Final = BLAKE3  # what new records name
READ_BYTES = 8 << 20  # bytes read at a time to hash a file: one read costs ~10 us, its hash ~2 ms


class Hasher(Protocol):
    """An incremental hash, as hashlib's and blake3's are; ``update`` releases the GIL on large buffers in both."""

    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def hasher(algorithm: str = ALGORITHM) -> Hasher:
    """A fresh hasher of ``algorithm`` (one thread)."""
    if algorithm == BLAKE3:
        return blake3(max_threads=1)
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"no checksum algorithm {algorithm!r} (blake3 or sha256)")


def checksum(data: bytes | memoryview, algorithm: str = ALGORITHM) -> str:
    """The hex checksum of ``data``."""
    digest = hasher(algorithm)
    digest.update(data)
    return digest.hexdigest()


def file_checksum(path: str | Path, fs: fsspec.AbstractFileSystem | None = None, algorithm: str = ALGORITHM) -> str:
    """The checksum of a file's bytes (a local file, or a file of ``fs``), read in ``READ_BYTES`` pieces: memory
    stays bounded."""
    digest = hasher(algorithm)
    with open(path, "rb") if fs is None else fs.open(path, "rb") as handle:
        while piece := handle.read(READ_BYTES):
            digest.update(piece)
    return digest.hexdigest()
