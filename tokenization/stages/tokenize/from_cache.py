"""Pass 1's cache hits (``first_pass``): each served as a segment in the attempt's working folder, checked first
(``hits``), many at a time, a hit found unfit removed from the cache and its file tokenized again in its turn.

A cached file's rejected records count towards the rank's limits in input order, as if it had been read again, so
a rank fails, or not, at the same record either way.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TypeVar, cast

import numpy as np

from tokenization.formats.ds import LOSS_DTYPE, TokenFile, TokenFileError, TokenFileWriter
from tokenization.inputs.content import hashed_now, taken_from_row
from tokenization.inputs.formats import file_format
from tokenization.progress import Progress
from tokenization.records import CacheEntry, InputFile, Rejected
from tokenization.stages.tokenize.hits import HitCheck, Sample
from tokenization.stages.tokenize.segments import (
    LOSS,
    PLACES,
    QUARANTINE,
    SEGMENT,
    SEGMENTS,
    CacheOwner,
    Found,
    Held,
    Loaded,
    Reading,
    Segment,
    lines_of,
    ones_file,
    quarantine_line,
    served,
    without_loss,
)
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import writing
from tokenization.tokenizer.counts import Counts, RejectTally
from tokenization.tokenizer.encoding import Encoder

log = logging.getLogger(__name__)

CACHED = "cached"  # a hit's files as fetched, in a folder of their own: read, never written through (hard links)
S = TypeVar("S", TokenFile, Loaded)
AHEAD = 1024  # hits checked together, their samples encoded in one batch (``_check_ahead``): ~45 MB of text at most


@dataclass(frozen=True)
class _Checked:
    """A hit checked ahead: what its segment holds (None for a small one, in memory, until the rank's are read
    together: ``Held.read_many``), its quarantine's bytes (None: it has none), its segment's path (None while it is
    ``loaded`` in memory, before its run is written: ``_write_runs``) and its seconds."""

    held: Held | None
    quarantine: bytes | None
    path: Path | None
    loaded: Loaded | None
    seconds: float = 0.0

    @property
    def segment(self) -> TokenFile | Loaded:
        return cast("Loaded", self.loaded) if self.held is None else self.held.segment


class CacheHits:
    """The hits of one rank's pass 1 (``FirstPass``), in the attempt's working folder ``work``: ``serve`` gives a
    hit's segment. ``reading`` says how a file is read (its source's options, renderer and number)."""

    def __init__(
        self,
        cache: CacheOwner,
        *,
        work: Path,
        save_loss: bool,
        encoder: Encoder,
        tokenizer: str,
        reading: Callable[[InputFile], Reading],
    ):
        self.cache, self.work, self.save_loss, self.encoder = cache, work, save_loss, encoder
        self.tokenizer, self._reading = tokenizer, reading
        self._checks: dict[int, HitCheck] = {}  # what each source's hits are held against, made at its first hit
        self._found: list[Found] = []  # the files of the try under way (``start``)
        self._ahead: dict[int, _Checked | None] = {}  # its hits checked ahead, by number (``_check_ahead``)
        self._alone: Collection[int] = ()  # hits whose segment is a file of their own, never in a run of others

    def start(self, found: list[Found], alone: Collection[int] = ()) -> None:
        """A new try at the rank's files: none of its hits checked yet (what their sources' hits are held against
        is kept). The hits ``alone`` (a grown file's earlier documents, ``first_pass``) each get a segment of their
        own, never one shared with the next hits."""
        self._found, self._ahead, self._alone = found, {}, alone

    def serve(
        self, i: int, entry: CacheEntry, file: InputFile, tally: RejectTally, shown: Progress, covers: int | None = None
    ) -> Segment | None:
        """Hit ``i``, checked (``_check_ahead``), or None. Its rejected records, naming the file as this rank reads
        it, count in ``tally`` as they would if it were read again; its contents are hashed from its bytes, as pass
        2 will read them. It advances ``shown`` by the input bytes it stands for, ``covers`` (a grown file's earlier
        ones: its appended ones are shown as they are read), by default the file's."""
        if i not in self._ahead:
            self._check_ahead(i)
        if (checked := self._ahead.pop(i)) is None or checked.path is None:
            return None
        started = time.perf_counter()
        folder = self.work / SEGMENTS / f"{i:05d}"
        quarantine = folder / QUARANTINE
        rejected = tally.next_file()
        if checked.quarantine is not None:  # else none is written: the rank's quarantine gathers those there are
            folder.mkdir(parents=True, exist_ok=True)
            with writing(quarantine), open(quarantine, "wb") as out:
                for line in lines_of(checked.quarantine):
                    item = replace(Rejected.loads(line, QUARANTINE), file=file.url)
                    out.write(quarantine_line(item))
                    rejected(item)
        tally.add(rejected)
        held = cast("Held", checked.held)
        counts = Counts.of(entry.counts)
        counts.contents = held.contents
        if held.plain is not None:  # this build saves no loss
            counts = without_loss(counts, held.plain)
        shown.advance(file.span_bytes if covers is None else covers, docs=counts.docs_written, tokens=counts.tokens)
        read = self.cache.cache.signer is None and (PLACES not in entry.files or file_format(file.url)[1] is not None)
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
        signed = self.cache.cache.signer is not None  # markers whose signatures verified: no sample is read
        checks = {} if signed else {k: self._hits(self._found[k][0]) for k in hits}  # the first loads HF's tokenizer
        started = time.perf_counter()
        found = map_concurrently(lambda k: self._one_ahead(k, checks.get(k)), hits)
        share = (time.perf_counter() - started) / max(1, len(hits))
        for k, (checked, _, _) in zip(hits, found, strict=True):
            self._ahead[k] = None if checked is None else replace(checked, seconds=share)
        small = self._held_together(hits)
        samples = {k: sample for k, (_, _, sample) in zip(hits, found, strict=True)}
        places = {k: table for k, (_, table, _) in zip(hits, found, strict=True)}
        held = [k for k in small if k in checks and self._ahead[k] is not None]
        samples |= self._samples_of(held, checks, places)
        by_source: dict[int, list[tuple[int, Sample]]] = {}
        for k in hits:
            if self._ahead[k] is None:
                continue  # found unfit already
            if isinstance(sample := samples[k], str):
                self._unfit(k, sample, of_its_input=True)
            elif sample is not None:
                by_source.setdefault(self._source(k), []).append((k, sample))
        for source, sampled in by_source.items():
            started = time.perf_counter()
            verdicts = self._checks[source].verdicts([sample for _, sample in sampled])
            share = (time.perf_counter() - started) / len(sampled)
            for (k, _), problem in zip(sampled, verdicts, strict=True):
                self._spent(k, share)
                if problem is not None:
                    self._unfit(k, problem, of_its_input=True)
        self._write_runs(hits)

    def _held_together(self, hits: list[int]) -> list[int]:
        """What the small hits among ``hits`` hold, their segments in memory read together (``Held.read_many``), each
        held against its marker's counts; one that disagrees is removed from the cache. Returns the small hits."""
        small = [k for k in hits if (checked := self._ahead.get(k)) is not None and checked.held is None]
        if not small:
            return small
        started = time.perf_counter()
        loaded = [cast("Loaded", cast("_Checked", self._ahead[k]).loaded) for k in small]
        for k, held in zip(small, Held.read_many(loaded, plain=not self.save_loss), strict=True):
            checked = cast("_Checked", self._ahead[k])
            if problem := self._against(cast("CacheEntry", self._found[k][2]), held, checked.quarantine):
                self._unfit(k, problem)
            else:
                self._ahead[k] = replace(checked, held=held)
        share = (time.perf_counter() - started) / len(small)
        for k in small:
            self._spent(k, share)
        return small

    def _samples_of(
        self, hits: list[int], checks: dict[int, HitCheck], places: dict[int, np.ndarray | None]
    ) -> dict[int, Sample | str]:
        """The samples of small ``hits`` that held, read from their inputs on threads (``_sample``)."""
        if not hits:
            return {}
        started = time.perf_counter()
        read = map_concurrently(lambda k: self._sample(k, checks[k], cast("_Checked", self._ahead[k]), places[k]), hits)
        share = (time.perf_counter() - started) / len(hits)
        for k in hits:
            self._spent(k, share)
        return dict(zip(hits, read, strict=True))

    def _write_runs(self, hits: list[int]) -> None:
        """The small hits among ``hits`` that passed, held in memory, into pass 2's files: one ``.ds`` family a run
        of them (files next to each other in input order, of one source), their documents end to end, where a
        folder and four links a hit cost more than its bytes."""
        runs: list[list[int]] = []
        for k in hits:
            checked = self._ahead.get(k)
            if checked is None or checked.loaded is None:
                continue
            together = k not in self._alone and k - 1 not in self._alone
            if together and runs and runs[-1][-1] == k - 1 and self._source(k) == self._source(k - 1):
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            started = time.perf_counter()
            path = self.work / SEGMENTS / f"{run[0]:05d}-hits.ds"
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
                tokenizer=self.tokenizer,
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

    def _one_ahead(
        self, k: int, check: HitCheck | None
    ) -> tuple[_Checked | None, np.ndarray | None, Sample | str | None]:
        """Hit ``k`` loaded or fetched (``_checked``), with its places; a fetched one held against its marker and
        counts, and its sample read from its input when ``check`` is given (``_sample``). A small one's sample is
        read once its segment has held, with the others' (``_held_together``)."""
        entry = self._found[k][2]
        found = self._checked(cast("CacheEntry", entry), self.work / SEGMENTS / f"{k:05d}")
        if found is None:
            return None, None, None
        checked, places = found
        if check is None or checked.held is None:
            return checked, places, None
        return checked, places, self._sample(k, check, checked, places)

    def _sample(self, k: int, check: HitCheck, checked: _Checked, places: np.ndarray | None) -> Sample | str:
        """The sample of hit ``k`` (``checked``: held), read from its input (``HitCheck.sample``), or how the hit
        disagrees with its input."""
        file, _, entry = self._found[k]
        return check.sample(cast("CacheEntry", entry), checked.segment, checked.quarantine, file, places)

    def _unfit(self, k: int, problem: str, of_its_input: bool = False) -> None:
        """Hit ``k`` found unfit: its file to be tokenized in its turn, and its entry removed, unless the entry
        disagrees ``of_its_input`` (its sample) only because it is another file's: its plan took the file's sha256
        from a remembered row (``taken_from_row``) that its bytes, hashed now, belie (a row forged or damaged). That
        entry is sound, its own file's; the miss then stores this file's under its real sha256, and corrects the row
        (``first_pass``)."""
        file, _, entry = self._found[k]
        self._ahead[k] = None
        if of_its_input and (taken := taken_from_row(file)) is not None and hashed_now(file)[0] != taken:
            log.info(
                "%s: the cache entry its plan's sha256 %s named is another file's, kept: %s",
                file.url,
                taken,
                problem,
            )
            return
        self.cache.cache.discard(cast("CacheEntry", entry), problem, file.name)

    def _spent(self, k: int, seconds: float) -> None:
        """Seconds more that checking hit ``k`` took, as its manifest counts them."""
        if (checked := self._ahead.get(k)) is not None:
            self._ahead[k] = replace(checked, seconds=checked.seconds + seconds)

    def _checked(self, entry: CacheEntry, folder: Path) -> tuple[_Checked, np.ndarray | None] | None:
        """A hit's files, in memory when its marker holds them (a small entry: ``CacheEntry.inline``, whose
        segment is read with the rank's others: ``_held_together``), else fetched into ``folder`` (an earlier try's
        removed) and what its segment holds (``Held``); and its places. None when its files disagree with its marker
        or with its counts (a marker edited by hand, ``Held.against``), and the entry is removed."""
        cache = self.cache.cache
        if entry.inline is not None:
            files = cache.load(entry)
            if files is None:
                return None
            quarantine, places = files.get(QUARANTINE), files.get(PLACES)
            loaded = self._segment(files, lambda: Loaded.of(files, SEGMENT, self.encoder.token_size))
            if isinstance(loaded, str):
                cache.discard(entry, loaded)
                return None
            table = None if places is None else np.frombuffer(places[: len(places) // 8 * 8], dtype="<i8")
            return _Checked(None, quarantine, None, loaded), table
        shutil.rmtree(folder, ignore_errors=True)  # an earlier try's
        if (fetched := cache.fetch(entry, folder / CACHED)) is None:
            return None
        quarantine = fetched[QUARANTINE].read_bytes() if QUARANTINE in fetched else None
        held = self._held(entry, fetched, quarantine)
        if isinstance(held, str):
            cache.discard(entry, held)
            return None
        table = np.fromfile(fetched[PLACES], dtype="<i8") if PLACES in fetched else None
        return _Checked(held, quarantine, fetched.get(SEGMENT), None), table

    def _on_disk(self, fetched: dict[str, Path]) -> TokenFile:
        """A fetched hit's segment, with a loss file of ones when this build saves loss and the entry has none
        (every byte 1: its counts must say so, ``Held.against``)."""
        if self.save_loss and LOSS not in fetched:
            size = TokenFile(str(fetched[SEGMENT]), self.encoder.token_size).num_tokens
            fetched[LOSS] = ones_file(fetched[SEGMENT].with_name(LOSS), size)
        return TokenFile(str(fetched[SEGMENT]), self.encoder.token_size)

    def _held(self, entry: CacheEntry, fetched: dict[str, Path], quarantine: bytes | None) -> Held | str:
        """What a fetched hit's segment holds, or how it and its ``quarantine`` disagree with its counts."""
        segment = self._segment(fetched, lambda: self._on_disk(fetched))
        if isinstance(segment, str):
            return segment
        try:
            held = Held.read(segment, plain=not self.save_loss)
        except TokenFileError as exc:
            return str(exc)
        return self._against(entry, held, quarantine) or held

    def _segment(self, names: Collection[str], segment: Callable[[], S]) -> S | str:
        """A hit's segment (its files ``names``, read as ``segment`` gives them), or what is wrong with them."""
        family = [SEGMENT, f"{SEGMENT}.index", f"{SEGMENT}.metadata"]
        if missing := [name for name in family if name not in names]:
            return f"it holds no {missing[0]}"
        try:
            return segment()
        except TokenFileError as exc:
            return str(exc)

    def _against(self, entry: CacheEntry, held: Held, quarantine: bytes | None) -> str | None:
        """How a hit's segment (``held``) and its ``quarantine`` disagree with its counts, or None."""
        lines = len(lines_of(quarantine or b""))
        return held.against(entry.counts, lines, self.encoder.vocab_size, self.encoder.policy.eos_id)

    def _hits(self, file: InputFile) -> HitCheck:
        """What the hits of ``file``'s source are held against, made at its first hit: it loads HF's tokenizer, to
        encode their samples (a rank that takes every file from the cache still builds no fast engine)."""
        reading = self._reading(file)
        if reading.source not in self._checks:
            self._checks[reading.source] = HitCheck(
                reading.options, reading.renderer, self._on_hf, self.save_loss, self.cache.owner
            )
        return self._checks[reading.source]

    @cached_property
    def _on_hf(self) -> Encoder:
        return self.encoder.on_hf()
