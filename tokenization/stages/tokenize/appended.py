"""A file that grew by whole lines appended since the last night (``inputs.grown``): its segment is its earlier
bytes' cache entry's documents, checked as any hit is (``from_cache``), then those of the lines after them, encoded
(``first_pass``), joined into one segment, as a miss's, that the rank stores under the file's own key.

A document's tokens, loss bytes and counts are its record's alone (its text, template, loss spans and the
tokenizer's policy: BOS, EOS), and its line's number and offset are the same in the earlier file and in this one,
so the joined segment, its places, its quarantine and its counts are, byte for byte, what encoding the whole file
gives; the contents of the joined documents must be the sum of the two parts' (``Counts.add``), or the rank fails.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np

from tokenization.formats.contents import ContentsHasher
from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileWriter, WrittenTokenFile
from tokenization.output.cache import Cache
from tokenization.records import CacheEntry
from tokenization.stages.tokenize.segments import LOSS, PLACES, QUARANTINE, SEGMENT, Segment
from tokenization.storage.folder import writing
from tokenization.tokenizer.counts import Counts

BLOCK_TOKENS = 1 << 24  # copied at a time, at document ends: memory stays bounded for a file of any size
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
    plain: bool,
) -> tuple[Segment, WrittenTokenFile, ContentsHasher | None]:
    """The file's segment: the earlier entry's documents (``hit``, its ``entry``) then the ``added`` ones, with
    their loss bytes, places and quarantined records, in the hit's segment folder; its counts with loss, as an
    entry's; with ``plain``, the contents of its tokens alone too (the hasher returned), as a miss's."""
    folder = hit.quarantine.parent
    shutil.rmtree(folder / JOINED, ignore_errors=True)  # an earlier try's
    with writing(folder / JOINED):
        (folder / JOINED).mkdir(parents=True)
    hasher = ContentsHasher() if plain else None
    writer = TokenFileWriter(
        folder / JOINED / SEGMENT,
        tokenizer=tokenizer,
        token_size=token_size,
        save_loss=True,
        durable=False,
        observe=None if hasher is None else lambda tokens, ends, loss, got: hasher.add(tokens, ends),
    )
    with writer:
        before = TokenFile(str(hit.path))
        _copy(writer, before, before.loss if found.loss is None else found.loss)
        after = TokenFile(str(added.path))
        _copy(writer, after, after.loss)
    written = writer.written
    if written is None:
        raise RuntimeError(f"{folder / JOINED / SEGMENT}: its writer was not closed")
    places = folder / JOINED / PLACES
    with writing(places):
        places.write_bytes(found.places + added.path.with_name(PLACES).read_bytes())
    quarantine = folder / QUARANTINE  # the hit's (its records named as this rank reads the file), then the added's
    with writing(quarantine):
        earlier_lines = quarantine.read_bytes() if quarantine.exists() else b""
        quarantine.write_bytes(earlier_lines + added.quarantine.read_bytes())
    counts = Counts.of(entry.counts)
    counts.add(added.counts)
    if counts.contents != written.contents:
        raise RuntimeError(
            f"{hit.file.name}: its earlier documents and its appended ones hold {counts.contents.describe()}, "
            f"their joined segment {written.contents.describe()}"
        )
    return Segment(hit.file, folder / JOINED / SEGMENT, counts, quarantine, None), written, hasher


def _copy(writer: TokenFileWriter, family: TokenFile, loss: np.ndarray | None) -> None:
    """A segment's documents into ``writer``, a block at a time at document ends, with their loss bytes (None:
    every one 1)."""
    ends = np.asarray(family.ends, dtype=np.int64)
    tokens, first, start = family.tokens, 0, 0
    while first < len(ends):
        last = max(first + 1, int(np.searchsorted(ends, start + BLOCK_TOKENS, side="right")))
        stop = int(ends[last - 1])
        block = np.ones(stop - start, LOSS_DTYPE) if loss is None else np.asarray(loss[start:stop])
        writer.write(np.asarray(tokens[start:stop]), ends[first:last] - start, block)
        first, start = last, stop
