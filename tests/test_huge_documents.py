"""Long documents are encoded in pieces, so that memory stays bounded, and still get exactly HF's ids and loss
bytes: ``PIECE_CHARS`` is lowered so that documents of ~100 kB built from the shared corpora are cut often."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from tests.conftest import shared_path
from tokenization import encoding
from tokenization.encoding import CUT_PROBE, Encoder, EngineMismatch, Piece
from tokenization.fast_engine import FastEngine
from tokenization.formats.ds import TokenFile

PIECE_CHARS = 2048  # ~50 pieces a document below
DOC_CHARS = 100_000
NAMES = ("gpt2", "llama3", "mistral-7b", "falcon-7b", "deepseek-v4")
FAST = ("gpt2", "llama3")  # the shared tokenizers the fast engine claims
HUGE_CHARS = 50_000_000
MAX_RSS_KB = 1 << 20  # 1 GiB: one 50 MB document peaked at 5.2 GB before it was cut into pieces


def corpus_text(path: Path) -> str:
    """A corpus's documents (the instruct file's as prompt + response), one after another."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    return "\n\n".join(r.get("text") or r.get("prompt", "") + r.get("response", "") for r in records)


@pytest.fixture(scope="module")
def long_docs() -> list[str]:
    """A ~100 kB document from each shared corpus, and one with nowhere to cut (no space between letters)."""
    corpora = sorted(shared_path("corpora").glob("*.jsonl.gz"))
    return [corpus_text(path)[:DOC_CHARS] for path in corpora] + ["12, 345; " * (DOC_CHARS // 8)]


@pytest.fixture
def pieces(monkeypatch) -> list[Piece]:
    """Lower ``PIECE_CHARS``, and record every piece the encoder cuts a document into."""
    monkeypatch.setattr(encoding, "PIECE_CHARS", PIECE_CHARS)
    made: list[Piece] = []
    cut = Encoder._pieces

    def recorded(self, doc: int, text: str) -> list[Piece]:
        these = cut(self, doc, text)
        made.extend(these)
        return these

    monkeypatch.setattr(Encoder, "_pieces", recorded)
    return made


def document_ids(encoded) -> list[list[int]]:
    ends = np.cumsum(encoded.lengths)
    return [encoded.tokens[end - n : end].tolist() for end, n in zip(ends, encoded.lengths, strict=True)]


@pytest.mark.parametrize(("name", "engine"), [*((name, "hf") for name in NAMES), *((name, "auto") for name in FAST)])
def test_cut_documents_get_hfs_ids_for_the_whole(name: str, engine: str, long_docs, pieces) -> None:
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    encoder = Encoder(path, engine=engine)
    got = document_ids(encoder.encode(long_docs))
    assert encoder.engine == ("gigatoken" if engine == "auto" else "hf")
    reference = Tokenizer.from_file(path)  # its own post-processor: mistral's BOS
    reference.encode_special_tokens = True
    expected = [[*e.ids, encoder.eos_id] for e in reference.encode_batch_fast(long_docs)]
    for doc, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
        assert ours == theirs, f"document {doc}: {long_docs[doc][:60]!r}"
    by_doc = [[p for p in pieces if p.doc == doc] for doc in range(len(long_docs))]
    for doc, cut in zip(long_docs, by_doc, strict=True):  # the pieces tile the document, leaving out spaces only
        assert cut[0].start == 0 and cut[-1].end == len(doc)
        assert all(doc[a.end : b.start] in ("", " ") for a, b in itertools.pairwise(cut))
    assert all(len(cut) > 10 for cut in by_doc[:-1]), [len(cut) for cut in by_doc]
    assert len(by_doc[-1]) == 1  # nowhere to cut: encoded whole


@pytest.fixture(scope="module")
def arabic_doc() -> str:
    """Arabic text, where Mistral's "▁" before a word is often a token of its own, the word's letters others."""
    with gzip.open(shared_path("corpora", "multilingual_docs.jsonl.gz"), "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    return "\n\n".join(r["text"] for r in records if r["lang"] == "ar-MA")[:DOC_CHARS]


def ranges_at_cuts(encoder: Encoder, doc: int, text: str) -> tuple[list[tuple[int, int]], int]:
    """No-loss ranges that end at, start at and straddle the starts of the pieces the text is cut into (a dropped
    space must still belong to the next token), and how many cuts there are."""
    cuts = [piece.start for piece in encoder._pieces(doc, text)[1:]]
    ranges = [(0, 500), *((c - 3, c) for c in cuts[::3]), *((c, c + 3) for c in cuts[1::3])]
    return ranges + [(c - 1, c + 1) for c in cuts[2::3]], len(cuts)


@pytest.mark.parametrize(("name", "engine"), [("mistral-7b", "hf"), ("gpt2", "auto")])
def test_cut_documents_get_the_loss_bytes_of_a_whole_one(name, engine, long_docs, arabic_doc, monkeypatch) -> None:
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    texts = [long_docs[0], arabic_doc, "بي " * (DOC_CHARS // 3)]  # Mistral: "▁" alone before every word
    monkeypatch.setattr(encoding, "PIECE_CHARS", PIECE_CHARS)
    encoder = Encoder(path, engine=engine)
    ranges, cuts = zip(*(ranges_at_cuts(encoder, doc, text) for doc, text in enumerate(texts)), strict=True)
    split = encoder.encode(texts, list(ranges))
    monkeypatch.setattr(encoding, "PIECE_CHARS", DOC_CHARS)
    unsplit = Encoder(path, engine=engine).encode(texts, list(ranges))
    np.testing.assert_array_equal(split.tokens, unsplit.tokens)
    np.testing.assert_array_equal(split.lengths, unsplit.lengths)
    np.testing.assert_array_equal(split.loss, unsplit.loss)
    assert min(cuts) > 10 and sum(map(len, ranges)) < len(split.loss) - int(split.loss.sum()) < len(split.loss) // 2
    assert split.loss[np.cumsum(split.lengths) - 1].tolist() == [1, 1, 1]  # the EOS keeps its loss
    assert encoder.checked_docs == (0 if engine == "hf" else sum(cuts) + len(texts))  # every piece that needs offsets


def test_the_fast_engines_self_check_samples_pieces(long_docs, pieces, monkeypatch) -> None:
    """A huge document is checked one piece in ``CHECK_EVERY``, never whole, and a wrong piece is found."""
    monkeypatch.setattr(encoding, "CHECK_EVERY", 8)
    path = str(shared_path("tokenizers", "gpt2", "tokenizer.json"))
    encoder = Encoder(path)
    encoder.encode([long_docs[1]])
    assert len(pieces) > 1 and encoder.checked_docs == 1 + (len(pieces) - 1) // encoding.CHECK_EVERY
    monkeypatch.setattr(encoding, "PIECE_CHARS", PIECE_CHARS // 4)
    original, seen = FastEngine.encode, []

    def wrong_on_one(self, texts):
        ids, lengths = original(self, texts)
        k = encoding.CHECK_EVERY - len(seen)
        if 0 <= k < len(texts):
            ids[lengths[:k].sum()] += 1
        seen.extend(texts)
        return ids, lengths

    monkeypatch.setattr(FastEngine, "encode", wrong_on_one)
    with pytest.raises(EngineMismatch, match=r"^document 0 of this run \(characters [1-9]\d*-\d+\): the fast engine"):
        Encoder(path).encode([long_docs[1]])


def test_a_tokenizer_that_cannot_be_cut_encodes_long_documents_whole(tmp_path, monkeypatch, caplog) -> None:
    """Prepending "▁" without turning spaces into "▁": neither " world" nor "world" continues "hello" exactly."""
    words = CUT_PROBE.replace(",", "").replace(".", "").split()
    vocab = {"[UNK]": 0, "▁": 1, **{w: i + 2 for i, w in enumerate(words)}}
    vocab |= {f"▁{w}": len(vocab) + i for i, w in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Prepend("▁")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    monkeypatch.setattr(encoding, "PIECE_CHARS", 100)
    encoder = Encoder(str(tmp_path / "tokenizer.json"))
    texts = [CUT_PROBE * 20, "lazy dog " * 50]
    with caplog.at_level(logging.WARNING, logger="tokenization.encoding"):
        got = document_ids(encoder.encode(texts))
    assert got == [[*tokenizer.encode(t).ids, encoder.eos_id] for t in texts]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"{tmp_path / 'tokenizer.json'}: no exact way to cut long documents into pieces: each is encoded whole"
    ]


HUGE_RUN = """
import re
import sys
from tokenization.cli import main
code = main(sys.argv[1:])
status = open("/proc/self/status").read()
print(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1), file=sys.stderr)
sys.exit(code)
"""


def test_a_50_mb_document_needs_under_1_gb(tmp_path) -> None:
    """The command line on one 50 MB document of shared-corpus text, on HF: peak memory under 1 GB, and the ids of
    the whole document, taken from the fast engine encoding it in one piece (it needs no Encodings: ~0.3 GB)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    gpt2 = shared_path("tokenizers", "gpt2", "tokenizer.json")
    text = corpus_text(shared_path("corpora", "sotu_en.jsonl.gz"))
    text = ("\n\n".join([text] * (HUGE_CHARS // len(text) + 1)))[:HUGE_CHARS]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "huge.jsonl").write_text(json.dumps({"id": "huge", "text": text}) + "\n")
    args = [
        "tokenize",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        str(gpt2),
        "--eos-token",
        "<|endoftext|>",
        "--engine",
        "hf",
        "--no-shuffle",
    ]
    done = subprocess.run([sys.executable, "-c", HUGE_RUN, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_kb = int(done.stderr.strip().splitlines()[-1])
    assert peak_kb < MAX_RSS_KB, f"peak RSS {peak_kb} kB"
    expected, _ = FastEngine(gpt2.read_bytes(), 1).encode([text])
    written = TokenFile(str(next((tmp_path / "out").glob("*.ds")))).tokens
    assert len(written) == len(expected) + 1 and written[-1] == 50256
    np.testing.assert_array_equal(written[:-1], expected)
