"""The token counter counts what tokenize writes, per file and as a length histogram, and annotates records."""

from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np

from tests.support.corpus import sample_records, write_jsonl
from tests.support.stages import documents, run
from tests.support.tokenizers import EOS
from tokenization.stages.count import CountConfig, count_tokens


def test_counts_equal_what_tokenize_writes(tmp_path, sample_corpus, sample_tokenizer) -> None:
    written = run([sample_corpus], tmp_path / "tokens", sample_tokenizer, shuffle_documents=False)
    stats = count_tokens(
        CountConfig(
            inputs=[str(sample_corpus)],
            tokenizer=str(sample_tokenizer),
            eos_token=EOS,
            stats_out=str(tmp_path / "stats.json"),
            annotate=str(tmp_path / "annotated.jsonl.gz"),
        )
    ).record
    assert stats.to_json() == json.loads((tmp_path / "stats.json").read_text())
    assert stats.tokens == written["counts"]["tokens"] and stats.docs == written["counts"]["docs_written"]
    assert stats.empty == written["counts"]["empty"] == 1
    assert sum(f.tokens for f in stats.files) == stats.tokens
    assert [f.url for f in stats.files] == [i["url"] for i in written["inputs"]]
    lengths = [len(d) for d in documents(tmp_path / "tokens")]
    assert sum(b.docs for b in stats.length_histogram) == len(lengths)
    for bucket in stats.length_histogram:
        in_bucket = [n for n in lengths if bucket.min_tokens <= n <= bucket.max_tokens]
        assert bucket.docs == len(in_bucket)
    assert stats.max_tokens_per_doc == max(lengths)

    with gzip.open(tmp_path / "annotated.jsonl.gz", "rt", encoding="utf-8") as handle:
        annotated = [json.loads(line) for line in handle]
    records = sample_records()
    assert [{k: v for k, v in a.items() if k != "token_count"} for a in annotated] == records
    assert [a["token_count"] for a in annotated if a["text"]] == lengths
    assert [a["token_count"] for a in annotated if not a["text"]] == [0]


def test_eos_policy_and_bad_records_are_counted(tmp_path, sample_tokenizer) -> None:
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": "one two"}, "{bad", {"text": ""}, {"text": "three"}])
    options: dict[str, Any] = {"inputs": [str(inputs)], "tokenizer": str(sample_tokenizer), "max_reject_fraction": None}
    without = count_tokens(CountConfig(**options, no_eos=True)).record
    with_eos = count_tokens(CountConfig(**options)).record  # the tokenizer's own EOS
    assert with_eos.tokenizer.eos_token == EOS
    assert with_eos.tokens == without.tokens + 2
    assert with_eos.rejected == {"malformed_json": 1} and with_eos.files[0].rejected == 1
    assert with_eos.docs_read == 4 == with_eos.docs + with_eos.empty + 1
    assert np.isclose(with_eos.mean_tokens_per_doc, with_eos.tokens / 2)
