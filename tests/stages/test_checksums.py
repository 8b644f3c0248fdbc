"""Issue 53: a stage's records give each file's BLAKE3; records of the version before gave its sha256, and are
still read and checked with it. A byte flipped in a file is caught under either, on the C helper's path and on
numpy's; the dataset's digest is made of the checksums as the records give them."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.support.checksums import as_sha256_records, digest_of, file_sums, records
from tests.support.stages import merged, run, shuffled
from tests.support.tokenizers import EOS
from tokenization.builds.accounting import dataset_digest
from tokenization.stages.verify import verify
from tokenization.storage.checksums import BLAKE3, SHA256, checksum
from tokenization.storage.folder import Folder

STAGES = ("ranks", "merged", "context")


@pytest.fixture
def stages(tmp_path, sample_corpus, sample_tokenizer, byte_path) -> Path:
    """A rank, its merge and their context shuffle, each in its folder, written on ``byte_path``."""
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=2, save_loss=True)
    merged(tmp_path / "ranks", tmp_path / "merged", seed=1, save_loss=True, merge_max_tokens_per_file=15_000)
    shuffled(tmp_path / "merged", tmp_path / "context", context_window=1025)
    return tmp_path


def checked(folder: Path, tokenizer: Path) -> list[str]:
    return verify(Folder(str(folder)), str(tokenizer), EOS).problems


def test_a_new_stage_records_each_files_blake3_and_verifies(stages, sample_tokenizer) -> None:
    for stage in STAGES:
        folder = stages / stage
        listed = [(name, entry) for path in records(folder) for name, entry in file_sums(json.loads(path.read_text()))]
        assert len(listed) >= 8, stage  # four files a family, in its manifest and its marker
        for name, entry in listed:
            data = (folder / name).read_bytes()
            assert entry == {"bytes": len(data), BLAKE3: checksum(data, BLAKE3)}, (stage, name)
        assert checked(folder, sample_tokenizer) == [], stage


def test_records_of_the_version_before_name_sha256_and_still_verify(stages, sample_tokenizer) -> None:
    for stage in STAGES:
        as_sha256_records(stages / stage)
        assert checked(stages / stage, sample_tokenizer) == [], stage


@pytest.mark.parametrize("algorithm", [BLAKE3, SHA256])
def test_a_flipped_byte_is_caught_under_either_checksum(stages, sample_tokenizer, algorithm) -> None:
    for stage in STAGES:
        folder = stages / stage
        if algorithm == SHA256:
            as_sha256_records(folder)
        marker = sorted((folder / "_completions").glob("*.json"))[0]
        name, entry = sorted(json.loads(marker.read_text())["files"].items())[0]  # a .ds
        path = folder / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        said = (
            f"{path}: differs from what _completions/{marker.name} records ({len(data)} bytes, {algorithm} "
            f"{checksum(bytes(data), algorithm)[:12]}…, not {entry['bytes']} bytes, {entry[algorithm][:12]}…)"
        )
        assert said in checked(folder, sample_tokenizer), stage


def test_the_digest_is_of_the_checksums_the_records_give(stages, sample_tokenizer) -> None:
    """A new build's digest is of its files' BLAKE3 (so not that of a build of the same bytes made before); one
    whose records give sha256 keeps the digest it was published with, which verify then finds again."""
    context, named = stages / "context", hashlib.sha256(sample_tokenizer.read_bytes()).hexdigest()
    new = dataset_digest(Folder(str(context)), named)
    assert new == digest_of(context, sample_tokenizer, BLAKE3)
    as_sha256_records(context)
    old = dataset_digest(Folder(str(context)), named)
    assert old == digest_of(context, sample_tokenizer, SHA256) and re.fullmatch("[0-9a-f]{64}", old) and old != new
