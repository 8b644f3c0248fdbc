"""Documents encoded exactly as the tokenize stage writes them (and as ``count`` counts them): ``Encoder`` composes
the tokenizer (``tokenizer_files``), the ids a run puts around each document (``encoding_policy``), the cutting of
long texts into pieces (``cutting``), the engine that encodes the pieces (``engines``) and loss bytes
(``loss_masks``).

Pieces are encoded in groups (``piece_groups``), without special tokens, and the post-processor's head (BOS) and
tail (EOS) are placed once per document by index arithmetic, for either engine. The special tokens that a chat
template writes are pieces of their own, one token each, placed the same way.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, TypeVar, cast

import numpy as np
from tokenizers import Tokenizer

from tokenization.formats.ds import token_dtype
from tokenization.records import TokenizerFacts, TokenizerInfo
from tokenization.storage.folder import StorageOptions
from tokenization.tokenizer import reused
from tokenization.tokenizer.cutting import Cutter, Piece, Ranges
from tokenization.tokenizer.engines import (
    ENGINES,
    CheckedEngine,
    Engine,
    EngineChoice,
    EngineMismatch,
    Group,
    HFEngine,
    chosen_engine,
)
from tokenization.tokenizer.fast_engine import DEFAULT_MEMORY_BUDGET_MB, FastEngine, MemoryBudget
from tokenization.tokenizer.framing import framed, joined, with_special_pieces
from tokenization.tokenizer.loading import TokenizerError, TokenizerFile, engine_panics
from tokenization.tokenizer.loss_masks import held_out
from tokenization.tokenizer.policy import SPECIAL_TEXT_POLICIES, EncodingPolicy, SpecialLiterals, SpecialTextPolicy

log = logging.getLogger(__name__)

NO_ENGINE = "none"  # the engine a stage names when it encoded no text
NO_ENGINE_NOTE = "no text was encoded: it all came from the tokenization cache, or there was none"
GROUP_CHARS = 1 << 18  # characters of pieces HF encodes at once, two pieces on two threads: 25-115 MB of Encodings
# Characters the fast engine encodes at once: it spreads a call's texts over the cores, which takes megabytes of
# them (Mistral-7B on 2 cores: 1.55 s for 42 MB in calls of 256 KiB, as on one core; 1.03 s by 1 MiB; 0.63 s by
# 4 MiB; 0.58 s in one call). Its ids cost 4 bytes a token: 4 MiB of text, ~4 MB of ids.
FAST_GROUP_CHARS = 1 << 22
T = TypeVar("T")


def available_threads() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def limit_hf_threads(threads: int | None) -> None:
    """Cap HF tokenizers' thread pool, which reads ``RAYON_NUM_THREADS`` once, when it first starts. The variable
    belongs to the whole process, so only a process's entry point calls this (the command line, a build's worker
    process, an Airflow task), before anything encodes; a library object never changes its process's environment."""
    if threads:
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


@dataclass
class Encoded:
    """A batch of encoded documents: flat token ids, per-document lengths and, when asked, loss bytes; with the
    special-token text it held, and how many of its pieces HF encoded again to check the engine."""

    tokens: np.ndarray
    lengths: np.ndarray
    loss: np.ndarray | None
    special_literals: Counter[str] = field(default_factory=Counter)
    self_checked: int = 0


class Prepared(NamedTuple):
    """A batch ready for the engine: its texts, no-loss ranges, pieces, the special-token text it holds, and the
    run's numbers of its first document and first piece (for messages, and the engine's sample)."""

    texts: list[str]
    no_loss: list[Ranges | None] | None
    pieces: list[Piece]
    literals: Counter[str]
    literal_docs: set[int]
    first_doc: int
    first_piece: int


class Part(NamedTuple):
    """A group of pieces encoded, its HF Encodings dropped: ids, lengths a piece, held-out tokens, pieces checked."""

    ids: np.ndarray
    lengths: np.ndarray
    held_out: np.ndarray | None
    checked: int


class Encoder:
    """Encodes documents exactly as the tokenize stage writes them (and as ``count`` counts them).

    Threads: the caller's thread, which prepares the batches and takes them encoded (``prepare``,
    ``count_checked``), owns the run's counters; ``encode_prepared`` may run on another, and changes nothing here."""

    def __init__(
        self,
        name_or_path: str,
        *,
        eos_token: str | None = None,
        special_text: SpecialTextPolicy = "text",
        engine: EngineChoice = "auto",
        threads: int | None = None,
        no_eos: bool = False,
        known: TokenizerFacts | None = None,
        memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB,
        storage_options: StorageOptions | None = None,
    ):
        """``known``: what loading this tokenizer with these settings told a build's plan (``facts``). When the
        file has those very bytes, HF's tokenizer is loaded only when a text is first encoded or cut.
        ``memory_budget_mb``: the resident memory the fast engine keeps its process within (``MemoryBudget``).
        ``storage_options``: what opens the tokenizer's URL."""
        if special_text not in SPECIAL_TEXT_POLICIES:
            raise TokenizerError(f"special-token policy must be one of {SPECIAL_TEXT_POLICIES}, got {special_text!r}")
        if engine not in ENGINES:
            raise TokenizerError(f"engine must be one of {ENGINES}, got {engine!r}")
        if threads is not None and threads < 1:
            raise TokenizerError(f"threads must be at least 1, got {threads}")
        if no_eos and eos_token is not None:
            raise TokenizerError(f"an EOS token ({eos_token!r}) and no EOS were both asked for: choose one")
        started = time.perf_counter()
        self.file = TokenizerFile.load(name_or_path, known, storage_options)
        self._planned = known is not None and known.sha256 == self.file.sha256  # a build's rank: ``reused``
        if known is not None and self._planned:
            self.policy = EncodingPolicy.known(known, special_text)
        else:
            self.policy = EncodingPolicy.choose(
                self.file, eos_token=eos_token, no_eos=no_eos, special_text=special_text
            )
        self.literals = SpecialLiterals.of(self.file.special_tokens)
        self._choice, self._threads = engine, threads or available_threads()
        self.budget = MemoryBudget(memory_budget_mb << 20)
        self._expected: int | None = None  # bytes of text to encode, about, when the caller knows (``expect``)
        self._engine: Engine | None = None
        self.engine_note: str | None = None
        self.checked_docs = 0  # pieces HF encoded again to check the engine, in the batches taken so far
        self._docs_prepared = 0  # the run's documents and pieces prepared so far: where the next batch starts
        self._pieces_prepared = 0
        self.tokenizer_held = False  # HF's tokenizer taken as this process held it, loaded by its plan or a rank
        self.load_seconds = round(time.perf_counter() - started, 3)  # reported apart from the work's rates

    @property
    def engine(self) -> Engine:
        """The engine, made when the first batch is prepared (on the caller's thread): a rank that takes every file
        from the tokenization cache never builds it (the fast engine's tables take a second or more). Its building
        counts as loading."""
        return self._made_engine()

    def _made_engine(self) -> Engine:
        if self._engine is None:
            hf = HFEngine(self.tokenizer)
            started = time.perf_counter()
            self._engine, self.engine_note = chosen_engine(
                self._choice, hf, self.file, self._threads, self.budget, self._expected
            )
            self._loaded(started)
        return self._engine

    def release(self) -> None:
        """Drop the fast engine's tokenizer and cache, their memory back to the system, unless the process holds
        little enough that the budget's room is left (``FastEngine.release``): a rank's pass 2 then has that room (a
        batch encoded after this loads it again)."""
        if (fast := self._fast) is not None:
            fast.release()

    def expect(self, text_bytes: int) -> None:
        """Say about how many bytes of text this encoder will encode, before it encodes any: under "auto", too few to
        be worth building the fast engine are encoded by HF (``engines.FAST_ENGINE_MIN_BYTES``)."""
        self._expected = text_bytes

    def expect_more(self, text_bytes: int) -> None:
        """Say that about ``text_bytes`` more will be encoded than expected (a cache hit found unfit, whose file is
        encoded after all), before the engine is made: the choice weighs them as a miss's."""
        if self._expected is not None:
            self._expected += text_bytes

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """HF's tokenizer, following the policy (its post-processor appends the EOS, its special-token text reads as
        the policy says), loaded when first used; loading counts as loading."""
        started = time.perf_counter()
        if self._planned:  # the one an earlier rank of this process loaded
            self.tokenizer_held = reused.held(self.file, self.policy)
            tokenizer = reused.policy_applied(self.file, self.policy)
        else:
            tokenizer = self.file.tokenizer
            self.policy.apply_to(tokenizer)
        self._loaded(started)
        return tokenizer

    @cached_property
    def cutter(self) -> Cutter:
        return Cutter(self.tokenizer, self.name)

    def _loaded(self, started: float) -> None:
        """Count what a lazy load took since ``started`` as loading, which the rates leave out."""
        self.load_seconds = round(self.load_seconds + time.perf_counter() - started, 3)

    def facts(self) -> TokenizerFacts:
        """What loading the tokenizer told, with this run's EOS settings: a build's plan hands it to its ranks."""
        p = self.policy
        return TokenizerFacts(
            sha256=self.sha256,
            vocab_size=self.vocab_size,
            special_tokens=self.special_tokens,
            eos_token=p.eos_token,
            eos_id=p.eos_id,
            eos_source=p.eos_source,
            bos_ids=p.bos_ids,
            tail_ids=p.tail_ids,
        )

    # What other modules read of the tokenizer and the policy.
    @property
    def name(self) -> str:
        return self.file.name

    @property
    def sha256(self) -> str:
        return self.file.sha256

    @property
    def vocab_size(self) -> int:
        return self.file.vocab_size

    @property
    def token_size(self) -> int:
        return self.file.token_size

    @property
    def special_tokens(self) -> list[str]:
        return self.file.special_tokens

    @property
    def eos_token(self) -> str | None:
        return self.policy.eos_token

    @property
    def eos_id(self) -> int | None:
        return self.policy.eos_id

    @property
    def bos_ids(self) -> list[int]:
        return self.policy.bos_ids

    def exactly(self, attempt: Callable[[], T]) -> T:
        """Run a pass over the documents; if the fast engine disagreed with HF on any, run it again on HF."""
        try:
            return attempt()
        except EngineMismatch as exc:
            self.fall_back(str(exc))
            return attempt()

    def fall_back(self, reason: str) -> None:
        """Encode with HF from now on, and say why in the log and the manifest."""
        log.warning("%s: falling back to HF tokenizers: %s", self.name, reason)
        self._engine, self.engine_note = HFEngine(self.tokenizer), f"fell back: {reason}"

    def on_hf(self) -> Encoder:
        """A copy of this encoder that encodes with HF alone and counts on its own, sharing the loaded tokenizer:
        the reference a cache hit's sample is encoded again with (``stages.tokenize.hits``). This one's engine stays
        unbuilt, and its counts and run numbers stay this run's."""
        engine = HFEngine(self.tokenizer)  # loaded here first, so that the copy holds it too
        reference = copy.copy(self)
        reference._engine, reference.engine_note = engine, None
        reference.checked_docs = reference._docs_prepared = reference._pieces_prepared = 0
        return reference

    def describe(self) -> TokenizerInfo:
        """The manifest's record of the tokenizer, the policy applied to it, and how it was encoded."""
        return TokenizerInfo(
            **self.file.describe(),
            **self.policy.describe(),
            engine=self._engine.name if self._engine else NO_ENGINE,
            engine_note=self.engine_note if self._engine else NO_ENGINE_NOTE,
            self_checked_docs=self.checked_docs,
            load_seconds=self.load_seconds,
            tokenizer_held=self.tokenizer_held or None,
            memory_budget_mb=self.budget.limit >> 20,
            engine_reloads=fast.reloads if (fast := self._fast) else 0,
            engine_reload_seconds=round(fast.reload_seconds, 3) if fast else 0.0,
        )

    @property
    def _fast(self) -> FastEngine | None:
        """The fast engine, when it is the one encoding."""
        return self._engine.fast if isinstance(self._engine, CheckedEngine) else None

    def special_split_problem(self) -> str | None:
        """Why a chat template's special tokens cannot be encoded apart from the text around them, or None."""
        return self.policy.special_split_problem(self.file, self.tokenizer)

    def encode(self, texts: list[str], no_loss: list[Ranges | None] | None = None) -> Encoded:
        """Encode a batch. With ``no_loss`` (one entry per text) loss bytes are computed: 0 for every token that
        overlaps a no-loss character range, 1 elsewhere; the document is never cropped and its EOS keeps loss."""
        return self.count_checked(self.encode_prepared(self.prepare(texts, no_loss)))

    def prepare(
        self, texts: list[str], no_loss: list[Ranges | None] | None = None, specials: list[Ranges | None] | None = None
    ) -> Prepared:
        """The Python half of encoding a batch: its special-token text counted, its long texts cut into pieces. It
        holds the GIL, so a pipeline runs it on another thread while the engine encodes the batch before.
        ``specials`` (one entry per text): the spans of special-token text that a chat template wrote, each
        encoded as its token whatever the policy, and not counted as special-token text of the documents."""
        self._made_engine()  # here, on the caller's thread, before a batch is encoded
        literals: Counter[str] = Counter()
        literal_docs: set[int] = set()
        pieces: list[Piece] = []
        as_special = self.policy.special_text == "special"
        for doc, text in enumerate(texts):
            spans = specials[doc] if specials else None
            # the template's own special tokens are no literals
            if self.literals.may_hold(text) and (found := self.literals.count(text, outside=spans)):
                literals.update(found)
                literal_docs.add(doc)
            if (as_special or not spans) and self.cutter.short(text):  # whole: no panic guard a document
                pieces.append(Piece(doc, 0, len(text)))
            else:
                pieces += self._document_pieces(doc, text, spans)
        batch = Prepared(texts, no_loss, pieces, literals, literal_docs, self._docs_prepared, self._pieces_prepared)
        self._docs_prepared += len(texts)
        self._pieces_prepared += len(pieces)
        return batch

    def _document_pieces(self, doc: int, text: str, specials: Ranges | None) -> list[Piece]:
        """The text's pieces: under the "text" policy, the template's special tokens apart, as HF reads them when
        it recognizes special tokens (``special_split_problem`` checks that this holds for the tokenizer). Under
        "special", the text is encoded whole, which reads them as special tokens already."""
        with engine_panics(self.name, f"cutting document {self._docs_prepared + doc} of this run"):
            if not specials or self.policy.special_text == "special":
                return self.cutter.pieces(doc, text)
            return self.cutter.pieces_around(doc, text, specials)

    def encode_prepared(self, batch: Prepared) -> Encoded:
        """Encode a prepared batch: its pieces by the engine (its special-token pieces apart), then each document
        framed by its BOS and EOS."""
        texts, no_loss, pieces = batch.texts, batch.no_loss, batch.pieces
        text_pieces = [piece for piece in pieces if piece.token is None]
        groups = piece_groups(text_pieces, self._by_hf(batch))
        parts = [self._encode_group(batch, text_pieces, group) for group in groups]
        top = max((int(part.ids.max()) for part in parts if len(part.ids)), default=-1)
        if top >= self.vocab_size:  # checked before the ids take the file's width, which would wrap them
            raise TokenizerError(f"{self.name}: token id {top} is outside the vocabulary")
        body = joined([part.ids for part in parts], token_dtype(self.token_size))  # 2 bytes a token where they fit
        piece_lengths = joined([part.lengths for part in parts], np.int64)
        # with no_loss, every part holds its held-out tokens (``_encode_group``)
        held = None if no_loss is None else joined(cast("list[np.ndarray]", [part.held_out for part in parts]), bool)
        checked = sum(part.checked for part in parts)
        del parts  # their ids are in ``body``: a huge document's tokens are held twice at most (framed), not thrice
        if len(text_pieces) < len(pieces):
            body, piece_lengths, held = with_special_pieces(pieces, body, piece_lengths, held, no_loss)
        body_lengths = np.zeros(len(texts), dtype=np.int64)
        np.add.at(body_lengths, [piece.doc for piece in pieces], piece_lengths)
        head, tail = self.policy.bos_ids, self.policy.tail_ids
        tokens = framed(body, body_lengths, head, tail)
        loss = None
        if held is not None:  # the head and tail keep their loss
            loss = framed((~held).view(np.uint8), body_lengths, [1] * len(head), [1] * len(tail))
        lengths = body_lengths + len(head) + len(tail)
        return Encoded(tokens, lengths, loss, batch.literals, checked)

    def _by_hf(self, batch: Prepared) -> Callable[[Piece], bool]:
        """Whether HF encodes a piece whole (its Encoding held until the group's ids are out): every piece with HF
        as the engine; with the fast one, those that need offsets, and those that may hold special-token text
        read as text."""
        if isinstance(self.engine, HFEngine):
            return lambda piece: True
        as_text = self.policy.special_text == "text"
        no_loss = batch.no_loss
        return lambda piece: bool(no_loss and no_loss[piece.doc]) or (as_text and piece.doc in batch.literal_docs)

    def _encode_group(self, batch: Prepared, pieces: list[Piece], group: range) -> Part:
        """The group's ids, lengths and, with no-loss ranges, which tokens carry none. HF gives the Encodings of
        the pieces that need offsets and, under the "text" policy, the ids of those holding special-token text;
        the Encodings are dropped here, once their ids and masks are out."""
        members = [pieces[k] for k in group]
        texts = [batch.texts[p.doc][p.start : p.end] for p in members]
        offsets = {j for j, p in enumerate(members) if batch.no_loss is not None and batch.no_loss[p.doc]}
        hf_ids: set[int] = set()
        if self.policy.special_text == "text":  # special-token text read as text, which the fast engine cannot
            candidates = [j for j, p in enumerate(members) if p.doc in batch.literal_docs]
            hf_ids = {j for j in candidates if self.literals.held_in(texts[j])}

        def where(j: int) -> str:
            return piece_name(batch, members[j])

        with engine_panics(self.name, f"encoding {documents_named(batch, members)}"):
            encoded = self.engine.encode(Group(texts, offsets, hf_ids, batch.first_piece + group.start, where))
        held = None if batch.no_loss is None else held_out(encoded.lengths, encoded.encodings, members, batch.no_loss)
        return Part(encoded.ids, encoded.lengths, held, encoded.checked)

    def count_checked(self, encoded: Encoded) -> Encoded:
        """Count the batch's self-checked pieces; only the thread that takes the encoded batches calls this."""
        self.checked_docs += encoded.self_checked
        return encoded


def documents_named(batch: Prepared, pieces: list[Piece]) -> str:
    """The documents of a group of pieces (at least one), as a message names them: by their numbers in the run."""
    first, last = batch.first_doc + pieces[0].doc, batch.first_doc + pieces[-1].doc
    return f"document {first} of this run" if first == last else f"documents {first}-{last} of this run"


def piece_name(batch: Prepared, piece: Piece) -> str:
    """A piece as a message names it: its document's number in the run and, for part of one, its characters."""
    whole = piece.end - piece.start == len(batch.texts[piece.doc])
    part = "" if whole else f" (characters {piece.start}-{piece.end})"
    return f"document {batch.first_doc + piece.doc} of this run{part}"


def piece_groups(pieces: list[Piece], by_hf: Callable[[Piece], bool]) -> Iterator[range]:
    """Runs of consecutive pieces (at least one each) of about ``GROUP_CHARS`` characters that HF encodes whole
    (``by_hf``), and ``FAST_GROUP_CHARS`` in all."""
    begin, size, hf_size = 0, 0, 0
    for k, piece in enumerate(pieces):
        chars = piece.end - piece.start
        size += chars
        hf_size += chars if by_hf(piece) else 0
        if hf_size >= GROUP_CHARS or size >= FAST_GROUP_CHARS:
            yield range(begin, k + 1)
            begin, size, hf_size = k + 1, 0, 0
    if begin < len(pieces):
        yield range(begin, len(pieces))
