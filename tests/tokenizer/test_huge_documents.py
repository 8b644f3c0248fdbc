"""Long documents are encoded in pieces, so that memory stays bounded, and still get exactly HF's ids and loss
bytes: ``PIECE_CHARS`` is lowered so that documents of ~100 kB built from the shared corpora are cut often."""

from __future__ import annotations

import base64
import functools
import gzip
import itertools
import json
import logging
import random
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import gigatoken
import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from tests.support.paths import shared_path
from tests.support.processes import HUGE_RUN, run_peak_kb, wait_for
from tokenization.cli import main
from tokenization.formats.ds import TokenFile
from tokenization.tokenizer import cutting, documents, engines, fast_engine
from tokenization.tokenizer.cutting import CUT_PROBE, NO_EXACT_CUT, Cutter, NoExactCut, Piece
from tokenization.tokenizer.encoding import Encoder
from tokenization.tokenizer.engines import EngineChoice, EngineMismatch
from tokenization.tokenizer.fast_engine import FastEngine
from tokenization.tokenizer.loading import TokenizerError

PIECE_CHARS = 2048  # ~50 pieces a document below
DOC_CHARS = 100_000
NAMES = ("gpt2", "llama3", "mistral-7b", "falcon-7b", "deepseek-v4")
FAST = ("gpt2", "llama3")  # the shared tokenizers the fast engine claims
HUGE_CHARS = 50_000_000
MAX_RSS_KB = 1 << 20  # 1 GiB: one 50 MB document peaked at 5.2 GB before it was cut into pieces
HUGE_BYTES = 50_000_000  # of UTF-8: one all-CJK document of this size peaked at 6.7 GB, minified code at 5.7 GB
SCRIPT_BYTES = 400_000  # a document of each script compared with HF whole, cut ~100 times below
SCRIPT_PIECE_CHARS = 2048
# Real-looking minified JavaScript with JSON in it, its spaces taken out: cut only next to punctuation
MINIFIED = """!function(e,t){"object"==typeof exports&&"undefined"!=typeof module?module.exports=t():"function"==
typeof define&&define.amd?define(t):(e=e||self).Util=t()}(this,function(){"use strict";var e={},t=/[&<>"']/g,n=
{"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"};function r(e){return null==e?"":String(e).replace(t,
function(e){return n[e]})}function o(e,t){for(var n=0,r=e.length;n<r;n++)if(!1===t(e[n],n,e))return e;return e}
e.escape=r,e.each=o,e.config={"version":"3.2.1","locale":"en-US","retries":3,"timeout":1500,"endpoints":
["/api/v1/items","/api/v1/users"]};return e});
""".replace(" ", "").replace("\n", "")


def corpus_text(path: Path) -> str:
    """A corpus's documents (the instruct file's as prompt + response), one after another."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    return "\n\n".join(r.get("text") or r.get("prompt", "") + r.get("response", "") for r in records)


@pytest.fixture(scope="module")
def long_docs() -> list[str]:
    """A ~100 kB document from each shared corpus, one of numbers cut at spaces after punctuation, and one with
    nowhere to cut (digits alone: one pretoken)."""
    corpora = sorted(shared_path("corpora").glob("*.jsonl.gz"))
    return [corpus_text(path)[:DOC_CHARS] for path in corpora] + ["12, 345; " * (DOC_CHARS // 8), "1234" * 25_000]


@pytest.fixture
def pieces(monkeypatch) -> list[Piece]:
    """Lower ``PIECE_CHARS``, and record every piece the encoder cuts a document into."""
    monkeypatch.setattr(cutting, "PIECE_CHARS", PIECE_CHARS)
    made: list[Piece] = []
    cut = Cutter.pieces

    def recorded(self, doc: int, text: str) -> list[Piece]:
        these = cut(self, doc, text)
        made.extend(these)
        return these

    monkeypatch.setattr(Cutter, "pieces", recorded)
    return made


def document_ids(encoded) -> list[list[int]]:
    ends = np.cumsum(encoded.lengths)
    return [encoded.tokens[end - n : end].tolist() for end, n in zip(ends, encoded.lengths, strict=True)]


@pytest.mark.parametrize(("name", "engine"), [*((name, "hf") for name in NAMES), *((name, "auto") for name in FAST)])
def test_cut_documents_get_hfs_ids_for_the_whole(name: str, engine: EngineChoice, long_docs, pieces) -> None:
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    encoder = Encoder(path, engine=engine)
    got = document_ids(encoder.encode(long_docs))
    assert encoder.engine.name == ("gigatoken" if engine == "auto" else "hf")
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
    cuts = [piece.start for piece in encoder.cutter.pieces(doc, text)[1:]]
    ranges = [(0, 500), *((c - 3, c) for c in cuts[::3]), *((c, c + 3) for c in cuts[1::3])]
    return ranges + [(c - 1, c + 1) for c in cuts[2::3]], len(cuts)


@pytest.mark.parametrize(("name", "engine"), [("mistral-7b", "hf"), ("gpt2", "auto")])
def test_cut_documents_get_the_loss_bytes_of_a_whole_one(name, engine, long_docs, arabic_doc, monkeypatch) -> None:
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    texts = [long_docs[0], arabic_doc, "بي " * (DOC_CHARS // 3)]  # Mistral: "▁" alone before every word
    monkeypatch.setattr(cutting, "PIECE_CHARS", PIECE_CHARS)
    encoder = Encoder(path, engine=engine)
    ranges, cuts = zip(*(ranges_at_cuts(encoder, doc, text) for doc, text in enumerate(texts)), strict=True)
    split = encoder.encode(texts, list(ranges))
    monkeypatch.setattr(cutting, "PIECE_CHARS", DOC_CHARS)
    unsplit = Encoder(path, engine=engine).encode(texts, list(ranges))
    np.testing.assert_array_equal(split.tokens, unsplit.tokens)
    np.testing.assert_array_equal(split.lengths, unsplit.lengths)
    np.testing.assert_array_equal(split.loss, unsplit.loss)
    assert split.loss is not None
    assert min(cuts) > 10 and sum(map(len, ranges)) < len(split.loss) - int(split.loss.sum()) < len(split.loss) // 2
    assert split.loss[np.cumsum(split.lengths) - 1].tolist() == [1, 1, 1]  # the EOS keeps its loss
    assert encoder.checked_docs == (0 if engine == "hf" else sum(cuts) + len(texts))  # every piece that needs offsets


def test_the_fast_engines_self_check_samples_pieces(long_docs, pieces, monkeypatch) -> None:
    """A huge document is checked one piece in ``CHECK_EVERY``, never whole, and a wrong piece is found."""
    monkeypatch.setattr(engines, "CHECK_EVERY", 8)
    path = str(shared_path("tokenizers", "gpt2", "tokenizer.json"))
    encoder = Encoder(path)
    encoder.encode([long_docs[1]])
    assert len(pieces) > 1 and encoder.checked_docs == 1 + (len(pieces) - 1) // engines.CHECK_EVERY
    monkeypatch.setattr(cutting, "PIECE_CHARS", PIECE_CHARS // 4)
    original = FastEngine.encode
    seen: list[str] = []

    def wrong_on_one(self, texts):
        ids, lengths = original(self, texts)
        k = engines.CHECK_EVERY - len(seen)
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
    monkeypatch.setattr(cutting, "PIECE_CHARS", 100)
    encoder = Encoder(str(tmp_path / "tokenizer.json"))
    texts = [CUT_PROBE * 20, "lazy dog " * 50]
    with caplog.at_level(logging.WARNING, logger="tokenization.tokenizer.cutting"):
        got = document_ids(encoder.encode(texts))
    assert got == [[*tokenizer.encode(t).ids, encoder.eos_id] for t in texts]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"{tmp_path / 'tokenizer.json'}: no exact way to cut long documents into pieces: each is encoded whole"
    ]
    monkeypatch.setattr(cutting, "MAX_PIECE_CHARS", 1000)  # unless that takes gigabytes
    with pytest.raises(NoExactCut, match=r"^1600 characters, and its tokenizer cannot be cut exactly: encoded whole"):
        encoder.encode(texts)


@pytest.mark.long
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


def chinese() -> str:
    """The shared corpus's Chinese documents end to end."""
    with gzip.open(shared_path("corpora", "multilingual_docs.jsonl.gz"), "rt", encoding="utf-8") as handle:
        return "".join(r["text"] for r in map(json.loads, handle) if r["lang"].startswith("zh"))


def script_text(kind: str, size: int) -> str:
    """About ``size`` UTF-8 bytes of text with no space: CJK with its own punctuation and no line break,
    Han characters alone in lines, Han characters alone (one pretoken for GPT-2 and Llama-3), minified code, or
    base64."""
    if kind == "base64":
        return base64.b64encode(random.Random(0).randbytes(size * 3 // 4)).decode()
    if kind == "minified":
        base = MINIFIED
    else:
        text = chinese()
        base = "".join(ch for ch in text if ch > "\u2e80" and not ch.isspace())
        if kind != "cjk":
            base = "".join(ch for ch in base if unicodedata.category(ch) == "Lo")
        if kind == "cjk_lines":
            base = "\n".join(base[k : k + 60] for k in range(0, len(base), 60))
    chars = size * len(base) // len(base.encode("utf-8"))
    return (base * (chars // len(base) + 1))[:chars]


@functools.cache
def loaded(path: str, engine: EngineChoice) -> Encoder:
    """One encoder a tokenizer and engine for the module's tests (Llama-3 takes seconds to load)."""
    return Encoder(path, engine=engine)


@pytest.fixture
def small_pieces(monkeypatch) -> None:
    """Pieces of ``SCRIPT_PIECE_CHARS`` and stretches with no exact cut of at most eight of them."""
    monkeypatch.setattr(cutting, "PIECE_CHARS", SCRIPT_PIECE_CHARS)
    monkeypatch.setattr(cutting, "MAX_PIECE_CHARS", 8 * SCRIPT_PIECE_CHARS)
    monkeypatch.setattr(cutting, "CUT_SEARCH_CHARS", SCRIPT_PIECE_CHARS // 4)


@pytest.mark.parametrize("kind", ["cjk", "cjk_lines", "minified", "base64"])
@pytest.mark.parametrize(
    ("name", "engine"), [("gpt2", "auto"), ("llama3", "auto"), ("gpt2", "hf"), ("deepseek-v4", "hf")]
)
def test_documents_of_every_script_are_cut_exactly(kind, name, engine, small_pieces) -> None:
    """Finding 9: text with no space was cut nowhere. Now at line starts and next to punctuation, where the
    pretokenizers split: the ids are HF's for the whole text, and the pieces tile it."""
    path = str(shared_path("tokenizers", name, "tokenizer.json"))
    text = script_text(kind, SCRIPT_BYTES)
    encoder = loaded(path, engine)
    pieces = encoder.cutter.pieces(0, text)
    assert [p.start for p in pieces[1:]] == [p.end for p in pieces[:-1]] and pieces[-1].end == len(text)
    assert len(pieces) > len(text) // (2 * SCRIPT_PIECE_CHARS), len(pieces)
    reference = Tokenizer.from_file(path)
    reference.encode_special_tokens = True
    assert encoder.encode([text]).tokens.tolist() == [*reference.encode(text).ids, encoder.eos_id]


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_a_run_of_han_characters_has_no_exact_cut(name, small_pieces) -> None:
    """One pretoken of 120 k characters: BPE inside a pretoken is not local (a run of "a" is paired from its
    start, so a cut at an odd place passes a window check and breaks the whole), so no cut is made there."""
    text = script_text("han", 3 * 120_000)
    with pytest.raises(NoExactCut) as raised:
        Encoder(str(shared_path("tokenizers", name, "tokenizer.json"))).encode(["short", text])
    assert raised.value.doc == 1
    assert str(raised.value) == (
        f"{len(text)} characters, and characters 0-16384 hold no exact cut (a space between letters, a line start, "
        f"or punctuation next to a letter or digit, that the tokenizer splits at), such as {text[2048:2064]!r}...: "
        "encoded whole it would take gigabytes; split it upstream"
    )


def test_a_tokenizer_that_prepends_a_space_is_cut_at_spaces_only(small_pieces) -> None:
    """Mistral prepends "▁" to every text, so a piece that does not begin after a space would begin with a "▁"
    that the whole does not hold: CJK with its punctuation but no space cannot be cut, CJK with spaces can."""
    path = str(shared_path("tokenizers", "mistral-7b", "tokenizer.json"))
    encoder = Encoder(path, engine="hf")
    with pytest.raises(NoExactCut, match=r"^\d+ characters, and characters 0-16384 hold no exact cut"):
        encoder.encode([script_text("cjk", SCRIPT_BYTES)])
    spaced = script_text("cjk", SCRIPT_BYTES).replace("。", "。 ")
    pieces = encoder.cutter.pieces(0, spaced)
    assert len(pieces) > 20 and all(spaced[p.start - 1] == " " and p.dropped_space for p in pieces[1:])
    assert encoder.encode([spaced]).tokens.tolist() == [*Tokenizer.from_file(path).encode(spaced).ids, encoder.eos_id]


def test_a_document_with_no_exact_cut_is_quarantined(tmp_path, small_pieces, caplog) -> None:
    """The command line quarantines the document with its reason and text, and writes the others of its batch."""
    texts = ["第一篇。", script_text("han", 100_000), "第三篇。"]
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"id": str(k), "text": t}, ensure_ascii=False) for k, t in enumerate(texts)]
    (tmp_path / "in" / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    gpt2 = str(shared_path("tokenizers", "gpt2", "tokenizer.json"))
    args = ["tokenize", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer", gpt2]
    with caplog.at_level(logging.WARNING, logger="tokenization.tokenizer.documents"):
        assert main([*args, "--no-shuffle", "--max-reject-fraction", "0.5"]) == 0
    [quarantined] = [json.loads(line) for line in (tmp_path / "out" / "_quarantine").glob("*.jsonl").__next__().open()]
    source = str(tmp_path / "in" / "docs.jsonl")
    assert quarantined == {"file": source, "line": 2, "reason": NO_EXACT_CUT, "raw": texts[1]}
    assert [r.getMessage()[:60] for r in caplog.records] == [
        f"{source} line 2: quarantined as no_exact_cut: 33333 "[:60]
    ]
    reference = Tokenizer.from_file(gpt2)
    written = TokenFile(str(next((tmp_path / "out").glob("*.ds")))).tokens.tolist()
    assert written == [*reference.encode(texts[0]).ids, 50256, *reference.encode(texts[2]).ids, 50256]


@pytest.mark.long
@pytest.mark.parametrize(
    ("kind", "name", "engine"),
    [
        ("cjk", "gpt2", "auto"),
        ("cjk", "llama3", "auto"),
        ("cjk", "gpt2", "hf"),
        ("minified", "gpt2", "auto"),
        ("minified", "llama3", "auto"),
        ("base64", "llama3", "auto"),
        ("base64", "gpt2", "auto"),
    ],
)
def test_a_50_mb_document_of_any_script_needs_under_1_gb(kind, name, engine, tmp_path) -> None:
    """Finding 9: one 50 MB all-CJK document peaked at 6.7 GB, minified code at 5.7 GB. Now under 1 GB, with
    the ids of the whole document taken from the fast engine encoding it in one piece."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    path = shared_path("tokenizers", name, "tokenizer.json")
    text = script_text(kind, HUGE_BYTES)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "huge.jsonl").write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", "utf-8")
    out = tmp_path / "out"
    args = ["tokenize", str(tmp_path / "in"), "--output", str(out), "--tokenizer", str(path), "--engine", engine]
    done, peak_kb = run_peak_kb([*args, "--no-shuffle"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert peak_kb < MAX_RSS_KB, f"peak RSS {peak_kb} kB"
    expected, _ = FastEngine(path.read_bytes(), 2).encode([text])
    written = TokenFile(str(next(out.glob("*.ds")))).tokens
    np.testing.assert_array_equal(written[:-1], expected)


@pytest.mark.long
def test_a_50_mb_document_with_no_exact_cut_is_quarantined_under_1_gb(tmp_path) -> None:
    """50 MB of Han characters alone: quarantined, in bounded memory, and the rank that wrote nothing fails."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc (Linux)")
    text = script_text("han", HUGE_BYTES)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "huge.jsonl").write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n", "utf-8")
    llama3 = str(shared_path("tokenizers", "llama3", "tokenizer.json"))
    done, peak_kb = run_peak_kb(
        ["tokenize", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer", llama3]
    )
    assert peak_kb < MAX_RSS_KB, f"peak RSS {peak_kb} kB"
    source = tmp_path / "in" / "huge.jsonl"
    assert done.returncode != 0
    assert (
        f"{source} line 1: quarantined as no_exact_cut: {len(text)} characters, and characters 0-524288" in done.stderr
    )
    assert (
        f"error: rank 0: read 1 records but wrote none: 1 rejected (no_exact_cut 1; first: {source} line 1)"
        in done.stderr
    )


@pytest.mark.parametrize("whole", [True, False])
def test_the_utf8_bytes_of_a_text_are_counted_in_slices(monkeypatch, whole: bool) -> None:
    """Counting a huge document's bytes held a second copy of it; slices give the same count, as does the UTF-8
    that CPython keeps with a text encoded whole; a text that has no UTF-8 (a lone surrogate) is refused both ways."""
    monkeypatch.setattr(documents, "UTF8_SLICE_CHARS", 7)
    monkeypatch.setattr(documents, "PIECE_CHARS", 1 << 20 if whole else 5)
    for text in ("", "plain ascii", "中文。" * 11, "a😀é" * 13):
        assert documents.utf8_length(text) == len(text.encode("utf-8"))
    with pytest.raises(UnicodeEncodeError):
        documents.utf8_length("text \ud800 here")


def test_a_reload_waits_for_the_calls_under_way(monkeypatch) -> None:
    """A call still encoding with the old tokenizer keeps its cache, and grows it: a reload waits for it, and no
    call starts meanwhile, so the process never holds two caches; the ids are a fresh tokenizer's."""
    data = shared_path("tokenizers", "gpt2", "tokenizer.json").read_bytes()
    engine, fresh = FastEngine(data, 2), FastEngine(data, 2)
    loaded, held, go_on, calls = engine._tokenizer, threading.Event(), threading.Event(), []

    class Held:  # the loaded tokenizer, whose first call waits to be let go
        def encode_batch(self, texts: list[str], parallel: bool) -> object:
            calls.append(texts)
            if len(calls) == 1:
                held.set()
                go_on.wait(10)
            assert loaded is not None
            return loaded.encode_batch(texts, parallel=parallel)

    monkeypatch.setattr(engine, "_tokenizer", Held())
    monkeypatch.setattr(fast_engine.MemoryBudget, "exceeded", lambda *args: True)
    texts = [[script_text("base64", 500 + n)] for n in range(3)]
    results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * 3

    def encode(n: int) -> None:
        results[n] = engine.encode(texts[n])

    threads = [threading.Thread(target=encode, args=(n,)) for n in range(3)]
    threads[0].start()
    assert held.wait(10)
    threads[1].start()  # encodes, then waits to reload until the first call is done
    wait_for(lambda: len(calls) == 2, 10)  # its call begun, however slowly the thread started
    threads[1].join(0.5)  # time to reload, were it not waiting
    threads[2].start()  # waits for the reload before it starts
    threads[2].join(0.5)
    assert threads[1].is_alive() and threads[2].is_alive()
    assert engine.reloads == 0 and len(calls) == 2
    go_on.set()
    for thread in threads:
        thread.join(10)
    assert engine.reloads >= 1 and len(calls) == 2  # the third call was the new tokenizer's
    for n, result in enumerate(results):
        assert result is not None, f"call {n} did not end"
        ids, lengths = result
        expected, expected_lengths = fresh.encode(texts[n])
        np.testing.assert_array_equal(ids, expected)
        np.testing.assert_array_equal(lengths, expected_lengths)


def test_after_pass_1_the_engine_is_dropped_only_where_the_budget_needs_its_room(monkeypatch) -> None:
    """``release`` after pass 1: a process that holds little enough that the budget's room is left keeps the engine
    and its cache (dropping them would only cost time); one that holds more drops them, and the next call loads the
    tokenizer again, with the same ids."""
    data = shared_path("tokenizers", "gpt2", "tokenizer.json").read_bytes()
    resident = {"now": 200 << 20}
    monkeypatch.setattr(fast_engine, "resident_bytes", lambda: resident["now"])
    engine = FastEngine(data, 2, fast_engine.MemoryBudget(1024 << 20))
    ids = engine.encode(["some words, and some more"])[0]
    loaded = engine._tokenizer
    resident["now"] = engine.budget.limit - engine.budget.room
    engine.release()
    assert engine._tokenizer is loaded
    resident["now"] += 1
    engine.release()
    assert engine._tokenizer is None
    np.testing.assert_array_equal(engine.encode(["some words, and some more"])[0], ids)
    assert engine._tokenizer is not None and engine.reloads == 0  # loaded again, not a reload for the budget


def test_the_fast_engine_drops_its_cache_before_the_budget_is_reached(monkeypatch) -> None:
    """gigatoken's pre-token cache grows with text that does not repeat its words, by doubling: the engine loads its
    tokenizer again once the process, plus as much again as the engine grew since its load, plus the room of the
    next calls, would pass its budget, and only if it grew (else what fills the budget is not its cache); its ids
    stay the same."""
    data = shared_path("tokenizers", "gpt2", "tokenizer.json").read_bytes()
    resident = {"now": 500 << 20}
    monkeypatch.setattr(fast_engine, "resident_bytes", lambda: resident["now"])
    budget = fast_engine.MemoryBudget(1024 << 20)
    engine, fresh = FastEngine(data, 2, budget), FastEngine(data, 2)
    text = script_text("base64", 3000)
    loaded = engine._tokenizer
    doubled = (budget.limit - budget.room + (500 << 20)) // 2  # where its cache, doubled, would fill the budget
    resident["now"] = doubled - 1
    engine.encode([text])
    assert engine._tokenizer is loaded
    resident["now"] = doubled + 1
    ids, lengths = engine.encode([text, text[:999]])
    assert engine._tokenizer is not loaded and engine.reloads == 1
    expected, expected_lengths = fresh.encode([text, text[:999]])
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(lengths, expected_lengths)
    np.testing.assert_array_equal(engine.encode([text])[0], fresh.encode([text])[0])  # the reloaded one
    assert engine.reloads == 1  # it loaded at that size: no growth since, no reload (none at every call)
    monkeypatch.setattr(fast_engine, "resident_bytes", lambda: None)  # where memory cannot be read: by characters
    monkeypatch.setattr(fast_engine, "CHARS_BETWEEN_LOOKS", 1000)
    small = FastEngine(data, 2, fast_engine.MemoryBudget(1 << 20))
    small.encode([text] * (small.budget.chars_between_reloads // len(text)))
    assert small.reloads == 0
    small.encode([text])
    assert small.reloads == 1

    small.release()  # after pass 1: its cache dropped, loaded again by the next call
    assert small._tokenizer is None
    np.testing.assert_array_equal(small.encode([text])[0], fresh.encode([text])[0])
    small.release()

    def out_of_memory(data: bytes) -> None:
        raise ValueError("memory allocation failed")

    monkeypatch.setattr(gigatoken.Tokenizer, "from_json", out_of_memory)  # the fast engine imports it as it loads
    with pytest.raises(TokenizerError) as failed:  # not Unsupported, which would start the rank over on HF
        small.encode([text])
    assert str(failed.value) == (
        "the fast engine could not load its tokenizer again: gigatoken cannot load it (memory allocation failed)"
    )
