"""The bucketed global shuffle: every document once, the same bytes for the same seed, and a uniform order."""

from __future__ import annotations

from collections import Counter
from itertools import permutations

import numpy as np
import pytest

from tests.support.stages import documents, file_bytes, merged, run
from tokenization import orderings
from tokenization.builds.accounting import incomplete_ranks
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFileError
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

RANKS, BUCKETS, SEED = 3, 4, 11
CHI2_23_P001 = 49.73  # the chi-square value that 23 degrees of freedom exceed with probability 0.001


def bucketed_build(tmp_path, corpus, tokenizer, name: str) -> list[list[int]]:
    """3 ranks scattered into 4 buckets, each bucket merged on its own; the documents in the dataset's order."""
    for rank in range(RANKS):
        run(
            [corpus],
            tmp_path / name / "ranks",
            tokenizer,
            rank=rank,
            world_size=RANKS,
            seed=SEED,
            num_buckets=BUCKETS,
            save_loss=True,
        )
    for bucket in range(BUCKETS):
        merged(
            tmp_path / name / "ranks",
            tmp_path / name / "merged",
            save_filename="corpus",
            seed=SEED,
            merge_mode="bucketed",
            bucket=bucket,
            save_loss=True,
            merge_max_tokens_per_file=8_000,
        )
    return documents(tmp_path / name / "merged")


def test_every_document_once_in_every_bucket_and_the_same_bytes_again(tmp_path, sample_corpus, sample_tokenizer):
    unshuffled = []
    for rank in range(RANKS):
        plain = tmp_path / "plain" / str(rank)
        run([sample_corpus], plain, sample_tokenizer, rank=rank, world_size=RANKS, shuffle_documents=False)
        unshuffled += documents(plain)
    got = bucketed_build(tmp_path, sample_corpus, sample_tokenizer, "first")
    assert sorted(map(tuple, got)) == sorted(map(tuple, unshuffled)) and len(got) == 308
    names = sorted(p.name for p in (tmp_path / "first" / "merged").glob("*.ds"))
    assert {name[:5] for name in names} == {f"{b:05d}" for b in range(BUCKETS)}  # every bucket wrote files
    assert names == sorted(names, key=lambda n: (int(n[:5]), n))  # the sorted names read bucket after bucket
    assert not (tmp_path / "first" / "merged" / "corpus.ds.metadata").exists()  # no bucket knows the total

    # the order is the one the documented streams give: rank files gathered in rank order, then permuted
    expected = []
    for bucket in range(BUCKETS):
        gathered = []
        for rank in range(RANKS):
            docs = documents(tmp_path / "plain" / str(rank))
            drawn = orderings.bucket_of(SEED, rank, len(docs), BUCKETS)
            gathered += [d for d, b in zip(docs, drawn, strict=True) if b == bucket]
        expected += [gathered[i] for i in orderings.bucket_order(SEED, bucket, len(gathered))]
    assert got == expected

    assert bucketed_build(tmp_path, sample_corpus, sample_tokenizer, "second") == got
    assert file_bytes(tmp_path / "second" / "merged") == file_bytes(tmp_path / "first" / "merged")


def test_a_bucket_outside_the_ranks_buckets_or_ranks_without_buckets_are_refused(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=1, num_buckets=2)
    with pytest.raises(UsageError, match=r"bucket 2 is outside 0..1: the ranks drew 2 buckets"):
        merged(tmp_path / "ranks", tmp_path / "out", merge_mode="bucketed", bucket=2)
    run([sample_corpus], tmp_path / "plain", sample_tokenizer, seed=1)
    with pytest.raises(TokenFileError, match=r"a bucketed merge needs ranks of one num_buckets, found None"):
        merged(tmp_path / "plain", tmp_path / "out", merge_mode="bucketed", bucket=0)
    with pytest.raises(UsageError, match="merge_mode bucketed and bucket go together"):
        MergeConfig(input="i", output="o", save_filename="m", merge_mode="bucketed")


def test_each_bucket_has_its_own_folder_which_its_merge_alone_reads(tmp_path, sample_corpus, sample_tokenizer):
    """A prefix a bucket: on S3 each bucket's merge lists only its own files, and each prefix gets its own request
    rate. The sensor and verify find the files there; a leftover stops only its own bucket's merge."""
    ranks = tmp_path / "ranks"
    for rank in range(2):
        run([sample_corpus], ranks, sample_tokenizer, rank=rank, world_size=2, seed=SEED, num_buckets=2)
    assert not list(ranks.glob("*.ds*"))
    for bucket in range(2):
        held = sorted(p.name for p in (ranks / f"bucket{bucket:05d}").iterdir())
        assert held == [
            f"{r:05d}_00000_bucket{bucket:05d}.ds{x}" for r in range(2) for x in ("", ".index", ".metadata")
        ]
    assert incomplete_ranks(Folder(str(ranks)), 2) == {} and verify(Folder(str(ranks))).ok

    leftover = ranks / "bucket00001" / "00007_00000_bucket00001.ds"
    leftover.write_bytes(b"")
    merged(ranks, tmp_path / "merged", seed=SEED, merge_mode="bucketed", bucket=0)
    with pytest.raises(TokenFileError, match=r"bucket00001/00007_00000_bucket00001.ds: no completion marker lists it"):
        merged(ranks, tmp_path / "merged", seed=SEED, merge_mode="bucketed", bucket=1)
    leftover.unlink()
    (ranks / "bucket00001" / "00001_00000_bucket00001.ds.index").write_bytes(b"\0" * 8)
    assert incomplete_ranks(Folder(str(ranks)), 2) == {
        1: "bucket00001/00001_00000_bucket00001.ds.index is missing or not the size its completion marker records"
    }
    assert "bucket00001/00001_00000_bucket00001.ds.index" in "\n".join(verify(Folder(str(ranks))).problems)


def final_orders(order_of, seeds: int) -> Counter:
    return Counter(tuple(order_of(seed)) for seed in range(seeds))


def chi_square(counts: Counter, trials: int) -> float:
    """Pearson's statistic of the orders of 4 documents against 24 equally likely ones."""
    expected = trials / 24
    return sum((counts.get(p, 0) - expected) ** 2 / expected for p in permutations(range(4)))


def test_bucketed_is_uniform_and_datatroves_interleave_is_not() -> None:
    """4 documents on 2 ranks, over 24,000 seeds: every one of the 24 orders comes up as often as chance allows
    with buckets; datatrove's interleave reaches only half of them (both ranks draw the same in-rank order)."""
    rank_docs = [[0, 1], [2, 3]]

    def bucketed(seed: int) -> list[int]:
        final = []
        for bucket in range(3):
            gathered = [
                d
                for r, docs in enumerate(rank_docs)
                for d, b in zip(docs, orderings.bucket_of(seed, r, len(docs), 3), strict=True)
                if b == bucket
            ]
            final += [gathered[i] for i in orderings.bucket_order(seed, bucket, len(gathered))]
        return final

    def interleave(seed: int) -> list[int]:  # datatrove: each rank default_rng(seed), then the merge's file draw
        shuffled = [[docs[i] for i in np.random.default_rng(seed).permutation(len(docs))] for docs in rank_docs]
        file_ids = np.repeat(np.arange(2), 2)
        np.random.default_rng(seed).shuffle(file_ids)
        cursors = [iter(docs) for docs in shuffled]
        return [next(cursors[f]) for f in file_ids]

    trials = 24_000
    assert chi_square(final_orders(bucketed, trials), trials) < CHI2_23_P001
    assert chi_square(final_orders(interleave, trials), trials) > 10 * CHI2_23_P001


def test_a_bucket_task_resumes_and_never_touches_another_buckets_files(tmp_path, sample_corpus, sample_tokenizer):
    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=SEED, num_buckets=2)
    options = {"save_filename": "corpus", "seed": SEED, "merge_mode": "bucketed"}
    first = merged(tmp_path / "ranks", tmp_path / "merged", bucket=0, merge_max_tokens_per_file=5_000, **options)
    merged(tmp_path / "ranks", tmp_path / "merged", bucket=1, merge_max_tokens_per_file=5_000, **options)
    others = {p.name: p.read_bytes() for p in (tmp_path / "merged").glob("00001_*")}
    again = merged(tmp_path / "ranks", tmp_path / "merged", bucket=0, merge_max_tokens_per_file=5_000, **options)
    assert again["counts"]["resumed_files"] == len(first["outputs"]) >= 2  # the same bucket: all kept
    merged(tmp_path / "ranks", tmp_path / "merged", bucket=0, merge_max_tokens_per_file=9_000, **options)  # starts over
    assert {p.name: p.read_bytes() for p in (tmp_path / "merged").glob("00001_*")} == others
    assert sorted(documents(tmp_path / "merged")) == sorted(documents(tmp_path / "ranks", "bucket*/*.ds"))
