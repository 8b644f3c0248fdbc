"""The source files a move reads: opened on demand, at most so many at a time, their units read with ``pread``
into block buffers used again (``Blocks``); and their contents read again, on a thread of their own, for the proof
of a stage that has no record of them (``contents_of``, ``uses_contents``, ``pieces_contents``)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from functools import partial
from itertools import repeat
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from tokenization.formats import native
from tokenization.formats.contents import READ_BLOCK, Contents, stream_contents, stream_uses
from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileError, token_dtype
from tokenization.storage.concurrent import files_at_once, map_concurrently
from tokenization.storage.folder import StorageOptions, file_at, writing

MAX_OPEN_FILES = 128
BLOCK_ROUND = 1 << 20  # block buffers are made in whole MiB, so that one serves blocks of slightly other sizes


class Blocks:
    """Buffers of blocks of bytes, each used again once nothing holds it (no view of it is alive: its reference
    count says so), so that a block's bytes go to pages already mapped. A new buffer of a few MiB costs the
    kernel's faults and the zeroing of its pages (huge pages here): ~7% of a context shuffle's CPU, and on the
    thread that moves the bytes. A writer holds a block until its threads have written and hashed it, and two are
    gathered at once: a few are in use at once; past ``keep`` buffers, a block gets a new one."""

    def __init__(self, keep: int = 6):
        self.keep = keep
        self._made: list[np.ndarray] = []
        self._idle = _references([np.empty(0, np.uint8)])[0]  # a buffer only the list holds, on this Python
        self._taking = threading.Lock()  # blocks are gathered on two threads at once: one buffer to one of them

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` uint8 bytes nothing else holds (their content left as it was)."""
        with self._taking:
            for buffer, references in zip(self._made, _references(self._made), strict=True):
                if references == self._idle and buffer.nbytes >= nbytes:
                    return buffer[:nbytes]
            buffer = np.empty(-(-nbytes // BLOCK_ROUND) * BLOCK_ROUND, np.uint8)
            if len(self._made) < self.keep:
                self._made.append(buffer)
            return buffer[:nbytes]


def _references(arrays: list[np.ndarray]) -> list[int]:
    """Each array's reference count, as counted here (``Blocks`` compares it with an idle buffer's)."""
    return [sys.getrefcount(a) for a in arrays]


class SourcePool:
    """Source token files, opened on demand, at most ``max_open`` at a time (least recently used first out), so
    the number of open files stays bounded whatever the number of inputs. Remote files are copied to
    ``cache_dir`` once, with large sequential reads, because the moves read them at random.

    Units are read with ``pread`` into private buffers, never mapped: resident memory stays that of a block. Loss
    bytes are read on a thread of their own while the tokens are read (``pread`` releases the GIL): scattered
    units cost ~2 us a call, and this halves the wait for them. Used with ``with``, which closes every file, stops
    the thread and deletes the cache, on errors too.
    """

    def __init__(
        self,
        urls: Sequence[str],
        token_size: int,
        with_loss: bool,
        max_open: int = MAX_OPEN_FILES,
        cache_dir: Path | None = None,
        storage_options: StorageOptions | None = None,
        blocks: tuple[Blocks, Blocks] | None = None,
    ):
        """``blocks``: the buffers for the tokens and the loss bytes of the blocks gathered, given where pools of
        one stage follow each other (a file's buffers serve the next; new ones by default)."""
        self.urls = list(urls)
        self.storage_options = storage_options
        self.token_size = token_size
        self.dtype = token_dtype(token_size)
        self.with_loss = with_loss
        self.max_open = max_open
        self.cache_dir = cache_dir
        self._open: OrderedDict[int, _Source] = OrderedDict()
        self._opening = threading.Lock()  # blocks are gathered on two threads at once where no file is closed
        self._checked: set[int] = set()  # sources whose files were checked once: opening one again is two opens
        self._fetching = threading.Lock()  # a remote source is copied once, whichever thread asks first
        self._loss_reader = ThreadPoolExecutor(1, thread_name_prefix="read-loss") if with_loss else None
        self.blocks = blocks or (Blocks(), Blocks())

    @property
    def closes_files(self) -> bool:
        """Whether the pool may close a file to open another (more sources than ``max_open``): a file read by one
        thread could be closed by another, so its blocks are gathered one at a time (``moves.move_units``)."""
        return len(self.urls) > self.max_open

    def _source(self, i: int) -> _Source:
        with self._opening:
            if i in self._open:
                self._open.move_to_end(i)
                return self._open[i]
            while len(self._open) >= self.max_open:
                self._open.popitem(last=False)[1].close()
            self._open[i] = self.private(i)
            return self._open[i]

    def private(self, i: int) -> _Source:
        """Source ``i`` opened with descriptors of its own, outside the pool's: the caller closes it. A thread may
        read it while another moves units through the pool, which closes its least recently used files."""
        path = self._local(i)
        if i not in self._checked:
            TokenFile(path, self.token_size)  # raises when the file is missing or its metadata gives another size
            self._checked.add(i)
        return _Source(path, self.token_size, self.with_loss)

    def read(self, i: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and loss bytes) ``[start, stop)`` of source ``i``, read into new arrays."""
        return self._both(self._source(i).pread_span, start, stop)

    def read_each(self, i: int, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and loss bytes) of every unit ``[starts[k], ends[k])`` of source ``i``, end to end in this order,
        one ``pread`` a unit."""
        return self._both(self._source(i).pread_each, starts, ends)

    def read_into(
        self, i: int, starts: np.ndarray, ends: np.ndarray, outs: Sequence[np.ndarray | None], to: np.ndarray
    ) -> None:
        """Tokens (and loss bytes) of every unit ``[starts[k], ends[k])`` of source ``i`` into the bytes ``outs[0]``
        (and ``outs[1]``) at item ``to[k]``, each straight into its place: one ``pread`` a unit, or on the C
        helper's path one ``preadv`` a run of units that lie end to end (a merge's)."""
        self._both(self._source(i).pread_into, starts, ends, outs, to)

    def _both(self, read: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
        """``read(0, *args)`` (the tokens) here while ``read(1, *args)`` (the loss bytes) runs on the loss thread."""
        loss = self._loss_reader.submit(read, 1, *args) if self._loss_reader else None
        return read(0, *args), loss.result() if loss else None

    @property
    def open_count(self) -> int:
        return len(self._open)

    def fetch(self, sizes: Sequence[int]) -> None:
        """Copy every remote source to the cache now (``sizes``: their ``.ds`` bytes), several at once
        (``files_at_once``)."""
        map_concurrently(self._local, range(len(self.urls)), workers=files_at_once(max(sizes, default=1)))

    def _local(self, i: int) -> str:
        folder, name = file_at(self.urls[i], self.storage_options)
        if folder.local is not None:
            return folder.path_of(name)
        if self.cache_dir is None:
            raise ValueError(f"{self.urls[i]} is remote: a local cache_dir is needed to read it at random")
        local = self.cache_dir / f"{i:06d}" / name
        with self._fetching:
            if not local.exists():  # the tokens and loss bytes: the pool is given the token size, not the metadata
                for suffix in [""] + [".loss"] * self.with_loss:
                    with writing(f"{local}{suffix}"):
                        local.parent.mkdir(parents=True, exist_ok=True)
                        folder.fetch(name + suffix, Path(f"{local}{suffix}"))
        return str(local)

    def __enter__(self) -> SourcePool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loss_reader is not None:
            self._loss_reader.shutdown()
        for source in self._open.values():
            source.close()
        self._open.clear()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)


class _Source:
    """One open source: a descriptor for its tokens and one for its loss bytes."""

    def __init__(self, path: str, token_size: int, with_loss: bool):
        self.paths = [path] + ([path + ".loss"] if with_loss else [])
        self.dtypes = [token_dtype(token_size), LOSS_DTYPE]
        self.fds = [os.open(p, os.O_RDONLY) for p in self.paths]

    def pread_span(self, which: int, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` of file ``which`` (0 tokens, 1 loss) in a new array; a short file is an error."""
        out = np.empty(stop - start, self.dtypes[which])
        # numpy declares ndarray's buffer protocol (__buffer__) for Python 3.12 and later only
        view, offset = memoryview(out).cast("B"), start * out.itemsize  # type: ignore[arg-type]
        while len(view):
            got = os.preadv(self.fds[which], [view], offset)
            if got == 0:
                raise TokenFileError(f"{self.paths[which]}: ends before byte {offset + len(view)}")
            view, offset = view[got:], offset + got
        return out

    def pread_each(self, which: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Items ``[starts[k], ends[k])`` of file ``which`` (0 tokens, 1 loss) end to end, as bytes (``pread_into``)."""
        lengths = ends - starts
        outs = [np.empty(int(lengths.sum()) * self.dtypes[which].itemsize, np.uint8)] * 2
        self.pread_into(which, starts, ends, outs, np.cumsum(lengths) - lengths)
        return outs[which]

    def pread_into(
        self, which: int, starts: np.ndarray, ends: np.ndarray, outs: Sequence[np.ndarray | None], to: np.ndarray
    ) -> None:
        """Items ``[starts[k], ends[k])`` of file ``which`` (0 tokens, 1 loss) into the bytes ``outs[which]`` at item
        ``to[k]``, each read straight into its place: by the C helper's ``tk_pread``, a block's reads in one call
        without the GIL, else one ``preadv`` each looped by ``map`` in C (2.5 us a 4 kB unit, where a ``pread`` a
        unit and joining their bytes took 9 us); a short file is an error."""
        out, size = outs[which], self.dtypes[which].itemsize
        if out is None:
            raise ValueError(f"{self.paths[which]}: no buffer to read into")
        places, lengths = (np.ascontiguousarray(a * size, dtype=np.int64) for a in (to, ends - starts))
        lib = native.helper()
        if lib is not None:
            fds = np.full(len(starts), self.fds[which], np.intc)
            offsets = np.ascontiguousarray(starts * size, dtype=np.int64)
            args = (a.ctypes.data for a in (fds, offsets, lengths, places))
            got = lib.tk_pread(*args, len(fds), out.ctypes.data)
            if got < 0:
                raise OSError(-got, os.strerror(-got), self.paths[which])
        else:
            # numpy declares ndarray's buffer protocol (__buffer__) for Python 3.12 and later only
            views = map(memoryview(out).__getitem__, map(slice, places.tolist(), (places + lengths).tolist()))  # type: ignore[arg-type]
            got = sum(map(os.preadv, repeat(self.fds[which]), zip(views), (starts * size).tolist()))
        if got != int(lengths.sum()):
            raise TokenFileError(f"{self.paths[which]}: ends before byte {int(ends.max()) * size}")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def contents_of(
    pool: SourcePool, i: int, *spans: tuple[np.ndarray, int], sources: Sequence[np.ndarray | None] | None = None
) -> list[Contents]:
    """The contents of source ``i`` for each span ``(cuts, tokens)``: its first ``tokens`` tokens cut at ``cuts``
    (``formats.contents.stream_contents``; each piece of its mixture source where ``sources`` gives a span's, one a
    cut), read once in large ``pread`` blocks with descriptors of its own, so that a stage hashes its inputs on a
    thread of their own while it moves their units (``SourcePool.private``)."""
    with closing(pool.private(i)) as source:
        return stream_contents(partial(_read_both, pool, source), spans, sources=sources)


def uses_contents(
    pool: SourcePool, i: int, cuts: np.ndarray, tokens: int, uses: np.ndarray, sources: np.ndarray | None = None
) -> tuple[Contents, Contents]:
    """Source ``i``'s contents cut at ``cuts``, and those of its pieces each taken ``uses`` times, each piece of its
    mixture source where ``sources`` gives them (``formats.contents.stream_uses``), read as ``contents_of`` reads."""
    with closing(pool.private(i)) as source:
        return stream_uses(partial(_read_both, pool, source), cuts, tokens, uses, sources=sources)


def pieces_contents(
    pool: SourcePool,
    i: int,
    starts: np.ndarray,
    ends: np.ndarray,
    sources: np.ndarray | None = None,
    block: int = READ_BLOCK,
) -> Contents:
    """The contents of these pieces of source ``i`` (piece ``k`` its tokens ``[starts[k], ends[k])``, of the mixture
    source ``sources[k]`` where given), as if they stood end to end: read in blocks, these pieces only, with
    descriptors of its own (a rank that moves a mixture's chosen documents hashes them, never the others)."""
    lengths = np.asarray(ends, dtype=np.int64) - starts
    cuts = np.cumsum(lengths)

    def read(start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        k = np.arange(np.searchsorted(cuts, start, side="right"), np.searchsorted(cuts, stop, side="left") + 1)
        k = k[k < len(cuts)]
        before = cuts[k] - lengths[k]
        spans = starts[k] + np.maximum(start - before, 0), starts[k] + np.minimum(stop - before, lengths[k])
        tokens = source.pread_each(0, *spans).view(source.dtypes[0])
        return tokens, source.pread_each(1, *spans).view(source.dtypes[1]) if pool.with_loss else None

    with closing(pool.private(i)) as source:
        total = int(cuts[-1]) if len(cuts) else 0
        (contents,) = stream_contents(read, [(cuts, total)], block, None if sources is None else [sources])
    return contents


def _read_both(pool: SourcePool, source: _Source, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Tokens ``[start, stop)`` of a private source, and their loss bytes when the pool moves them."""
    return source.pread_span(0, start, stop), source.pread_span(1, start, stop) if pool.with_loss else None
