"""A mixture's ``.source`` sidecar is inside the proof: each piece's source is part of its contents, from the ranks
through the merge to the context shuffle, and verify totals the sources again against ``_BUILD.json``. A sidecar
relabelled, or two of its entries swapped, with its sha256 rewritten wherever a record holds it, fails verify,
naming the file (and the source whose totals moved)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.builds.test_mixtures import config, spec, write_sources
from tests.builds.test_verify_chain import verified
from tests.support.builds import copy_of, published_run
from tests.support.checksums import resum
from tokenization.builds.accounting import dataset_digest
from tokenization.builds.run import Build
from tokenization.formats.contents import ContentsHasher, factors, sourced
from tokenization.formats.ds import TokenFileError
from tokenization.records import Contents
from tokenization.storage.folder import Folder


def test_a_pieces_source_is_part_of_its_contents() -> None:
    """Per piece, after its hash: a piece relabelled or two swapped change the sum; a stream of one source is its
    plain contents times its source's factor; a stream without sources keeps its contents."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50_000, 5_000).astype(np.uint16)
    ends = np.append(np.sort(rng.choice(np.arange(1, 5_000), 40, replace=False)), 5_000)
    sources = rng.integers(0, 3, len(ends)).astype(np.uint8)

    def held(given: np.ndarray | None) -> Contents:
        hasher = ContentsHasher(sources=given)
        hasher.add(tokens, ends)
        return hasher.result()

    plain, mixed = held(None), held(sources)
    assert (mixed.pieces, mixed.tokens) == (plain.pieces, plain.tokens) and mixed.sum != plain.sum
    relabelled = sources.copy()
    relabelled[7] = (relabelled[7] + 1) % 3
    assert held(relabelled) != mixed
    k = int(np.flatnonzero(sources != sources[0])[0])
    swapped = sources.copy()
    swapped[[0, k]] = swapped[[k, 0]]
    assert held(swapped) != mixed
    assert held(np.full(len(ends), 2, np.uint8)) == sourced(plain, 2)
    assert len(set(factors(np.arange(256)).tolist())) == 256 and all(f & 1 for f in factors(np.arange(256)).tolist())


DATASETS = {"context": {}, "merged": {"context_window": 0}}  # the dataset: windows, or the merge's files


@pytest.fixture(scope="module", params=list(DATASETS))
def mixed_build(request, tmp_path_factory, sample_tokenizer) -> Path:
    root = tmp_path_factory.mktemp("mixture-proof")
    inputs = write_sources(root / "sources")
    built = config(root, sample_tokenizer, spec(inputs, 60_000), **DATASETS[request.param])
    return published_run(Build.start(built, "mix"))


@pytest.fixture
def run_dir(mixed_build, tmp_path) -> Path:
    return copy_of(mixed_build, tmp_path)


def dataset_of(run_dir: Path) -> Path:
    return run_dir / json.loads((run_dir / "_BUILD.json").read_text())["dataset"].rsplit("/", 1)[1]


def forged_sidecar(run_dir: Path, change) -> tuple[Path, str]:
    """The dataset's first ``.source`` sidecar changed by ``change(sources)``, and its checksum rewritten wherever a
    record holds it (its stage manifest's entry, a merge's checkpoint, its completion marker, and the marker's
    checksum of the manifest) and in ``_BUILD.json``'s digest; returns the sidecar and its family's name."""
    dataset = dataset_of(run_dir)
    sidecar = sorted(dataset.glob("*.ds.source"))[0]
    sources = np.fromfile(sidecar, np.uint8)
    change(sources)
    sources.tofile(sidecar)
    for path in sorted((dataset / "_manifests").glob("*.json")):
        data = json.loads(path.read_text())
        entries = data.get("outputs", [data])  # a stage manifest's, or a checkpoint
        listing = [entry for entry in entries if sidecar.name in entry["files"]]
        if not listing:
            continue
        resum(listing[0]["files"][sidecar.name], sidecar.read_bytes())
        path.write_text(json.dumps(data, indent=2, sort_keys=True))
        marker_path = dataset / "_completions" / path.name
        if marker_path.exists():
            marker = json.loads(marker_path.read_text())
            resum(marker["files"][sidecar.name], sidecar.read_bytes())
            marker["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            marker_path.write_text(json.dumps(marker, sort_keys=True))
    record_path = run_dir / "_BUILD.json"
    record = json.loads(record_path.read_text())
    record["digest"] = dataset_digest(Folder(str(dataset)), record["tokenizer"]["sha256"])
    record_path.write_text(json.dumps(record, indent=2))
    return sidecar, sidecar.name.removesuffix(".source")


def test_a_mixture_verifies(run_dir) -> None:
    status, lines = verified(run_dir)
    assert status == 0 and lines[-1].endswith(": OK"), lines


def test_a_relabelled_piece_fails_verify_naming_its_file_and_source(run_dir) -> None:
    names = json.loads((run_dir / "_BUILD.json").read_text())["mixture"]
    moved = {}

    def relabel(sources: np.ndarray) -> None:
        moved["from"], moved["to"] = int(sources[0]), (int(sources[0]) + 1) % len(names)
        sources[0] = moved["to"]

    sidecar, family = forged_sidecar(run_dir, relabel)
    status, lines = verified(run_dir)
    assert status == 1
    assert any(line.startswith(f"{sidecar.parent / family}: holds ") for line in lines), lines
    assert any(" its manifest records " in line for line in lines if line.startswith(str(sidecar.parent / family)))
    dataset, record = dataset_of(run_dir), run_dir / "_BUILD.json"
    for number in (moved["from"], moved["to"]):
        account = names[number]
        said = f"{dataset}: its .source sidecars give mixture source {account['name']!r} "
        assert any(
            line.startswith(said) and line.endswith(f"tokens, but {record} records {account['tokens_chosen']:,} chosen")
            for line in lines
        ), lines
        uses = [line for line in lines if line.startswith(said) and line.endswith(" uses")]
        shift = 1 if number == moved["to"] else -1
        assert uses == (
            [f"{said}{account['uses'] + shift:,} documents, but {record} records {account['uses']:,} uses"]
            if dataset.name == "merged"
            else []
        )


def test_two_swapped_sources_fail_verify_naming_their_file(run_dir) -> None:
    def swap(sources: np.ndarray) -> None:
        k = int(np.flatnonzero(sources != sources[0])[0])
        sources[[0, k]] = sources[[k, 0]]

    sidecar, family = forged_sidecar(run_dir, swap)
    status, lines = verified(run_dir)
    assert status == 1
    assert [line.split(": ")[0] for line in lines if " its manifest records " in line] == [
        str(sidecar.parent / family)
    ], lines


def test_a_mixture_merge_input_changed_since_its_rank_wrote_it_is_named_and_nothing_published(
    tmp_path, sample_tokenizer
) -> None:
    """A mixture's merge hashes its inputs as it reads them: one whose bytes are not what its rank recorded (one bit
    of a token flipped after the rank wrote it) is refused naming it, before a window is cut, where publish alone
    noticed it (as a piece changed somewhere on the way); no merged file stays behind for a resume to keep."""
    build = Build.start(config(tmp_path, sample_tokenizer, spec(write_sources(tmp_path / "sources"), 60_000)), "mix")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    changed = sorted(Path(build.layout.ranks.path).glob("*.ds"))[1]
    data = bytearray(changed.read_bytes())
    data[1001] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.raises(TokenFileError, match=rf"^{changed}: holds .*, its manifest records .*: it is not the file"):
        build.merge(progress=False)
    merged = Path(build.layout.merged.path)
    assert not list(merged.glob("*.ds")) and not list(merged.glob("_completions/*"))
