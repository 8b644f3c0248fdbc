"""Pass 1 of a rank, a file at a time: each input file's documents, in input order, become a segment in the
attempt's working folder (a ``.ds`` family, the file's counts and its quarantined records), taken from the
tokenization cache (``tokenization.output.cache``) when it holds the file (``from_cache``), else encoded there and
then stored.

A segment is the same whether it was encoded or taken from the cache, and a rank's documents are its segments'
end to end, so pass 2 writes the same bytes with a full cache, an empty one or none. An entry holds its documents'
loss bytes whatever this build saves (a miss encodes them when a cache is in use), so that a build with
``save_loss`` and one without share it: its ``.loss`` file is stored only when some byte is 0 (a template's or a
chat's mask, a record's ``no_loss_ranges``); all ones, as plain text gives, it is left out and made again on a hit
that saves loss. Its counts are those of a build that saves loss (its contents cover the loss bytes); a build
without takes them as it would have counted them itself (no tokens with loss, contents of the tokens alone).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenization.formats import contents as hashed
from tokenization.formats.contents import ContentsHasher
from tokenization.formats.ds import TokenFileWriter, WrittenTokenFile
from tokenization.inputs.content import hashed_now, rank_hashes, taken_from_row, with_sha256
from tokenization.inputs.formats import text_bytes_about
from tokenization.inputs.grown import Tail
from tokenization.output.attempts import Attempt
from tokenization.progress import Progress, ProgressMode
from tokenization.records import CacheEntry, FileSum, InputFile, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.stages.tokenize import appended
from tokenization.stages.tokenize.segments import (
    LOSS,
    PLACES,
    QUARANTINE,
    SEGMENT,
    SEGMENTS,
    CacheOwner,
    Found,
    Read,
    Reading,
    Segment,
    file_key,
    places_of,
    quarantine_line,
    served,
    total,
    without_loss,
)
from tokenization.storage.checksums import ALGORITHM, file_checksum
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import writing
from tokenization.tokenizer.cache_key import CacheKey, cache_key
from tokenization.tokenizer.counts import Counts, RejectTally
from tokenization.tokenizer.documents import DocumentOptions, encoded_batches, prime, read_ahead
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.pipeline import Threads
from tokenization.wording import counted

if TYPE_CHECKING:
    from tokenization.stages.tokenize.from_cache import CacheHits

log = logging.getLogger(__name__)


class FirstPass:
    """Pass 1 of one rank (named ``where`` in messages and progress): ``run`` gives its segments, in input order."""

    def __init__(
        self,
        options: DocumentOptions,
        *,
        save_loss: bool,
        encoder: Encoder,
        renderer: Renderer | None,
        attempt: Attempt,
        where: str,
        cache: CacheOwner | None = None,
        readings: Mapping[str, Reading] | None = None,
    ):
        """``readings``: how each file (by URL) is read, when its source's settings are its own (a mixture's)."""
        self.options, self.save_loss, self.encoder, self.renderer = options, save_loss, encoder, renderer
        self.attempt, self.where, self.cache = attempt, where, cache
        self.readings = readings or {}
        self._hits: CacheHits | None = None  # the cache's hits, served as segments
        if cache is not None:
            from tokenization.stages.tokenize.from_cache import CacheHits  # a rank without a cache goes without it

            self._hits = CacheHits(
                cache,
                work=attempt.work,
                save_loss=save_loss,
                encoder=encoder,
                tokenizer=options.tokenizer,
                reading=self._reading,
            )
        self._found: list[Found] = []  # the files of the try under way (``_pass``)
        self._next: dict[int, Read] = {}  # a file's reading, started while the file before it still encoded
        self._grown: dict[int, Tail] = {}  # the files that grew by lines appended, by number, their earlier entry found
        self._rows: dict[str, str] = {}  # what this rank leaves the next night of the files it hashed, by URL
        self._corrected: set[str] = set()  # the files whose rows named another sha256 than their bytes' (URLs)
        self._hashing: ThreadPoolExecutor | None = None  # a miss's sha256, beside its encoding (``_as_it_is``)
        self.tally: RejectTally  # of a try at the rank's files (``_pass``), with the entries it stored
        self.stored: list[CacheEntry] = []

    def run(self, files: Sequence[InputFile], progress: ProgressMode) -> list[Segment]:
        """Every file's segment; ``TooManyRejects`` as soon as the rank's limits are passed (``quarantined`` then
        gives what was rejected so far). If the fast engine disagrees with HF on any file, every file is done again
        on HF, as a rank without a cache would, and the entries this rank stored with the fast engine are removed."""
        with contextlib.ExitStack() as held:
            found = self._look_up(files, held)
            threads = held.enter_context(Threads())
            self._hashing = held.enter_context(ThreadPoolExecutor(1, thread_name_prefix="hash"))
            return self.encoder.exactly(lambda: self._pass(found, threads, progress))

    @property
    def _cache(self) -> CacheOwner:
        """The cache, which a rank has when it looked a file up, stored or took an entry."""
        if self.cache is None:
            raise RuntimeError(f"{self.where}: no cache to use")
        return self.cache

    def _look_up(self, files: Sequence[InputFile], held: contextlib.ExitStack) -> list[Found]:
        """Each file with its key and its cache entry (None for a miss, or without a cache). The rank's use of the
        cache is recorded before it looks anything up, and lasts as long as ``held``."""
        if self.cache is None:
            return [(file, None, None) for file in files]
        # the files new or changed since the last night: the plan read none
        identified, rows, tails = rank_hashes(files)
        keys = [self._key(file) for file in identified]
        earlier = {i: self._earlier_key(f, tails[f.url]) for i, f in enumerate(identified) if f.url in tails}
        c = self.cache
        used = [key.digest for key in [*keys, *earlier.values()]]
        held.enter_context(c.cache.using(c.owner, c.keeps, c.stem, used))
        self._rows = dict(rows)
        c.remember(rows)  # once the folder is known to be a cache (``using``)
        entries = map_concurrently(lambda key: c.cache.lookup(key.digest), keys)  # reads that wait, at once
        self._grown = {}
        for i, key in earlier.items():  # a grown file's earlier bytes' entry serves as a hit, its places with it
            if entries[i] is None and (entry := c.cache.lookup(key.digest)) is not None and PLACES in entry.files:
                entries[i], self._grown[i] = entry, tails[identified[i].url]
        missed = [f for f, entry in zip(files, entries, strict=True) if entry is None]
        hits = len(files) - len(missed) - len(self._grown)
        listed = counted(len(files), "input file")
        log.info(
            "%s: %d of %s in the cache, %d grown by lines appended (those encoded), %d to tokenize",
            self.where,
            hits,
            listed,
            len(self._grown),
            len(missed),
        )
        added = sum(files[i].size - tail.offset for i, tail in self._grown.items())
        self.encoder.expect(sum(text_bytes_about(f) for f in missed) + added)
        return list(zip(files, keys, entries, strict=True))

    def _earlier_key(self, file: InputFile, tail: Tail) -> CacheKey:
        """The cache key of a grown file's earlier bytes (``inputs.grown``), read as the file is."""
        reading = self._reading(file)
        return cache_key(
            f"sha256={tail.sha256}", file.url, encoder=self.encoder, renderer=reading.renderer, options=reading.options
        )

    def _pass(self, found: list[Found], threads: Threads, progress: ProgressMode) -> list[Segment]:
        """One try at every file, in input order: a fresh tally of rejects, and what it stores in the cache."""
        for entry in self.stored:  # a try before this one's, whose engine then disagreed with HF
            self._cache.cache.discard(entry, "made by the fast engine in a rank where it then disagreed with HF")
        self.tally = RejectTally(
            self.where, self.options.source, self.options.max_rejects, self.options.max_reject_fraction
        )
        self.stored = []
        self._found = found
        if self._hits is not None:
            self._hits.start(found, alone=self._grown)
        try:
            with Progress(self.where, sum(file.span_bytes for file, _, _ in found), "B", progress) as shown:
                segments = [self._segment(i, *each, shown, threads) for i, each in enumerate(found)]
        finally:  # a file's reading started ahead, and never reached: a failed try's
            for read in self._next.values():
                read.close()
            self._next.clear()
        self.tally.check(total(segments))
        return segments

    def _read(self, i: int, threads: Threads, tail: Tail | None = None) -> Read:
        """File ``i``'s reader and the read-ahead of its records: started already when the file before it was read
        to its end (``_read_next``), else new; with ``tail``, of its lines appended since the last night."""
        if tail is None and (started := self._next.pop(i, None)) is not None:
            return started
        file = self._found[i][0]
        reading = self._reading(file)
        reader = reading.options.reader([file], reading.renderer)
        if tail is not None:
            reader.resume(file.url, tail.offset, tail.lines)
        return Read(reader, read_ahead(reader, threads))

    def _read_next(self, i: int, threads: Threads) -> None:
        """Start reading file ``i`` + 1 once file ``i`` is read to its end, when it has no cache entry (a hit is not
        read): its first batch is then read while file ``i``'s last batches are prepared and encoded."""
        if i + 1 < len(self._found) and self._found[i + 1][2] is None:
            self._next[i + 1] = read = self._read(i + 1, threads)
            read.ahead.start()

    def _prime_next(self, i: int, threads: Threads) -> None:
        """Hand the engine file ``i`` + 1's first batch once file ``i``'s last is in it (``documents.prime``), when
        its reading has started: the engine goes on from one file to the next without waiting for file ``i`` to be
        written."""
        if (read := self._next.get(i + 1)) is not None and read.primed is None:
            file, key, _ = self._found[i + 1]
            options, with_loss = self._reading(file).options, self._with_loss(key)
            primed = prime(read.ahead, encoder=self.encoder, options=options, save_loss=with_loss, threads=threads)
            self._next[i + 1] = read._replace(primed=primed)

    def _with_loss(self, key: CacheKey | None) -> bool:
        """Whether a miss is encoded with loss bytes: an entry holds its loss bytes, whatever this build saves."""
        return self.save_loss or key is not None

    def _reading(self, file: InputFile) -> Reading:
        return self.readings.get(file.url) or Reading(self.options, self.renderer)

    def _key(self, file: InputFile) -> CacheKey:
        return file_key(file, self._reading(file), self.encoder)

    def _segment(
        self,
        i: int,
        file: InputFile,
        key: CacheKey | None,
        entry: CacheEntry | None,
        shown: Progress,
        threads: Threads,
    ) -> Segment:
        """The file's segment: its cache ``entry``'s, checked, or else encoded (then stored, under ``key``)."""
        folder = self.attempt.work / SEGMENTS / f"{i:05d}"
        source = self._reading(file).source
        if i in self._grown:  # an earlier try's join, which a small hit's serving leaves where it has no quarantine
            (folder / QUARANTINE).unlink(missing_ok=True)
        hit = None
        if entry is not None and self._hits is not None:  # a grown file's hit stands for its earlier bytes alone
            covers = self._grown[i].offset if i in self._grown else None
            hit = self._hits.serve(i, entry, file, self.tally, shown, covers)
        if hit is not None and key is not None and entry is not None and i in self._grown:
            return replace(self._extended(i, hit, entry, key, shown, threads), source=source)
        if hit is not None:
            return replace(hit, source=source)
        if entry is not None:  # a hit found unfit: its file is encoded after all
            self.encoder.expect_more(text_bytes_about(file))
        shutil.rmtree(folder, ignore_errors=True)  # an earlier try's, or an entry's found unfit
        started = time.perf_counter()
        hashing, planned = None, file
        if key is not None and taken_from_row(file) and self._hashing is not None:  # read anyway: its sha256 too
            hashing = self._hashing.submit(hashed_now, file)
        with_loss = self._with_loss(key)
        segment, written, plain = self._encode(file, folder, shown, threads, with_loss, places=key is not None, index=i)
        seconds = time.perf_counter() - started
        if key is None:
            return replace(segment, source=source)
        if hashing is not None:
            file, key = self._as_it_is(file, key, *hashing.result())
            segment = replace(segment, file=file)
        self._store(segment, written, key, seconds)  # its counts with loss, as every entry's
        if plain is not None:  # this build saves no loss: its counts as it counts them
            segment = replace(segment, counts=without_loss(segment.counts, plain.result()))
        how = served(file, key.digest, segment.counts, hit=False, seconds=seconds, read=True)
        if file is not planned:  # its content as read, where the plan's is not
            how = replace(how, content=key.described["content"])
        return replace(segment, cached=how, source=source)

    def _as_it_is(self, file: InputFile, key: CacheKey, sha256: str, row: str | None) -> tuple[InputFile, CacheKey]:
        """A miss whose plan took its sha256 from a remembered row (``inputs.content.taken_from_row``), and its
        key: as planned when its bytes, read beside its encoding, have that ``sha256``; else as they are, named in
        the log (the entry is stored under its real sha256, never the row's), and its ``row`` (``hashed_now``)
        left for the next night. A forged row would otherwise outlive its forging: every night's entry stored under
        the sha256 it names. Said once a file, however many of its parts the rank holds or tries it makes."""
        if sha256 == taken_from_row(file):
            return file, key
        real = with_sha256(file, sha256)
        if file.url in self._corrected:
            return real, self._key(real)
        self._corrected.add(file.url)
        log.warning(
            "%s: %s: its bytes' sha256 is %s, not the %s its plan took from the cache's record of known input files "
            "(a row forged or damaged); its entry is stored under its bytes' sha256, and its row corrected",
            self.where,
            file.url,
            sha256,
            taken_from_row(file),
        )
        if row is not None:
            self._rows[file.url] = row
            self._cache.remember(self._rows)
        return real, self._key(real)

    def _extended(
        self, i: int, hit: Segment, entry: CacheEntry, key: CacheKey, shown: Progress, threads: Threads
    ) -> Segment:
        """File ``i``, grown by lines appended since the last night (``inputs.grown``): ``hit``, its earlier bytes'
        ``entry``'s documents (checked as a hit), then its appended lines encoded, joined (``appended``) and stored
        under its own ``key``, as a miss's segment."""
        started = time.perf_counter()
        file, tail = hit.file, self._grown[i]
        found = appended.earlier(self._cache.cache, entry, hit)
        folder = hit.quarantine.parent / appended.ADDED
        shutil.rmtree(folder, ignore_errors=True)  # an earlier try's
        added, _, plain = self._encode(file, folder, shown, threads, True, places=True, index=i, tail=tail)
        o = self._reading(file).options
        segment, written = appended.joined(
            hit, entry, found, added, tokenizer=o.tokenizer, token_size=self.encoder.token_size
        )
        seconds = time.perf_counter() - started
        self._store(segment, written, key, seconds)
        if plain is not None:  # this build saves no loss: its counts as it counts them (the hit's are so already)
            segment = replace(segment, counts=without_loss(segment.counts, hit.counts.contents + plain.result()))
        lines = added.counts.docs_read + added.counts.blank_lines
        how = served(file, key.digest, segment.counts, hit=False, seconds=seconds, read=True)
        earlier = hit.counts  # taken from the cache: no rate of encoding counts them
        how = replace(
            how,
            appended_lines=lines,
            reused_text_bytes=earlier.text_bytes,
            reused_tokens=earlier.tokens,
            reused_bytes=self._grown[i].offset,
        )
        return replace(segment, cached=how)

    def _encode(
        self,
        file: InputFile,
        folder: Path,
        shown: Progress,
        threads: Threads,
        with_loss: bool,
        *,
        places: bool,
        index: int,
        tail: Tail | None = None,
    ) -> tuple[Segment, WrittenTokenFile, ContentsHasher | None]:
        """A miss (or no cache): the file's documents (file ``index`` of the pass) encoded into the segment, rejects
        to its quarantine, and with ``places`` (to store) where each document starts in the input (``PLACES``, a
        batch at a time); an attempt whose lease is found lost stops at the next batch (its successor does the
        work). ``with_loss``: with loss bytes, and their counts; when this build saves none, the contents of its
        tokens alone are hashed too (the hasher returned), on the writer's own thread, as it writes. With ``tail``,
        only the file's lines appended since the last night."""
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        tally = self.tally.next_file()
        quarantine = folder / QUARANTINE
        o = self._reading(file).options
        plain = ContentsHasher() if with_loss and not self.save_loss else None

        def observe(tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None, found: hashed.Found) -> None:
            if plain is not None:
                plain.add(tokens, ends)

        writer = TokenFileWriter(  # a working file: pass 2 reads it, the cache checks its checksum before any use
            folder / SEGMENT,
            tokenizer=o.tokenizer,
            token_size=self.encoder.token_size,
            save_loss=with_loss,
            durable=False,
            observe=observe if plain is not None else None,
        )
        # the writer's threads stop at the block's end on errors too: no buffered byte of a failed try may reach a
        # file that a second try reopens
        where = folder / PLACES
        with (
            writing(quarantine),
            open(quarantine, "wb") as bad,
            writing(where),
            open(where, "wb") if places else contextlib.nullcontext() as at,
            writer,
        ):

            def reject(item: Rejected) -> None:
                bad.write(quarantine_line(item))
                tally(item)

            # taken last, once nothing can fail before its batches are iterated (and closed): until then a failed
            # try closes a reading started ahead, and its batch in the engine, with the rest (``_pass``)
            reader, ahead, primed = self._read(index, threads, tail)
            counts = Counts() if primed is None else primed.counts
            batches = encoded_batches(
                reader,
                encoder=self.encoder,
                counts=counts,
                options=o,
                reject=reject,
                desc=self.where,
                save_loss=with_loss,
                progress=shown,
                threads=threads,
                ahead=ahead,
                read_next=lambda: self._read_next(index, threads),
                then=lambda: self._prime_next(index, threads),
                primed=primed,
            )
            with closing(batches):  # a write error stops the reading and encoding threads here, not at exit
                for batch in batches:
                    self.attempt.lease.check()  # no request: the heartbeat found it
                    lengths = batch.encoded.lengths
                    ends = np.cumsum(lengths)[lengths > 0]  # a document of no token is counted empty, not written
                    writer.write(batch.encoded.tokens, ends, batch.encoded.loss)
                    if at is not None:
                        at.write(places_of(batch.records, lengths).astype("<i8").tobytes())
        self.tally.add(tally)
        written = writer.written
        if written is None:  # set when the block above closed it
            raise RuntimeError(f"{folder / SEGMENT}: its writer was not closed")
        counts.contents = written.contents
        return Segment(file, folder / SEGMENT, counts, quarantine, None), written, plain

    def _store(self, segment: Segment, written: WrittenTokenFile, key: CacheKey, seconds: float) -> None:
        """A miss's segment into the cache, for the next build."""
        ones = segment.counts.loss_tokens == segment.counts.tokens  # made again from the counts on a hit
        kept = [f for f in written.files if not (ones and f.name == LOSS)]
        files = {f.name: segment.path.with_name(f.name) for f in kept}
        sums = {f.name: f.sum for f in kept}
        files[PLACES] = segment.path.with_name(PLACES)
        sums[PLACES] = FileSum.of(files[PLACES].stat().st_size, file_checksum(files[PLACES]), ALGORITHM)
        if size := segment.quarantine.stat().st_size:
            files[QUARANTINE] = segment.quarantine
            sums[QUARANTINE] = FileSum.of(size, file_checksum(segment.quarantine), ALGORITHM)
        entry = CacheEntry(
            key=key.digest,
            data="",  # the data folder and the time: the commit's
            files=sums,
            counts=segment.counts.record(),
            source=segment.file,
            content=key.described["content"],
            described=key.described,
            created=0.0,
            encode_seconds=round(seconds, 3),
        )
        if (stored := self._cache.cache.commit(entry, files)) is not None:
            self.stored.append(stored)


def quarantined(work: Path) -> Path:
    """The rank's rejected records, file after file, in one file of its working folder (those of the files done
    so far, when the rank failed on its limits)."""
    whole = work / QUARANTINE
    with writing(whole), open(whole, "wb") as out:
        for part in sorted((work / SEGMENTS).glob(f"*/{QUARANTINE}"), key=lambda p: int(p.parent.name)):
            with open(part, "rb") as lines:
                shutil.copyfileobj(lines, out)
    return whole
