"""HashedFile: blocks written in pieces on one thread and hashed on another give the bytes and the sha256 given."""

from __future__ import annotations

import hashlib

import numpy as np

from tokenization.formats.ds import WRITE_PIECE, HashedFile


def test_blocks_larger_than_a_write_piece_arrive_whole_and_hashed(tmp_path) -> None:
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 256, n, dtype=np.uint8) for n in (WRITE_PIECE * 3 + 7, 0, 1, WRITE_PIECE)]
    hashed = HashedFile(tmp_path / "f.bin")
    for block in blocks:
        hashed.write(block)
    written = hashed.close()
    expected = b"".join(b.tobytes() for b in blocks)
    assert (tmp_path / "f.bin").read_bytes() == expected
    assert (written.bytes, written.sha256) == (len(expected), hashlib.sha256(expected).hexdigest())
