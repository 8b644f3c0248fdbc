"""HashedFile: blocks written in pieces on one thread and hashed on another give the bytes and the checksum given."""

from __future__ import annotations

import numpy as np
import pytest

from tokenization.formats.hashed_file import WRITE_PIECE, HashedFile
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
