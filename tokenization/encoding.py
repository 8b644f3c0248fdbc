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

HF holds 100-450 bytes for every character it encodes (an ``Encoding`` keeps strings and offsets for each token,
a normalized string keeps alignments for each byte): one 50 MB document would need 5 GB or more. A text longer than
``PIECE_CHARS`` is therefore cut into pieces where pretokenizers split (``CUTS``, in order of preference): at a
single space, at the start of a line, or between punctuation or a symbol and a letter or digit (code, base64, CJK's
"。"). HF confirms each cut on a window around it: the two sides must encode to exactly the ids and character spans
of the window. That makes the cut exact for the whole text where the tokenizer decides a split from the characters
beside it: the regex pretokenizers of byte-level BPE (GPT-2, Llama-3, DeepSeek) end a pretoken at such a boundary
whatever comes before, and BPE never merges across pretokens; SentencePiece BPE (Mistral), with no pretokenizer,
has no token that holds "▁" after another character, so none spans a cut at a space. It would not be exact inside a
pretoken, where BPE is not local (GPT-2 pairs a run of "a" from its start: a cut at an odd place passes its window
and changes the whole), so no cut is made there, and a tokenizer that prepends "▁" is cut at spaces only. A stretch
of more than ``MAX_PIECE_CHARS`` with no exact cut (Han characters without punctuation, a run of digits) raises
``NoExactCut``: the document is quarantined as ``no_exact_cut``, neither encoded whole nor cut inexactly. Pieces
are encoded in groups of ``GROUP_CHARS``, without special tokens, and the post-processor's head (BOS) and tail (EOS)
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
from itertools import chain, islice, zip_longest
from typing import Literal, NamedTuple, TypeVar

import fsspec
import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenization.fast_engine import FastEngine, Unsupported
from tokenization.formats.ds import token_dtype, token_size_for_vocab
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
PIECE_CHARS = 1 << 17  # a longer text is cut into pieces of about this size; HF holds 100-450 bytes a character
MAX_PIECE_CHARS = 1 << 19  # a stretch with no exact cut is one piece up to this (HF: 230 MB of CJK), else quarantined
GROUP_CHARS = 1 << 18  # characters of pieces HF encodes at once, two pieces on two threads: 25-115 MB of Encodings
CUT_SEARCH_CHARS = 1 << 14  # the stretch each kind of cut is looked for in at a time; a regex scan, ~0.1 ms
CUT_TRIES = 8  # candidates of a kind HF checks at most per stretch: three encodes of <= 2 * WINDOW_CHARS, ~3 ms
WINDOW_CHARS = 512  # characters on each side of a candidate cut that HF encodes to confirm it
CUT = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")  # a single space between two letters: prose
SPACE_CUTS = (CUT, re.compile(r"(?<=\S) (?=\S)"))  # and between any other two characters: ". Next", "a = b"
CUTS = (  # where pretokenizers split, in order of preference; each match is the index where the next piece begins
    *SPACE_CUTS,
    re.compile(r"(?<=\n)(?=\S)"),  # the start of a line: text with line breaks but no single spaces
    re.compile(r"(?<=[^\W_])(?=[^\w\s])"),  # a letter or digit, then punctuation or a symbol: code, base64, "中文。"
    re.compile(r"(?<=[^\w\s])(?=[^\W_])"),  # punctuation or a symbol, then a letter or digit (not Llama-3's ".a")
)
CUT_PROBE = "The quick brown fox jumps over the lazy dog, said Ada to her old friend Charles."
NO_EXACT_CUT = "no_exact_cut"  # the quarantine reason of a document that cannot be cut into bounded pieces
TOO_BIG = "encoded whole it would take gigabytes; split it upstream"  # what a NoExactCut's message ends with
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


class NoExactCut(ValueError):
    """Document ``doc`` of a batch has more than ``MAX_PIECE_CHARS`` characters with no exact cut: encoded whole it
    would take gigabytes, so it is quarantined (``NO_EXACT_CUT``). The message says where, and what is there."""

    def __init__(self, doc: int, message: str):
        super().__init__(message)
        self.doc = doc


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
    """Characters ``[start, end)`` of document ``doc`` of a batch, encoded on their own, or the one special token
    they are (``token``). ``dropped_space``: the space just before ``start`` was left out of the text, and belongs
    to the first token."""

    doc: int
    start: int
    end: int
    dropped_space: bool = False
    token: int | None = None  # the special token that a template wrote here: its id, placed apart from the engine


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

    def prepare(
        self, texts: list[str], no_loss: list[Ranges | None] | None = None, specials: list[Ranges | None] | None = None
    ) -> Prepared:
        """The Python half of encoding a batch: its special-token text counted, its long texts cut into pieces. It
        holds the GIL, so a pipeline runs it on another thread while the engine encodes the batch before.
        ``specials`` (one entry per text): the spans of special-token text that a chat template wrote, each
        encoded as its token whatever the policy, and not counted as special-token text of the documents."""
        literals: Counter = Counter()
        literal_docs: set[int] = set()
        pieces: list[Piece] = []
        for doc, text in enumerate(texts):
            spans = specials[doc] if specials else None
            found: Counter = Counter()
            for begin, end in gaps(spans, len(text)):  # the template's own special tokens are no literals
                found.update(self.count_special_literals(text[begin:end]))  # (the whole text: no copy)
            if found:
                literals.update(found)
                literal_docs.add(doc)
            pieces += self._document_pieces(doc, text, spans)
        return Prepared(texts, no_loss, pieces, literals, literal_docs)

    def _document_pieces(self, doc: int, text: str, specials: Ranges | None) -> list[Piece]:
        """The text's pieces: under the "text" policy, the template's special tokens apart, as HF reads them when
        it recognizes special tokens (it splits them out, then normalizes and pre-tokenizes each stretch between
        them on its own; ``special_split_problem`` checks that this holds for the tokenizer). Under "special",
        the text is encoded whole, which reads them as special tokens already."""
        if not specials or self.special_text == "special":
            return self._pieces(doc, text)
        pieces: list[Piece] = []
        for (begin, end), special in zip_longest(gaps(specials, len(text)), specials):
            if end > begin:
                stretch = self._pieces(doc, text[begin:end])
                pieces += [p._replace(start=p.start + begin, end=p.end + begin) for p in stretch]
            if special is not None:
                token = text[special[0] : special[1]]
                if (token_id := self.tokenizer.token_to_id(token)) is None:
                    raise TokenizerError(f"{self.name}: a chat template's {token!r} is not one of its tokens")
                pieces.append(Piece(doc, *special, token=token_id))
        return pieces

    def special_split_problem(self) -> str | None:
        """Why the template's special tokens cannot be encoded apart from the text around them with exactly the
        ids HF gives the whole text when it recognizes them, or None: a pre-tokenizer that prepends "▁" only at the
        start of a text, or a token that strips the spaces beside it, would make them differ."""
        if self.special_text != "text" or not self.special_tokens:
            return None
        around = ("Hi ", " there", "\n\nok  ")
        wholes = [token.join(around) for token in self.special_tokens]
        self.tokenizer.encode_special_tokens = False  # as HF reads the text of a chat template
        try:
            read = self.tokenizer.encode_batch_fast(wholes, add_special_tokens=False)
        finally:
            self.tokenizer.encode_special_tokens = True
        first, middle, last = (e.ids for e in self.tokenizer.encode_batch_fast(list(around), add_special_tokens=False))
        for token, whole in zip(self.special_tokens, read, strict=True):
            token_id = self.tokenizer.token_to_id(token)
            if whole.ids != [*first, token_id, *middle, token_id, *last]:
                return (
                    f"{self.name}: the text around its special token {token!r} encodes otherwise when the token is "
                    "encoded apart, so the special tokens of a chat template cannot be encoded exactly with the "
                    "contents as text; pass --special-tokens-in-text special"
                )
        return None

    def encode_prepared(self, batch: Prepared) -> Encoded:
        """Encode a prepared batch: its pieces by the engine (its special-token pieces apart), then each document
        framed by its BOS and EOS."""
        texts, no_loss, pieces, literal_docs = batch.texts, batch.no_loss, batch.pieces, batch.literal_docs
        text_pieces = [piece for piece in pieces if piece.token is None]
        groups = piece_groups(text_pieces)
        parts = [self._encode_group(texts, text_pieces, group, no_loss, literal_docs) for group in groups]
        top = max((int(ids.max()) for ids, _, _ in parts if len(ids)), default=-1)
        if top >= self.vocab_size:  # checked before the ids take the file's width, which would wrap them
            raise TokenizerError(f"{self.name}: token id {top} is outside the vocabulary")
        body = joined([ids for ids, _, _ in parts], token_dtype(self.token_size))  # 2 bytes a token where they fit
        piece_lengths = joined([n for _, n, _ in parts], np.int64)
        held_out = None if no_loss is None else joined([held for _, _, held in parts], bool)
        del parts  # their ids are in ``body``: a huge document's tokens are held twice at most (framed), not thrice
        if len(text_pieces) < len(pieces):
            body, piece_lengths, held_out = with_special_pieces(pieces, body, piece_lengths, held_out, no_loss)
        body_lengths = np.zeros(len(texts), dtype=np.int64)
        np.add.at(body_lengths, [piece.doc for piece in pieces], piece_lengths)
        self._pieces_seen += len(pieces)
        self._docs_seen += len(texts)
        tokens = framed(body, body_lengths, self.bos_ids, self.tail_ids)
        loss = None
        if held_out is not None:  # the head and tail keep their loss
            loss = framed((~held_out).view(np.uint8), body_lengths, [1] * len(self.bos_ids), [1] * len(self.tail_ids))
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
        """The text as pieces of about ``PIECE_CHARS`` characters: one when it is short, or has no exact cut and is
        at most ``MAX_PIECE_CHARS`` long. Raises ``NoExactCut`` for a longer stretch with none."""
        if len(text) <= PIECE_CHARS:
            return [Piece(doc, 0, len(text))]
        skip = self._continuation
        if skip is None:
            if len(text) > MAX_PIECE_CHARS:
                raise NoExactCut(doc, f"{len(text)} characters, and its tokenizer cannot be cut exactly: {TOO_BIG}")
            return [Piece(doc, 0, len(text))]
        cuts = self._cuts(doc, text, skip)  # where each piece after the first begins, less its dropped space
        ends = [*cuts, len(text)]
        rest = [Piece(doc, cut + skip, end, skip == 1) for cut, end in zip(cuts, ends[1:], strict=True)]
        return [Piece(doc, 0, ends[0]), *rest]

    @cached_property
    def _continuation(self) -> int | None:
        """How the piece after a cut begins: 0, with its space (byte-level BPE, where " world" is one pre-token),
        or 1, without it (normalizers that prepend "▁", as SentencePiece does: "world" becomes "▁world", which is
        what the whole text holds). None when neither reproduces the probe: long texts are then encoded whole, up
        to ``MAX_PIECE_CHARS``."""
        cuts = [match.start() for match in CUT.finditer(CUT_PROBE)]
        for skip in (0, 1):
            if all(self._splits_exactly(CUT_PROBE, cut, skip) for cut in cuts):
                return skip
        log.warning("%s: no exact way to cut long documents into pieces: each is encoded whole", self.name)
        return None

    def _cuts(self, doc: int, text: str, skip: int) -> list[int]:
        """Where to cut a long text: places about ``PIECE_CHARS`` apart at which HF splits it exactly. Only spaces
        when a "▁" is prepended (``skip`` 1): after any other cut the piece would begin with a "▁" that the whole
        text does not hold."""
        kinds = CUTS if skip == 0 else SPACE_CUTS
        cuts: list[int] = []
        begin = 0  # where the piece being cut begins
        while len(text) - begin > PIECE_CHARS:
            cut = self._cut_after(text, begin, skip, kinds)
            if cut is None and len(text) - begin > MAX_PIECE_CHARS:
                raise NoExactCut(doc, no_cut_reason(text, begin))
            if cut is None:  # the rest is one piece, of at most MAX_PIECE_CHARS
                break
            cuts.append(cut)
            begin = cut + skip
        return cuts

    def _cut_after(self, text: str, begin: int, skip: int, kinds: tuple[re.Pattern, ...]) -> int | None:
        """The first exact cut that leaves the piece from ``begin`` between ``PIECE_CHARS`` and ``MAX_PIECE_CHARS``
        long, looked for in stretches of ``CUT_SEARCH_CHARS``, each kind of cut in turn, so that a cut is found
        wherever one exists and a piece grows no longer than it must."""
        limit = min(len(text), begin + MAX_PIECE_CHARS)
        for start in range(begin + PIECE_CHARS, limit, CUT_SEARCH_CHARS):
            for kind in kinds:
                cut = self._cut_near(text, kind, start, min(start + CUT_SEARCH_CHARS, limit), skip)
                if cut is not None:
                    return cut
        return None

    def _cut_near(self, text: str, kind: re.Pattern, start: int, stop: int, skip: int) -> int | None:
        """The first of at most ``CUT_TRIES`` candidates of a kind in ``[start, stop)`` that HF confirms on a window
        around it."""
        for match in islice(kind.finditer(text, start, stop), CUT_TRIES):
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


def no_cut_reason(text: str, begin: int) -> str:
    """Why a text cannot be cut, with a glimpse of the stretch: a run of one script with no punctuation, a run of
    digits or of symbols."""
    stop = begin + MAX_PIECE_CHARS
    return (
        f"{len(text)} characters, and characters {begin}-{stop} hold no exact cut (a space between letters, a line "
        f"start, or punctuation next to a letter or digit, that the tokenizer splits at), such as "
        f"{text[begin + PIECE_CHARS : begin + PIECE_CHARS + 16]!r}...: {TOO_BIG}"
    )


def gaps(spans: Ranges | None, length: int) -> Ranges:
    """The stretches of a ``length``-character text between sorted ``spans``; the whole text when there are none."""
    bounds = [0, *(x for span in spans or () for x in span), length]
    return list(zip(bounds[::2], bounds[1::2], strict=True))


def with_special_pieces(
    pieces: list[Piece], body: np.ndarray, lengths: np.ndarray, held_out: np.ndarray | None, no_loss: list | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The ids, lengths and held-out tokens of all ``pieces`` from those of their text pieces: each special piece
    is its one token, which carries loss unless its characters overlap a no-loss range, like any other token."""
    special = np.fromiter((p.token is not None for p in pieces), dtype=bool, count=len(pieces))
    every = np.ones(len(pieces), dtype=np.int64)
    every[~special] = lengths
    places = np.zeros(int(every.sum()), dtype=bool)
    places[(np.cumsum(every) - every)[special]] = True
    specials = [p for p in pieces if p.token is not None]
    ids = np.empty(len(places), dtype=body.dtype)
    ids[places] = [p.token for p in specials]
    ids[~places] = body
    if held_out is None:
        return ids, every, None
    held = np.empty(len(places), dtype=bool)
    held[~places] = held_out
    held[places] = [bool(no_loss[p.doc]) and bool(overlapping([(p.start, p.end)], no_loss[p.doc])[0]) for p in specials]
    return ids, every, held


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
    """``arrays`` end to end, as ``dtype``, also when there are none."""
    return np.concatenate(arrays, dtype=dtype, casting="same_kind") if arrays else np.empty(0, dtype=dtype)


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids as one flat uint32 array (the fast engine's type: 4 bytes a token), and how many each has."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum())), lengths


def framed(body: np.ndarray, body_lengths: np.ndarray, head: list[int], tail: list[int]) -> np.ndarray:
    """Each document's run of ``body`` between ``head`` and ``tail``. The body's places are marked in a byte mask
    and filled in one masked copy (~1 ns a token; index arrays would cost 16 bytes a token)."""
    if not head and not tail:
        return body
    if not head and len(body_lengths) == 1 and body.flags.owndata:  # one document (a huge one is a batch alone):
        body.resize(len(body) + len(tail), refcheck=False)  # its tail goes after it, in place (realloc: no copy)
        body[len(body) - len(tail) :] = tail
        return body
    lengths = body_lengths + len(head) + len(tail)
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=body.dtype)
    body_places = np.ones(len(out), dtype=bool)
    starts = ends - lengths
    places = [(starts + k, v) for k, v in enumerate(head)] + [(ends - len(tail) + k, v) for k, v in enumerate(tail)]
    for where, value in places:
        out[where] = value
        body_places[where] = False
    out[body_places] = body
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
    if not ranges:
        return np.zeros(len(spans), dtype=bool)
    return overlapping(spans, ranges) & (np.asarray(encoding.special_tokens_mask) == 0) & (spans[:, 1] > spans[:, 0])


def overlapping(spans: np.ndarray | list[tuple[int, int]], ranges: Ranges) -> np.ndarray:
    """Which ``[begin, end)`` spans overlap any of the (non-empty list of) ranges: those whose ranges that start
    before their end reach past their beginning."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    begin, end = spans[:, 0], spans[:, 1]
    bounds = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    bounds = bounds[np.argsort(bounds[:, 0])]
    reach = np.maximum.accumulate(bounds[:, 1])
    before = np.searchsorted(bounds[:, 0], end)  # how many ranges start before each span ends
    return (before > 0) & (reach[np.maximum(before - 1, 0)] > begin)
