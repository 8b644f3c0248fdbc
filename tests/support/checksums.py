"""A record's file checksum as a test rewrites it, of the algorithm the record names (``storage.checksums``): BLAKE3
in this version's records, sha256 in older ones."""

from __future__ import annotations

from tokenization.storage.checksums import BLAKE3, SHA256, checksum


def resum(file_sum: dict, data: bytes) -> None:
    """A record's entry of one file (``{"bytes": ..., "blake3": ...}``) made to say ``data``: its size, and its
    checksum of the algorithm the entry names."""
    (algorithm,) = {BLAKE3, SHA256} & set(file_sum)
    file_sum.update({"bytes": len(data), algorithm: checksum(data, algorithm)})
