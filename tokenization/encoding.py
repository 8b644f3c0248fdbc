"""Tokenizer loading and the encoding policy: EOS, BOS, literal special-token text, loss masks, engine, and the
pieces that bound the memory a long document needs.

The EOS is appended by the tokenizer's post-processor, as datatrove does, but a BOS that the tokenizer's own
post-processor adds is kept (datatrove drops it: huggingface/datatrove#345). Unless told otherwise, the EOS is the
tokenizer's own end-of-text token (``Encoder._own_eos`` says where it is looked for).

Tokenizers are encoded by the fast engine (``fast_engine``) when it loads them. Its ids must be HF's: every run
re-encodes a sample of its pieces with HF (one in ``CHECK_EVERY``, from the first, and every piece that needs loss
offsets) and raises ``EngineMismatch`` on any difference, so that the stage can start over on HF. Under the "text"
policy, pieces that hold special-token text are encoded by HF alone, as the fast engine always reads that text as
the special token.

HF holds ~100 bytes for every character it encodes (an ``Encoding`` keeps strings and offsets for each token,
a normalized string keeps alignments for each byte): one 50 MB document would need 5 GB. A text longer than
``PIECE_CHARS`` is therefore cut into pieces, at single spaces between letters where HF confirms, on a window
around the cut, that the two sides encode to exactly the ids (and character spans) of the whole; pieces are
encoded in groups of ``GROUP_CHARS``, without special tokens, and the post-processor's head (BOS) and tail (EOS)
are placed once per document by index arithmetic, for either engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, islice
from typing import Literal, NamedTuple, TypeVar

import fsspec
import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenization.fast_engine import FastEngine, Unsupported
from tokenization.formats.ds import token_size_for_vocab
from tokenization.storage import is_local, open_fs

log = logging.getLogger(__name__)

SpecialTextPolicy = Literal["text", "special"]
SPECIAL_TEXT_POLICIES: tuple[str, ...] = ("text", "special")
EngineChoice = Literal["auto", "hf"]
ENGINES: tuple[str, ...] = ("auto", "hf")
CHECK_EVERY = 1024  # one piece in 1024 is encoded again by HF, on a few cores at ~1 MB/s: ~5% on top of the engine
# Well-known end-of-text tokens, in order of preference (GPT-2 and many others, Llama-3, SentencePiece, Gemma,
# DeepSeek, Phi-3): a tokenizer that holds both <|endoftext|> and </s> ends documents with <|endoftext|>.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>", "<|end|>")
EOS_ORIGINS = {  # how a message names the place where the tokenizer's own EOS was found
    "tokenizer_config.json": "tokenizer_config.json",
    "post-processor": "its post-processor",
    "vocabulary": "its vocabulary",
}
PIECE_CHARS = 1 << 18  # a longer text is cut into pieces of about this size; HF holds ~100 bytes a character
GROUP_CHARS = 1 << 20  # characters of pieces HF encodes at once: ~100 MB of Encodings, dropped once the ids are out
CUT_SEARCH_CHARS = 1 << 14  # how far past its target a cut is looked for; a regex scan, ~0.1 ms
CUT_TRIES = 8  # candidate cuts HF checks at most per target, each three encodes of <= 2 * WINDOW_CHARS characters
WINDOW_CHARS = 512  # characters on each side of a candidate cut that HF encodes to confirm it
CUT = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")  # a single space between two letters
CUT_PROBE = "The quick brown fox jumps over the lazy dog, said Ada to her old friend Charles."
T = TypeVar("T")
Ranges = list[tuple[int, int]]  # [start, end) character ranges of a document


def available_threads() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def limit_hf_threads(threads: int | None) -> None:
    """Cap HF tokenizers' thread pool, which reads ``RAYON_NUM_THREADS`` once, when it first starts. The variable
    belongs to the whole process, so only a process's entry point calls this (the command line, a build's worker
    process, an Airflow task), before anything encodes; a library object never changes its process's environment."""
    if threads:
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded or does not fit the requested policy."""


class EngineMismatch(RuntimeError):
    """The fast engine gave other ids than HF for a document: the run must start over on HF."""


def tokenizer_location(name_or_path: str) -> tuple[fsspec.AbstractFileSystem, str] | None:
    """Where the ``tokenizer.json`` of a file, a folder holding one, or any fsspec URL is; None for a HuggingFace
    hub name."""
    fs, path = open_fs(name_or_path)
    if is_local(fs) and not os.path.exists(path):
        if name_or_path.endswith(".json") or name_or_path.startswith(("/", ".", "~")):
            raise TokenizerError(f"{name_or_path}: no such tokenizer file")
        return None
    if fs.isdir(path):
        path = path.rstrip("/") + "/tokenizer.json"
    return fs, path


def load_tokenizer_bytes(name_or_path: str) -> tuple[Tokenizer, bytes]:
    """A tokenizer and its serialized form, from a ``tokenizer.json`` file, a folder holding one, or any fsspec
    URL. Anything else is taken as a HuggingFace hub name, which needs network access."""
    location = tokenizer_location(name_or_path)
    if location is None:
        try:
            tokenizer = Tokenizer.from_pretrained(name_or_path)
        except Exception as exc:
            raise TokenizerError(
                f"{name_or_path}: not a local tokenizer file and could not be loaded from the HuggingFace hub ({exc})"
            ) from exc
        return tokenizer, tokenizer.to_str().encode("utf-8")
    fs, path = location
    try:
        data = fs.cat_file(path)
    except FileNotFoundError as exc:
        raise TokenizerError(f"{name_or_path}: no tokenizer.json found") from exc
    try:
        return Tokenizer.from_str(data.decode("utf-8")), data
    except Exception as exc:
        raise TokenizerError(f"{name_or_path}: not a tokenizers JSON file ({exc})") from exc


def configured_eos(name_or_path: str) -> str | None:
    """The ``eos_token`` named by a ``tokenizer_config.json`` beside the tokenizer (a string or a dict with
    ``content``), or None. A hub name has none: reading its config would need the network."""
    location = tokenizer_location(name_or_path)
    if location is None:
        return None
    fs, path = location
    config_path = posixpath.join(posixpath.dirname(path), "tokenizer_config.json")
    try:
        config = json.loads(fs.cat_file(config_path))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TokenizerError(f"{config_path}: not a JSON file ({exc})") from exc
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


@dataclass
class Encoded:
    """A batch of encoded documents: flat token ids, per-document lengths and, when asked, loss bytes."""

    tokens: np.ndarray
    lengths: np.ndarray
    loss: np.ndarray | None
    special_literals: Counter = field(default_factory=Counter)


class Piece(NamedTuple):
    """Characters ``[start, end)`` of document ``doc`` of a batch, encoded on their own. ``dropped_space``: the
    space just before ``start`` was left out of the text, and belongs to the first token."""

    doc: int
    start: int
    end: int
    dropped_space: bool = False


class Prepared(NamedTuple):
    """A batch ready for the engine: its texts, no-loss ranges, pieces, and the special-token text it holds."""

    texts: list[str]
    no_loss: list[Ranges | None] | None
    pieces: list[Piece]
    literals: Counter
    literal_docs: set[int]


class Encoder:
    """Encodes documents exactly as the tokenize stage writes them (and as ``count`` counts them)."""

    def __init__(
        self,
        name_or_path: str,
        eos_token: str | None = None,
        special_text: SpecialTextPolicy = "text",
        engine: EngineChoice = "auto",
        threads: int | None = None,
        *,
        no_eos: bool = False,
    ):
        if special_text not in SPECIAL_TEXT_POLICIES:
            raise TokenizerError(f"special-token policy must be one of {SPECIAL_TEXT_POLICIES}, got {special_text!r}")
        if engine not in ENGINES:
            raise TokenizerError(f"engine must be one of {ENGINES}, got {engine!r}")
        if threads is not None and threads < 1:
            raise TokenizerError(f"threads must be at least 1, got {threads}")
        if no_eos and eos_token is not None:
            raise TokenizerError(f"an EOS token ({eos_token!r}) and no EOS were both asked for: choose one")
        started = time.perf_counter()
        self.name = name_or_path
        self.threads = threads or available_threads()
        self.tokenizer, data = load_tokenizer_bytes(name_or_path)
        self.tokenizer.no_truncation()  # a document is never cropped, nor padded
        self.tokenizer.no_padding()
        self.engine = "hf"
        self.engine_note = "asked for HF" if engine == "hf" else None
        self._fast: FastEngine | None = None
        self.checked_docs = 0
        self._docs_seen = 0
        self._pieces_seen = 0
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.token_size = token_size_for_vocab(self.vocab_size)
        self.special_text = special_text
        added = json.loads(data).get("added_tokens") or []
        specials = {t["content"] for t in added if t.get("special")}
        self.special_tokens = sorted(specials, key=lambda t: (-len(t), t))  # longest first, for the literal regex
        self.bos_ids, appended = self._special_ids_around()
        self.eos_token, self.eos_source = (None, None) if no_eos else self._choose_eos(eos_token, appended)
        self.eos_id = None if self.eos_token is None else self.tokenizer.token_to_id(self.eos_token)
        self.tail_ids = appended  # what the post-processor appends: the EOS, when there is one
        if self.eos_id is not None:
            self._append_eos(self.eos_token, self.eos_id)
            self.tail_ids = [self.eos_id]
        self.tokenizer.encode_special_tokens = special_text == "text"
        self._literal_re = re.compile("|".join(map(re.escape, self.special_tokens))) if self.special_tokens else None
        self._literal_prefixes = tuple({t[:2] for t in self.special_tokens})
        if engine == "auto":
            self._choose_engine(data)
        self.load_seconds = round(time.perf_counter() - started, 3)  # reported apart from the work's rates

    def _choose_engine(self, data: bytes) -> None:
        try:
            self._fast = FastEngine(data, self.threads)
            self.engine, self.engine_note = "gigatoken", None
        except Unsupported as exc:
            self.engine_note = f"fast engine declined: {exc}"
            log.info("%s: encoding with HF tokenizers (%s)", self.name, self.engine_note)

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
        self._fast, self.engine, self.engine_note = None, "hf", f"fell back: {reason}"

    def _special_ids_around(self) -> tuple[list[int], list[int]]:
        """The ids that the tokenizer's own post-processor puts before a document (its BOS, if any) and after it."""
        probe = "a"
        with_specials = self.tokenizer.encode(probe, add_special_tokens=True).ids
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        for k in range(len(with_specials) - len(plain) + 1):
            if with_specials[k : k + len(plain)] == plain:
                return with_specials[:k], with_specials[k + len(plain) :]
        raise TokenizerError(f"{self.name}: its post-processor changes the text's ids, not only the ends")

    def _choose_eos(self, eos_token: str | None, appended: list[int]) -> tuple[str, str]:
        """The EOS to append and where it came from: the parameter, or else the tokenizer's own."""
        if eos_token is not None:
            if self.tokenizer.token_to_id(eos_token) is None:
                raise TokenizerError(self._unknown_eos(eos_token, appended))
            return eos_token, "param"
        own = self._own_eos(appended)
        if own is None:
            raise TokenizerError(
                f"{self.name}: no end-of-text token found (no tokenizer_config.json beside it names one, its "
                f"post-processor appends none, and its vocabulary holds none of {', '.join(EOS_CANDIDATES)}): "
                "pass --eos-token TOKEN, or --no-eos to write documents without a separator"
            )
        return own

    def _own_eos(self, appended: list[int]) -> tuple[str, str] | None:
        """The tokenizer's own end-of-text token and where it was found: the ``tokenizer_config.json`` beside it,
        else the last special token its post-processor appends, else the first of ``EOS_CANDIDATES`` it holds."""
        configured = configured_eos(self.name)
        if configured is not None and self.tokenizer.token_to_id(configured) is not None:
            return configured, "tokenizer_config.json"
        if configured is not None:
            log.warning("%s: tokenizer_config.json names EOS %r, which is not in the vocabulary", self.name, configured)
        if appended:
            return self.tokenizer.id_to_token(appended[-1]), "post-processor"
        known = next((t for t in EOS_CANDIDATES if self.tokenizer.token_to_id(t) is not None), None)
        return None if known is None else (known, "vocabulary")

    def _unknown_eos(self, eos_token: str, appended: list[int]) -> str:
        """Why ``eos_token`` cannot be used, and what can: the tokenizer's own EOS, or else a few special tokens."""
        message = f"EOS token {eos_token!r} is not in the vocabulary of {self.name}"
        own = self._own_eos(appended)
        if own is None:
            return f"{message} (special tokens: {', '.join(self.special_tokens[:8]) or 'none'})"
        token, source = own
        origin = EOS_ORIGINS[source]
        return f"{message}; its own end-of-text token is {token!r} (from {origin}): leave the EOS unset to use it"

    def _append_eos(self, eos_token: str, eos_id: int) -> None:
        bos = [(self.tokenizer.id_to_token(i), i) for i in self.bos_ids]
        template = " ".join([*(t for t, _ in bos), "$A", eos_token])
        self.tokenizer.post_processor = TemplateProcessing(
            single=template, special_tokens=list(dict.fromkeys([*bos, (eos_token, eos_id)])), pair=None
        )

    def describe(self) -> dict:
        """The manifest's record of the tokenizer and the policy applied to it."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "token_size": self.token_size,
            "eos_token": self.eos_token,
            "eos_id": self.eos_id,
            "eos_source": self.eos_source,
            "bos_ids": self.bos_ids,
            "special_text": self.special_text,
            "engine": self.engine,
            "engine_note": self.engine_note,
            "self_checked_docs": self.checked_docs,
            "load_seconds": self.load_seconds,
        }

    def count_special_literals(self, text: str) -> Counter:
        if self._literal_re is None or not any(p in text for p in self._literal_prefixes):
            return Counter()
        return Counter(self._literal_re.findall(text))

    def encode(self, texts: list[str], no_loss: list[Ranges | None] | None = None) -> Encoded:
        """Encode a batch. With ``no_loss`` (one entry per text) loss bytes are computed: 0 for every token that
        overlaps a no-loss character range, 1 elsewhere; the document is never cropped and its EOS keeps loss."""
        return self.encode_prepared(self.prepare(texts, no_loss))

    def prepare(self, texts: list[str], no_loss: list[Ranges | None] | None = None) -> Prepared:
        """The Python half of encoding a batch: its special-token text counted, its long texts cut into pieces. It
        holds the GIL, so a pipeline runs it on another thread while the engine encodes the batch before."""
        literals: Counter = Counter()
        literal_docs: set[int] = set()
        for doc, text in enumerate(texts):
            found = self.count_special_literals(text)
            if found:
                literals.update(found)
                literal_docs.add(doc)
        pieces = [piece for doc, text in enumerate(texts) for piece in self._pieces(doc, text)]
        return Prepared(texts, no_loss, pieces, literals, literal_docs)

    def encode_prepared(self, batch: Prepared) -> Encoded:
        """Encode a prepared batch: its pieces by the engine, then each document framed by its BOS and EOS."""
        texts, no_loss, pieces, literal_docs = batch.texts, batch.no_loss, batch.pieces, batch.literal_docs
        parts = [self._encode_group(texts, pieces, group, no_loss, literal_docs) for group in piece_groups(pieces)]
        body = joined([ids for ids, _, _ in parts], np.int64)
        body_lengths = np.zeros(len(texts), dtype=np.int64)
        np.add.at(body_lengths, [piece.doc for piece in pieces], joined([n for _, n, _ in parts], np.int64))
        self._pieces_seen += len(pieces)
        self._docs_seen += len(texts)
        if len(body) and int(body.max()) >= self.vocab_size:
            raise TokenizerError(f"{self.name}: token id {int(body.max())} is outside the vocabulary")
        tokens = framed(body, body_lengths, self.bos_ids, self.tail_ids)
        loss = None
        if no_loss is not None:  # the head and tail keep their loss
            kept = ~joined([held_out for _, _, held_out in parts], bool)
            loss = framed(kept.view(np.uint8), body_lengths, [1] * len(self.bos_ids), [1] * len(self.tail_ids))
        lengths = body_lengths + len(self.bos_ids) + len(self.tail_ids)
        return Encoded(tokens, lengths, loss, batch.literals)

    def _encode_group(
        self,
        texts: list[str],
        pieces: list[Piece],
        group: range,
        no_loss: list[Ranges | None] | None,
        literal_docs: set[int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The group's ids (flat), its pieces' lengths and, with ``no_loss``, which tokens carry none. HF encodes
        every piece on its engine; else it encodes the fast engine's sampled pieces, every piece that needs offsets
        and, under the "text" policy, every piece holding special-token text, whose ids are then HF's. The
        Encodings are dropped here, once their ids are out."""
        strings = [texts[pieces[k].doc][pieces[k].start : pieces[k].end] for k in group]
        needs_spans = [no_loss is not None and bool(no_loss[pieces[k].doc]) for k in group]
        by_hf = set(range(len(group)))
        if self._fast is not None:
            held = [j for j, k in enumerate(group) if pieces[k].doc in literal_docs]
            by_hf = {j for j in held if self._holds_literal(strings[j])}
        reference = [
            j for j, k in enumerate(group) if j in by_hf or needs_spans[j] or (self._pieces_seen + k) % CHECK_EVERY == 0
        ]
        encode = self.tokenizer.encode_batch if any(needs_spans) else self.tokenizer.encode_batch_fast
        encodings = dict(zip(reference, encode([strings[j] for j in reference], add_special_tokens=False), strict=True))
        if self._fast is None:
            ids, lengths = flat_ids([e.ids for e in encodings.values()])
        else:
            ids, lengths = self._fast.encode(strings)
            starts = np.cumsum(lengths) - lengths
            checked = [j for j in reference if j not in by_hf]
            for j in checked:
                self._compare(texts, pieces[group[j]], ids[starts[j] : starts[j] + lengths[j]], encodings[j].ids)
            self.checked_docs += len(checked)
            if by_hf:
                ids, lengths = replaced(ids, lengths, {j: encodings[j].ids for j in by_hf})
        if no_loss is None:
            return ids, lengths, None
        starts = np.cumsum(lengths) - lengths
        held_out = np.zeros(len(ids), dtype=bool)
        for j, encoding in encodings.items():
            if needs_spans[j]:
                piece = pieces[group[j]]
                held_out[starts[j] : starts[j] + lengths[j]] = no_loss_mask(encoding, piece, no_loss[piece.doc])
        return ids, lengths, held_out

    def _holds_literal(self, text: str) -> bool:
        """Whether the text holds special-token text that the "text" policy encodes as plain text."""
        return self.special_text == "text" and self._literal_re is not None and bool(self._literal_re.search(text))

    def _compare(self, texts: list[str], piece: Piece, fast: np.ndarray, reference: list[int]) -> None:
        if len(fast) != len(reference) or not np.array_equal(fast, reference):
            differ = np.flatnonzero(fast[: len(reference)] != np.asarray(reference[: len(fast)], dtype=np.int64))
            at = int(differ[0]) if len(differ) else min(len(fast), len(reference))
            whole = piece.end - piece.start == len(texts[piece.doc])
            part = "" if whole else f" (characters {piece.start}-{piece.end})"
            raise EngineMismatch(
                f"document {self._docs_seen + piece.doc} of this run{part}: the fast engine and HF differ at token "
                f"{at} ({len(fast)} vs {len(reference)} tokens)"
            )

    def _pieces(self, doc: int, text: str) -> list[Piece]:
        """The text as pieces of about ``PIECE_CHARS`` characters: one when it is short or cannot be cut."""
        skip = self._continuation if len(text) > PIECE_CHARS else None
        if skip is None:
            return [Piece(doc, 0, len(text))]
        cuts = self._cuts(text, skip)  # a cut is the index of a space
        ends = [*cuts, len(text)]
        rest = [Piece(doc, cut + skip, end, skip == 1) for cut, end in zip(cuts, ends[1:], strict=True)]
        return [Piece(doc, 0, ends[0]), *rest]

    @cached_property
    def _continuation(self) -> int | None:
        """How the piece after a cut begins: 0, with its space (byte-level BPE, where " world" is one pre-token),
        or 1, without it (normalizers that prepend "▁", as SentencePiece does: "world" becomes "▁world", which is
        what the whole text holds). None when neither reproduces the probe: long texts are then encoded whole."""
        cuts = [match.start() for match in CUT.finditer(CUT_PROBE)]
        for skip in (0, 1):
            if all(self._splits_exactly(CUT_PROBE, cut, skip) for cut in cuts):
                return skip
        log.warning("%s: no exact way to cut long documents into pieces: each is encoded whole", self.name)
        return None

    def _cuts(self, text: str, skip: int) -> list[int]:
        """Where to cut a long text: spaces about ``PIECE_CHARS`` apart at which HF splits it exactly."""
        cuts: list[int] = []
        target = PIECE_CHARS
        while target < len(text):
            cut = self._cut_near(text, target, skip)
            if cut is None:  # no exact cut close by: this piece grows
                target += PIECE_CHARS
            else:
                cuts.append(cut)
                target = cut + PIECE_CHARS
        return cuts

    def _cut_near(self, text: str, target: int, skip: int) -> int | None:
        """The first candidate cut at or after ``target`` that HF confirms on a window around it."""
        for match in islice(CUT.finditer(text, target, target + CUT_SEARCH_CHARS), CUT_TRIES):
            cut = match.start()
            begin = max(0, cut - WINDOW_CHARS)
            if self._splits_exactly(text[begin : cut + WINDOW_CHARS], cut - begin, skip):
                return cut
        return None

    def _splits_exactly(self, text: str, cut: int, skip: int) -> bool:
        """HF gives ``text`` the ids and character spans of ``text[:cut]`` followed by those of the rest, which
        begins ``skip`` characters after the cut."""
        left, rest = Piece(0, 0, cut), Piece(0, cut + skip, len(text), skip == 1)
        whole, *parts = self.tokenizer.encode_batch([text, text[:cut], text[rest.start :]], add_special_tokens=False)
        if whole.ids != parts[0].ids + parts[1].ids:
            return False
        spans = np.concatenate([token_spans(parts[0], left), token_spans(parts[1], rest)])
        return np.array_equal(token_spans(whole, Piece(0, 0, len(text))), spans)


def piece_groups(pieces: list[Piece]) -> Iterator[range]:
    """Runs of consecutive pieces of about ``GROUP_CHARS`` characters in all (at least one piece each)."""
    begin, size = 0, 0
    for k, piece in enumerate(pieces):
        size += piece.end - piece.start
        if size >= GROUP_CHARS:
            yield range(begin, k + 1)
            begin, size = k + 1, 0
    if begin < len(pieces):
        yield range(begin, len(pieces))


def replaced(ids: np.ndarray, lengths: np.ndarray, by_index: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``ids`` cut by ``lengths``, with the runs of the given indices replaced by other ids."""
    runs = np.split(ids, np.cumsum(lengths)[:-1])
    for j, other in by_index.items():
        runs[j] = np.asarray(other, dtype=ids.dtype)
    return joined(runs, ids.dtype), np.fromiter(map(len, runs), dtype=np.int64, count=len(runs))


def joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    """``arrays`` end to end, also when there are none."""
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids as one flat array, and how many each list has."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum())), lengths


def framed(body: np.ndarray, body_lengths: np.ndarray, head: list[int], tail: list[int]) -> np.ndarray:
    """Each document's run of ``body`` between ``head`` and ``tail``. The frame's places are marked in a byte mask
    and the body fills the rest in one masked copy (~1 ns a token; index arrays would cost 16 bytes a token)."""
    if not head and not tail:
        return body
    lengths = body_lengths + len(head) + len(tail)
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=body.dtype)
    frame = np.zeros(len(out), dtype=bool)
    starts = ends - lengths
    places = [(starts + k, v) for k, v in enumerate(head)] + [(ends - len(tail) + k, v) for k, v in enumerate(tail)]
    for where, value in places:
        out[where] = value
        frame[where] = True
    out[~frame] = body
    return out


def token_spans(encoding: Encoding, piece: Piece) -> np.ndarray:
    """The tokens' ``[begin, end)`` characters in the piece's document. A dropped space belongs to the first token,
    which is that space alone when it shares its characters with the next (a prepended "▁" before byte tokens)."""
    spans = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + piece.start
    if piece.dropped_space and len(spans):
        spans[0, 0] = piece.start - 1
        if len(spans) > 1 and spans[0, 1] > spans[1, 0]:
            spans[0, 1] = piece.start
    return spans


def no_loss_mask(encoding: Encoding, piece: Piece, ranges: Ranges) -> np.ndarray:
    """Tokens of the piece's ``encoding`` whose span overlaps any ``[start, end)`` range of its document; special
    tokens never do. A token overlaps one when the ranges that start before its end reach past its beginning:
    O(log ranges) a token, as a document may have many ranges and many pieces."""
    spans = token_spans(encoding, piece)
    begin, end = spans[:, 0], spans[:, 1]
    if not ranges:
        return np.zeros(len(spans), dtype=bool)
    bounds = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    bounds = bounds[np.argsort(bounds[:, 0])]
    reach = np.maximum.accumulate(bounds[:, 1])
    before = np.searchsorted(bounds[:, 0], end)  # how many ranges start before each token ends
    overlaps = (before > 0) & (reach[np.maximum(before - 1, 0)] > begin)
    return overlaps & (np.asarray(encoding.special_tokens_mask) == 0) & (end > begin)
