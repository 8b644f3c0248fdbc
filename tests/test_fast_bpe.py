"""The fast engine gives HF's ids exactly, declines what it cannot reproduce, and a run that finds a difference
starts over on HF and says so."""

from __future__ import annotations

import gzip
import json
from itertools import cycle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from tests.conftest import EOS, SHARED, sample_records, shared_path
from tokenization import encoding
from tokenization.encoding import Encoder
from tokenization.fast_bpe import FastBPE, Unsupported
from tokenization.formats.ds import TokenFile
from tokenization.tokenize import TokenizeConfig, tokenize_rank

CLAIMED = {"gpt2", "llama3"}
DECLINED = {
    "mistral-7b": "byte fallback",
    "falcon-7b": "pre-tokenizer Sequence",
    "deepseek-v4": "added tokens that are not special",
}
# Literal special tokens and the text around them: the "special" policy must split them out as HF does.
LITERALS = [
    "a<|endoftext|>b",
    "<|endoftext|><|endoftext|> x <|begin_of_text|>\n\n<|eot_id|>",
    "tail <|end_of_text|>",
    "<|reserved_special_token_1|><|reserved_special_token_10|>",
    "not quite <|endoftext| nor |endoftext|>",
]


def corpus_texts() -> list[str]:
    """Every document of every shared corpus (the instruct file as prompt + response)."""
    texts = []
    for path in sorted(shared_path("corpora").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                texts.append(record.get("text") or record.get("prompt", "") + record.get("response", ""))
    return texts


def tokenizer_spec(name: str) -> dict:
    return json.loads(shared_path("tokenizers", name, "tokenizer.json").read_text())


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus_texts()


def test_claims_exactly_the_byte_level_regex_tokenizers() -> None:
    found = {p.name for p in shared_path("tokenizers").iterdir()}
    assert found == CLAIMED | set(DECLINED), "a new shared tokenizer: decide whether the fast engine claims it"
    for name, reason in DECLINED.items():
        with pytest.raises(Unsupported, match=reason):
            FastBPE(tokenizer_spec(name), "text", 1)


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_same_ids_as_hf_on_every_shared_corpus(name: str, texts: list[str]) -> None:
    fast = FastBPE(tokenizer_spec(name), "text", 2)
    reference = Tokenizer.from_file(str(SHARED / "tokenizers" / name / "tokenizer.json"))
    reference.encode_special_tokens = True
    for text, ours, theirs in zip(
        texts, fast.encode(texts), reference.encode_batch_fast(texts, add_special_tokens=False), strict=True
    ):
        assert fast.ids(ours).tolist() == theirs.ids, text[:80]


@pytest.mark.parametrize("name", sorted(CLAIMED))
@pytest.mark.parametrize("policy", ["text", "special"])
def test_literal_special_tokens_follow_the_policy_as_hf_does(name: str, policy: str, texts: list[str]) -> None:
    mixed = zip(texts[::40], cycle(LITERALS), strict=False)
    docs = LITERALS + [t[:2000] + literal + t[2000:4000] for t, literal in mixed]
    fast = FastBPE(tokenizer_spec(name), policy, 2)
    reference = Tokenizer.from_file(str(SHARED / "tokenizers" / name / "tokenizer.json"))
    reference.encode_special_tokens = policy == "text"
    expected = [e.ids for e in reference.encode_batch_fast(docs, add_special_tokens=False)]
    assert [fast.ids(r).tolist() for r in fast.encode(docs)] == expected


def test_encoder_places_bos_and_eos_like_the_post_processor(tmp_path: Path, sample_tokenizer: Path) -> None:
    hf = Tokenizer.from_file(str(sample_tokenizer))
    hf.add_special_tokens(["<s>"])
    hf.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", hf.token_to_id("<s>"))])
    hf.save(str(tmp_path / "tokenizer.json"))
    texts = [r["text"] for r in sample_records()] + ["", "x"]
    fast = Encoder(str(tmp_path), EOS)
    slow = Encoder(str(tmp_path), EOS, engine="hf")
    assert (fast.engine, slow.engine) == ("tiktoken", "hf")
    a, b = fast.encode(texts), slow.encode(texts)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert fast.checked_docs == 1 + (len(texts) - 1) // encoding.CHECK_EVERY
    assert a.tokens[0] == hf.token_to_id("<s>") and a.tokens[a.lengths[0] - 1] == hf.token_to_id(EOS)


def test_a_difference_from_hf_restarts_the_rank_on_hf(
    tmp_path: Path, sample_corpus: Path, sample_tokenizer: Path, monkeypatch
) -> None:
    """A fast engine that gets one document wrong (past the first batch) must not reach the output."""
    config = TokenizeConfig(
        inputs=[str(sample_corpus)], output=str(tmp_path / "hf"), tokenizer=str(sample_tokenizer), eos_token=EOS
    )
    expected = tokenize_rank(TokenizeConfig(**{**vars(config), "engine": "hf"}))
    original = FastBPE.encode

    def wrong_on_one(self, texts):
        ranks = original(self, texts)
        if len(texts) > encoding.CHECK_EVERY:
            ranks[encoding.CHECK_EVERY] = ranks[encoding.CHECK_EVERY][:-1]
        return ranks

    monkeypatch.setattr(FastBPE, "encode", wrong_on_one)
    got = tokenize_rank(TokenizeConfig(**{**vars(config), "output": str(tmp_path / "fast")}))
    described = got["tokenizer"]
    assert described["engine"] == "hf"
    assert described["engine_note"].startswith(f"fell back: document {encoding.CHECK_EVERY} of this run")
    assert got["counts"] == expected["counts"]
    for ours, theirs in zip(got["outputs"], expected["outputs"], strict=True):
        a = TokenFile(str(tmp_path / "fast" / ours["name"]))
        b = TokenFile(str(tmp_path / "hf" / theirs["name"]))
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.ends, b.ends)
