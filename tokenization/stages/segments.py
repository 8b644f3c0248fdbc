"""A rank's pass 1 as segments (``first_pass``): one input file's documents as a ``.ds`` family with its counts and
its rejected records, how each file is read (a mixture's sources each their own way) and keyed in the cache, and
what a segment taken from the cache holds, read once to check it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tokenization.formats.contents import Contents, ContentsHasher, stream_contents, within
from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileError
from tokenization.formats.source_pool import SourcePool
from tokenization.inputs.content import content_identity
from tokenization.inputs.reader import DocumentReader, Record
from tokenization.output import known
from tokenization.output.cache import Cache
from tokenization.records import CachedInput, CacheEntry, InputFile, Mixture, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.storage.folder import writing
from tokenization.tokenizer.cache_key import CacheKey, cache_key
from tokenization.tokenizer.counts import Counts
from tokenization.tokenizer.documents import DocumentOptions
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.pipeline import ReadAhead


@dataclass(frozen=True)
class Segment:
    """One input file's first pass: its documents' ``.ds`` family (``path``), its counts, and its rejected records
    (``quarantine``: one JSON line each, naming the file as this rank reads it); ``cached``: how the cache served
    it (None without a cache)."""

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
Read = tuple[DocumentReader, ReadAhead[Record | Rejected]]  # a file's reader, and the read-ahead of its records


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
class Held:
    """What a cache hit's segment holds, read once, in blocks: its index, its highest id, its loss bytes' highest
    value and how many are 1, and its contents (``formats.contents``) with its loss bytes, as its counts record
    them; ``plain``: the contents of its tokens alone, when asked (a build that saves no loss)."""

    segment: TokenFile
    ends: np.ndarray
    top: int
    loss_top: int
    loss_ones: int
    contents: Contents
    plain: Contents | None

    @classmethod
    def read(cls, segment: TokenFile, *, plain: bool) -> Held:
        """The segment's facts; its loss bytes are its ``.loss`` file's, or every one 1 without one (an entry's
        whose bytes are all 1). A loss file that does not cover its tokens is a ``TokenFileError``."""
        with_file = segment.exists(".loss")
        if with_file and segment.size(".loss") != segment.num_tokens:
            raise TokenFileError(
                f"its loss file holds {segment.size('.loss'):,} bytes for {segment.num_tokens:,} tokens"
            )
        ends = np.asarray(segment.ends, dtype=np.int64)
        seen = {"top": -1, "loss_top": 0, "loss_ones": 0}
        alone = ContentsHasher() if plain else None

        def read(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
            tokens, loss = pool.read(0, start, stop)
            loss = np.ones(len(tokens), dtype=LOSS_DTYPE) if loss is None else loss
            seen["top"] = max(seen["top"], int(tokens.max()))
            seen["loss_top"] = max(seen["loss_top"], int(loss.max()))
            seen["loss_ones"] += int(np.count_nonzero(loss))
            if alone is not None:
                alone.add(tokens, within(ends, start, stop))
            return tokens, loss

        with SourcePool([segment.url], segment.token_size, with_file) as pool:
            (contents,) = stream_contents(read, [(ends, segment.num_tokens)])
        return cls(segment, ends, contents=contents, plain=None if alone is None else alone.result(), **seen)


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
