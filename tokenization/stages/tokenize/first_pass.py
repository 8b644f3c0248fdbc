"""Pass 1 of a rank, a file at a time: each input file's documents, in input order, become a segment in the
attempt's working folder (a ``.ds`` family, the file's counts and its quarantined records), taken from the
tokenization cache (``tokenization.output.cache``) when it holds the file, else encoded there and then stored.

A segment is the same whether it was encoded or taken from the cache, and a rank's documents are its segments'
end to end, so pass 2 writes the same bytes with a full cache, an empty one or none. An entry holds its documents'
loss bytes whatever this build saves (a miss encodes them when a cache is in use), so that a build with
``save_loss`` and one without share it: its ``.loss`` file is stored only when some byte is 0 (a template's or a
chat's mask, a record's ``no_loss_ranges``); all ones, as plain text gives, it is left out and made again on a hit
that saves loss. Its counts are those of a build that saves loss (its contents cover the loss bytes); a build
without takes them as it would have counted them itself (no tokens with loss, contents of the tokens alone).

A cached file's rejected records count towards the rank's limits in input order, as if it had been read again, so
a rank fails, or not, at the same record either way.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import cast

import numpy as np
import orjson

from tokenization.formats import contents as hashed
from tokenization.formats.contents import ContentsHasher
from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileError, TokenFileWriter, WrittenTokenFile
from tokenization.inputs.content import rank_hashes
from tokenization.inputs.formats import file_format, text_bytes_about
from tokenization.output.attempts import Attempt
from tokenization.progress import Progress, ProgressMode
from tokenization.records import CacheEntry, FileSum, InputFile, Rejected
from tokenization.rendering.renderer import Renderer
from tokenization.stages.tokenize.hits import HitCheck, Sample
from tokenization.stages.tokenize.segments import (
    PLACES,
    QUARANTINE,
    CacheOwner,
    Found,
    Held,
    Loaded,
    Read,
    Reading,
    Segment,
    file_key,
    lines_of,
    ones_file,
    places_of,
    served,
    total,
    without_loss,
)
from tokenization.storage.checksums import ALGORITHM, file_checksum
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import writing
from tokenization.tokenizer.cache_key import CacheKey
from tokenization.tokenizer.counts import Counts, RejectTally
from tokenization.tokenizer.documents import DocumentOptions, encoded_batches, read_ahead
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.pipeline import Threads
from tokenization.wording import counted

log = logging.getLogger(__name__)

SEGMENTS = "segments"  # in the attempt's working folder: one folder a file, numbered in input order
SEGMENT = "segment.ds"
LOSS = f"{SEGMENT}.loss"
CACHED = "cached"  # a hit's files as fetched, in a folder of their own: read, never written through (hard links)
AHEAD = 1024  # hits checked together, their samples encoded in one batch (``_check_ahead``): ~45 MB of text at most


@dataclass(frozen=True)
class _Checked:
    """A hit checked ahead: what its segment holds, its quarantine's bytes (None: it has none), its segment's path
    (None while it is ``loaded`` in memory, before its run is written: ``_write_runs``) and its seconds."""

    held: Held
    quarantine: bytes | None
    path: Path | None
    loaded: Loaded | None
    seconds: float = 0.0


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
        self._checks: dict[int, HitCheck] = {}  # what each source's hits are held against, made at its first hit
        self._found: list[Found] = []  # the files of the try under way (``_pass``)
        self._ahead: dict[int, _Checked | None] = {}  # its hits checked ahead, by number (``_check_ahead``)
        self._next: dict[int, Read] = {}  # a file's reading, started while the file before it still encoded
        self.tally: RejectTally  # of a try at the rank's files (``_pass``), with the entries it stored
        self.stored: list[CacheEntry] = []

    def run(self, files: Sequence[InputFile], progress: ProgressMode) -> list[Segment]:
        """Every file's segment; ``TooManyRejects`` as soon as the rank's limits are passed (``quarantined`` then
        gives what was rejected so far). If the fast engine disagrees with HF on any file, every file is done again
        on HF, as a rank without a cache would, and the entries this rank stored with the fast engine are removed."""
        with contextlib.ExitStack() as held:
            found = self._look_up(files, held)
            threads = held.enter_context(Threads())
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
        identified, rows = rank_hashes(files)  # the files new or changed since the last night: the plan read none
        keys = [self._key(file) for file in identified]
        c = self.cache
        held.enter_context(c.cache.using(c.owner, c.keeps, c.stem, [key.digest for key in keys]))
        c.remember(rows)  # once the folder is known to be a cache (``using``)
        entries = map_concurrently(lambda key: c.cache.lookup(key.digest), keys)  # reads that wait, at once
        missed = [f for f, entry in zip(files, entries, strict=True) if entry is None]
        hits = len(files) - len(missed)
        listed = counted(len(files), "input file")
        log.info("%s: %d of %s in the cache, %d to tokenize", self.where, hits, listed, len(missed))
        self.encoder.expect(sum(text_bytes_about(f) for f in missed))
        return list(zip(files, keys, entries, strict=True))

    def _pass(self, found: list[Found], threads: Threads, progress: ProgressMode) -> list[Segment]:
        """One try at every file, in input order: a fresh tally of rejects, and what it stores in the cache."""
        for entry in self.stored:  # a try before this one's, whose engine then disagreed with HF
            self._cache.cache.discard(entry, "made by the fast engine in a rank where it then disagreed with HF")
        self.tally = RejectTally(
            self.where, self.options.source, self.options.max_rejects, self.options.max_reject_fraction
        )
        self.stored = []
        self._found, self._ahead = found, {}
        try:
            with Progress(self.where, sum(file.span_bytes for file, _, _ in found), "B", progress) as shown:
                segments = [self._segment(i, *each, shown, threads) for i, each in enumerate(found)]
        finally:  # a file's reading started ahead, and never reached: a failed try's
            for _, ahead in self._next.values():
                ahead.close()
            self._next.clear()
        self.tally.check(total(segments))
        return segments

    def _read(self, i: int, threads: Threads) -> Read:
        """File ``i``'s reader and the read-ahead of its records: started already when the file before it was read
        to its end (``_read_next``), else new."""
        if (started := self._next.pop(i, None)) is not None:
            return started
        file = self._found[i][0]
        reading = self._reading(file)
        reader = reading.options.reader([file], reading.renderer)
        return reader, read_ahead(reader, threads)

    def _read_next(self, i: int, threads: Threads) -> None:
        """Start reading file ``i`` + 1 while file ``i``'s last batches encode, when it has no cache entry (a hit
        is not read): its first batch is then ready as soon as file ``i`` is written."""
        if i + 1 < len(self._found) and self._found[i + 1][2] is None:
            self._next[i + 1] = read = self._read(i + 1, threads)
            read[1].start()

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
        if entry is not None and (hit := self._from_cache(i, entry, file, shown)) is not None:
            return replace(hit, source=source)
        shutil.rmtree(folder, ignore_errors=True)  # an earlier try's, or an entry's found unfit
        started = time.perf_counter()
        with_loss = self.save_loss or key is not None  # an entry holds its loss bytes, whatever this build saves
        segment, written, plain = self._encode(file, folder, shown, threads, with_loss, places=key is not None, index=i)
        seconds = time.perf_counter() - started
        if key is None:
            return replace(segment, source=source)
        self._store(segment, written, key, seconds)  # its counts with loss, as every entry's
        if plain is not None:  # this build saves no loss: its counts as it counts them
            segment = replace(segment, counts=without_loss(segment.counts, plain.result()))
        how = served(file, key.digest, segment.counts, hit=False, seconds=seconds, read=True)
        return replace(segment, cached=how, source=source)

    def _from_cache(self, i: int, entry: CacheEntry, file: InputFile, shown: Progress) -> Segment | None:
        """Hit ``i``, checked (``_check_ahead``), or None. Its rejected records, naming the file as this rank reads
        it, count as they would if it were read again; its contents are hashed from its bytes, as pass 2 will read
        them."""
        if i not in self._ahead:
            self._check_ahead(i)
        if (checked := self._ahead.pop(i)) is None or checked.path is None:
            return None
        started = time.perf_counter()
        folder = self.attempt.work / SEGMENTS / f"{i:05d}"
        quarantine = folder / QUARANTINE
        tally = self.tally.next_file()
        if checked.quarantine is not None:  # else none is written: the rank's quarantine gathers those there are
            folder.mkdir(parents=True, exist_ok=True)
            with writing(quarantine), open(quarantine, "wb") as out:
                for line in lines_of(checked.quarantine):
                    item = replace(Rejected.loads(line, QUARANTINE), file=file.url)
                    out.write(_line(item))
                    tally(item)
        self.tally.add(tally)
        held = checked.held
        counts = Counts.of(entry.counts)
        counts.contents = held.contents
        if held.plain is not None:  # this build saves no loss
            counts = without_loss(counts, held.plain)
        shown.advance(file.span_bytes, docs=counts.docs_written, tokens=counts.tokens)
        read = self._cache.cache.signer is None and (PLACES not in entry.files or file_format(file.url)[1] is not None)
        seconds = checked.seconds + time.perf_counter() - started
        how = served(file, entry.key, counts, hit=True, seconds=seconds, read=read)
        return Segment(file, checked.path, counts, quarantine, how)

    def _check_ahead(self, i: int) -> None:
        """Hit ``i`` and the next ones, ``AHEAD`` at most, checked together: each loaded (a small entry, in memory)
        or fetched and held against its marker and its counts, and, without a key, its sample read from its input,
        on threads (each a few small reads that wait for the disk, for the cache's files as for an input out of the
        page cache: one-line files are as many waits as hits); then their samples encoded in one batch a source
        (``stages.tokenize.hits``), not one encoder call a hit. A hit found unfit is removed from the cache (its file
        is tokenized again, in its turn). The small hits left are written to pass 2 a file a run (``_write_runs``)."""
        hits = [k for k in range(i, len(self._found)) if self._found[k][2] is not None][:AHEAD]
        signed = self._cache.cache.signer is not None  # markers whose signatures verified: no sample is read
        checks = {} if signed else {k: self._hits(self._found[k][0]) for k in hits}  # the first loads HF's tokenizer
        started = time.perf_counter()
        found = map_concurrently(lambda k: self._one_ahead(k, checks.get(k)), hits)
        share = (time.perf_counter() - started) / max(1, len(hits))
        by_source: dict[int, list[tuple[int, Sample]]] = {}
        for k, (checked, sample) in zip(hits, found, strict=True):
            self._ahead[k] = None if checked is None else replace(checked, seconds=share)
            if isinstance(sample, str):
                self._unfit(k, sample)
            elif sample is not None:
                by_source.setdefault(self._reading(self._found[k][0]).source, []).append((k, sample))
        for source, sampled in by_source.items():
            started = time.perf_counter()
            verdicts = self._checks[source].verdicts([sample for _, sample in sampled])
            share = (time.perf_counter() - started) / len(sampled)
            for (k, _), problem in zip(sampled, verdicts, strict=True):
                self._spent(k, share)
                if problem is not None:
                    self._unfit(k, problem)
        self._write_runs(hits)

    def _write_runs(self, hits: list[int]) -> None:
        """The small hits among ``hits`` that passed, held in memory, into pass 2's files: one ``.ds`` family a run
        of them (files next to each other in input order, of one source), their documents end to end, where a
        folder and four links a hit cost more than its bytes."""
        runs: list[list[int]] = []
        for k in hits:
            checked = self._ahead.get(k)
            if checked is None or checked.loaded is None:
                continue
            if runs and runs[-1][-1] == k - 1 and self._source(k) == self._source(k - 1):
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            started = time.perf_counter()
            path = self.attempt.work / SEGMENTS / f"{run[0]:05d}-hits.ds"
            with writing(path.parent):
                path.parent.mkdir(parents=True, exist_ok=True)
            loaded = [cast("Loaded", cast("_Checked", self._ahead[k]).loaded) for k in run]
            sizes = np.array([each.num_tokens for each in loaded], dtype=np.int64)
            at = (np.cumsum(sizes) - sizes).tolist()
            ends = np.concatenate([e.ends.astype(np.int64) + s for e, s in zip(loaded, at, strict=True)])
            tokens = np.concatenate([each.tokens for each in loaded])
            loss = None
            if self.save_loss:
                loss = np.concatenate([np.ones(e.num_tokens, LOSS_DTYPE) if e.loss is None else e.loss for e in loaded])
            writer = TokenFileWriter(
                path,
                tokenizer=self.options.tokenizer,
                token_size=self.encoder.token_size,
                save_loss=self.save_loss,
                durable=False,
            )
            with writer:
                writer.write(tokens, ends, loss)
            share = (time.perf_counter() - started) / len(run)
            for k in run:
                self._ahead[k] = replace(cast("_Checked", self._ahead[k]), path=path, loaded=None)
                self._spent(k, share)

    def _source(self, k: int) -> int:
        return self._reading(self._found[k][0]).source

    def _one_ahead(self, k: int, check: HitCheck | None) -> tuple[_Checked | None, Sample | str | None]:
        """Hit ``k`` loaded or fetched and held against its marker and counts (``_checked``), with its sample read
        from its input when ``check`` is given (``HitCheck.sample``: or how the hit disagrees with its input)."""
        file, _, entry = self._found[k]
        found = self._checked(cast("CacheEntry", entry), self.attempt.work / SEGMENTS / f"{k:05d}")
        if found is None:
            return None, None
        checked, places = found
        if check is None:
            return checked, None
        return checked, check.sample(cast("CacheEntry", entry), checked.held.segment, checked.quarantine, file, places)

    def _unfit(self, k: int, problem: str) -> None:
        """Hit ``k`` found unfit: its entry removed, its file to be tokenized in its turn."""
        self._cache.cache.discard(cast("CacheEntry", self._found[k][2]), problem)
        self._ahead[k] = None

    def _spent(self, k: int, seconds: float) -> None:
        """Seconds more that checking hit ``k`` took, as its manifest counts them."""
        if (checked := self._ahead.get(k)) is not None:
            self._ahead[k] = replace(checked, seconds=checked.seconds + seconds)

    def _checked(self, entry: CacheEntry, folder: Path) -> tuple[_Checked, np.ndarray | None] | None:
        """A hit's files, in memory when its marker holds them (a small entry: ``CacheEntry.inline``), else
        fetched into ``folder`` (an earlier try's removed), what its segment holds (``Held``), and its places; or
        None when its files disagree with its marker or with its counts (a marker edited by hand,
        ``Held.against``), and the entry is removed."""
        cache = self._cache.cache
        path: Path | None = None
        if entry.inline is not None:
            files = cache.load(entry)
            if files is None:
                return None
            quarantine, places = files.get(QUARANTINE), files.get(PLACES)
            held = self._held(entry, files, quarantine, lambda: Loaded.of(files, SEGMENT, self.encoder.token_size))
            table = None if places is None else np.frombuffer(places[: len(places) // 8 * 8], dtype="<i8")
        else:
            shutil.rmtree(folder, ignore_errors=True)  # an earlier try's
            if (fetched := cache.fetch(entry, folder / CACHED)) is None:
                return None
            path = fetched.get(SEGMENT)
            quarantine = fetched[QUARANTINE].read_bytes() if QUARANTINE in fetched else None
            held = self._held(entry, fetched, quarantine, lambda: self._on_disk(fetched))
            table = np.fromfile(fetched[PLACES], dtype="<i8") if PLACES in fetched else None
        if isinstance(held, str):
            cache.discard(entry, held)
            return None
        loaded = held.segment if isinstance(held.segment, Loaded) else None
        return _Checked(held, quarantine, path, loaded), table

    def _on_disk(self, fetched: dict[str, Path]) -> TokenFile:
        """A fetched hit's segment, with a loss file of ones when this build saves loss and the entry has none
        (every byte 1: its counts must say so, ``Held.against``)."""
        if self.save_loss and LOSS not in fetched:
            size = TokenFile(str(fetched[SEGMENT]), self.encoder.token_size).num_tokens
            fetched[LOSS] = ones_file(fetched[SEGMENT].with_name(LOSS), size)
        return TokenFile(str(fetched[SEGMENT]), self.encoder.token_size)

    def _held(
        self,
        entry: CacheEntry,
        names: Collection[str],
        quarantine: bytes | None,
        segment: Callable[[], TokenFile | Loaded],
    ) -> Held | str:
        """What a hit's segment holds (its files ``names``, read as ``segment`` gives them), or how it and its
        ``quarantine`` disagree with its counts."""
        family = [SEGMENT, f"{SEGMENT}.index", f"{SEGMENT}.metadata"]
        if missing := [name for name in family if name not in names]:
            return f"it holds no {missing[0]}"
        try:
            held = Held.read(segment(), plain=not self.save_loss)
        except TokenFileError as exc:
            return str(exc)
        lines = len(lines_of(quarantine or b""))
        return held.against(entry.counts, lines, self.encoder.vocab_size) or held

    def _hits(self, file: InputFile) -> HitCheck:
        """What the hits of ``file``'s source are held against, made at its first hit: it loads HF's tokenizer, to
        encode their samples (a rank that takes every file from the cache still builds no fast engine)."""
        reading = self._reading(file)
        if reading.source not in self._checks:
            self._checks[reading.source] = HitCheck(
                reading.options, reading.renderer, self._on_hf, self.save_loss, self._cache.owner
            )
        return self._checks[reading.source]

    @cached_property
    def _on_hf(self) -> Encoder:
        return self.encoder.on_hf()

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
    ) -> tuple[Segment, WrittenTokenFile, ContentsHasher | None]:
        """A miss (or no cache): the file's documents (file ``index`` of the pass) encoded into the segment, rejects
        to its quarantine, and with ``places`` (to store) where each document starts in the input (``PLACES``, a
        batch at a time); an attempt whose lease is found lost stops at the next batch (its successor does the
        work). ``with_loss``: with loss bytes, and their counts; when this build saves none, the contents of its
        tokens alone are hashed too (the hasher returned), on the writer's own thread, as it writes."""
        with writing(folder):
            folder.mkdir(parents=True, exist_ok=True)
        counts, tally = Counts(), self.tally.next_file()
        quarantine = folder / QUARANTINE
        o = self._reading(file).options
        reader, ahead = self._read(index, threads)
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
                bad.write(_line(item))
                tally(item)

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
                then=lambda: self._read_next(index, threads),
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


def _line(item: Rejected) -> bytes:
    return orjson.dumps(item.to_json()) + b"\n"
