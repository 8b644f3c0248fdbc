"""A file that grew by whole lines appended since the last night (``inputs.grown``): its segment is its earlier
bytes' cache entry's documents, checked as any hit is (``from_cache``), then those of the lines after them, encoded
(``first_pass``), joined into one segment, as a miss's, that the rank stores under the file's own key.

A document's tokens, loss bytes and counts are its record's alone (its text, template, loss spans and the
tokenizer's policy: BOS, EOS), and its line's number and offset are the same in the earlier file and in this one,
so the joined segment, its places, its quarantine and its counts are, byte for byte, what encoding the whole file
gives.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenization.formats.ds import INDEX_DTYPE, LOSS_DTYPE, Metadata, TokenFile, WrittenTokenFile
from tokenization.formats.hashed_file import WrittenFile
from tokenization.output.cache import Cache
from tokenization.records import CacheEntry
from tokenization.stages.tokenize.segments import LOSS, PLACES, SEGMENT, Segment
from tokenization.storage.checksums import hasher
from tokenization.storage.folder import writing
from tokenization.tokenizer.counts import Counts

BLOCK_BYTES = 8 << 20  # copied at a time: memory stays bounded for a file of any size
ADDED = "appended"  # in the file's segment folder: the appended lines' segment
JOINED = "joined"  # and there the joined segment and its places


@dataclass(frozen=True)
class Earlier:
    """What the joined segment takes of the earlier bytes' entry besides its documents: its places, and its loss
    bytes when it has a loss file that the hit's segment does not hold (a small entry's, in a build that saves no
    loss; None: they are the segment's own, or every one 1)."""

    places: bytes
    loss: np.ndarray | None


def earlier(cache: Cache, entry: CacheEntry, hit: Segment) -> Earlier:
    """The earlier entry's places and, where the hit's segment lacks them, its loss bytes: a fetched entry's
    beside its segment, a small one's from its marker, each checked already as the hit was served."""
    fetched = entry.inline is None
    places = hit.path.with_name(PLACES).read_bytes() if fetched else cache.read(entry, PLACES)
    loss = None
    if LOSS in entry.files and not TokenFile(str(hit.path)).exists(".loss"):
        loss = cache.read(entry, LOSS)
        if loss is None:
            raise RuntimeError(f"{hit.file.name}: the loss bytes of its earlier entry {entry.key} could not be read")
    if places is None:
        raise RuntimeError(f"{hit.file.name}: the places of its earlier entry {entry.key} could not be read")
    return Earlier(places, None if loss is None else np.frombuffer(loss, dtype=LOSS_DTYPE))


def joined(
    hit: Segment,
    entry: CacheEntry,
    found: Earlier,
    added: Segment,
    *,
    tokenizer: str,
    token_size: int,
) -> tuple[Segment, WrittenTokenFile]:
    """The file's segment: the earlier entry's documents (``hit``, its ``entry``) then the ``added`` ones (a
    segment with loss bytes), with their loss bytes, places and quarantined records, in the hit's segment folder;
    its counts with loss, as an entry's. Its files are the two parts' bytes end to end (the added index entries moved
    by the earlier tokens), each checksummed as it is written; its contents are the sum of the parts' (the earlier
    ones held against its entry's files when the hit was checked, ``Held.against``), so no token is hashed again."""
    folder = hit.quarantine.parent / JOINED
    shutil.rmtree(folder, ignore_errors=True)  # an earlier try's
    with writing(folder):
        folder.mkdir(parents=True)
    before, after = TokenFile(str(hit.path)), TokenFile(str(added.path))
    moved = (np.asarray(after.ends, dtype=np.int64) + before.num_tokens).astype(INDEX_DTYPE)
    if found.loss is not None:
        earlier_loss: _Piece = found.loss.tobytes()
    elif before.exists(".loss"):
        earlier_loss = hit.path.with_name(hit.path.name + ".loss")
    else:
        earlier_loss = before.num_tokens  # every byte 1
    tokens = before.num_tokens + after.num_tokens
    parts: dict[str, list[_Piece]] = {
        SEGMENT: [hit.path, added.path],
        f"{SEGMENT}.index": [hit.path.with_name(hit.path.name + ".index"), moved.tobytes()],
        LOSS: [earlier_loss, added.path.with_name(added.path.name + ".loss")],
        f"{SEGMENT}.metadata": [Metadata(tokenizer, token_size, tokens).render().encode()],
    }
    files = tuple(_written(folder / name, pieces) for name, pieces in parts.items())
    places = folder / PLACES
    with writing(places):
        places.write_bytes(found.places + added.path.with_name(PLACES).read_bytes())
    quarantine = hit.quarantine  # the hit's (its records named as this rank reads the file), then the added's
    with writing(quarantine):
        earlier_lines = quarantine.read_bytes() if quarantine.exists() else b""
        quarantine.write_bytes(earlier_lines + added.quarantine.read_bytes())
    counts = Counts.of(entry.counts)
    counts.add(added.counts)
    path = folder / SEGMENT
    written = WrittenTokenFile(path, tokens, len(before.ends) + len(moved), files, counts.contents)
    return Segment(hit.file, path, counts, quarantine, None), written


_Piece = Path | bytes | int  # a file's bytes, bytes, or that many loss bytes of 1


def _written(path: Path, pieces: list[_Piece]) -> WrittenFile:
    """``pieces`` end to end as the file ``path``, checksummed as they are written, a bounded block at a time."""
    digest, size = hasher(), 0
    with writing(path), open(path, "wb") as out:
        for piece in pieces:
            for block in _blocks(piece):
                out.write(block)
                digest.update(block)
                size += len(block)
    return WrittenFile(path.name, size, digest.hexdigest())


def _blocks(piece: _Piece) -> Iterator[bytes]:
    if isinstance(piece, bytes):
        yield piece
    elif isinstance(piece, int):
        ones = np.ones(min(piece, BLOCK_BYTES), LOSS_DTYPE).tobytes()
        for start in range(0, piece, len(ones)):
            yield ones[: piece - start]
    else:
        with open(piece, "rb") as source:
            while block := source.read(BLOCK_BYTES):
                yield block
