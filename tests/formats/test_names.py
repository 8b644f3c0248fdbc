"""What files are called: datatrove's names, and a rank's clean-up pattern that finds every one of them."""

from __future__ import annotations

from tokenization.formats.names import (
    RankFileKind,
    bucket_file_name,
    merge_stem,
    merged_file_name,
    rank_file_name,
    rank_file_pattern,
    rank_stem,
    working_file_name,
)


def test_names_are_datatroves() -> None:
    assert rank_stem(3) == "00003" and rank_stem(3, "web") == "web_00003"
    assert rank_file_name("web_00003", 1, RankFileKind.DOC_SHUFFLED) == "web_00003_00001_doc_shuffled.ds"
    assert rank_file_name("00000", 0, RankFileKind.UNSHUFFLED, ".bin") == "00000_00000_unshuffled.bin"
    assert bucket_file_name("00002", 0, 7) == "00002_00000_bucket00007.ds"
    assert working_file_name(RankFileKind.CHUNK_SHUFFLED) == "chunk_shuffled.ds"
    assert f"{RankFileKind.UNSHUFFLED}" == str(RankFileKind.UNSHUFFLED) == "unshuffled"
    assert merged_file_name("corpus", 4, 3) == "004_corpus.ds" and merge_stem("corpus") == "corpus"
    assert merged_file_name("corpus", 4, 3, bucket=2) == "00002_004_corpus.ds"
    assert merge_stem("corpus", 2) == "corpus_bucket00002"


def test_the_rank_pattern_finds_every_file_of_its_rank_and_no_other() -> None:
    pattern = rank_file_pattern("web_00003")
    ours = [
        rank_file_name("web_00003", 2, kind, suffix)
        for kind in list(RankFileKind)[:3]
        for suffix in (".ds", ".bin", ".idx")
    ]
    ours += [f"{name}{member}" for name in ours if name.endswith(".ds") for member in (".index", ".loss", ".metadata")]
    ours += [bucket_file_name("web_00003", 0, 65_535), bucket_file_name("web_00003", 0, 1) + ".index"]
    ours += ["web_00003_doc_shuffled.ds"]  # a family of before sub-files
    assert all(pattern.fullmatch(name) for name in ours)
    others = ["web_00013_00000_doc_shuffled.ds", "00003_00000_doc_shuffled.ds", "web_00003_00000_shuffled.ds"]
    others += ["web_00003_00000_doc_shuffled.json", "004_corpus.ds"]
    assert not any(pattern.fullmatch(name) for name in others)
