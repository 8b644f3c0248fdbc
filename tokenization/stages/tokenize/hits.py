"""A tokenization cache hit held against its input file, before a rank uses it, where the deployment sets no key
to sign the cache with (``output.signing``: with one, a hit whose marker verifies is trusted, and none of this is
done).

An entry's marker records each file's size and checksum, which catch an entry damaged since it was stored, never
one written to deceive: whoever can write the cache can store another file's tokens under a key, or change an id,
and write sizes, checksums and counts to match. So a hit is also held against what it was made from, at a cost that
does not grow with its input file: a sample of its documents is read from the input, where the entry says they
start, and encoded again with HF, and must be the hit's, tokens and loss bytes.

- The places: a miss records, beside its segment, where each document's record starts in its input
  (``segments.PLACES``: the byte offset of its line in the file's decompressed bytes, or its row in a parquet
  file, and its line or row number). They must go forward through the file, a document each, on lines the
  entry's quarantine does not name.
- The sample: the first document, then others, ``SAMPLE_DOCS`` at most, drawn from the entry's key and the
  build's run folder: a retry of a build draws the same, each new build others, so that an id changed anywhere is
  found, build after build. Each is read where its place says (``DocumentReader.at``): a plain JSON-lines file a
  buffer at each place, a parquet file the row groups that hold them; a gzip or zstd file cannot be entered in the
  middle, so it is decompressed from its start up to the last drawn document (on average most of the file: set a
  key for compressed corpora). A place where no record with text starts is a disagreement. They are encoded whole
  while ``SAMPLE_BYTES`` of text last; a drawn document beyond them, of any length, by a window of its text
  (``_window``), whose tokens must be in it, in a row.

What this catches: another file's tokens (swapped entries), unless the two files have the same first document and
the same records at the drawn places; a document's tokens replaced, when it is in the sample (always, in a file of
at most ``SAMPLE_DOCS``); an id changed to another valid id in the sample's text, so with probability about
``SAMPLE_DOCS / n`` in a file of n documents each build, times the share of a long document its window covers; a
quarantined record planted on a document's line. What it does not: an id changed outside the sample's text; counts
(records read, blank lines, text bytes, empty records, rejects by reason) and quarantined records that agree with
the entry's own files but not with the input (a record planted on a blank line, or one removed), and documents of
the input left out of the entry, their places skipped: these need reading the whole input, which a key makes
unnecessary. Its cost: a few reads of the input, and loading HF's tokenizer once a rank (0.2-0.7 s). A rank reads
the samples of many hits (``sample``), then encodes them in one batch (``verdicts``): a hit of a one-line file is a
document of a few tokens, which encoding alone cost more than the rest of its check.

An entry stored before places were recorded has none: it is held against its whole input, read again as its rank
reads it (``_read_again``: counts, quarantine line by line, the sample matched by counting records), as before.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace

import numpy as np

from tokenization.formats.ds import TokenFile
from tokenization.inputs.reader import Record
from tokenization.records import CacheEntry, InputFile, RecordError, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.stages.tokenize.segments import QUARANTINE, Loaded, lines_of
from tokenization.tokenizer.cutting import NO_EXACT_CUT
from tokenization.tokenizer.documents import DocumentOptions, utf8_length
from tokenization.tokenizer.encoding import Encoded, Encoder

SAMPLE_DOCS = 8  # documents a hit's sample holds at most: every document of a smaller file
SAMPLE_BYTES = 16 << 10  # of text encoded whole: ~10 ms of HF (1-2 MB/s) a file at most
WINDOW_CHARS = 4 << 10  # of a drawn document beyond them, encoded (``_window``): long documents are sampled too
WINDOW_SLACK = 16  # tokens at each end of such a window that the text around it may change


@dataclass
class _Read:
    """What reading an input file again gave: its counts, and the sampled records by their number among the
    records that may have been written (those with text, not quarantined as too long to cut)."""

    docs_read: int = 0
    blank_lines: int = 0
    text_bytes: int = 0
    empty: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
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

    def sample(
        self,
        entry: CacheEntry,
        segment: TokenFile | Loaded,
        quarantine: bytes | None,
        file: InputFile,
        places: np.ndarray | None,
    ) -> Sample | str:
        """The sample of the hit ``entry`` (its ``segment``, its ``quarantine`` file's bytes, if any, and its
        ``places`` table, all checked against its marker), read from the input ``file`` it stands for, to be encoded
        with the rank's others (``verdicts``); or how the hit already disagrees with its input. An entry stored
        before places were recorded has none: its input is read whole (``_read_again``)."""
        c = entry.counts
        seed = f"{self.build}\n{entry.key}"
        drawn = _drawn(seed, c.docs_written)
        if places is not None:
            return self._at_places(segment, quarantine, file, places, drawn, seed)
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
        return _chosen(segment, read.sampled, drawn, silent, seed)

    def _at_places(
        self,
        segment: TokenFile | Loaded,
        quarantine: bytes | None,
        file: InputFile,
        table: np.ndarray,
        drawn: list[int],
        seed: str,
    ) -> Sample | str:
        """The drawn documents' records, read from the input where the hit's places say they start (there, and
        nowhere else: ``DocumentReader.at``), or how the places disagree with it. The places must go forward
        through the file, a document each, on lines that its quarantine does not name."""
        documents = len(segment.ends)
        if len(table) != 2 * documents:
            return f"its places file holds {len(table) * 8:,} bytes, for {documents:,} documents"
        offsets, lines = table.reshape(-1, 2).T
        if documents and (
            offsets[0] < 0 or lines[0] < 1 or (np.diff(offsets) <= 0).any() or (np.diff(lines) <= 0).any()
        ):
            return "its places do not go forward through its input file"
        try:
            named = [(item.line, item.reason) for item in _quarantined(quarantine)]
        except RecordError as exc:
            return f"its quarantine is not one: {exc}"
        if named and (clash := np.flatnonzero(np.isin(lines, [line for line, _ in named]))).size:
            line, reason = next(item for item in named if item[0] == lines[clash[0]])
            return f"its quarantine holds line {line} ({reason}), where its document {clash[0]} starts"
        order = sorted(drawn, key=lambda k: offsets[k])
        found = self.options.reader([file], self.renderer).at(file, [(int(offsets[k]), int(lines[k])) for k in order])
        sampled = {}
        for k, item in zip(order, found, strict=True):
            if not isinstance(item, Record) or not item.text:
                at = f"line {lines[k]} (byte {offsets[k]:,})"
                return f"its document {k} is at {at} of its input, which holds no record with text there"
            sampled[k] = item
        return _chosen(segment, sampled, drawn, 0, seed)

    def _read_again(self, file: InputFile, quarantine: bytes | None, drawn: set[int]) -> tuple[_Read, str | None]:
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
                    if read.candidates in drawn:
                        read.sampled[read.candidates] = item
                    read.candidates += 1
            if (extra := next(expected, None)) is not None or uncut:
                line, reason = (extra.line, extra.reason) if extra else (min(uncut), NO_EXACT_CUT)
                return read, f"its quarantine holds line {line} ({reason}), which the input does not reject"
        read.blank_lines = reader.blank_lines
        return read, None

    def verdicts(self, samples: Sequence[Sample]) -> list[str | None]:
        """How each hit's sampled records, encoded again, differ from its documents, or None: the samples of many
        hits encoded in one batch, since a hit of a one-line file is a document of a few tokens, and encoding it
        alone cost more than the rest of its check. Record ``k`` of a sample is document ``k`` of its hit, or, when
        ``silent`` texts encoded to no token, one of the ``silent`` before it. A window's tokens but
        ``WINDOW_SLACK`` at each end must be in the document, in a row, with their loss bytes; a whole record's
        must be the document."""
        records = [record for sample in samples for _, record, _ in sample.chosen]
        if not records:
            return [None] * len(samples)
        no_loss = [r.no_loss_ranges for r in records] if self.save_loss else None
        prepared = self.encoder.prepare([r.text for r in records], no_loss, [r.special_spans for r in records])
        encoded = self.encoder.encode_prepared(prepared)
        if self.save_loss and encoded.loss is None:  # encoding with no_loss gives loss bytes
            raise RuntimeError("the sampled records were encoded without loss bytes")
        offsets = np.cumsum(encoded.lengths) - encoded.lengths
        found: list[str | None] = []
        first = 0
        for sample in samples:
            last = first + len(sample.chosen)
            found.append(self._problem(sample, encoded, offsets[first:last], encoded.lengths[first:last]))
            first = last
        return found

    def _problem(self, sample: Sample, encoded: Encoded, offsets: np.ndarray, lengths: np.ndarray) -> str | None:
        """How one hit's sample, encoded at ``offsets`` of ``encoded``, differs from its documents, or None."""
        segment, silent = sample.segment, sample.silent
        ends = np.asarray(segment.ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]])
        tokens, loss = segment.tokens, segment.loss if self.save_loss else None
        for (k, record, window), offset, length in zip(sample.chosen, offsets, lengths, strict=True):
            first, last = (
                (offset + WINDOW_SLACK, offset + length - WINDOW_SLACK) if window else (offset, offset + length)
            )
            if last <= first and window:
                continue  # a window of too few tokens to tell
            want = encoded.tokens[first:last]
            want_loss = encoded.loss[first:last] if encoded.loss is not None and loss is not None else None
            places = range(max(0, k - silent), min(k, len(ends) - 1) + 1)
            if (length == 0 and silent) or any(
                _holds(
                    tokens[starts[d] : ends[d]],
                    loss[starts[d] : ends[d]] if loss is not None else None,
                    want,
                    want_loss,
                    whole=not window,
                )
                for d in places
            ):
                continue
            return f"its document {k} is not what the input's record at line {record.line} encodes to"
        return None


@dataclass(frozen=True)
class Sample:
    """What a hit's sample holds, read from its input, before it is encoded with the rank's others: the hit's
    ``segment``, and the records ``chosen`` (``(k, record, window)``: record ``k``, whole or a window of it), of
    which ``silent`` texts before each may have encoded to no token."""

    segment: TokenFile | Loaded
    chosen: list[tuple[int, Record, bool]]
    silent: int


def _chosen(
    segment: TokenFile | Loaded, sampled: dict[int, Record], drawn: list[int], silent: int, seed: str
) -> Sample:
    """The sampled records to encode, in order of preference: whole while ``SAMPLE_BYTES`` of text last, and a
    record beyond them, of any length, by a window of ``WINDOW_CHARS`` or so drawn by ``seed`` (``_window``)."""
    chosen, room = [], SAMPLE_BYTES
    for k in drawn:
        if k not in sampled:
            continue
        if (size := utf8_length(sampled[k].text)) <= room:
            chosen.append((k, sampled[k], False))
            room -= size
        elif (piece := _window(sampled[k], f"{seed}\n{k}")) is not None:
            chosen.append((k, piece, True))
    return Sample(segment, chosen, silent)


def _window(record: Record, seed: str) -> Record | None:
    """About ``WINDOW_CHARS`` of the record's text from a place drawn by ``seed``, from a space to a space, with its
    loss ranges and special spans moved and cut to it: tokenizers split words at whitespace, so its tokens, but for
    the first and last ``WINDOW_SLACK``, are some of the whole text's, in a row. None when it has no spaces there."""
    text = record.text
    drawn = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") % max(1, len(text) - WINDOW_CHARS)
    start = text.find(" ", drawn) if drawn else 0
    end = text.rfind(" ", start + 1, start + WINDOW_CHARS)
    if start < 0 or end <= start:
        return None

    def within(ranges: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
        if ranges is None:
            return None
        return [(max(a, start) - start, min(b, end) - start) for a, b in ranges if a < end and b > start]

    return replace(record, text=text[start:end], no_loss_ranges=within(record.no_loss_ranges), special_spans=None)


def _holds(
    document: np.ndarray, loss: np.ndarray | None, want: np.ndarray, want_loss: np.ndarray | None, *, whole: bool
) -> bool:
    """Whether the document (its tokens, and its ``loss`` bytes) is ``want`` (``want_loss``), or, not ``whole``,
    holds them in a row somewhere: looked for where the document holds the rarest of ``want``'s tokens in its place,
    every such place (a window's first token, say " the", was looked for at 10,000 places at most, and a long
    document that held it more often failed a true hit)."""
    if whole:
        return np.array_equal(document, want) and (loss is None or want_loss is None or np.array_equal(loss, want_loss))
    if not 0 < len(want) <= len(document):
        return False
    seen = np.bincount(document, minlength=int(want.max()) + 1)
    anchor = int(np.argmin(seen[want]))  # the rarest of the window's tokens in the document
    places = np.flatnonzero(document == want[anchor]) - anchor
    for at in places[(places >= 0) & (places <= len(document) - len(want))]:
        if np.array_equal(document[at : at + len(want)], want) and (
            loss is None or want_loss is None or np.array_equal(loss[at : at + len(want)], want_loss)
        ):
            return True
    return False


def _drawn(seed: str, documents: int) -> list[int]:
    """The documents a hit's sample draws, in order of preference: the first, then up to ``SAMPLE_DOCS - 1``
    others drawn by ``seed`` (the build's and the entry's)."""
    if documents <= 0:
        return []
    return [0, *random.Random(seed).sample(range(1, documents), min(documents - 1, SAMPLE_DOCS - 1))]


def _digest(text: str) -> bytes:
    """What tells a quarantined text from another, held in its place: such a text is over 512 K characters."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _quarantined(data: bytes | None) -> Iterator[Rejected]:
    """A hit's quarantine, record by record (``RecordError`` on a line that is none)."""
    for line in lines_of(data or b""):
        yield Rejected.loads(line, QUARANTINE)
