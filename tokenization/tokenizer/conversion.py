"""Tokenizer files that are not a ``tokenizer.json``, converted to one: a SentencePiece model (the ``tokenizer.model``
of Llama 2, Mistral or Gemma) and an OpenAI tiktoken rank file (r50k_base, cl100k_base, o200k_base).

The rest of a run works from a ``tokenizer.json``: HF ``tokenizers`` and the fast engine both load it, and a build's
plan pins its sha256. So a file of another format is converted, the same file always to the same bytes, into the
tokenizer.json that the model's HuggingFace release has, and flows on unchanged:

* SentencePiece (BPE with byte fallback): gigatoken's converter, the one its own ``from_sentencepiece`` uses (a
  private module: the project pins gigatoken's minor version), with the post-processor and decoder of HF's
  conversion added: the model's BOS before every text, as HF's Llama 2, Mistral and Gemma tokenizers add it. The
  EOS is the model's eos piece. The model is read whole first: a truncated or corrupt protobuf is refused as such
  (the converter's reader cuts a field that runs past the end short and reads on), and so is a piece longer than
  ``MAX_PIECE_CHARS``, as the converter's time grows with the square of a piece's length (it looks up every split
  of every piece): bounded so, a conversion's time is linear in the file's size.
* tiktoken: byte-level BPE whose merges are every split of a token into two tokens, ranked as tiktoken ranks the
  token, which whole pre-tokens skip (``ignore_merges``, as tiktoken looks them up first). A rank file carries
  neither its split pattern nor its special tokens, which the encoding's code defines: the three OpenAI encodings are
  recognised by their published sha256, and any other rank file is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from functools import lru_cache
from typing import Any, NamedTuple


class UnreadableTokenizer(ValueError):
    """A tokenizer file of a format this project reads, which it cannot convert; the message says why."""


class TokenizerSource(NamedTuple):
    """A tokenizer as a ``tokenizer.json`` (``data``), the format of the file it came from, and the end-of-text token
    that file names (None: a tokenizer.json, whose own config or vocabulary says)."""

    data: bytes
    format: str
    eos: str | None


class Encoding(NamedTuple):
    """What a tiktoken rank file leaves to its encoding's code: the split pattern (None: GPT-2's, which HF's
    byte-level pre-tokenizer applies itself) and the special tokens."""

    name: str
    pattern: str | None
    special_tokens: dict[str, int]


ENDOFTEXT = "<|endoftext|>"
# tiktoken_ext/openai_public.py's patterns, as HF's own tokenizer.json files of these encodings write them (the form
# the fast engine recognises; tiktoken's possessive rewrite of cl100k's matches the same text).
CL100K_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
TIKTOKEN_ENCODINGS = {  # by the sha256 OpenAI publishes for each rank file
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930": Encoding("r50k_base", None, {ENDOFTEXT: 50256}),
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7": Encoding(
        "cl100k_base",
        CL100K_PATTERN,
        {
            ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d": Encoding(
        "o200k_base", O200K_PATTERN, {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}
    ),
}
RANK_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} [0-9]+\r?\n")  # a tiktoken file's line: a token in base64, its rank
# SentencePiece's ModelProto: its pieces (field 1, each a message whose field 1 is its text) come first, so a
# model's first byte is 0x0a; its trainer spec is field 2, whose fields 41 and 42 are the BOS and EOS ids (-1: none),
# and its normalizer spec field 3.
SP_PIECES, SP_TRAINER_SPEC, SP_NORMALIZER_SPEC, SP_PIECE_TEXT, SP_BOS_ID, SP_EOS_ID = 1, 2, 3, 1, 41, 42
SP_MESSAGES = (SP_PIECES, SP_TRAINER_SPEC, SP_NORMALIZER_SPEC)  # the fields of a model that gigatoken's converter reads
# Characters of a piece, at most: real models' longest have a few dozen (Llama 2's and Mistral's 16). Up to this, a
# piece costs the converter about what its bytes cost as short pieces (2.5 s for 2 MB of them, 1 s for Mistral's
# model); a 200,000-character piece alone took 20 s.
MAX_PIECE_CHARS = 1024
FIXED_SIZES = {1: 8, 5: 4}  # the bytes of a protobuf field of wire type 1 (64 bits) and 5 (32 bits)


@lru_cache(maxsize=2)  # a build's plan and the ranks it runs in the same process load one file
def as_tokenizer_json(raw: bytes) -> TokenizerSource:
    """The tokenizer in ``raw``, a tokenizer.json, a SentencePiece model or a tiktoken rank file, as a
    tokenizer.json. Anything else is passed on as a tokenizer.json, which loading it will refuse."""
    if raw.lstrip()[:1] == b"{":
        return TokenizerSource(raw, "tokenizer.json", None)
    if RANK_LINE.match(raw):
        return _from_tiktoken(raw)
    if raw[:1] == b"\x0a":
        return _from_sentencepiece(raw)
    return TokenizerSource(raw, "tokenizer.json", None)


def _from_sentencepiece(raw: bytes) -> TokenizerSource:
    from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json  # a SentencePiece model's only

    bos_id, eos_id = _special_ids(raw)
    try:
        converted = json.loads(sentencepiece_to_tokenizer_json(raw))
    except Exception as exc:  # the converter says why: a unigram model, no byte fallback
        raise UnreadableTokenizer(f"not a SentencePiece model this project reads ({exc})") from None
    pieces = {i: piece for piece, i in converted["model"]["vocab"].items()}
    bos = pieces.get(bos_id)
    if bos is not None:  # HF's LlamaConverter and GemmaConverter: "<s> $A", "<s> $A <s> $B"
        converted["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        }
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if any(step["type"] == "Prepend" for step in converted["normalizer"]["normalizers"]):  # its dummy prefix
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    converted["decoder"] = {"type": "Sequence", "decoders": decoders}
    return TokenizerSource(_dumped(converted), "sentencepiece", pieces.get(eos_id))


def _special_ids(raw: bytes) -> tuple[int, int]:
    """The BOS and EOS ids a SentencePiece model's trainer spec names (proto defaults 1 and 2; -1: none), once the
    model is known to be whole, and its pieces to be text of at most ``MAX_PIECE_CHARS`` characters."""
    try:
        model = [(field, _fields(value)) for field, value in _fields(raw) if field in SP_MESSAGES]
        pieces = [_text(dict(piece).get(SP_PIECE_TEXT, b"")) for field, piece in model if field == SP_PIECES]
        spec = next((dict(spec) for field, spec in reversed(model) if field == SP_TRAINER_SPEC), None)  # the last
        if spec is None:
            raise ValueError(f"it ends after {len(pieces):,} pieces, with no trainer spec")
        ids = _int32(spec.get(SP_BOS_ID, 1)), _int32(spec.get(SP_EOS_ID, 2))
    except ValueError as exc:  # a UnicodeDecodeError too
        raise UnreadableTokenizer(f"truncated or not a SentencePiece model: {exc}") from None
    for k, piece in enumerate(pieces):
        if len(piece) > MAX_PIECE_CHARS:
            raise UnreadableTokenizer(
                f"piece {k:,} of the SentencePiece model has {len(piece):,} characters, more than the "
                f"{MAX_PIECE_CHARS:,} a piece may have (real models' longest have a few dozen; converting a piece "
                "takes time that grows with the square of its length)"
            )
    return ids


def _fields(message: int | bytes) -> list[tuple[int, int | bytes]]:
    """The fields of a protobuf message, as gigatoken's converter reads them (varints as ints, the others as bytes),
    refusing a field that runs past the end, as a truncated file's last one does, or of a wire type it cannot read."""
    if not isinstance(message, bytes):
        raise ValueError(f"a number ({message}) stands where a message belongs")
    fields: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(message):
        key, i = _varint(message, i)
        wire = key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(message, i)
        elif wire == 2 or wire in FIXED_SIZES:
            size, i = _varint(message, i) if wire == 2 else (FIXED_SIZES[wire], i)
            if i + size > len(message):
                raise ValueError(f"a field of {size:,} bytes at byte {i:,} runs past the end, at {len(message):,}")
            value, i = message[i : i + size], i + size
        else:
            raise ValueError(f"the field before byte {i:,} has wire type {wire}, which no SentencePiece model uses")
        fields.append((key >> 3, value))
    return fields


def _varint(message: bytes, i: int) -> tuple[int, int]:
    """The protobuf varint at ``message[i]`` (at most 10 bytes), and where the next field begins."""
    if i < len(message) and message[i] < 0x80:  # most are one byte: a model's pieces are read in ~0.1 s
        return message[i], i + 1
    value = 0
    for k, byte in enumerate(message[i : i + 10]):
        value |= (byte & 0x7F) << 7 * k
        if byte < 0x80:
            return value, i + k + 1
    raise ValueError(f"the number at byte {i:,} does not end")


def _text(value: int | bytes) -> str:
    """A piece's text, which the converter reads as UTF-8."""
    if not isinstance(value, bytes):
        raise ValueError(f"a number ({value}) stands where a piece's text belongs")
    return value.decode()


def _int32(value: int | bytes) -> int:
    """An int32 field's value: a negative one is a 64-bit two's complement varint."""
    if not isinstance(value, int):
        raise ValueError(f"{len(value):,} bytes stand where an id belongs")
    return value - (1 << 64) if value >= 1 << 63 else value


def _from_tiktoken(raw: bytes) -> TokenizerSource:
    encoding = TIKTOKEN_ENCODINGS.get(hashlib.sha256(raw).hexdigest())
    if encoding is None:
        *others, last = (e.name for e in TIKTOKEN_ENCODINGS.values())
        raise UnreadableTokenizer(
            "a tiktoken rank file of an unknown encoding: a rank file holds neither its split pattern nor its special "
            f"tokens, so only OpenAI's {', '.join(others)} and {last} are read (known by their sha256); give the "
            "model's tokenizer.json instead (Llama 3's tokenizer.model is such a rank file)"
        )
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines())}
    names = {token: token.decode("latin-1").translate(BYTE_CHARS) for token in ranks}  # as byte-level BPE writes it
    merges = sorted(  # by the token's rank, then by its halves' (HF's conversion of tiktoken files does the same)
        (rank, ranks[token[:k]], ranks[token[k:]], token[:k], token[k:])
        for token, rank in ranks.items()
        for k in range(1, len(token))
        if token[:k] in ranks and token[k:] in ranks
    )
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if encoding.pattern is None:
        pre_tokenizer = byte_level
    else:
        split = {"type": "Split", "pattern": {"Regex": encoding.pattern}, "behavior": "Isolated", "invert": False}
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [split, byte_level | {"use_regex": False}]}
    converted = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for token, i in encoding.special_tokens.items()
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level | {"add_prefix_space": True, "trim_offsets": False},
        "decoder": byte_level | {"add_prefix_space": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            # the special tokens too: HF would give added tokens missing from it the next free ids, not theirs
            "vocab": {names[token]: rank for token, rank in ranks.items()} | encoding.special_tokens,
            "merges": [[names[left], names[right]] for *_, left, right in merges],
        },
    }
    return TokenizerSource(_dumped(converted), "tiktoken", ENDOFTEXT)


def _byte_chars() -> dict[int, int]:
    """GPT-2's printable character for each byte (as a ``str.translate`` table of its Latin-1 character), as HF's
    byte-level BPE writes tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return dict(zip(printable, printable, strict=True)) | {b: 256 + k for k, b in enumerate(others)}


BYTE_CHARS = _byte_chars()


def _dumped(tokenizer: dict[str, Any]) -> bytes:
    return json.dumps(tokenizer, ensure_ascii=False).encode()
