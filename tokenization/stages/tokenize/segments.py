"""A rank's pass 1 as segments (``first_pass``): one input file's documents as a ``.ds`` family with its counts and
its rejected records, how each file is read (a mixture's sources each their own way) and keyed in the cache, and
what a segment taken from the cache holds, read once to check it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson

from tokenization.formats.contents import Contents, ContentsHasher, contents_each, stream_contents, within
from tokenization.formats.ds import INDEX_DTYPE, LOSS_DTYPE, Metadata, TokenFile, TokenFileError, token_dtype
from tokenization.formats.source_pool import SourcePool
from tokenization.inputs.content import content_identity
from tokenization.inputs.reader import DocumentReader, Record
from tokenization.output import known
from tokenization.output.cache import Cache
from tokenization.records import CachedInput, CacheEntry, InputFile, Mixture, RankCounts, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.storage.folder import writing
from tokenization.tokenizer.cache_key import CacheKey, cache_key
from tokenization.tokenizer.counts import Counts, histogram_buckets
from tokenization.tokenizer.documents import DocumentOptions, Primed
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.pipeline import ReadAhead

SEGMENTS = "segments"  # in the attempt's working folder: one folder a file, numbered in input order
SEGMENT = "segment.ds"
LOSS = f"{SEGMENT}.loss"
QUARANTINE = "quarantine.jsonl"  # a segment's rejected records; an entry's too
PLACES = "places.i64"  # where each document's record starts in the input, a hit's sample read there (``hits``)


@dataclass(frozen=True)
class Segment:
    """One input file's first pass: its documents' ``.ds`` family (``path``: a run of small cache hits shares one,
    their documents end to end in input order), its counts, and its rejected records (``quarantine``: one JSON line
    each, naming the file as this rank reads it); ``cached``: how the cache served it (None without a cache)."""

    file: InputFile
    path: Path
    counts: Counts
    quarantine: Path
    cached: CachedInput | None
    source: int = 0  # a mixture's source of the file

    @property
    def encoded(self) -> bool:
        """Whether this rank encoded the file (a miss, or no cache), rather than taking it from the cache."""
        return self.cached is None or not self.cached.hit


Found = tuple[InputFile, CacheKey | None, CacheEntry | None]  # a file, its key and its cache entry, when it has them


class Read(NamedTuple):
    """A file's reader, the read-ahead of its records, and its first batch when the engine has it already."""

    reader: DocumentReader
    ahead: ReadAhead[Record | Rejected]
    primed: Primed | None = None

    def close(self) -> None:
        """Stop it, never encoded (a try that failed before the file's turn)."""
        if self.primed is not None:
            self.primed.close()
        self.ahead.close()


@dataclass(frozen=True)
class Reading:
    """How a file is read: with its source's options (keys, template) and renderer; ``source``, its number in a
    mixture (0 without one)."""

    options: DocumentOptions
    renderer: Renderer | None
    source: int = 0


def source_readings(options: DocumentOptions, mixture: Mixture, encoder: Encoder) -> list[Reading]:
    """How each of a mixture's sources is read: with its own text key and template, where it sets them."""
    readings = []
    for number, source in enumerate(mixture.sources):
        own = replace(
            options, text_key=source.text_key or options.text_key, template=source.template or options.template
        )
        readings.append(Reading(own, own.renderer(encoder), number))
    return readings


def file_key(file: InputFile, reading: Reading, encoder: Encoder) -> CacheKey:
    """The cache key of ``file`` (or part) read as ``reading`` says (with or without ``save_loss``: one entry)."""
    return cache_key(
        content_identity(file, reading.options.storage_options),
        file.url,
        encoder=encoder,
        renderer=reading.renderer,
        options=reading.options,
    )


@dataclass(frozen=True)
class CacheOwner:
    """Who uses the cache: a rank (``stem``) of a build (``owner``, its run folder), whose entries stay while
    ``keeps`` (the build's ``_RUN.json``) exists."""

    cache: Cache
    owner: str
    keeps: str
    stem: str
    inputs: Sequence[str] = ()  # the build's input specs, by which the files its ranks hash are remembered

    def remember(self, rows: Mapping[str, str]) -> None:
        """Leave the rows of the files this rank hashed for the next night's plan (``output.known``), unless the
        cache was found read-only (said once already)."""
        if rows and self.inputs and not self.cache.read_only:
            who = f"{hashlib.sha256(self.owner.encode()).hexdigest()[:16]}.{self.stem}"
            known.remember_part(self.cache, self.inputs, who, rows)


@dataclass(frozen=True)
class Loaded:
    """A small cache hit's segment in memory, from its entry's files (``Cache.load``): what a ``TokenFile`` of it
    on disk gives (its tokens, index and loss bytes, or None without a ``.loss``: every byte 1)."""

    tokens: np.ndarray
    ends: np.ndarray
    loss: np.ndarray | None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def of(cls, files: Mapping[str, bytes], name: str, token_size: int) -> Loaded:
        """The family ``name`` (``segment.ds``) among ``files``, read as a ``TokenFile`` is: its metadata's token
        size must be ``token_size``, and each file whole entries; else a ``TokenFileError``."""
        metadata = Metadata.parse(files[f"{name}.metadata"].decode("utf-8", "replace"), f"{name}.metadata")
        if metadata.token_size != token_size:
            raise TokenFileError(f"{name}: metadata says token_size {metadata.token_size}, caller expects {token_size}")
        loss = files.get(f"{name}.loss")
        arrays = [(files[name], token_dtype(token_size)), (files[f"{name}.index"], INDEX_DTYPE)]
        if loss is not None:
            arrays.append((loss, LOSS_DTYPE))
        for data, dtype in arrays:
            if len(data) % dtype.itemsize:
                raise TokenFileError(f"{name}: a file of {len(data):,} bytes, not whole entries of {dtype.itemsize}")
        tokens, ends, *rest = (np.frombuffer(data, dtype=dtype) for data, dtype in arrays)
        if rest and len(rest[0]) != len(tokens):
            raise TokenFileError(f"its loss file holds {len(rest[0]):,} bytes for {len(tokens):,} tokens")
        return cls(tokens, ends, rest[0] if rest else None)


@dataclass(frozen=True)
class Held:
    """What a cache hit's segment holds, read once, in blocks: its index, its highest id, its loss bytes' highest
    value and how many are 1, and its contents (``formats.contents``) with its loss bytes, as its counts record
    them; ``plain``: the contents of its tokens alone, when asked (a build that saves no loss); ``lasts``: each
    document's last id (its EOS), as far as its index goes up."""

    segment: TokenFile | Loaded
    ends: np.ndarray
    top: int
    loss_top: int
    loss_ones: int
    contents: Contents
    plain: Contents | None
    lasts: np.ndarray

    @classmethod
    def read(cls, segment: TokenFile | Loaded, *, plain: bool) -> Held:
        """The segment's facts; its loss bytes are its ``.loss`` file's, or every one 1 without one (an entry's
        whose bytes are all 1). A loss file that does not cover its tokens is a ``TokenFileError``."""
        if isinstance(segment, Loaded):
            loss = segment.loss
            return cls._scan(segment, lambda a, b: (segment.tokens[a:b], None if loss is None else loss[a:b]), plain)
        with_file = segment.exists(".loss")
        if with_file and segment.size(".loss") != segment.num_tokens:
            raise TokenFileError(
                f"its loss file holds {segment.size('.loss'):,} bytes for {segment.num_tokens:,} tokens"
            )
        with SourcePool([segment.url], segment.token_size, with_file) as pool:
            return cls._scan(segment, lambda a, b: pool.read(0, a, b), plain)

    @classmethod
    def read_many(cls, segments: Sequence[Loaded], *, plain: bool) -> list[Held]:
        """``read`` of many segments in memory (a rank's small hits), their facts found in one pass over all of
        their tokens (``contents_each``): a scan a hit of a one-line file cost more than the rest of its check. A
        segment whose index does not go up to its last token, in order (damaged, which ``against`` refuses), or that
        holds none, is read alone, as ``read`` reads it."""
        alone = {k: cls.read(s, plain=plain) for k, s in enumerate(segments) if not _tidy(s)}
        together = [s for k, s in enumerate(segments) if k not in alone]
        if not together:
            return [alone[k] for k in range(len(segments))]
        sizes = np.array([s.num_tokens for s in together], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        ends = [np.asarray(s.ends, dtype=np.int64) for s in together]
        entries = np.array([len(e) for e in ends], dtype=np.int64)
        cuts = np.concatenate([e + at for e, at in zip(ends, starts.tolist(), strict=True)])
        firsts = np.cumsum(entries) - entries
        tokens = np.concatenate([s.tokens for s in together])
        lasts = np.split(tokens[cuts - 1], firsts[1:])  # tidy: every index entry past its segment's first token
        loss = np.concatenate([np.ones(s.num_tokens, LOSS_DTYPE) if s.loss is None else s.loss for s in together])
        contents = contents_each(tokens, loss, cuts, firsts)
        plains = contents_each(tokens, None, cuts, firsts) if plain else [None] * len(together)
        tops = np.maximum.reduceat(tokens, starts).tolist()
        loss_tops = np.maximum.reduceat(loss, starts).tolist()
        ones = np.add.reduceat((loss != 0).astype(np.int64), starts).tolist()
        made = iter(
            cls(s, e, top, loss_top, n, c, p, last)
            for s, e, top, loss_top, n, c, p, last in zip(
                together, ends, tops, loss_tops, ones, contents, plains, lasts, strict=True
            )
        )
        return [alone[k] if k in alone else next(made) for k in range(len(segments))]

    @classmethod
    def _scan(
        cls,
        segment: TokenFile | Loaded,
        blocks: Callable[[int, int], tuple[np.ndarray, np.ndarray | None]],
        plain: bool,
    ) -> Held:
        """The facts of a segment whose tokens and loss bytes (None: every one 1) ``blocks`` reads."""
        ends = np.asarray(segment.ends, dtype=np.int64)
        seen = {"top": -1, "loss_top": 0, "loss_ones": 0}
        alone = ContentsHasher() if plain else None
        lasts: list[np.ndarray] = []

        def read(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
            tokens, loss = blocks(start, stop)
            lasts.append(tokens[ends[(ends > start) & (ends <= stop)] - 1 - start])
            loss = np.ones(len(tokens), dtype=LOSS_DTYPE) if loss is None else loss
            seen["top"] = max(seen["top"], int(tokens.max()))
            seen["loss_top"] = max(seen["loss_top"], int(loss.max()))
            seen["loss_ones"] += int(np.count_nonzero(loss))
            if alone is not None:
                alone.add(tokens, within(ends, start, stop))
            return tokens, loss

        (contents,) = stream_contents(read, [(ends, segment.num_tokens)])
        plain_contents = None if alone is None else alone.result()
        last = np.concatenate(lasts) if lasts else ends[:0]
        return cls(segment, ends, contents=contents, plain=plain_contents, lasts=last, **seen)

    def against(self, c: RankCounts, quarantined: int, vocab_size: int, eos_id: int | None = None) -> str | None:
        """How the segment and its ``quarantined`` records (lines) disagree with their counts ``c``, or None: every
        id within the vocabulary, every loss byte 0 or 1, every document of a token at least and ending with
        ``eos_id`` (when the build appends one: a document's end moved within the tokens leaves one without), and
        the documents, tokens, lengths, contents and quarantined records the counts say."""
        if self.top >= vocab_size:
            return f"its documents hold id {self.top:,}, outside the tokenizer's {vocab_size:,}"
        if self.loss_top > 1:
            return f"its loss bytes hold {self.loss_top}, where each is 0 or 1"
        ends = self.ends
        lengths = np.diff(ends, prepend=0)
        shape = Counts()
        shape.add_lengths(lengths)
        found = {
            "documents": (len(ends), c.docs_written),
            "tokens": (self.segment.num_tokens, c.tokens),
            "index end": (int(ends[-1]) if len(ends) else 0, c.tokens),
            "documents of no token (its index goes back)": (int(np.count_nonzero(lengths <= 0)), 0),
            "tokens in its longest document": (shape.longest, c.longest),
            "tokens with loss": (self.loss_ones, c.loss_tokens),
            "quarantined records": (quarantined, c.rejected_total),
        }
        for what, (value, said) in found.items():
            if said is not None and value != said:
                return f"its files hold {value:,} {what}, its counts say {said:,}"
        if eos_id is not None and len(self.lasts) == len(ends) and len(off := np.flatnonzero(self.lasts != eos_id)):
            k = int(off[0])
            return (
                f"its document {k:,} ends with id {int(self.lasts[k]):,}, not the EOS {eos_id} that ends every document"
            )
        if not np.array_equal(shape.length_buckets, histogram_buckets(c.length_histogram)):
            return "its documents' lengths are not those its counts' histogram says"
        if c.contents_in is not None and c.contents_in.value != self.contents:
            return f"its files hold {self.contents.describe()}, its counts say {c.contents_in.value.describe()}"
        return None


def _tidy(segment: Loaded) -> bool:
    """Whether a segment holds tokens and its index goes up to its last one, in order (``Held.read_many``)."""
    ends, tokens = segment.ends, segment.num_tokens
    return bool(tokens and len(ends) and ends[-1] == tokens and ends[0] >= 0 and (ends[1:] >= ends[:-1]).all())


def ones_file(path: Path, tokens: int) -> Path:
    """A loss file of ``tokens`` bytes, every one 1: an entry's that it left out as such (``FirstPass._store``),
    written a block at a time."""
    block = np.ones(max(1, min(tokens, 1 << 24)), dtype=LOSS_DTYPE)
    with writing(path), open(path, "wb") as out:  # a file of no token: an empty one
        for start in range(0, tokens, len(block)):
            out.write(block[: min(len(block), tokens - start)].tobytes())
    return path


def without_loss(counts: Counts, plain: Contents) -> Counts:
    """A file's counts, as a build that saves no loss counts them: no token with loss, the contents of its tokens
    alone."""
    return replace(counts, loss_tokens=0, contents=plain)


def total(segments: Sequence[Segment]) -> Counts:
    """A rank's counts: its files'."""
    counts = Counts()
    for segment in segments:
        counts.add(segment.counts)
    return counts


def served(file: InputFile, key: str, counts: Counts, *, hit: bool, seconds: float, read: bool) -> CachedInput:
    """How the cache served ``file``, as its rank's manifest lists it."""
    return CachedInput(
        input_read=read,
        url=file.url,
        key=key,
        hit=hit,
        bytes=file.span_bytes,
        text_bytes=counts.text_bytes,
        tokens=counts.tokens,
        seconds=round(seconds, 3),
    )


def places_of(records: Sequence[Record], lengths: np.ndarray) -> np.ndarray:
    """Where the documents that a batch wrote start in their input, a row each: the offset and the line of their
    records (``inputs.reader.Record``), for a hit to read only those it samples."""
    texts = np.array([(r.offset, r.line) for r in records if r.text], dtype=np.int64).reshape(-1, 2)
    return texts[lengths > 0]


def lines_of(data: bytes) -> list[bytes]:
    """The lines of a quarantine's bytes, as reading its file line by line gives them (split at newlines only)."""
    *whole, last = data.split(b"\n")
    return [line + b"\n" for line in whole] + ([last] if last else [])


def quarantine_line(item: Rejected) -> bytes:
    """A rejected record as its line in a quarantine."""
    return orjson.dumps(item.to_json()) + b"\n"
