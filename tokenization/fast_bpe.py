"""A faster engine for byte-level BPE tokenizers (the GPT-2 and Llama-3 families): tiktoken, built from the
tokenizer.json's own vocabulary, merges, pre-tokenizer regex and special tokens.

tiktoken merges by the rank of the merged token; HF merges by the rank of the merge. Ranks are therefore taken
from the merge list (a token's rank is the position of the first merge that makes it), and the engine's ranks are
mapped back to the tokenizer's ids. Whatever the engine cannot reproduce exactly (normalizers, SentencePiece-style
Metaspace, byte fallback, chained pre-tokenizers, added tokens that are not special) is declined with a reason and
left to HF. Equivalence is not assumed: ``Encoder`` checks a sample of every run against HF.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import pairwise

import numpy as np
import tiktoken

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Unsupported(ValueError):
    """The tokenizer has a feature the fast engine cannot reproduce exactly; the message says which."""


def byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the other
    bytes take the code points from 256 upwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return {c: b for b, c in chars.items()}


def _pattern(pre_tokenizer: dict | None) -> str:
    """The single regex that splits text as the pre-tokenizer does, or ``Unsupported``."""
    kind = (pre_tokenizer or {}).get("type")
    if kind == "ByteLevel":
        if pre_tokenizer.get("add_prefix_space") or not pre_tokenizer.get("use_regex", True):
            raise Unsupported("ByteLevel pre-tokenizer with add_prefix_space or without its regex")
        return GPT2_PATTERN
    steps = (pre_tokenizer or {}).get("pretokenizers") or []
    if kind == "Sequence" and [s.get("type") for s in steps] == ["Split", "ByteLevel"]:
        split, level = steps
        regex = split.get("pattern", {}).get("Regex")
        if regex is None or split.get("behavior") != "Isolated" or split.get("invert"):
            raise Unsupported("Split pre-tokenizer that does not isolate regex matches")
        if level.get("add_prefix_space") or level.get("use_regex", True):
            raise Unsupported("ByteLevel step with add_prefix_space or its own regex")
        return regex
    raise Unsupported(f"pre-tokenizer {kind or 'none'} is not a byte-level regex split")


def _check_model(spec: dict) -> None:
    model = spec.get("model") or {}
    if model.get("type", "BPE") != "BPE" or "merges" not in model:
        raise Unsupported(f"model {model.get('type')} is not BPE")
    if model.get("byte_fallback") or model.get("dropout") or model.get("continuing_subword_prefix"):
        raise Unsupported("BPE with byte fallback, dropout or a subword prefix")
    if model.get("end_of_word_suffix"):
        raise Unsupported("BPE with an end-of-word suffix")
    normalizer = spec.get("normalizer")
    if normalizer and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
        raise Unsupported(f"normalizer {normalizer.get('type')}")
    added = spec.get("added_tokens") or []
    if any(not t.get("special") for t in added):
        raise Unsupported("added tokens that are not special (always split out, whatever the policy)")
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        raise Unsupported("special tokens that strip spaces or match single words only")
    contents = sorted(t["content"] for t in added)
    if any(b.startswith(a) for a, b in pairwise(contents)):
        raise Unsupported("a special token that is a prefix of another")


def _ranks(model: dict) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """The engine's ranks (bytes first, then each token at the first merge that makes it) and the vocabulary's
    ids, both keyed by the token's bytes."""
    vocab: dict[str, int] = model["vocab"]
    alphabet = byte_alphabet()
    stray = set().union(*map(set, vocab)) - alphabet.keys()
    if stray:
        raise Unsupported(f"vocabulary characters outside the byte-level alphabet: {''.join(sorted(stray))[:20]!r}")
    table = str.maketrans({c: chr(b) for c, b in alphabet.items()})

    def to_bytes(token: str) -> bytes:
        try:
            return token.translate(table).encode("latin-1")
        except UnicodeEncodeError as exc:
            raise Unsupported(f"merge part {token!r} is outside the byte-level alphabet") from exc

    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    ids: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        ids[to_bytes(token)] = token_id
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        ranks.setdefault(to_bytes(left) + to_bytes(right), len(ranks))
    if model.get("ignore_merges"):  # HF then takes a whole word from the vocabulary first, as tiktoken does
        for token in sorted(ids, key=ids.__getitem__):
            ranks.setdefault(token, len(ranks))
    missing = next((t for t in ranks if t not in ids), None)
    if missing is not None:
        raise Unsupported(f"merge result {missing!r} is not in the vocabulary")
    return ranks, ids


class FastBPE:
    """Encodes texts to the tokenizer's ids (no BOS or EOS), on ``threads`` threads that release the GIL."""

    def __init__(self, spec: dict, special_text: str, threads: int):
        _check_model(spec)
        pattern = _pattern(spec.get("pre_tokenizer"))
        ranks, ids = _ranks(spec["model"])
        special = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
        self.rank_to_id = np.empty(len(ranks) + len(special), dtype=np.int64)
        for token, rank in ranks.items():
            self.rank_to_id[rank] = ids[token]
        special_ranks = {}
        for i, (content, token_id) in enumerate(special.items()):
            special_ranks[content] = len(ranks) + i
            self.rank_to_id[len(ranks) + i] = token_id
        self.identity = bool(np.array_equal(self.rank_to_id, np.arange(len(self.rank_to_id))))
        try:
            encoding = tiktoken.Encoding(
                "corpus-tokenization", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_ranks
            )
        except Exception as exc:  # a regex the Rust engine rejects, for one
            raise Unsupported(f"tiktoken cannot build this encoding ({exc})") from exc
        # Specials are split out only when the policy says so; otherwise they are encoded as the text they are.
        self._encode = partial(
            encoding.encode_to_numpy,
            allowed_special="all" if special_text == "special" else set(),
            disallowed_special=(),
        )
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="fast-bpe") if threads > 1 else None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One array of engine ranks per text; ``ids`` maps them to the tokenizer's ids."""
        if self._pool is None or len(texts) < 2:
            return list(map(self._encode, texts))
        return list(self._pool.map(self._encode, texts))

    def ids(self, ranks: Iterable[int] | np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        return ranks if self.identity else self.rank_to_id[ranks]
