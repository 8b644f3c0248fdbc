"""Tokenizer loading and the encoding policy: EOS, BOS, literal special-token text, loss masks.

The EOS is appended by the tokenizer's post-processor, as datatrove does, but a BOS that the tokenizer's own
post-processor adds is kept (datatrove drops it: huggingface/datatrove#345).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

import numpy as np
from tokenizers import Encoding, Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenization.formats.ds import token_size_for_vocab
from tokenization.storage import is_local, open_fs

SpecialTextPolicy = Literal["text", "special"]
SPECIAL_TEXT_POLICIES: tuple[str, ...] = ("text", "special")


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded or does not fit the requested policy."""


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
    ):
        if special_text not in SPECIAL_TEXT_POLICIES:
            raise TokenizerError(f"special-token policy must be one of {SPECIAL_TEXT_POLICIES}, got {special_text!r}")
        self.name = name_or_path
        self.tokenizer, data = load_tokenizer_bytes(name_or_path)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.token_size = token_size_for_vocab(self.vocab_size)
        self.special_text = special_text
        added = json.loads(data).get("added_tokens") or []
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
        ids = [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        if len(tokens) and int(tokens.max()) >= self.vocab_size:
            raise TokenizerError(f"{self.name}: token id {int(tokens.max())} is outside the vocabulary")
        loss = None
        if no_loss is not None:
            loss = np.ones(len(tokens), dtype=np.uint8)
            masked = [i for i, ranges in enumerate(no_loss) if ranges]
            if masked:
                starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
                encodings = self.tokenizer.encode_batch([texts[i] for i in masked])
                for i, encoding in zip(masked, encodings, strict=True):
                    doc = loss[starts[i] : starts[i] + lengths[i]]
                    doc[no_loss_mask(encoding, no_loss[i])] = 0
        return Encoded(tokens, lengths, loss, literals)


def no_loss_mask(encoding: Encoding, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Tokens of ``encoding`` whose character span overlaps any ``[start, end)`` range; special tokens never do."""
    offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
    begin, end = offsets[:, 0], offsets[:, 1]
    regular = (np.asarray(encoding.special_tokens_mask) == 0) & (end > begin)
    mask = np.zeros(len(offsets), dtype=bool)
    for range_start, range_end in ranges:
        mask |= (begin < range_end) & (end > range_start)
    return mask & regular
