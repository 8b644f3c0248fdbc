"""The fast engine gives HF's ids exactly on every shared tokenizer and corpus, both special-token policies stay
exact, a tokenizer it cannot load goes to HF with the reason, and a run that finds a difference starts over on HF
and says so."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from itertools import cycle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from tests.support.corpus import corpus_texts, sample_records
from tests.support.paths import SHARED, shared_path
from tests.support.tokenizers import EOS
from tokenization.formats.ds import TokenFile
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
from tokenization.tokenizer import engines
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.fast_engine import FastEngine, Unsupported
from tokenization.tokenizer.policy import SpecialTextPolicy

CLAIMED = {"gpt2", "llama3", "mistral-7b", "deepseek-v4"}
DECLINED = {"falcon-7b": "Byte remapping failed: no single-byte vocab entry for byte 0x03"}
# Literal special tokens and the text around them: the "special" policy must split them out as HF does.
LITERALS = [
    "a<|endoftext|>b",
    "<|endoftext|><|endoftext|> x <|begin_of_text|>\n\n<|eot_id|>",
    "tail <|end_of_text|>",
    "<|reserved_special_token_1|><|reserved_special_token_10|>",
    "not quite <|endoftext| nor |endoftext|>",
    "<s>[INST] </s>",
    "<｜User｜>hi<｜Assistant｜><｜end▁of▁sentence｜>",
]


def tokenizer_bytes(name: str) -> bytes:
    return shared_path("tokenizers", name, "tokenizer.json").read_bytes()


def tokenizer_file(name: str) -> str:
    return str(SHARED / "tokenizers" / name / "tokenizer.json")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus_texts()


def test_loads_every_shared_tokenizer_but_falcon_which_goes_to_hf_with_the_reason() -> None:
    found = {p.name for p in shared_path("tokenizers").iterdir()}
    assert found == CLAIMED | set(DECLINED), "a new shared tokenizer: decide whether the fast engine claims it"
    for name, reason in DECLINED.items():
        with pytest.raises(Unsupported, match=reason):
            FastEngine(tokenizer_bytes(name), 1)
        encoder = Encoder(tokenizer_file(name))
        assert encoder.engine.name == "hf"
        assert encoder.engine_note == f"fast engine declined: gigatoken cannot load it ({reason})"


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_same_ids_as_hf_on_every_shared_corpus(name: str, texts: list[str]) -> None:
    ids, lengths = FastEngine(tokenizer_bytes(name), 2).encode(texts)
    expected = Tokenizer.from_file(tokenizer_file(name)).encode_batch_fast(texts, add_special_tokens=False)
    assert lengths.tolist() == [len(e.ids) for e in expected]
    differ = [k for k, run in enumerate(np.split(ids, np.cumsum(lengths)[:-1])) if run.tolist() != expected[k].ids]
    assert not differ, f"{len(differ)} documents differ, the first: {texts[differ[0]][:80]!r}"


@pytest.mark.parametrize("name", sorted(CLAIMED))
@pytest.mark.parametrize("policy", ["text", "special"])
def test_literal_special_tokens_follow_the_policy_as_hf_does(
    name: str, policy: SpecialTextPolicy, texts: list[str]
) -> None:
    """The Encoder on the fast engine writes HF's ids under both policies; under "text" the documents holding
    special-token text are HF's alone, and the run stays on the fast engine."""
    mixed = zip(texts[::40], cycle(LITERALS), strict=False)
    docs = LITERALS + [t[:2000] + literal + t[2000:4000] for t, literal in mixed]
    fast = Encoder(tokenizer_file(name), special_text=policy)
    slow = Encoder(tokenizer_file(name), special_text=policy, engine="hf")
    a, b = fast.encode(docs), slow.encode(docs)
    assert fast.engine.name == "gigatoken" and fast.engine_note is None
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.special_literals == b.special_literals and sum(a.special_literals.values()) >= len(LITERALS)


def test_encoder_places_bos_and_eos_like_the_post_processor(tmp_path: Path, sample_tokenizer: Path) -> None:
    hf = Tokenizer.from_file(str(sample_tokenizer))
    hf.add_special_tokens(["<s>"])
    hf.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", hf.token_to_id("<s>"))])
    hf.save(str(tmp_path / "tokenizer.json"))
    texts = [r["text"] for r in sample_records()] + ["", "x"]
    fast = Encoder(str(tmp_path), eos_token=EOS)
    slow = Encoder(str(tmp_path), eos_token=EOS, engine="hf")
    assert (fast.engine.name, slow.engine.name) == ("gigatoken", "hf")
    a, b = fast.encode(texts), slow.encode(texts)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert fast.checked_docs == 1 + (len(texts) - 1) // engines.CHECK_EVERY
    assert a.tokens[0] == hf.token_to_id("<s>") and a.tokens[a.lengths[0] - 1] == hf.token_to_id(EOS)


def test_a_difference_from_hf_restarts_the_rank_on_hf(
    tmp_path: Path, sample_corpus: Path, sample_tokenizer: Path, monkeypatch
) -> None:
    """A fast engine that gets one document wrong (past the first batch) must not reach the output."""
    monkeypatch.setattr(engines, "CHECK_EVERY", 64)
    config = TokenizeConfig(
        inputs=[str(sample_corpus)], output=str(tmp_path / "hf"), tokenizer=str(sample_tokenizer), eos_token=EOS
    )
    expected = tokenize_rank(TokenizeConfig(**{**vars(config), "engine": "hf"})).to_json()
    original = FastEngine.encode

    def wrong_on_one(self, texts):
        ids, lengths = original(self, texts)
        if len(texts) > engines.CHECK_EVERY:
            ids[lengths[: engines.CHECK_EVERY].sum()] += 1
        return ids, lengths

    monkeypatch.setattr(FastEngine, "encode", wrong_on_one)
    got = tokenize_rank(TokenizeConfig(**{**vars(config), "output": str(tmp_path / "fast")})).to_json()
    described = got["tokenizer"]
    assert described["engine"] == "hf"
    assert described["engine_note"].startswith(f"fell back: document {engines.CHECK_EVERY} of this run")
    assert got["counts"] == expected["counts"]
    for ours, theirs in zip(got["outputs"], expected["outputs"], strict=True):
        a = TokenFile(str(tmp_path / "fast" / ours["name"]))
        b = TokenFile(str(tmp_path / "hf" / theirs["name"]))
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.ends, b.ends)


FORKED = """
import os, sys
import numpy as np
from tokenization.tokenizer.fast_engine import FastEngine
engine = FastEngine(open(sys.argv[1], "rb").read(), 2)
texts = [f"hello world {i}, " * 20000 for i in range(64)]  # 20 MB: large enough to be spread over the pool
expected = engine.encode(texts)[0]  # starts gigatoken's thread pool in this process
pid = os.fork()
if pid == 0:  # the pool has no threads here: waiting on it would hang
    os._exit(0 if np.array_equal(engine.encode(texts)[0], expected) else 3)
os._exit(os.waitpid(pid, 0)[1] >> 8)
"""


def test_a_forked_child_encodes_without_its_parents_thread_pool(sample_tokenizer: Path) -> None:
    """Airflow and Celery fork task processes: a child of a process that used the pool must not wait on it."""
    done = subprocess.run([sys.executable, "-c", FORKED, str(sample_tokenizer)], timeout=30, check=False)
    assert done.returncode == 0


WITHOUT_AWKWARD = """
import sys
import numpy as np
from tokenization.tokenizer.fast_engine import FastEngine
engine = FastEngine(open(sys.argv[1], "rb").read(), 2)
texts = ["", "hello world", "x" * 5000, "", "the end, again and again. " * 3000]
ids, lengths = engine.encode(texts)
assert "awkward" not in sys.modules, "encoding imported awkward"
assert ids.dtype == np.uint32 and lengths.dtype == np.int64 and int(lengths.sum()) == ids.size
import awkward  # importable again once no call encodes
awkward_ids, awkward_lengths = engine.encode(texts)  # gigatoken's awkward.Array now
assert np.array_equal(ids, awkward_ids) and np.array_equal(lengths, awkward_lengths)
assert engine.encode(["one text"])[1].tolist() == [2]
"""


def test_encodes_without_importing_awkward_the_same_ids(sample_tokenizer: Path) -> None:
    """Importing awkward (and with it pyarrow) took ~0.17 s of CPU of a tokenize rank's ~1.6 s (GPT-2):
    the ids come as gigatoken's numpy views when awkward is not imported, the same as its awkward.Array's."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_AWKWARD, str(sample_tokenizer)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_hf_checks_its_sample_while_the_fast_engine_encodes(sample_tokenizer: Path, monkeypatch) -> None:
    """Both release the GIL: the run's first sampled piece (up to 128k characters) took HF ~0.1 s, which the first
    batch waited for before the fast engine began. HF now starts only once the fast engine has (else it times out),
    and the ids and the checked count are those of HF alone."""
    fast_started, hf_done = threading.Event(), threading.Event()
    real_fast, real_hf = FastEngine.encode, engines.HFEngine.encodings

    def fast(self, texts):
        fast_started.set()
        return real_fast(self, texts)

    def hf(self, texts, which, *, offsets):
        assert fast_started.wait(5), "HF checked its sample before the fast engine began"
        found = real_hf(self, texts, which, offsets=offsets)
        hf_done.set()
        return found

    texts = [f"hello world {i}, again and again. " * 200 for i in range(3)]
    expected = Encoder(str(sample_tokenizer), eos_token=EOS, engine="hf").encode(texts)
    monkeypatch.setattr(FastEngine, "encode", fast)
    monkeypatch.setattr(engines.HFEngine, "encodings", hf)
    encoder = Encoder(str(sample_tokenizer), eos_token=EOS)
    got = encoder.encode(texts)
    assert encoder.engine.name == "gigatoken" and hf_done.is_set() and encoder.checked_docs == 1
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_array_equal(got.lengths, expected.lengths)


def test_a_fast_engine_error_is_raised_once_hfs_check_beside_it_ended(sample_tokenizer: Path, monkeypatch) -> None:
    """The fast engine's error, not the check's; and the check is over when it is raised, not running on."""
    hf_done = threading.Event()
    real_hf = engines.HFEngine.encodings

    def fails(self, texts):
        raise RuntimeError("the fast engine failed")

    def hf(self, texts, which, *, offsets):
        time.sleep(0.2)
        found = real_hf(self, texts, which, offsets=offsets)
        hf_done.set()
        return found

    monkeypatch.setattr(FastEngine, "encode", fails)
    monkeypatch.setattr(engines.HFEngine, "encodings", hf)
    encoder = Encoder(str(sample_tokenizer), eos_token=EOS)
    with pytest.raises(RuntimeError, match=r"^the fast engine failed$"):
        encoder.encode(["hello world, again and again. " * 200])
    assert hf_done.is_set()
