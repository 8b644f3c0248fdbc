"""Files written past the page cache: the bytes given, the size given, whether or not the filesystem takes direct
writes."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os

import numpy as np
import pytest

from tokenization.formats.hashed_file import HashedFile
from tokenization.storage import direct
from tokenization.storage.checksums import checksum
from tokenization.storage.direct import ALIGN, STAGE_BYTES, DirectFile


def written(path, pieces: list[bytes]) -> DirectFile:
    opened = DirectFile.create(path)
    if opened is None:
        pytest.skip(f"{path.parent}'s filesystem takes no direct writes (O_DIRECT)")
    for piece in pieces:
        opened.write(memoryview(piece))
    opened.finish()
    opened.close()
    return opened


@pytest.mark.parametrize("sizes", [[], [1], [ALIGN - 1, 1], [ALIGN], [STAGE_BYTES + 1], [3, STAGE_BYTES, ALIGN + 5, 7]])
def test_a_direct_file_holds_the_bytes_written_and_no_padding(tmp_path, sizes) -> None:
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    path = tmp_path / "f.bin"
    assert written(path, pieces).direct
    assert path.read_bytes() == b"".join(pieces)


def cached_share(path) -> float:
    """The share of a file's pages in the page cache (``mincore`` of a map of it, which reads none of them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        vector = ctypes.create_string_buffer(pages)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        return sum(byte & 1 for byte in vector.raw) / pages


def test_a_direct_file_leaves_its_pages_out_of_the_page_cache_where_a_buffered_one_fills_them(tmp_path) -> None:
    probe = DirectFile.create(tmp_path / "probe")
    if probe is None:
        pytest.skip(f"{tmp_path}'s filesystem takes no direct writes (O_DIRECT)")
    try:
        os.write(probe.fd, b"x")  # what a direct write must not be: unaligned
        pytest.skip(f"{tmp_path}'s filesystem takes unaligned direct writes: it is the page cache itself (tmpfs)")
    except OSError as exc:
        assert exc.errno == errno.EINVAL
    finally:
        probe.close()
        probe.close()  # once only: the number may name another file by then
    data = np.random.default_rng(0).integers(0, 256, 2 * STAGE_BYTES + 5, dtype=np.uint8)
    shares = {}
    for cached in (True, False):
        path = tmp_path / f"cached-{cached}.bin"
        with HashedFile(path, cached=cached) as hashed:
            hashed.write(data)
        shares[cached] = cached_share(path)
        assert path.read_bytes() == data.tobytes()
    assert shares == {True: 1, False: 0}


def test_a_refused_direct_write_is_written_through_the_page_cache_from_where_it_was(tmp_path, monkeypatch) -> None:
    """A filesystem that opens a file for direct writes but refuses one (EINVAL) gets the same bytes, buffered."""
    real, refused = os.write, list[int]()

    def refusing_the_second(fd: int, data) -> int:
        if len(data) == STAGE_BYTES and len(refused) < 2:  # a whole stage: the file's (pytest writes less)
            refused.append(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
            if len(refused) == 2:
                raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(direct.os, "write", refusing_the_second)
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (STAGE_BYTES * 2 + 3, ALIGN + 1)]
    path = tmp_path / "f.bin"
    opened = written(path, pieces)
    assert not opened.direct and refused == [os.O_DIRECT, os.O_DIRECT]  # both tried direct; the second written again
    assert path.read_bytes() == b"".join(pieces)


def test_an_uncached_hashed_file_has_its_bytes_checksum_and_size(tmp_path) -> None:
    block = np.random.default_rng(0).integers(0, 256, 5 * STAGE_BYTES // 2 + 11, dtype=np.uint8)
    path = tmp_path / "f.bin"
    with HashedFile(path, expected=8 * STAGE_BYTES, cached=False) as hashed:
        hashed.write(block[: ALIGN + 3])
        hashed.write(block[ALIGN + 3 :])
    assert path.read_bytes() == block.tobytes()
    assert hashed.written is not None and hashed.written.checksum == checksum(block.tobytes())
    assert path.stat().st_blocks * 512 < len(block) + (1 << 20)  # the blocks reserved past its end freed
