"""Records' file checksums as tests read and rewrite them, of the algorithm each record names
(``storage.checksums``): BLAKE3 in this version's records, sha256 in older ones, which a test makes of new ones."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import orjson

from tokenization.formats.ds import named_by_content
from tokenization.storage.checksums import BLAKE3, SHA256, checksum


def resum(file_sum: dict, data: bytes) -> None:
    """A record's entry of one file (``{"bytes": ..., "blake3": ...}``) made to say ``data``: its size, and its
    checksum of the algorithm the entry names."""
    (algorithm,) = {BLAKE3, SHA256} & set(file_sum)
    file_sum.update({"bytes": len(data), algorithm: checksum(data, algorithm)})


def records(folder: Path) -> Iterator[Path]:
    """Every record of a stage folder: its manifests, the merge's checkpoints, its completion markers."""
    yield from sorted((folder / "_manifests").glob("*.json"))
    yield from sorted((folder / "_completions").glob("*.json"))


def file_sums(record: dict) -> Iterator[tuple[str, dict]]:
    """Each file a record lists, and its entry there (``{"bytes": ..., "blake3": ...}``)."""
    for entry in record.get("outputs", [record]):  # a stage manifest's entries; a checkpoint, a marker itself
        yield from entry.get("files", {}).items()


def as_sha256_records(folder: Path) -> None:
    """A stage folder's records as the version before wrote them: each format one version older, each file's sum
    its sha256, and each marker's checksum of its manifest made to match."""
    for path in records(folder):
        record = json.loads(path.read_text())
        family, version = record["format"].rsplit("/", 1)
        record["format"] = f"{family}/{int(version) - 1}"
        for name, entry in file_sums(record):
            del entry[BLAKE3]
            entry[SHA256] = checksum((folder / name).read_bytes(), SHA256)
        if path.parent.name == "_completions":
            record["sha256"] = checksum((folder / record["manifest"]).read_bytes(), SHA256)
        path.write_text(json.dumps(record, indent=2, sort_keys=True))


def digest_of(folder: Path, tokenizer: Path, algorithm: str) -> str:
    """The dataset's digest as docs/builds.md defines it, from the files themselves: the sha256 of the sorted
    ``[name, checksum]`` pairs, each metadata file naming the tokenizer by its sha256."""
    named = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    sums = {}
    for name in {name for path in records(folder) for name, _ in file_sums(json.loads(path.read_text()))}:
        data = (folder / name).read_bytes()
        sums[name] = checksum(named_by_content(data, named) if name.endswith(".metadata") else data, algorithm)
    return hashlib.sha256(orjson.dumps(sorted(sums.items()))).hexdigest()
