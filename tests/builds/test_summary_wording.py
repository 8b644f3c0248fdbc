"""The summary of a build of one file says "1 file", not "1 files"."""

from __future__ import annotations

import re

from tests.support.builds import config_of
from tokenization.builds.complete import summary
from tokenization.builds.run import Build


def test_a_build_of_one_file_says_1_file(tmp_path, sample_corpus, sample_tokenizer) -> None:
    config = config_of(sample_corpus, tmp_path, sample_tokenizer, num_ranks=1, num_context_shards=1)
    record = Build.start(config, "one").run().record
    assert len(record.files) == 1
    text = summary(record)
    assert f"tokens: {record.tokens:,} in 1 file, " in text, text
    assert "verify: passed (1 file)" in text and not re.search(r"\b1 [a-z ]*files\b", text), text
