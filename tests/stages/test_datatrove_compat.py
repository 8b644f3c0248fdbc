"""Byte compatibility with datatrove 0.10.1's DocumentTokenizer (with JsonlReader), run side by side.

The sample-corpus tests always run; the real-corpus ones need ``../shared/data`` and skip without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import shared_path
from tests.support.references import run_datatrove
from tests.support.stages import file_bytes, run
from tests.support.tokenizers import EOS

RSS_LIMIT_MB = 500


# Runs the CLI and reports the process's own peak RSS (VmHWM, in KiB: ru_maxrss would include the parent's,
# which Linux carries over exec) on its last line of stdout.
CLI_WITH_PEAK_RSS = (
    "import sys; from tokenization.cli import main; code = main(sys.argv[1:]); "
    "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))); sys.exit(code)"
)


def run_cli_ranks(inputs: Path, output: Path, tokenizer: Path, ranks: int, *extra: str) -> float:
    """Tokenize every rank through the CLI, each in its own process; returns the largest peak RSS in MB."""
    peaks = []
    for rank in range(ranks):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                CLI_WITH_PEAK_RSS,
                "tokenize",
                str(inputs),
                "--output",
                str(output),
                "--tokenizer",
                str(tokenizer),
                "--eos-token",
                EOS,
                "--seed",
                "1234",
                "--rank",
                str(rank),
                "--world-size",
                str(ranks),
                *extra,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        peaks.append(int(done.stdout.split()[-1]) / 1024)
    return max(peaks)


def assert_same_files(ours: Path, theirs: Path, suffixes=(".ds", ".ds.index", ".ds.loss", ".ds.metadata")) -> None:
    expected = {k: v for k, v in file_bytes(theirs).items() if k.endswith(suffixes)}
    assert expected, f"datatrove wrote nothing in {theirs}"
    actual = {k: v for k, v in file_bytes(ours).items() if k.endswith(suffixes)}
    assert actual.keys() == expected.keys()
    for name in expected:
        assert actual[name] == expected[name], f"{name} differs from datatrove's"


def test_sample_doc_shuffle_with_loss(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run_datatrove(sample_corpus, tmp_path / "dt", sample_tokenizer, 2, seed=1234, save_loss_metadata=True)
    for rank in range(2):
        run(
            [sample_corpus],
            tmp_path / "ours",
            sample_tokenizer,
            rank=rank,
            world_size=2,
            seed=1234,
            save_loss=True,
            special_text="special",
        )
    # datatrove crops documents whose no-loss range reaches the end; the sample's ranges end mid-text.
    assert_same_files(tmp_path / "ours", tmp_path / "dt")


def test_a_tokenizer_path_through_a_symlink_is_written_as_datatrove_writes_it(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    """datatrove writes the tokenizer's path as given; a link to the sample's folder is how a Hugging Face hub
    cache, or a clone whose ../shared is a link, names it."""
    linked = tmp_path / "link"
    linked.symlink_to(sample_tokenizer.parent, target_is_directory=True)
    tokenizer = linked / sample_tokenizer.name
    run_datatrove(sample_corpus, tmp_path / "dt", tokenizer, 1, seed=7)
    run([sample_corpus], tmp_path / "ours", tokenizer, seed=7, special_text="special")
    assert_same_files(tmp_path / "ours", tmp_path / "dt", (".ds", ".ds.index", ".ds.metadata"))
    assert (tmp_path / "ours" / "00000_00000_doc_shuffled.ds.metadata").read_text().startswith(f"{tokenizer}|2\n")


def test_sample_chunk_shuffle_matches_when_the_tail_is_dropped(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run_datatrove(sample_corpus, tmp_path / "dt", sample_tokenizer, 1, seed=99, shuffle_chunk_size=512)
    run(
        [sample_corpus],
        tmp_path / "ours",
        sample_tokenizer,
        seed=99,
        shuffle_chunk_size=512,
        drop_last_chunk=True,
        special_text="special",
    )
    assert_same_files(tmp_path / "ours", tmp_path / "dt", (".ds", ".ds.index"))


def test_sample_max_tokens_per_file_matches_without_the_empty_trailing_file(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    run_datatrove(sample_corpus, tmp_path / "dt", sample_tokenizer, 1, seed=5, max_tokens_per_file=4000)
    run([sample_corpus], tmp_path / "ours", sample_tokenizer, seed=5, max_tokens_per_file=4000, special_text="special")
    theirs = file_bytes(tmp_path / "dt")
    last = max(k for k in theirs if k.endswith(".ds"))
    if theirs[last] == b"":  # datatrove's defect: a 0-token sub-file after the last document
        theirs = {k: v for k, v in theirs.items() if not k.startswith(last)}
    assert file_bytes(tmp_path / "ours") == theirs


def test_gpt2_three_ranks_with_and_without_loss_on_real_corpora(tmp_path) -> None:
    corpora = _corpora_without_instruct(tmp_path)
    tokenizer = shared_path("tokenizers", "gpt2", "tokenizer.json")
    run_datatrove(corpora, tmp_path / "dt", tokenizer, 3, seed=1234, save_loss_metadata=True)
    peak_mb = run_cli_ranks(corpora, tmp_path / "loss", tokenizer, 3, "--save-loss")
    run_cli_ranks(corpora, tmp_path / "plain", tokenizer, 3)
    assert_same_files(tmp_path / "loss", tmp_path / "dt")
    assert_same_files(tmp_path / "plain", tmp_path / "dt", (".ds", ".ds.index", ".ds.metadata"))
    assert peak_mb < RSS_LIMIT_MB, f"a rank peaked at {peak_mb:.0f} MB"


def test_llama3_uint32_three_ranks_on_real_corpora(tmp_path) -> None:
    corpora = _corpora_without_instruct(tmp_path)
    tokenizer = shared_path("tokenizers", "llama3", "tokenizer.json")
    run_datatrove(corpora, tmp_path / "dt", tokenizer, 3, seed=1234, eos="<|end_of_text|>")
    for rank in range(3):
        run([corpora], tmp_path / "ours", tokenizer, rank=rank, world_size=3, seed=1234, eos_token="<|end_of_text|>")
    assert_same_files(tmp_path / "ours", tmp_path / "dt", (".ds", ".ds.index", ".ds.metadata"))
    assert (tmp_path / "ours" / "00000_00000_doc_shuffled.ds.metadata").read_text().split("\n")[0].endswith("|4")


def _corpora_without_instruct(tmp_path: Path) -> Path:
    """The shared corpora with a text field (the instruct file has prompt/response instead)."""
    source = shared_path("corpora")
    folder = tmp_path / "corpora"
    folder.mkdir()
    for path in sorted(source.glob("*.jsonl.gz")):
        if not path.name.startswith("instruct_"):
            (folder / path.name).symlink_to(path)
    if not any(folder.iterdir()):
        pytest.skip(f"no corpora in {source}")
    return folder
