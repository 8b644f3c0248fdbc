"""Tokenizer loading and the encoding policy: EOS, BOS, literal special-token text, loss masks, engine.

The EOS is appended by the tokenizer's post-processor, as datatrove does, but a BOS that the tokenizer's own
post-processor adds is kept (datatrove drops it: huggingface/datatrove#345).

Byte-level BPE tokenizers are encoded by the fast engine (``fast_bpe``) when it can represent them. Its ids must
be HF's: every run re-encodes a sample of its documents with HF (one in ``CHECK_EVERY``, from the first, and
every document that needs loss offsets) and raises ``EngineMismatch`` on any difference, so
that the stage can start over on HF.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenization.fast_bpe import FastBPE, Unsupported
from tokenization.formats.ds import token_size_for_vocab
from tokenization.storage import is_local, open_fs

log = logging.getLogger(__name__)

SpecialTextPolicy = Literal["text", "special"]
SPECIAL_TEXT_POLICIES: tuple[str, ...] = ("text", "special")
EngineChoice = Literal["auto", "hf"]
ENGINES: tuple[str, ...] = ("auto", "hf")
CHECK_EVERY = 64
T = TypeVar("T")


def available_threads() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded or does not fit the requested policy."""


class EngineMismatch(RuntimeError):
    """The fast engine gave other ids than HF for a document: the run must start over on HF."""


def load_tokenizer_bytes(name_or_path: str) -> tuple[Tokenizer, bytes]:
    """A tokenizer and its serialized form, from a ``tokenizer.json`` file, a folder holding one, or any fsspec
    URL. Anything else is taken as a HuggingFace hub name, which needs network access."""
    fs, path = open_fs(name_or_path)
    if not is_local(fs) or os.path.exists(path):
        if fs.isdir(path):
            path = path.rstrip("/") + "/tokenizer.json"
        try:
            data = fs.cat_file(path)
        except FileNotFoundError as exc:
            raise TokenizerError(f"{name_or_path}: no tokenizer.json found") from exc
        try:
            return Tokenizer.from_str(data.decode("utf-8")), data
        except Exception as exc:
            raise TokenizerError(f"{name_or_path}: not a tokenizers JSON file ({exc})") from exc
    if name_or_path.endswith(".json") or name_or_path.startswith(("/", ".", "~")):
        raise TokenizerError(f"{name_or_path}: no such tokenizer file")
    try:
        tokenizer = Tokenizer.from_pretrained(name_or_path)
    except Exception as exc:
        raise TokenizerError(
            f"{name_or_path}: not a local tokenizer file and could not be loaded from the HuggingFace hub ({exc})"
        ) from exc
    return tokenizer, tokenizer.to_str().encode("utf-8")


@dataclass
class Encoded:
    """A batch of encoded documents: flat token ids, per-document lengths and, when asked, loss bytes."""

    tokens: np.ndarray
    lengths: np.ndarray
    loss: np.ndarray | None
    special_literals: Counter = field(default_factory=Counter)


class Encoder:
    """Encodes documents exactly as the tokenize stage writes them (and as ``count`` counts them)."""

    def __init__(
        self,
        name_or_path: str,
        eos_token: str | None = None,
        special_text: SpecialTextPolicy = "text",
        engine: EngineChoice = "auto",
        threads: int | None = None,
    ):
        if special_text not in SPECIAL_TEXT_POLICIES:
            raise TokenizerError(f"special-token policy must be one of {SPECIAL_TEXT_POLICIES}, got {special_text!r}")
        if engine not in ENGINES:
            raise TokenizerError(f"engine must be one of {ENGINES}, got {engine!r}")
        if threads is not None and threads < 1:
            raise TokenizerError(f"threads must be at least 1, got {threads}")
        self.name = name_or_path
        self.threads = threads or available_threads()
        if threads:  # HF's Rust thread pool reads this when it first starts
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        self.tokenizer, data = load_tokenizer_bytes(name_or_path)
        self._spec = json.loads(data)
        self.engine = "hf"
        self.engine_note = "asked for HF" if engine == "hf" else None
        self._fast: FastBPE | None = None
        self.checked_docs = 0
        self._docs_seen = 0
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.token_size = token_size_for_vocab(self.vocab_size)
        self.special_text = special_text
        added = self._spec.get("added_tokens") or []
        self.special_tokens = sorted({t["content"] for t in added if t.get("special")}, key=len, reverse=True)
        self.eos_token = eos_token
        self.eos_id: int | None = None
        self.bos_ids: list[int] = self._leading_special_ids()
        if eos_token is not None:
            self.eos_id = self.tokenizer.token_to_id(eos_token)
            if self.eos_id is None:
                hint = ", ".join(self.special_tokens[:8]) or "none"
                raise TokenizerError(
                    f"EOS token {eos_token!r} is not in the vocabulary of {name_or_path} (special tokens: {hint})"
                )
            self._append_eos(eos_token, self.eos_id)
        self.tokenizer.encode_special_tokens = special_text == "text"
        self._literal_re = re.compile("|".join(map(re.escape, self.special_tokens))) if self.special_tokens else None
        self._literal_prefixes = tuple({t[:2] for t in self.special_tokens})
        if engine == "auto":
            self._choose_engine()

    def _choose_engine(self) -> None:
        try:
            self._fast = FastBPE(self._spec, self.special_text, self.threads)
            self.engine, self.engine_note = "tiktoken", None
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

    def _leading_special_ids(self) -> list[int]:
        """The ids that the tokenizer's own post-processor puts before a document: its BOS, if any."""
        probe = "a"
        with_specials = self.tokenizer.encode(probe, add_special_tokens=True).ids
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        for k in range(len(with_specials) - len(plain) + 1):
            if with_specials[k : k + len(plain)] == plain:
                return with_specials[:k]
        return []

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
            "bos_ids": self.bos_ids,
            "special_text": self.special_text,
            "engine": self.engine,
            "engine_note": self.engine_note,
            "self_checked_docs": self.checked_docs,
        }

    def count_special_literals(self, text: str) -> Counter:
        if self._literal_re is None or not any(p in text for p in self._literal_prefixes):
            return Counter()
        return Counter(self._literal_re.findall(text))

    def encode(self, texts: list[str], no_loss: list[list[tuple[int, int]] | None] | None = None) -> Encoded:
        """Encode a batch. With ``no_loss`` (one entry per text) loss bytes are computed: 0 for every token that
        overlaps a no-loss character range, 1 elsewhere; the document is never cropped and its EOS keeps loss."""
        literals: Counter = Counter()
        for text in texts:
            literals.update(self.count_special_literals(text))
        masked = [i for i, ranges in enumerate(no_loss or []) if ranges]
        if self._fast is None:
            ids = [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts)]
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            tokens = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        else:
            tokens, lengths = self._encode_fast(texts)
        if len(tokens) and int(tokens.max()) >= self.vocab_size:
            raise TokenizerError(f"{self.name}: token id {int(tokens.max())} is outside the vocabulary")
        starts = np.cumsum(lengths) - lengths
        loss = None if no_loss is None else np.ones(len(tokens), dtype=np.uint8)
        checked = self._check_sample(texts, tokens, starts, lengths, exclude=set(masked))
        if masked:  # offsets only for the documents that need them; their ids are checked as well
            for i, encoding in zip(masked, self.tokenizer.encode_batch([texts[i] for i in masked]), strict=True):
                doc = slice(starts[i], starts[i] + lengths[i])
                if self._fast is not None:
                    self._compare(self._docs_seen + i, tokens[doc], encoding.ids)
                loss[doc][no_loss_mask(encoding, no_loss[i])] = 0
            checked += len(masked) if self._fast is not None else 0
        self.checked_docs += checked
        self._docs_seen += len(texts)
        return Encoded(tokens, lengths, loss, literals)

    def _encode_fast(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The fast engine's ids with the BOS and EOS the post-processor would add, placed by index arithmetic."""
        ranks = self._fast.encode(texts)
        body_lengths = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
        body = self._fast.ids(np.concatenate(ranks) if ranks else np.empty(0, dtype=np.int64))
        head, tail = self.bos_ids, [] if self.eos_id is None else [self.eos_id]
        if not head and not tail:
            return body, body_lengths
        lengths = body_lengths + len(head) + len(tail)
        starts = np.cumsum(lengths) - lengths
        tokens = np.empty(int(lengths.sum()), dtype=np.int64)
        shift = np.repeat(starts + len(head) - (np.cumsum(body_lengths) - body_lengths), body_lengths)
        tokens[np.arange(len(body)) + shift] = body
        for k, token in enumerate(head):
            tokens[starts + k] = token
        for k, token in enumerate(tail):
            tokens[starts + lengths - len(tail) + k] = token
        return tokens, lengths

    def _check_sample(
        self, texts: list[str], tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, exclude: set[int]
    ) -> int:
        """Re-encode this batch's share of the run's sample with HF; return how many documents were compared."""
        if self._fast is None:
            return 0
        positions = self._docs_seen + np.arange(len(texts))
        sample = [i for i in np.flatnonzero(positions % CHECK_EVERY == 0).tolist() if i not in exclude]
        for i, encoding in zip(sample, self.tokenizer.encode_batch_fast([texts[i] for i in sample]), strict=True):
            self._compare(int(positions[i]), tokens[starts[i] : starts[i] + lengths[i]], encoding.ids)
        return len(sample)

    def _compare(self, position: int, fast: np.ndarray, reference: list[int]) -> None:
        if len(fast) != len(reference) or not np.array_equal(fast, reference):
            differ = np.flatnonzero(fast[: len(reference)] != np.asarray(reference[: len(fast)], dtype=np.int64))
            at = int(differ[0]) if len(differ) else min(len(fast), len(reference))
            raise EngineMismatch(
                f"document {position} of this run: the fast engine and HF differ at token {at} "
                f"({len(fast)} vs {len(reference)} tokens)"
            )


def no_loss_mask(encoding: Encoding, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Tokens of ``encoding`` whose character span overlaps any ``[start, end)`` range; special tokens never do."""
    offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
    begin, end = offsets[:, 0], offsets[:, 1]
    regular = (np.asarray(encoding.special_tokens_mask) == 0) & (end > begin)
    mask = np.zeros(len(offsets), dtype=bool)
    for range_start, range_end in ranges:
        mask |= (begin < range_end) & (end > range_start)
    return mask & regular
