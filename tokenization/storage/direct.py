"""A file appended past the page cache (Linux ``O_DIRECT``): for a build's last files, which no stage on this
machine reads again.

A buffered write copies every byte into a page-cache page the kernel must first find room for; on a VM whose host
takes free memory back, each such page can fault on the host too. Writing a context shuffle's 960 MB took 0.42 s of
CPU buffered (1.5 s in a bad minute), and ~0.1 s direct (the copy into the stage included); and the pages it would
have filled are left to the files that are read again (a stage's inputs).

A direct write needs its offset, its length and its buffer's address aligned to the device's block: bytes are
staged in an aligned buffer and written a whole buffer at a time; the last, partial block is written padded with
zeros and the file then truncated to its size. Where a filesystem refuses direct writes (at the open or at a write),
the file is simply written through the page cache instead, from the same place: the bytes are the same either way.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import numpy as np

ALIGN = 4096  # the offsets, lengths and addresses of direct writes: any logical block of up to 4 KiB
STAGE_BYTES = 4 << 20  # bytes staged before a write: ~240 writes a GB, each ~1.5 ms of the disk's


class DirectFile:
    """A new file, written from its start by ``write`` and finished by ``finish``; ``close`` releases it either way.
    ``direct``: whether its writes still go past the page cache (False once its filesystem refused one)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.direct = True
        self.closed = False
        raw = np.empty(STAGE_BYTES + ALIGN, np.uint8)
        skip = -raw.ctypes.data % ALIGN
        self._stage = raw[skip : skip + STAGE_BYTES]
        self._staged = 0
        self.size = 0

    @classmethod
    def create(cls, path: Path) -> DirectFile | None:
        """``path`` created (or emptied) for direct writes; None where the platform or its filesystem has none."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o666)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None
        return cls(fd)

    def fileno(self) -> int:
        return self.fd

    def write(self, data: memoryview) -> None:
        """Append ``data``: staged, and written whenever the stage fills."""
        src = np.frombuffer(data, np.uint8)
        self.size += len(src)
        at = 0
        while at < len(src):
            n = min(STAGE_BYTES - self._staged, len(src) - at)
            self._stage[self._staged : self._staged + n] = src[at : at + n]  # numpy copies without the GIL
            self._staged += n
            at += n
            if self._staged == STAGE_BYTES:
                self._write(self._stage)
                self._staged = 0

    def finish(self) -> None:
        """Write what is staged: its last block padded with zeros, which the file is then cut short of."""
        staged, self._staged = self._staged, 0
        if not staged:
            return
        whole = -(-staged // ALIGN) * ALIGN if self.direct else staged
        self._stage[staged:whole] = 0
        self._write(self._stage[:whole])
        if whole != staged:
            os.ftruncate(self.fd, self.size)

    def close(self) -> None:
        """Release the descriptor, once: a second call does nothing (the number may name another file by then)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def _write(self, block: np.ndarray) -> None:
        view = memoryview(block)  # type: ignore[arg-type]
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()

    def _buffered(self) -> None:
        """Write through the page cache from now on: the filesystem refused a direct write (or the one before it
        ended short of a block)."""
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False
