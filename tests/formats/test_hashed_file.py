"""HashedFile: blocks written in pieces on one thread and hashed on another give the bytes and the checksum given."""

from __future__ import annotations

import numpy as np
import pytest

from tokenization.formats import hashed_file
from tokenization.formats.hashed_file import WRITE_PIECE, WRITEBACK_BYTES, HashedFile
from tokenization.storage.checksums import BLAKE3, checksum


def test_blocks_larger_than_a_write_piece_arrive_whole_and_hashed(tmp_path) -> None:
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 256, n, dtype=np.uint8) for n in (WRITE_PIECE * 3 + 7, 0, 1, WRITE_PIECE)]
    with HashedFile(tmp_path / "f.bin") as hashed:
        for block in blocks:
            hashed.write(block)
    expected = b"".join(b.tobytes() for b in blocks)
    assert (tmp_path / "f.bin").read_bytes() == expected
    assert hashed.written is not None
    assert (hashed.written.bytes, hashed.written.checksum) == (len(expected), checksum(expected, BLAKE3))


def test_an_error_in_the_block_releases_the_file_and_writes_every_block_taken(tmp_path) -> None:
    block = np.arange(WRITE_PIECE * 2, dtype=np.uint8)
    with pytest.raises(ZeroDivisionError), HashedFile(tmp_path / "f.bin") as hashed:
        hashed.write(block)
        raise ZeroDivisionError("in the block")
    assert hashed.handle.closed and hashed.written is None
    assert (tmp_path / "f.bin").read_bytes() == block.tobytes()  # nothing arrives later, behind a retry's back


def test_a_durable_files_writeback_starts_once_its_bytes_add_up_to_a_mib(tmp_path, monkeypatch) -> None:
    """Small blocks (a merge's index: ~2 kB a block) are sent to the disk together, once a MiB of them is written;
    a large one at once; every byte before the last MiB is on its way when the file closes, in order, once."""
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(hashed_file, "start_writeback", lambda fd, offset, length: started.append((offset, length)))
    sizes = [2_000] * 1_000 + [3 * WRITEBACK_BYTES, 5, 2_000]
    with HashedFile(tmp_path / "f.bin") as hashed:
        for size in sizes:
            hashed.write(np.zeros(size, np.uint8))
    ends = [offset + length for offset, length in started]
    assert [offset for offset, _ in started] == [0, *ends[:-1]]  # contiguous, in order
    assert all(length >= WRITEBACK_BYTES for _, length in started)
    assert ends[-1] == sum(sizes) - 2_005 and len(started) == 2  # a MiB of small blocks; the rest with the large one


@pytest.mark.parametrize("given_mib", [3, 40])
def test_a_files_expected_bytes_are_allocated_before_they_come_and_the_rest_freed_at_close(tmp_path, given_mib) -> None:
    """Told it will hold 40 MiB, a durable file has their blocks before its first byte (its size still 0, so no
    reader sees bytes that never came); given 3 MiB only, it keeps no block past its end once closed."""
    path, expected = tmp_path / "f.bin", 40 << 20
    block = np.random.default_rng(0).integers(0, 256, given_mib << 20, dtype=np.uint8)
    with HashedFile(path, expected=expected) as hashed:
        if not hashed._reserved:
            pytest.skip(f"{tmp_path}'s filesystem allocates no blocks ahead (fallocate)")
        assert path.stat().st_size == 0 and path.stat().st_blocks * 512 >= expected
        hashed.write(block)
    assert path.read_bytes() == block.tobytes()
    assert path.stat().st_blocks * 512 < block.nbytes + (1 << 20)  # 40 MiB allocated, 3 MiB kept


def test_a_working_file_allocates_nothing_ahead(tmp_path) -> None:
    """Nothing publishes a working file (``durable=False``): it is written as it comes, without a reservation."""
    with HashedFile(tmp_path / "f.bin", durable=False, expected=40 << 20) as hashed:
        assert hashed._reserved == 0 and (tmp_path / "f.bin").stat().st_blocks == 0
        hashed.write(np.zeros(10, np.uint8))
