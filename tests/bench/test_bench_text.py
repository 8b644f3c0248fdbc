"""The benchmarks' generated web text (bench/text.py): the same seed gives the same bytes, every line is a JSON
object of valid UTF-8, and a few MB of it follow the length distribution and the vocabulary growth fitted on the
shared web corpus, whose fit the module's constants hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bench import text
from tests.support.paths import shared_path

MB = 4e6


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> list[bytes]:
    """4 MB of text, seed 7, in two files (two processes)."""
    return made(tmp_path_factory.mktemp("web"), seed=7)


def made(folder: Path, seed: int) -> list[bytes]:
    """The files of 4 MB of text made in ``folder``, in order, after checking the bytes of text it reports."""
    written = text.generate(folder, MB / 1e9, seed=seed, files=2)
    files = [path.read_bytes() for path in sorted(folder.iterdir())]
    sizes = [len(json.loads(line)["text"].encode()) for data in files for line in data.splitlines()]
    assert written == sum(sizes)
    return files


@pytest.fixture(scope="module")
def texts(generated) -> list[str]:
    return [json.loads(line)["text"] for data in generated for line in data.decode("utf-8").split("\n")[:-1]]


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(tmp_path, generated) -> None:
    again, other = made(tmp_path / "again", seed=7), made(tmp_path / "other", seed=8)
    assert again == generated
    assert all(a != b for a, b in zip(other, generated, strict=True))
    assert [p.name for p in sorted((tmp_path / "again").iterdir())] == ["web-00000.jsonl", "web-00001.jsonl"]


def test_every_line_is_a_json_object_of_valid_utf8_holding_the_text_asked_for(generated, texts) -> None:
    lines = [line for data in generated for line in data.decode("utf-8", errors="strict").split("\n")[:-1]]
    assert all(set(json.loads(line)) == {"text"} for line in lines)
    assert all(data.endswith(b"}\n") for data in generated)
    sizes = [len(t.encode()) for t in texts]
    assert MB <= sum(sizes) < MB + 2 * max(sizes)  # whole documents, each file to its share and one document past it
    assert min(sizes) > 0
    # What must be escaped is: quotes, backslashes (Windows paths), newlines (paragraphs).
    joined = "".join(texts)
    assert '"' in joined and "\\" in joined and "\n\n" in joined


def test_it_holds_every_script_numbers_urls_and_code(texts) -> None:
    joined = "".join(texts)
    for script in ("[a-z]", "[а-я]", "[α-ω]", "[\u4e00-\u9fff]", "[\u0600-\u06ff]", "[\u0900-\u097f]"):
        assert re.search(script, joined), script
    assert re.search(r"https://(www\.)?\w+\.\w+(\.\w+)?/\w+", joined)
    assert re.search(r"\b[a-z]+_[a-z]+\b", joined) and re.search(r"\b[a-z]+\.[a-z]+\([a-z]+\)", joined)
    assert re.search(r"\b[a-z]+[A-Z][a-z]+\b", joined) and re.search(r"\b\d{1,3},\d{3}\b", joined)


def test_document_lengths_follow_the_fitted_log_normal(texts) -> None:
    mu, sigma = text.lognormal([len(t.encode()) for t in texts])
    assert len(texts) > 500
    assert mu == pytest.approx(text.LENGTH_MU, abs=0.2)
    assert sigma == pytest.approx(text.LENGTH_SIGMA, abs=0.15)


def test_distinct_words_grow_as_the_fitted_heaps_law(texts) -> None:
    words = text.corpus_words(texts)
    points = np.geomspace(10_000, len(words), 8).astype(int).tolist()
    fitted = [text.HEAPS_K * n**text.HEAPS_BETA for n in points]
    assert text.distinct_words(words, points) == pytest.approx(fitted, rel=0.1)
    beta, _ = text.heaps(words)
    assert beta == pytest.approx(text.HEAPS_BETA, abs=0.04)


def test_the_constants_are_the_fit_of_the_shared_web_corpus() -> None:
    folder = shared_path("corpora", "web_commoncrawl.jsonl.gz").parent
    fitted = text.fit(text.web_texts(folder))
    assert (fitted["documents"], fitted["words"]) == (740, 464_984)
    assert [round(fitted[key], 2) for key in ("length_mu", "length_sigma", "heaps_k", "zipf_s")] == [
        text.LENGTH_MU,
        text.LENGTH_SIGMA,
        text.HEAPS_K,
        text.ZIPF_S,
    ]
    assert round(fitted["heaps_beta"], 3) == text.HEAPS_BETA
