"""A build's worker runs rank after rank; each loaded HF's tokenizer again (``tokenizer.reused``)."""

from __future__ import annotations

from tests.support.tokenizers import EOS
from tokenization.tokenizer import loading, reused
from tokenization.tokenizer.encoding import Encoder


def test_the_ranks_of_one_process_load_the_tokenizer_once_and_encode_as_each_would_alone(
    sample_tokenizer, monkeypatch
) -> None:
    """Two ranks' encoders (made with their plan's facts) in one process parse the tokenizer once and encode as
    one made alone does; another policy, or an encoder of no plan, gets a tokenizer of its own."""
    monkeypatch.setattr(reused, "_last", None)
    parsed: list[str] = []
    parse = loading.parse_tokenizer

    def parsing(name, data):
        parsed.append(name)
        return parse(name, data)

    monkeypatch.setattr(loading, "parse_tokenizer", parsing)
    facts = Encoder(str(sample_tokenizer), eos_token=EOS).facts()
    parsed.clear()
    ranks = [Encoder(str(sample_tokenizer), known=facts, engine="hf") for _ in range(2)]
    assert ranks[0].tokenizer is ranks[1].tokenizer
    assert len(parsed) == 1
    texts = ["a document", "<|endoftext|> and its text, twice over"]
    alone = Encoder(str(sample_tokenizer), eos_token=EOS, engine="hf")
    assert [e.tokens.tolist() for e in (ranks[1].encode(texts), alone.encode(texts))] == [
        alone.encode(texts).tokens.tolist()
    ] * 2
    other = Encoder(str(sample_tokenizer), known=facts, engine="hf", special_text="special")
    assert other.tokenizer is not ranks[0].tokenizer
    assert alone.tokenizer is not ranks[0].tokenizer
