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
