"""Per-rank manifests, quarantine files and completion markers: the record that makes a shard trustworthy.

Layout inside an output folder, beside the token files::

    _manifests/{stem}.json      seed, tokenizer hash, inputs, params, counts, checksum of every output file
    _quarantine/{stem}.jsonl    rejected records: file, line, reason, raw line
    _completions/{stem}.json    written last; holds the manifest's sha256, so a reader can check it
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
from dataclasses import asdict, is_dataclass

import fsspec
import numpy as np
import orjson
import tokenizers

from tokenization.storage import join, list_names, open_fs, remove_if_exists, write_bytes_atomic

MANIFEST_FORMAT = "corpus-tokenization/rank-manifest/1"
MERGE_FORMAT = "corpus-tokenization/merge-manifest/1"
CONTEXT_FORMAT = "corpus-tokenization/context-manifest/1"


def manifest_path(out_path: str, stem: str) -> str:
    return join(out_path, "_manifests", f"{stem}.json")


def quarantine_path(out_path: str, stem: str) -> str:
    return join(out_path, "_quarantine", f"{stem}.jsonl")


def marker_path(out_path: str, stem: str) -> str:
    return join(out_path, "_completions", f"{stem}.json")


def dumps_line(obj: dict) -> bytes:
    return orjson.dumps(obj) + b"\n"


def versions() -> dict:
    """Library versions that decide the bytes: numpy's Generator streams may change between releases."""
    return {
        "corpus-tokenization": importlib.metadata.version("corpus-tokenization"),
        "numpy": np.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }


def rank_manifest(
    *, stage: str, config, encoder, inputs, counts: dict, outputs: list, seconds: float, input_bytes: int
) -> dict:
    params = asdict(config) if is_dataclass(config) else dict(config)
    return {
        "format": MANIFEST_FORMAT,
        "stage": stage,
        "rank": params.get("rank"),
        "world_size": params.get("world_size"),
        "seed": params.get("seed"),
        "versions": versions(),
        "tokenizer": encoder.describe(),
        "inputs": [{"url": f.url, "bytes": f.size} for f in inputs],
        "params": params,
        "counts": counts,
        "outputs": outputs,
        "seconds": round(seconds, 3),
        "input_bytes": input_bytes,
        "throughput": {
            "input_mb_per_s": round(input_bytes / 1e6 / seconds, 3) if seconds else None,
            "tokens_per_s": round(counts["tokens"] / seconds, 1) if seconds else None,
        },
    }


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj: dict) -> bytes:
    data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    write_bytes_atomic(fs, path, data)
    return data


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """A JSON file's content, or None when it does not exist."""
    try:
        return orjson.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def remove_marker(fs: fsspec.AbstractFileSystem, out_path: str, stem: str) -> None:
    """The first step of any re-run: from now until the new marker, the output is not complete."""
    remove_if_exists(fs, marker_path(out_path, stem))


def commit(fs: fsspec.AbstractFileSystem, out_path: str, stem: str, manifest: dict) -> None:
    """Write the manifest, then the marker that names its checksum: the marker is always the last file."""
    data = write_json(fs, manifest_path(out_path, stem), manifest)
    marker = {"manifest": f"_manifests/{stem}.json", "sha256": hashlib.sha256(data).hexdigest()}
    write_bytes_atomic(fs, marker_path(out_path, stem), orjson.dumps(marker))


def pseudo_ends(start: int, tokens: int, every: int | None, until: int) -> dict | None:
    """The chunk or window boundaries in the index of a file that covers tokens ``[start, start + tokens)`` of
    a stream cut every ``every`` tokens up to ``until`` (``start`` is on the grid): what ``verify`` must not
    mistake for document ends. ``None`` when every entry is a document end."""
    if not every or start >= until:
        return None
    return {"every": every, "until": min(start + tokens, until) - start}


def output_entries(folder: str) -> dict[str, dict]:
    """Every output file that the manifests in ``folder/_manifests`` describe, by file name."""
    fs, path = open_fs(join(folder, "_manifests"))
    entries: dict[str, dict] = {}
    for name in list_names(fs, path):
        if name.endswith(".json"):
            data = orjson.loads(fs.cat_file(join(path, name)))
            for entry in data.get("outputs", [data] if "files" in data else []):
                entries[entry["name"]] = entry | {"_manifest": data}
    return entries
