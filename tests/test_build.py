"""A build's folder belongs to one run, reads only what that run's ranks wrote, and adds up token for token."""

from __future__ import annotations

import shutil

import orjson
import pytest

from tests.test_merge import merged
from tests.test_tokenize import run
from tokenization import manifest
from tokenization.build import (
    BuildError,
    Layout,
    claim_run_folder,
    incomplete_ranks,
    rank_manifests,
    run_folder,
    stage_counts,
    token_flow,
)
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFileError


def test_run_ids_map_to_folders_one_to_one() -> None:
    """Finding 2: ':' and '+' both became '-', so 'qa:col' and 'qa-col' shared a folder."""
    ids = ["qa-col", "qa:col", "qa+col", "qa%3Acol", "scheduled__2026-11-30T02:00:00+00:00", ".hidden", "a~b"]
    folders = [run_folder("/builds", run_id) for run_id in ids]
    assert len(set(folders)) == len(ids)
    assert folders[:2] == ["/builds/qa-col", "/builds/qa%3Acol"]
    assert folders[4] == "/builds/scheduled__2026-11-30T02%3A00%3A00%2B00%3A00"
    assert folders[5] == "/builds/%2Ehidden" and folders[6] == "/builds/a~b"
    for bad in ["", ".", ".."]:
        with pytest.raises(UsageError, match="cannot name a folder"):
            run_folder("/builds", bad)


def test_a_folder_of_another_run_is_refused(tmp_path) -> None:
    folder = str(tmp_path / "run")
    claim_run_folder(folder, "nightly")
    claim_run_folder(folder, "nightly")  # a retry of the same run
    with pytest.raises(BuildError, match=r"holds the output of run 'nightly', not of 'manual': two runs never share"):
        claim_run_folder(folder, "manual")
    (tmp_path / "unclaimed").mkdir()
    (tmp_path / "unclaimed" / "ranks").mkdir()
    with pytest.raises(BuildError, match=r"unclaimed already holds ranks, which no run claims"):
        claim_run_folder(str(tmp_path / "unclaimed"), "manual")


@pytest.fixture
def three_then_two(tmp_path, sample_corpus, sample_tokenizer):
    """Finding 2's worst case: a 3-rank run, then a 2-rank run into the same folder."""
    ranks = tmp_path / "ranks"
    for rank in range(3):
        run([sample_corpus], ranks, sample_tokenizer, rank=rank, world_size=3, seed=5)
    for rank in range(2):
        run([sample_corpus], ranks, sample_tokenizer, rank=rank, world_size=2, seed=5)
    return ranks


def test_a_leftover_rank_is_never_merged(tmp_path, three_then_two) -> None:
    with pytest.raises(BuildError, match=r"not ranks of this 2-rank run: \['00002'\]"):
        incomplete_ranks(str(three_then_two), 2)
    (three_then_two / "_completions" / "00002.json").unlink()  # an unfinished attempt leaves files, no marker
    with pytest.raises(TokenFileError, match=r"00002_00000_doc_shuffled.ds: no completion marker lists it"):
        merged(three_then_two, tmp_path / "merged", seed=5)
    assert incomplete_ranks(str(three_then_two), 2) == {}


def test_tokens_must_add_up_from_stage_to_stage(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Finding 2's symptom: 16,729 tokens published while the ranks' own tally counted 3."""
    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=5)
    merged(tmp_path / "ranks", tmp_path / "merged", seed=5)
    layout = Layout(str(tmp_path))
    ranks_total = sum(m["counts"]["tokens_written"] for m in rank_manifests(layout.ranks, 2))
    stages = {"merge": stage_counts(layout.merged), "context_shuffle": stage_counts(layout.context)}
    assert stages["context_shuffle"] is None
    assert token_flow(ranks_total, stages, ranks_total) == {"tokenize": ranks_total, "merge": ranks_total}
    with pytest.raises(BuildError, match=f"merge wrote {ranks_total} tokens and dropped 0, but was given 3"):
        token_flow(3, stages, ranks_total)
    with pytest.raises(BuildError, match=f"the dataset's files hold 16729 tokens, its manifests say {ranks_total}"):
        token_flow(ranks_total, stages, 16_729)


def test_a_copied_in_family_is_not_read(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=5)
    run([sample_corpus], tmp_path / "other", sample_tokenizer, seed=6, save_filename="x")
    for path in (tmp_path / "other").glob("x_*.ds*"):
        shutil.copy(path, tmp_path / "ranks" / path.name)
    with pytest.raises(TokenFileError, match=r"ranks/x_00000_00000_doc_shuffled.ds: no completion marker lists it"):
        manifest.token_files(str(tmp_path / "ranks"))
    marker = orjson.loads((tmp_path / "ranks" / "_completions" / "00000.json").read_bytes())
    assert sorted(marker["files"]) == sorted(p.name for p in (tmp_path / "ranks").glob("00000_*"))
