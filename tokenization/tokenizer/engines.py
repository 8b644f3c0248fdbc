"""Engines: what turns a group of pieces of text into the tokenizer's ids, without BOS or EOS.

Tokenizers are encoded by the fast engine (``fast_engine``) when it loads them, checked (``CheckedEngine``): its
ids must be HF's, so every run re-encodes a sample of its pieces with HF (one in ``CHECK_EVERY``, from the first,
and every piece that needs loss offsets) and raises ``EngineMismatch`` on any difference, so that the stage can
start over on HF (``Encoder.exactly``). Under the "text" policy, pieces that hold special-token text are encoded by
HF alone, as the fast engine always reads that text as the special token. Other tokenizers, and runs that ask for
it, are encoded by HF alone (``HFEngine``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import chain
from typing import ClassVar, Literal, NamedTuple, Protocol

import numpy as np
from tokenizers import Encoding, Tokenizer

from tokenization.tokenizer.fast_engine import FastEngine, MemoryBudget, Unsupported
from tokenization.tokenizer.loading import TokenizerFile

log = logging.getLogger(__name__)

EngineChoice = Literal["auto", "hf"]
ENGINES: tuple[str, ...] = ("auto", "hf")
CHECK_EVERY = 1024  # one piece in 1024 is encoded again by HF, on a few cores at ~1 MB/s: ~5% on top of the engine
# Bytes of text below which "auto" encodes with HF when told about how many there are (a rank that takes most of
# its files from the tokenization cache). In a rank's worker building the fast engine (no awkward imported since
# issue 53) costs 0.16 s of CPU (GPT-2) to 0.7 s (Llama 3), then ~0.03 s a MB; HF encodes 2.2-2.8 MB of text a CPU
# second. So HF is sooner below 0.35-1.9 MB of text: 1 MiB costs either at most ~0.3 s more than the other. (At
# 2 MiB of input bytes, counted compressed, a next night's rank of two changed 0.5 MB gzip files, 3.5 MB of text,
# encoded them on HF: 1.7 s of CPU, where the first night's fast engine took 0.03-0.09 s a file.)
FAST_ENGINE_MIN_BYTES = 1 << 20
# A group of fewer characters is encoded by HF alone: the fast engine's fixed cost a call (~1-3 ms, its thread and
# its output) is what HF takes for a few kB, and ranks of many one-line files make a call a file.
HF_GROUP_CHARS = 4096


class EngineMismatch(RuntimeError):
    """The fast engine gave other ids than HF for a document: the run must start over on HF."""


class Group(NamedTuple):
    """Pieces that an engine encodes at once, named by their index in ``texts``."""

    texts: list[str]
    offsets: set[int]  # pieces whose tokens' characters make loss masks: HF's Encodings of them are returned
    hf_ids: set[int]  # pieces whose ids must be HF's: special-token text read as text, which the fast engine cannot
    first: int  # the run's index of the first piece: the checked engine checks those at multiples of CHECK_EVERY
    where: Callable[[int], str]  # how a message names a piece: its document in the run, and its characters


class GroupIds(NamedTuple):
    """A group encoded: its ids end to end (uint32), how many each piece has, HF's Encodings of (at least) the
    pieces in ``offsets``, and how many pieces HF encoded again to check the engine."""

    ids: np.ndarray
    lengths: np.ndarray
    encodings: dict[int, Encoding]
    checked: int


class Engine(Protocol):
    """Encodes groups of pieces. It may keep caches, but no count that another thread reads: what it checked is
    in what it returns."""

    name: ClassVar[str]  # as the manifest names it

    def encode(self, group: Group) -> GroupIds: ...


@dataclass(frozen=True)
class HFEngine:
    """HF tokenizers: every piece's ids and Encoding."""

    tokenizer: Tokenizer
    name: ClassVar[str] = "hf"

    def encode(self, group: Group) -> GroupIds:
        encodings = self.encodings(group.texts, range(len(group.texts)), offsets=bool(group.offsets))
        ids, lengths = flat_ids([e.ids for e in encodings.values()])
        return GroupIds(ids, lengths, encodings, 0)

    def encodings(self, texts: list[str], which: Iterable[int], *, offsets: bool) -> dict[int, Encoding]:
        """The Encodings of the texts ``which``, by index; with ``offsets``, the slower call that keeps their
        tokens' characters. The Encodings are dropped once their ids are out: they hold ~150 bytes a token."""
        encode = self.tokenizer.encode_batch if offsets else self.tokenizer.encode_batch_fast
        chosen = list(which)
        return dict(zip(chosen, encode([texts[j] for j in chosen], add_special_tokens=False), strict=True))


@dataclass(frozen=True)
class CheckedEngine:
    """The fast engine, its ids compared with the ``reference`` engine's on a sample of the pieces, on every
    piece that needs offsets (HF encodes those anyway), and replaced by them where they must be HF's."""

    fast: FastEngine
    reference: HFEngine
    name: ClassVar[str] = "gigatoken"

    def encode(self, group: Group) -> GroupIds:
        if sum(map(len, group.texts)) < HF_GROUP_CHARS:
            return self.reference.encode(group)
        sampled = [
            j
            for j in range(len(group.texts))
            if j in group.hf_ids or j in group.offsets or (group.first + j) % CHECK_EVERY == 0
        ]
        ids, lengths, encodings = self._both(group, sampled)
        starts = np.cumsum(lengths) - lengths
        checked = [j for j in sampled if j not in group.hf_ids]
        for j in checked:
            compare(ids[starts[j] : starts[j] + lengths[j]], encodings[j].ids, group.where(j))
        if group.hf_ids:
            ids, lengths = replaced(ids, lengths, {j: encodings[j].ids for j in group.hf_ids})
        return GroupIds(ids, lengths, encodings, len(checked))

    def _both(self, group: Group, sampled: list[int]) -> tuple[np.ndarray, np.ndarray, dict[int, Encoding]]:
        """The fast engine's ids of the group and HF's Encodings of the ``sampled`` pieces, HF's on a thread of its
        own meanwhile: both release the GIL, and one sampled piece (up to ``cutting.PIECE_CHARS``, the run's first
        among them) took HF ~0.1 s, which the first batch otherwise waited for before the fast engine began."""
        if not sampled:
            return *self.fast.encode(group.texts), {}
        beside = ThreadPoolExecutor(1, thread_name_prefix="reference")  # one a call: a fork leaves none to reuse
        try:
            reference = beside.submit(self.reference.encodings, group.texts, sampled, offsets=bool(group.offsets))
            try:
                ids, lengths = self.fast.encode(group.texts)
            except BaseException:
                wait([reference])  # ended here, not while the caller goes on; the fast engine's error is raised
                raise
            return ids, lengths, reference.result()
        finally:
            beside.shutdown(wait=False)


def chosen_engine(
    choice: EngineChoice,
    hf: HFEngine,
    file: TokenizerFile,
    threads: int,
    budget: MemoryBudget,
    expected: int | None = None,
) -> tuple[Engine, str | None]:
    """The engine to encode ``file`` with (``hf``: HF's, which checks the fast one, and whose own cache is bounded:
    10,000 words), and why it is not the fast one (None when it is), keeping its process within ``budget``.
    ``expected``: about how many bytes of text there are to encode, when known."""
    if choice == "hf":
        return hf, "asked for HF"
    if expected is not None and expected < FAST_ENGINE_MIN_BYTES:
        return hf, f"~{expected:,} bytes of text to encode, which HF encodes sooner than the fast engine is built"
    try:
        return CheckedEngine(FastEngine(file.data, threads, budget), hf), None
    except Unsupported as exc:
        note = f"fast engine declined: {exc}"
        log.info("%s: encoding with HF tokenizers (%s)", file.name, note)
        return hf, note


def compare(fast: np.ndarray, reference: list[int], where: str) -> None:
    """Raise ``EngineMismatch`` unless the fast engine's ids of a piece are HF's."""
    if len(fast) != len(reference) or not np.array_equal(fast, reference):
        differ = np.flatnonzero(fast[: len(reference)] != np.asarray(reference[: len(fast)], dtype=np.int64))
        at = int(differ[0]) if len(differ) else min(len(fast), len(reference))
        raise EngineMismatch(
            f"{where}: the fast engine and HF differ at token {at} ({len(fast)} vs {len(reference)} tokens)"
        )


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids as one flat uint32 array (the fast engine's type: 4 bytes a token), and how many each has."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum())), lengths


def replaced(ids: np.ndarray, lengths: np.ndarray, by_index: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``ids`` cut by ``lengths`` (at least one run), with the runs of the given indices replaced by others."""
    runs = np.split(ids, np.cumsum(lengths)[:-1])
    for j, other in by_index.items():
        runs[j] = np.asarray(other, dtype=ids.dtype)
    return np.concatenate(runs), np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))
