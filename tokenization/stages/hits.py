"""A tokenization cache hit held against its input file, before a rank uses it, where the deployment sets no key
to sign the cache with (``output.signing``: with one, a hit whose marker verifies is trusted, and none of this is
done).

An entry's marker records each file's size and sha256, which catch an entry damaged since it was stored, never
one written to deceive: whoever can write the cache can store another file's tokens under a key, or change an id,
and write sizes, sha256s and counts to match. So a hit is also held against what it was made from, at a small part
of the cost of encoding it again:

- its input file is read again, as its rank reads it (decompressed, parsed, rendered, but not encoded): on the
  shared corpora that runs at 100-240 MB/s of text on one core, where the fast engine encodes 10-80 MB/s on two.
  What reading gives must be what the entry says: the records read, blank lines, text bytes, empty records,
  documents and rejected records by reason, and its quarantine line by line: each line the reader's own record
  with its line, reason and raw text, or, for a record quarantined because it cannot be cut, that very record's
  text;
- a sample of its documents is encoded again with HF and must be the hit's, tokens and loss bytes: the first
  document, then others, ``SAMPLE_DOCS`` at most, of at most ``SAMPLE_BYTES`` of text in all (a drawn document that
  would pass that is passed over), drawn from the entry's key and the build's run folder: a retry of a build draws
  the same, each new build others, so that an id changed anywhere is found, build after build. Each is matched to
  its input record by counting the records that were written, so the input is read once, to its end.

What this catches: another file's tokens (swapped entries) whenever the two files differ in their records, text
bytes, blank lines or quarantine, and always when they differ in their first document (of at most
``SAMPLE_BYTES``); a record slipped into, or changed in, a quarantine; an id changed to another valid id in a
document of the sample, so with probability about ``SAMPLE_DOCS / n`` in a file of n documents each build (always
in a file of at most ``SAMPLE_DOCS``, within the byte bound). What it does not: an id changed in a document outside the
sample, nor a count that no file holds (the special-token text counted). Its cost: reading the input again, and
loading HF's tokenizer once a rank (0.2-0.7 s), which a rank that only hits would not load otherwise.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenization.formats.ds import TokenFile
from tokenization.inputs.sources import Record
from tokenization.records import CacheEntry, InputFile, RecordError, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.tokenizer.cutting import NO_EXACT_CUT
from tokenization.tokenizer.documents import DocumentOptions, utf8_length
from tokenization.tokenizer.encoding import Encoder

SAMPLE_DOCS = 8  # documents a hit's sample holds at most: every document of a smaller file
SAMPLE_BYTES = 16 << 10  # of text: ~10 ms of HF (1-2 MB/s) a file at most, and no document cut into pieces


@dataclass
class _Read:
    """What reading an input file again gave: its counts, and the sampled records by their number among the
    records that may have been written (those with text, not quarantined as too long to cut)."""

    docs_read: int = 0
    blank_lines: int = 0
    text_bytes: int = 0
    empty: int = 0
    rejected: Counter = field(default_factory=Counter)
    candidates: int = 0
    sampled: dict[int, Record] = field(default_factory=dict)


@dataclass(frozen=True)
class HitCheck:
    """How a rank reads and encodes its files, to hold its hits against: ``encoder`` encodes with HF alone
    (``Encoder.on_hf``)."""

    options: DocumentOptions
    renderer: Renderer | None
    encoder: Encoder
    save_loss: bool
    build: str  # the run folder of the build that reads the hits: each build draws its own sample

    def disagreement(
        self, entry: CacheEntry, segment: TokenFile, quarantine: Path | None, file: InputFile
    ) -> str | None:
        """How the hit ``entry`` (its ``segment`` and its ``quarantine`` file, if any, both checked against its
        marker) disagrees with the input ``file`` it stands for, or None."""
        c = entry.counts
        drawn = _drawn(f"{self.build}\n{entry.key}", c.docs_written)
        try:
            read, problem = self._read_again(file, quarantine, set(drawn))
        except RecordError as exc:
            return f"its quarantine is not one: {exc}"
        if problem:
            return problem
        for what, found, counted in (
            ("records read", read.docs_read, c.docs_read),
            ("blank lines", read.blank_lines, c.blank_lines),
            ("text bytes", read.text_bytes, c.text_bytes),
        ):
            if found != counted:
                return f"its input file has {found:,} {what}, its counts say {counted:,}"
        if dict(read.rejected) != c.rejected:
            return f"its input file rejects {dict(sorted(read.rejected.items()))}, its counts say {c.rejected}"
        silent = c.empty - read.empty  # texts that encoded to no token: none, unless the run frames no document
        framed = bool(self.encoder.bos_ids or self.encoder.policy.tail_ids)
        if silent < 0 or (silent and framed) or read.candidates != c.docs_written + silent:
            return (
                f"its input file has {read.candidates:,} records with text and {read.empty:,} without, its counts "
                f"say {c.docs_written:,} documents and {c.empty:,} empty"
            )
        return self._sample_problem(segment, read.sampled, drawn, silent)

    def _read_again(self, file: InputFile, quarantine: Path | None, drawn: set[int]) -> tuple[_Read, str | None]:
        """Read the input file as its rank does, checking the hit's quarantine line by line on the way; keep the
        drawn records of at most ``SAMPLE_BYTES``. Returns what was read, and the first difference found."""
        uncut = {item.line: _digest(item.raw) for item in _quarantined(quarantine) if item.reason == NO_EXACT_CUT}
        expected = (item for item in _quarantined(quarantine) if item.reason != NO_EXACT_CUT)
        o = self.options
        reader = o.reader([file], self.renderer)
        read = _Read()
        with closing(expected), closing(iter(reader)) as items:
            for item in items:
                read.docs_read += 1
                if isinstance(item, Rejected):
                    read.rejected[item.reason] += 1
                    stored = next(expected, None)
                    if stored is None or (stored.line, stored.reason, stored.raw) != (item.line, item.reason, item.raw):
                        return (
                            read,
                            f"its quarantine does not hold line {item.line} as the input rejects it ({item.reason})",
                        )
                    continue
                size = utf8_length(item.text)
                read.text_bytes += size
                if not item.text:
                    read.empty += 1
                elif item.line in uncut:
                    read.rejected[NO_EXACT_CUT] += 1
                    if uncut.pop(item.line) != _digest(item.text):
                        return read, f"its quarantine holds line {item.line} ({NO_EXACT_CUT}) with another text"
                else:
                    if read.candidates in drawn and size <= SAMPLE_BYTES:
                        read.sampled[read.candidates] = item
                    read.candidates += 1
            if (extra := next(expected, None)) is not None or uncut:
                line, reason = (extra.line, extra.reason) if extra else (min(uncut), NO_EXACT_CUT)
                return read, f"its quarantine holds line {line} ({reason}), which the input does not reject"
        read.blank_lines = reader.blank_lines
        return read, None

    def _sample_problem(
        self, segment: TokenFile, sampled: dict[int, Record], drawn: list[int], silent: int
    ) -> str | None:
        """How the sampled records, encoded again, differ from the hit's documents, or None. Record ``k`` is
        document ``k`` of the hit, or, when ``silent`` texts encoded to no token, one of the ``silent`` before it."""
        chosen, room = [], SAMPLE_BYTES
        for k in drawn:
            if k in sampled and (size := utf8_length(sampled[k].text)) <= room:
                chosen.append(k)
                room -= size
        if not chosen:
            return None
        records = [sampled[k] for k in chosen]
        no_loss = [r.no_loss_ranges for r in records] if self.save_loss else None
        prepared = self.encoder.prepare([r.text for r in records], no_loss, [r.special_spans for r in records])
        encoded = self.encoder.encode_prepared(prepared)
        ends = np.asarray(segment.ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]])
        tokens, loss = segment.tokens, segment.loss if self.save_loss else None
        if loss is not None and encoded.loss is None:  # encoding with no_loss gives loss bytes
            raise RuntimeError("the sampled records were encoded without loss bytes")
        offsets = np.cumsum(encoded.lengths) - encoded.lengths
        for k, record, offset, length in zip(chosen, records, offsets, encoded.lengths, strict=True):
            want = encoded.tokens[offset : offset + length]
            want_loss = encoded.loss[offset : offset + length] if encoded.loss is not None else None
            places = range(max(0, k - silent), min(k, len(ends) - 1) + 1)
            if (length == 0 and silent) or any(
                np.array_equal(tokens[starts[d] : ends[d]], want)
                and (loss is None or want_loss is None or np.array_equal(loss[starts[d] : ends[d]], want_loss))
                for d in places
            ):
                continue
            return f"its document {k} is not what the input's record at line {record.line} encodes to"
        return None


def _drawn(seed: str, documents: int) -> list[int]:
    """The documents a hit's sample draws, in order of preference: the first, then up to ``SAMPLE_DOCS - 1``
    others drawn by ``seed`` (the build's and the entry's)."""
    if documents <= 0:
        return []
    return [0, *random.Random(seed).sample(range(1, documents), min(documents - 1, SAMPLE_DOCS - 1))]


def _digest(text: str) -> bytes:
    """What tells a quarantined text from another, held in its place: such a text is over 512 K characters."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _quarantined(path: Path | None) -> Iterator[Rejected]:
    """A hit's quarantine, record by record (``RecordError`` on a line that is none)."""
    if path is None:
        return
    with open(path, "rb") as lines:
        for line in lines:
            yield Rejected.loads(line, str(path))
