"""``tokenization verify RUN_DIR`` checks the chain that publish checked, from the records that stay after publish
(the token files of ranks/ and merged/ are gone by then): a stage folder's records against each other, the contents
from the ranks through the merge to the context shuffle, and what ``_BUILD.json`` records of every stage. A forger
who rewrites one stage's records and every checksum over them to match is caught on a link of the chain."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.builds.test_footprint import config_for
from tests.support.builds import copy_of, published_run
from tests.support.checksums import resum
from tests.support.processes import cli
from tokenization.builds.accounting import dataset_digest
from tokenization.builds.run import Build
from tokenization.formats.contents import ContentsHasher
from tokenization.records import ContentsSum
from tokenization.storage.folder import Folder

MASK = (1 << 64) - 1
EOS_ID = 0  # the sample tokenizer's


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A build published with its defaults (the token files of ranks/ and merged/ removed)."""
    return published_run(Build.start(config_for(tmp_path_factory.mktemp("chain"), num_ranks=2), "night"))


@pytest.fixture
def run_dir(built, tmp_path) -> Path:
    return copy_of(built, tmp_path)


def verified(path: Path) -> tuple[int, list[str]]:
    done = cli("verify", str(path))
    return done.returncode, done.stdout.splitlines()


def rewritten(folder: Path, stem: str, edit: Callable[[dict], None]) -> None:
    """A stage manifest edited, and its completion marker's checksum made to match it."""
    path, marker_path = folder / "_manifests" / f"{stem}.json", folder / "_completions" / f"{stem}.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    marker = json.loads(marker_path.read_text())
    marker["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    marker_path.write_text(json.dumps(marker, sort_keys=True))


def shifted(contents: dict, by: int = 1) -> None:
    contents["sum"] = f"{(int(contents['sum'], 16) + by) & MASK:016x}"


def test_a_published_build_verifies_with_its_whole_chain(run_dir) -> None:
    status, lines = verified(run_dir)
    assert status == 0 and lines[-1].endswith("4 files, 64,522 tokens: OK"), lines


def test_a_merge_whose_records_say_it_read_other_pieces_than_the_ranks_wrote_fails(run_dir) -> None:
    """The merge's records rewritten to say it read and wrote other pieces, its entries, checkpoint and marker made
    to match: the merge's folder alone still adds up (its token files are gone), but the chain does not."""
    merged = run_dir / "merged"

    def edit(manifest: dict) -> None:
        shifted(manifest["counts"]["contents_in"])
        shifted(manifest["counts"]["contents_out"])
        shifted(manifest["outputs"][0]["contents"])

    rewritten(merged, "corpus", edit)
    checkpoint = merged / "_manifests" / "000_corpus.json"
    data = json.loads(checkpoint.read_text())
    shifted(data["contents"])
    checkpoint.write_text(json.dumps(data, indent=2, sort_keys=True))
    assert verified(merged)[0] == 0  # its records agree with each other
    status, lines = verified(run_dir)
    ranks = json.loads((run_dir / "_BUILD.json").read_text())["stages"]["tokenize"]["contents_out"]
    assert status == 1
    assert [line for line in lines if " pieces, " in line] == [
        f"{run_dir}: the merge read 308 pieces, 64,522 tokens, sum {(int(ranks['sum'], 16) + 1) & MASK:016x}, but "
        f"the ranks wrote 308 pieces, 64,522 tokens, sum {ranks['sum']}: a piece was lost, duplicated or changed "
        "on the way"
    ]


def test_a_dataset_forged_with_its_records_and_digest_fails_on_what_the_build_recorded(run_dir) -> None:
    """Two tokens of a context file exchanged, and every record over it rewritten to match (its entry's contents and
    sha256, the shard's contents written, its marker, ``_BUILD.json``'s digest): only the contents ``_BUILD.json``
    records of the context shuffle can tell."""
    context = run_dir / "context"
    ds = context / "000_corpus.ds"
    tokens, loss = np.fromfile(ds, "<u2"), np.fromfile(context / "000_corpus.ds.loss", np.uint8)
    swappable = (tokens[:-1] != tokens[1:]) & (loss[:-1] == loss[1:]) & (tokens[:-1] != EOS_ID) & (tokens[1:] != EOS_ID)
    first = int(np.flatnonzero(swappable)[0])
    tokens[[first, first + 1]] = tokens[[first + 1, first]]  # ids, document ends and loss bytes all as they were
    tokens.tofile(ds)
    ends = np.fromfile(context / "000_corpus.ds.index", "<u8").astype(np.int64)
    hasher = ContentsHasher()
    hasher.add(tokens, ends, loss)
    held = ContentsSum.of(hasher.result()).to_json()
    owner = next(
        path.stem
        for path in (context / "_manifests").glob("*.json")
        if any(entry["name"] == ds.name for entry in json.loads(path.read_text())["outputs"])
    )

    change = {}

    def edit(manifest: dict) -> None:
        (entry,) = [entry for entry in manifest["outputs"] if entry["name"] == ds.name]
        change["by"] = int(held["sum"], 16) - int(entry["contents"]["sum"], 16)
        entry["contents"] = held
        resum(entry["files"][ds.name], ds.read_bytes())
        shifted(manifest["counts"]["contents_out"], change["by"])

    rewritten(context, owner, edit)
    marker_path = context / "_completions" / f"{owner}.json"
    marker = json.loads(marker_path.read_text())
    resum(marker["files"][ds.name], ds.read_bytes())
    marker_path.write_text(json.dumps(marker, sort_keys=True))
    build_path = run_dir / "_BUILD.json"
    record = json.loads(build_path.read_text())
    record["digest"] = dataset_digest(Folder(str(context)), record["tokenizer"]["sha256"])
    build_path.write_text(json.dumps(record, indent=2))
    assert verified(context)[0] == 0  # the dataset's folder alone holds what its records say
    status, lines = verified(run_dir)
    assert status == 1
    recorded = ContentsSum(**record["stages"]["context_shuffle"]["contents_out"]).value
    assert [line for line in lines if "_BUILD.json" in line] == [
        f"{build_path}: records context_shuffle contents_out {recorded.describe()}, but its stage records say "
        f"{replace(recorded, sum=(recorded.sum + change['by']) & MASK).describe()}"
    ]


def removed_manifest(run_dir: Path, stage: str, stem: str) -> str:
    (run_dir / stage / "_manifests" / f"{stem}.json").unlink()
    return (
        f"{run_dir / stage}/_completions/{stem}.json: no stage manifest _manifests/{stem}.json: a marker copied from "
        "elsewhere, or its manifest was removed"
    )


def changed_checkpoint(run_dir: Path, stage: str, stem: str) -> str:
    checkpoint = run_dir / stage / "_manifests" / f"{stem}.json"
    data = json.loads(checkpoint.read_text())
    data["units_end"] += 1  # a resumed merge would start one unit late
    checkpoint.write_text(json.dumps(data, indent=2, sort_keys=True))
    return (
        f"{checkpoint}: differs from the checkpoint of {stem}.ds, which _manifests/corpus.json lists: a resumed merge "
        "would start from it"
    )


@pytest.mark.parametrize(
    ("damage", "stage", "stem"),
    [
        (removed_manifest, "merged", "corpus"),
        (removed_manifest, "ranks", "00000"),
        (changed_checkpoint, "merged", "001_corpus"),
    ],
)
def test_a_stage_folders_records_are_checked_though_its_token_files_are_gone(run_dir, damage, stage, stem) -> None:
    expected = damage(run_dir, stage, stem)
    for path in (run_dir / stage, run_dir):
        status, lines = verified(path)
        assert status == 1 and expected in lines, lines


def test_a_flipped_rank_marker_fails_the_runs_verify(run_dir) -> None:
    marker_path = run_dir / "ranks" / "_completions" / "00001.json"
    marker = json.loads(marker_path.read_text())
    marker["sha256"] = "0" * 64
    marker_path.write_text(json.dumps(marker, sort_keys=True))
    status, lines = verified(run_dir)
    assert status == 1
    assert f"{run_dir}/ranks/_manifests/00001.json: differs from the checksum its completion marker records" in lines


def test_ranks_whose_documents_do_not_add_up_fail_the_runs_verify(run_dir) -> None:
    """A rank's records rewritten to say it read a document more, its marker made to match."""

    def edit(manifest: dict) -> None:
        manifest["counts"]["docs_read"] += 1

    rewritten(run_dir / "ranks", "00001", edit)
    status, lines = verified(run_dir)
    assert status == 1
    assert [line for line in lines if "conserved" in line] == [
        f"{run_dir}/ranks: documents are not conserved: 310 read, 308 written + 1 empty + 0 quarantined"
    ], lines
