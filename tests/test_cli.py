"""The command line contract: names, exit codes, one-line errors, summaries and inspect."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import EOS, write_jsonl


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenization.cli", *args], capture_output=True, text=True)


def test_tokenize_then_inspect(tmp_path, sample_corpus, sample_tokenizer) -> None:
    out = tmp_path / "out"
    done = cli("tokenize", str(sample_corpus), "--output", str(out), "--tokenizer", str(sample_tokenizer),
               "--eos-token", EOS, "--seed", "3", "--rank", "1", "--world-size", "2", "--save-filename", "demo",
               "--save-loss", "--max-tokens-per-file", "20000")  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("rank 1/2: ") and " 0 rejected, " in summary and " 0 dropped, " in summary
    assert sorted(p.name for p in out.glob("*.ds")) == [
        "demo_00001_00000_doc_shuffled.ds",
        "demo_00001_00001_doc_shuffled.ds",
    ]

    shown = cli("inspect", str(out), "--decode", "1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{out}/demo_00001_00000_doc_shuffled.ds: ") and "uint16, loss" in lines[0]
    assert lines[2].startswith("total: 2 files, ")
    assert lines[3].startswith(f"--- {out}/demo_00001_00000_doc_shuffled.ds document 0 (")
    assert shown.stdout.rstrip().endswith(EOS)


def test_errors_are_one_line_with_exit_1(tmp_path, sample_corpus, sample_tokenizer) -> None:
    done = cli("tokenize", str(sample_corpus), "--output", str(tmp_path), "--tokenizer", str(sample_tokenizer),
               "--eos-token", "</s>")  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: EOS token '</s>' is not in the vocabulary of {sample_tokenizer} (special tokens: {EOS})"
    ]
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes((sample_corpus / "part-00000.jsonl.gz").read_bytes()[:5000])
    done = cli("tokenize", str(truncated), "--output", str(tmp_path / "o"), "--tokenizer", str(sample_tokenizer))
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {truncated}: corrupt or truncated gzip data after line ")
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{nope"] * 3)
    done = cli("tokenize", str(bad), "--output", str(tmp_path / "b"), "--tokenizer", str(sample_tokenizer),
               "--max-rejects", "1")  # fmt: skip
    assert done.returncode == 1 and "exceed max_rejects=1" in done.stderr


def test_usage_errors_exit_2(sample_tokenizer) -> None:
    assert cli("tokenize", "x", "--tokenizer", str(sample_tokenizer)).returncode == 2  # no --output
    assert cli("tokenize", "x", "--output", "o", "--tokenizer", "t", "--max-tokens-per-file", "0").returncode == 2
    assert cli("frobnicate").returncode == 2


def test_engine_and_threads_reach_the_stats(tmp_path, sample_corpus, sample_tokenizer) -> None:
    engines = {}
    for engine in ("auto", "hf"):
        stats = tmp_path / f"{engine}.json"
        done = cli("count", str(sample_corpus), "--tokenizer", str(sample_tokenizer), "--eos-token", EOS,
                   "--engine", engine, "--threads", "1", "--stats-out", str(stats))  # fmt: skip
        assert done.returncode == 0, done.stderr
        engines[engine] = json.loads(stats.read_text())
    assert [engines[e]["tokenizer"]["engine"] for e in ("auto", "hf")] == ["tiktoken", "hf"]
    assert engines["auto"]["tokens"] == engines["hf"]["tokens"] == 64522
    assert engines["auto"]["tokenizer"]["self_checked_docs"] == 5  # documents 0, 64, ..., 256 of 308
    assert cli("count", str(sample_corpus), "--tokenizer", str(sample_tokenizer), "--threads", "0").returncode == 2
