"""A binary file written and hashed as it is written, on threads of their own beside the caller (``HashedFile``),
what it records of itself (``WrittenFile``), and the writers' shared way of finishing or abandoning their files
(``FinishOrAbandon``): what every token-file writer builds on (``formats.ds``, ``formats.megatron``)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from tokenization.records.inputs import FileSum
from tokenization.storage.checksums import ALGORITHM, checksum, hasher
from tokenization.storage.direct import DirectFile
from tokenization.storage.folder import reserve_space, start_writeback, writing

if TYPE_CHECKING:
    from typing import Self

# Bytes a write system call takes at most. The kernel backs a write with page-cache folios as large as the write;
# folios of 1 MiB and more come from free 2 MiB blocks, which a VM may have handed back to its host (free page
# reporting), and then fault there: 960 MB went to the page cache in 0.37 s in 256 KiB writes, in 1.1-2.8 s in
# 1-8 MiB ones. ~4,000 calls a GB cost ~10 ms.
WRITE_PIECE = 256 << 10
INLINE_BYTES = 1 << 20  # a smaller block is written and hashed on the caller's thread (``InOrder``)
# Bytes a durable file has written before their writeback is started (``HashedFile``): a merge's index gains ~2 kB
# a block, whose writeback, started each time, was a small disk write and a syscall of up to 3 ms on the thread that
# hands the blocks on, 115 times a GB; what is left under it at the end is the close's fsync's.
WRITEBACK_BYTES = 1 << 20


@dataclass(frozen=True)
class WrittenFile:
    """One file of a written family, as a manifest records it: its checksum is of ``storage.checksums.ALGORITHM``."""

    name: str
    bytes: int
    checksum: str

    @property
    def sum(self) -> FileSum:
        """As a record lists it."""
        return FileSum.of(self.bytes, self.checksum, ALGORITHM)


def written_whole(name: str, data: bytes) -> WrittenFile:
    """A small file written at once, and its checksum."""
    return WrittenFile(name, len(data), checksum(data))


class FinishOrAbandon(ABC):
    """A writer that ``with`` closes: the block's end finishes it (``close``, whose result ``written`` keeps), an
    error in the block (or in finishing) abandons it (``abandon``): its handles are released and nothing of it is
    published, so a failure path leaves no open file and no half-written file that looks finished."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abandon()
            return
        try:
            self.close()
        except BaseException:
            self.abandon()
            raise

    @abstractmethod
    def close(self) -> object:
        """Finish the files and return what was written."""

    @abstractmethod
    def abandon(self) -> None:
        """Release the handles without finishing; safe to call after a ``close`` that failed half way."""


class InOrder:
    """Calls run one after another on a thread of its own, at most one waiting, so that they overlap with the
    caller's work; a call on fewer than ``INLINE_BYTES`` runs on the caller's thread instead, since starting the
    thread costs more than it (~0.1 ms: a rank of 100,000 one-line files started 700,000 threads)."""

    def __init__(self, name: str):
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)  # starts its thread at the first submit
        self._pending: Future[Any] | None = None

    def run(self, size: int, call: Callable[..., Any], *args: object) -> None:
        """``call(*args)``, after the calls before it; ``size``: the bytes it works on."""
        self.wait()
        if size < INLINE_BYTES:
            call(*args)
        else:
            self._pending = self._thread.submit(call, *args)

    def wait(self) -> None:
        """Wait for the call in flight, if any, raising its error here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def shutdown(self) -> None:
        """Stop the thread, after the call in flight (whose error, if any, is dropped)."""
        self._thread.shutdown()
        self._pending = None


class HashedFile(FinishOrAbandon):
    """A binary file opened for appending, hashed as it is written.

    Writing and hashing run on a thread each (both release the GIL), so they overlap with each other and with the
    caller gathering the next block: on two cores the hash (BLAKE3, one thread) runs on the second while the first
    moves the bytes. ``write`` takes the array over: the caller must not change it afterwards. At most one block
    waits, so memory stays bounded by two blocks. A ``durable`` file's blocks go to the kernel's writeback at once,
    so ``close``'s fsync waits for the last blocks, not for the whole file (small blocks go once they add up to
    ``WRITEBACK_BYTES``); a working file that nothing publishes is not synced (a crash loses its attempt anyway).
    A durable file's ``expected`` bytes, when its writer knows them, have their blocks allocated at once
    (``reserve_space``); what is left past its end at ``close`` is freed. A durable file not ``cached`` is written
    past the page cache (``storage.direct``): a build's last files, which nothing on this machine reads next.
    """

    def __init__(self, path: Path, durable: bool = True, expected: int = 0, cached: bool = True):
        self.path = path
        self.durable = durable
        with writing(path):
            direct = None if cached or not durable else DirectFile.create(path)
            self.handle: BinaryIO | DirectFile = direct or open(path, "wb")  # noqa: SIM115 - closed in close()
            self._reserved = expected if durable and reserve_space(self.handle.fileno(), expected) else 0
        self.digest = hasher()
        self.size = 0
        self._unsynced = 0  # where the bytes whose writeback is not started yet begin
        self._writer = InOrder("write")
        self._hasher = InOrder("hash")
        self.written: WrittenFile | None = None

    def write(self, data: np.ndarray) -> None:
        # numpy declares ndarray's buffer protocol (__buffer__) for Python 3.12 and later only
        view = memoryview(np.ascontiguousarray(data)).cast("B")  # type: ignore[arg-type]
        with writing(self.path):
            self._writer.run(len(view), self._append, view, self.size)  # raises a full disk here, say
        self._hasher.run(len(view), self.digest.update, view)
        self.size += len(view)

    def _append(self, view: memoryview, offset: int) -> None:
        if isinstance(self.handle, DirectFile):  # whole: it writes a stage at a time, each on its way to the disk
            self.handle.write(view)
            return
        for start in range(0, len(view), WRITE_PIECE):
            self.handle.write(view[start : start + WRITE_PIECE])
        self.handle.flush()
        end = offset + len(view)
        if self.durable and end - self._unsynced >= WRITEBACK_BYTES:
            start_writeback(self.handle.fileno(), self._unsynced, end - self._unsynced)
            self._unsynced = end

    def close(self) -> WrittenFile:
        try:
            with writing(self.path):
                self._writer.wait()
                self._hasher.wait()
                if isinstance(self.handle, DirectFile):
                    self.handle.finish()
                else:
                    self.handle.flush()
                if self._reserved > self.size:  # blocks allocated past the end: freed
                    os.ftruncate(self.handle.fileno(), self.size)
                if self.durable:
                    os.fsync(self.handle.fileno())
        finally:
            self._writer.shutdown()
            self._hasher.shutdown()
            with writing(self.path):
                self.handle.close()
        self.written = WrittenFile(self.path.name, self.size, self.digest.hexdigest())
        return self.written

    def abandon(self) -> None:
        """Release the threads and the handle without the fsync. The block taken is written first (its error, if
        any, is dropped: another is on its way), so no byte of a failed writer reaches the file after this returns
        (a retry may reopen it)."""
        self._writer.shutdown()
        self._hasher.shutdown()
        self.handle.close()
