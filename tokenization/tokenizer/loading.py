"""A tokenizer as a run loads it: its ``tokenizer.json`` from a file, a folder holding one, any fsspec URL or the
HuggingFace hub (or converted from a SentencePiece model or a tiktoken rank file: ``tokenizer_formats``), that
tokenizer.json's sha256 (which a build's plan pins), its vocabulary and the width of its ids, its special tokens, and
its own end-of-text token.

Unless told otherwise, a run ends every document with the tokenizer's own end-of-text token: the one the
``tokenizer_config.json`` beside it names, else the one a converted file names (a SentencePiece model's eos piece),
else the last special token its post-processor appends, else the first of ``EOS_CANDIDATES`` its vocabulary holds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson
from tokenizers import Tokenizer

from tokenization.errors import TokenizationError
from tokenization.formats.ds import token_size_for_vocab
from tokenization.records import TokenizerFacts
from tokenization.storage.folder import Folder, StorageOptions, file_at
from tokenization.tokenizer.conversion import TokenizerSource, UnreadableTokenizer, as_tokenizer_json

log = logging.getLogger(__name__)

# Well-known end-of-text tokens, in order of preference (GPT-2 and many others, Llama-3, SentencePiece, Gemma,
# DeepSeek, Phi-3): a tokenizer that holds both <|endoftext|> and </s> ends documents with <|endoftext|>.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>", "<|end|>")
EOS_ORIGINS = {  # how a message names the place where the tokenizer's own EOS was found
    "tokenizer_config.json": "tokenizer_config.json",
    "sentencepiece": "its SentencePiece model",
    "tiktoken": "its tiktoken encoding",
    "post-processor": "its post-processor",
    "vocabulary": "its vocabulary",
}


HUB_TIMEOUT = 3.0  # seconds to reach the hub's host before a hub name is refused
FOLDER_FILES = ("tokenizer.json", "tokenizer.model")  # what a folder's tokenizer is, in order of preference
FILE_SUFFIXES = (".json", ".model", ".tiktoken")  # a missing file so named is no hub name
# Token ids lie below this: the largest vocabularies hold about a million tokens, and the fast engine makes a table
# of 16 bytes for every id up to the highest (at id 4,294,967,295, 64 GiB: the process aborts).
MAX_TOKEN_ID = 1 << 24


class TokenizerError(TokenizationError, ValueError):
    """The tokenizer cannot be loaded or does not fit the requested policy."""


def tokenizer_location(name_or_path: str, storage_options: StorageOptions | None = None) -> tuple[Folder, str] | None:
    """Where the tokenizer file of a path, a folder holding one (its ``tokenizer.json``, else its
    ``tokenizer.model``, as Meta's Llama 2 download has only that), or any fsspec URL is; None for a HuggingFace hub
    name."""
    where = Folder(name_or_path, storage_options)
    if where.local is not None and not os.path.exists(where.path):
        if name_or_path.endswith(FILE_SUFFIXES) or name_or_path.startswith(("/", ".", "~")):
            raise TokenizerError(f"{name_or_path}: no such tokenizer file")
        return None
    if where.is_folder():
        return where, next((name for name in FOLDER_FILES if where.exists(name)), FOLDER_FILES[0])
    return file_at(name_or_path, storage_options)


def read_tokenizer(name_or_path: str, storage_options: StorageOptions | None = None) -> TokenizerSource:
    """The tokenizer.json of a tokenizer file (a tokenizer.json, a SentencePiece model or a tiktoken rank file, which
    are converted), a folder holding one, or any fsspec URL. Anything else is taken as a HuggingFace hub name, which
    needs network access."""
    location = tokenizer_location(name_or_path, storage_options)
    raw = _from_hub(name_or_path) if location is None else _read(name_or_path, *location)
    try:
        return as_tokenizer_json(raw)
    except UnreadableTokenizer as exc:
        raise TokenizerError(f"{name_or_path}: {exc}") from None


def parse_tokenizer(name_or_path: str, data: bytes) -> Tokenizer:
    """HF's tokenizer of the tokenizer.json ``data``, set never to crop a document nor to pad one."""
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:
        raise TokenizerError(f"{name_or_path}: not a tokenizers JSON file ({exc})") from exc
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def token_of(tokenizer: Tokenizer, token_id: int) -> str:
    """The token of an id that the tokenizer itself gave (a BOS or EOS it appends): never missing but by a bug."""
    token = tokenizer.id_to_token(token_id)
    if token is None:
        raise TokenizerError(f"the tokenizer has no token of its own id {token_id}")
    return token


def top_id(name_or_path: str, tokenizer: dict[str, Any]) -> int:
    """The highest id of the tokenizer.json ``tokenizer`` (of its model's vocabulary and its added tokens, which
    may leave gaps: cl100k's last is 100276, past its 100,261 tokens), refused from ``MAX_TOKEN_ID`` on."""
    vocab = tokenizer["model"].get("vocab")
    vocab = vocab if isinstance(vocab, dict) else {}  # a unigram model's is a list: its ids are its indices
    added = {t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []}
    top = max(max(vocab.values(), default=-1), max(added.values(), default=-1))  # in C: no call a token
    if top >= MAX_TOKEN_ID:
        token = next(t for t, i in [*vocab.items(), *added.items()] if i == top)
        raise TokenizerError(
            f"{name_or_path}: token {token!r} has id {top:,}; token ids must be below {MAX_TOKEN_ID:,} (the largest "
            "vocabularies hold about a million tokens): give the tokenizer ids that follow its vocabulary"
        )
    return top


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a panic of an engine's Rust code (HF tokenizers', gigatoken's), which pyo3 raises as a
    ``pyo3_runtime.PanicException``: each extension has its own class of that name, derived from BaseException."""
    return type(exc).__module__ == "pyo3_runtime" and type(exc).__name__ == "PanicException"


@contextmanager
def engine_panics(name_or_path: str, doing: str) -> Iterator[None]:
    """Raise an engine's panic inside (a catastrophic ``Split`` regex makes HF's panic) as a ``TokenizerError``
    naming the tokenizer and what it was ``doing``: as a BaseException it passes every ``except Exception`` and
    would end the run with a traceback."""
    try:
        yield
    except BaseException as exc:
        if not is_panic(exc):
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "no reason given"
        raise TokenizerError(
            f"{name_or_path}: its engine failed {doing} ({reason}): this tokenizer cannot encode that text; fix the "
            "tokenizer, or give another"
        ) from None


def _from_hub(name: str) -> bytes:
    """The ``tokenizer.json`` of a HuggingFace hub repository: from the local hub cache when it is there, else
    downloaded, once the hub's host is known to answer: the hub client would otherwise retry for ~25 s."""
    from huggingface_hub import constants, hf_hub_download

    try:
        return Path(hf_hub_download(name, "tokenizer.json", local_files_only=True)).read_bytes()
    except Exception:  # not in the cache (or not a valid name: the download below says which)
        pass
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.create_connection((host, 443), timeout=HUB_TIMEOUT).close()
    except OSError as exc:
        raise TokenizerError(
            f"{name}: no such local tokenizer file, and the HuggingFace hub ({host}) cannot be reached to fetch it "
            f"({exc}): give a tokenizer.json file, a folder holding one, or an fsspec URL"
        ) from None
    try:
        return Path(hf_hub_download(name, "tokenizer.json")).read_bytes()
    except Exception as exc:
        raise TokenizerError(f"{name}: no such local tokenizer file, nor a HuggingFace hub tokenizer ({exc})") from exc


def _read(name_or_path: str, folder: Folder, name: str) -> bytes:
    try:
        return folder.read(name)
    except FileNotFoundError as exc:
        raise TokenizerError(f"{name_or_path}: no {' nor '.join(FOLDER_FILES)} found") from exc


def configured_token(name_or_path: str, key: str, storage_options: StorageOptions | None = None) -> str | None:
    """The special token ``key`` (``eos_token``, ``pad_token``) that a ``tokenizer_config.json`` beside the
    tokenizer names (a string or a dict with ``content``), or None. A hub name has none: reading its config would
    need the network."""
    location = tokenizer_location(name_or_path, storage_options)
    if location is None:
        return None
    folder = location[0]
    config_path = folder.path_of("tokenizer_config.json")
    try:
        config = json.loads(folder.read("tokenizer_config.json"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TokenizerError(f"{config_path}: not a JSON file ({exc})") from exc
    token = config.get(key) if isinstance(config, dict) else None
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


@dataclass(frozen=True)
class TokenizerFile:
    """A tokenizer and what a manifest says of it. ``data`` is its ``tokenizer.json`` (converted from the file's
    ``format``), which the fast engine loads itself; ``special_tokens`` come longest first, as a regex must try them;
    ``source_eos``: the end-of-text token a converted file names; ``tokenizer``, HF's, is loaded when first used."""

    name: str
    data: bytes
    sha256: str
    vocab_size: int
    token_size: int
    special_tokens: list[str]
    format: str = "tokenizer.json"
    source_eos: str | None = None
    storage_options: StorageOptions | None = field(default=None, compare=False, repr=False)  # for files beside it

    @classmethod
    def load(
        cls, name_or_path: str, known: TokenizerFacts | None = None, storage_options: StorageOptions | None = None
    ) -> TokenizerFile:
        """The tokenizer, loaded. With ``known`` (what loading these very bytes told a build's plan), only its file is
        read (and converted): HF's tokenizer is loaded when first used, which a rank that takes every file from the
        tokenization cache never does (0.2-0.7 s)."""
        source = read_tokenizer(name_or_path, storage_options)
        sha256 = hashlib.sha256(source.data).hexdigest()
        tokenizer = None
        if known is not None and sha256 == known.sha256:
            vocab_size, specials = known.vocab_size, known.special_tokens
        else:
            tokenizer = parse_tokenizer(name_or_path, source.data)
            parsed = orjson.loads(source.data)  # 1.3-9 MB: orjson takes a third of json's time
            added = parsed.get("added_tokens") or []
            top = top_id(name_or_path, parsed)
            vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), top + 1)  # every id lies below
            specials = sorted({t["content"] for t in added if t.get("special")}, key=lambda t: (-len(t), t))
        file = cls(
            name=name_or_path,
            data=source.data,
            sha256=sha256,
            vocab_size=vocab_size,
            token_size=token_size_for_vocab(vocab_size),
            special_tokens=specials,
            format=source.format,
            source_eos=source.eos,
            storage_options=storage_options,
        )
        if tokenizer is not None:
            object.__setattr__(file, "tokenizer", tokenizer)  # loaded already: the property's value
        return file

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """HF's tokenizer, loaded from ``data`` when first used."""
        return parse_tokenizer(self.name, self.data)

    def describe(self) -> dict[str, Any]:
        """The manifest's record of the tokenizer itself."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "token_size": self.token_size,
            "format": self.format,
        }

    def special_ids_around(self) -> tuple[list[int], list[int]]:
        """The ids that the tokenizer's own post-processor puts before a document (its BOS, if any) and after it."""
        probe = "a"
        with_specials = self.tokenizer.encode(probe, add_special_tokens=True).ids
        plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
        for k in range(len(with_specials) - len(plain) + 1):
            if with_specials[k : k + len(plain)] == plain:
                return with_specials[:k], with_specials[k + len(plain) :]
        raise TokenizerError(f"{self.name}: its post-processor changes the text's ids, not only the ends")

    def pad(self) -> tuple[str, int] | None:
        """The tokenizer's own pad token and its id: the one its ``tokenizer.json`` pads with, else the one the
        ``tokenizer_config.json`` beside it names, when its vocabulary holds it."""
        padding = json.loads(self.data).get("padding") or {}
        token = padding.get("pad_token") or configured_token(self.name, "pad_token", self.storage_options)
        found = None if token is None else self.tokenizer.token_to_id(token)
        return None if token is None or found is None else (token, found)  # (no token finds no id)

    def choose_eos(self, eos_token: str | None, appended: list[int]) -> tuple[str, str]:
        """The EOS to append and where it came from: the parameter, or else the tokenizer's own. ``appended``: the
        ids its post-processor appends."""
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
        else the file it was converted from (a SentencePiece model names its eos piece), else the last special token
        its post-processor appends, else the first of ``EOS_CANDIDATES`` it holds."""
        configured = configured_token(self.name, "eos_token", self.storage_options)
        if configured is not None and self.tokenizer.token_to_id(configured) is not None:
            return configured, "tokenizer_config.json"
        if configured is not None:
            log.warning("%s: tokenizer_config.json names EOS %r, which is not in the vocabulary", self.name, configured)
        if self.source_eos is not None:
            return self.source_eos, self.format
        if appended:
            return token_of(self.tokenizer, appended[-1]), "post-processor"
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
