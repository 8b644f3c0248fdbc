"""Per-rank manifests, quarantine files and completion markers: the record that makes a shard trustworthy.

Layout inside an output folder, beside the token files::

    _manifests/{stem}.json      seed, tokenizer hash, inputs, params, counts, checksum of every output file
    _quarantine/{stem}.jsonl    rejected records: file, line, reason, raw line
    _completions/{stem}.json    written last (see ``tokenization.attempts``): the attempt, the manifest's sha256,
                                and every published file with its size and sha256
"""

from __future__ import annotations

import importlib.metadata
import platform
import resource
from dataclasses import dataclass
from typing import Generic, TypeVar

import fsspec
import numpy as np
import orjson

from tokenization.formats import DS, token_file_names
from tokenization.formats.ds import TokenFileError
from tokenization.options import Options, params
from tokenization.storage import join, list_names, open_fs

MANIFEST_FORMAT = "corpus-tokenization/rank-manifest/1"
MERGE_FORMAT = "corpus-tokenization/merge-manifest/1"
CONTEXT_FORMAT = "corpus-tokenization/context-manifest/1"


def manifest_name(stem: str) -> str:
    return f"_manifests/{stem}.json"


def marker_name(stem: str) -> str:
    return f"_completions/{stem}.json"


def quarantine_name(stem: str) -> str:
    return f"_quarantine/{stem}.jsonl"


def manifest_path(out_path: str, stem: str) -> str:
    return join(out_path, manifest_name(stem))


def quarantine_path(out_path: str, stem: str) -> str:
    return join(out_path, quarantine_name(stem))


def marker_path(out_path: str, stem: str) -> str:
    return join(out_path, marker_name(stem))


def dumps_line(obj: dict) -> bytes:
    return orjson.dumps(obj) + b"\n"


def versions() -> dict:
    """Library versions that decide the bytes: numpy's Generator streams may change between releases."""
    return {
        "corpus-tokenization": importlib.metadata.version("corpus-tokenization"),
        "numpy": np.__version__,
        "tokenizers": importlib.metadata.version("tokenizers"),  # not imported: ~20 ms a stage
        "python": platform.python_version(),
    }


def stage_record(format: str, stage: str, config: Options, seconds: float, **fields: object) -> dict:
    """The record every stage manifest is: its format and stage, the library versions that decide the bytes, the
    config's params (never its storage options), the stage's own ``fields``, how many seconds it took and the peak
    memory of the process that ran it (what a worker must hold for such a task)."""
    return {
        "format": format,
        "stage": stage,
        "versions": versions(),
        "params": params(config),
        **fields,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # Linux counts KiB
    }


C = TypeVar("C")


@dataclass(frozen=True)
class StageResult(Generic[C]):
    """What a stage did: its counts, typed for callers, and the manifest it wrote (``record``), with the attempt
    that wrote it."""

    counts: C
    record: dict
    attempt: str | None = None

    @property
    def outputs(self) -> list[str]:
        """The names of the token files the stage published, in order."""
        return [entry["name"] for entry in self.record.get("outputs", [])]

    @property
    def tokens(self) -> int:
        """Tokens in the files the stage published."""
        return sum(entry["tokens"] for entry in self.record.get("outputs", []))

    @property
    def seconds(self) -> float:
        return self.record["seconds"]

    def to_json(self) -> dict:
        return self.record | ({"attempt": self.attempt} if self.attempt else {})


def throughput(seconds: float, load_seconds: float, text_bytes: int, tokens: int) -> dict:
    """Rates of the work itself: UTF-8 bytes of text (not of compressed input) and tokens a second, without the
    tokenizer's loading, which the manifest reports on its own (``tokenizer.load_seconds``)."""
    working = seconds - load_seconds
    if working <= 0:
        return {"text_mb_per_s": None, "tokens_per_s": None}
    return {"text_mb_per_s": round(text_bytes / 1e6 / working, 3), "tokens_per_s": round(tokens / working, 1)}


def dumps(obj: dict) -> bytes:
    """A manifest's bytes: indented, keys sorted, so equal records are equal files."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """A JSON file's content, or None when it does not exist."""
    try:
        return orjson.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def pseudo_ends(start: int, tokens: int, every: int | None, until: int) -> dict | None:
    """The chunk or window boundaries in the index of a file that covers tokens ``[start, start + tokens)`` of
    a stream cut every ``every`` tokens up to ``until`` (``start`` is on the grid): what ``verify`` must not
    mistake for document ends. ``None`` when every entry is a document end."""
    if not every or start >= until:
        return None
    return {"every": every, "until": min(start + tokens, until) - start}


def output_files(outputs: list[dict]) -> dict[str, dict]:
    """Every file of a stage's output entries, ``name -> {bytes, sha256}``: what its completion marker lists."""
    return {name: info for entry in outputs for name, info in entry["files"].items()}


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


def completion_markers(fs: fsspec.AbstractFileSystem, out_path: str) -> dict[str, dict]:
    """Every completion marker of an output folder, by stem."""
    folder = join(out_path, "_completions")
    markers = {}
    for name in list_names(fs, folder):
        marker = read_json(fs, join(folder, name)) if name.endswith(".json") else None
        if marker is not None:
            markers[name.removesuffix(".json")] = marker
    return markers


def token_files(folder: str) -> list[str]:
    """The ``.ds`` files of a folder that a stage should read, sorted by name as datatrove lists them.

    A folder written by this package holds completion markers, and then exactly the ``.ds`` files they list count:
    a ``.ds`` file that no marker lists (a leftover of another run, an attempt that did not finish) is an error, as
    is a listed one that is missing. A folder without markers (datatrove's output, say) gives every ``.ds`` file.
    """
    fs, path = open_fs(folder)
    present = set(token_file_names(list_names(fs, path), (DS,)))
    markers = completion_markers(fs, path)
    if markers:
        listed = set(token_file_names((n for marker in markers.values() for n in marker.get("files", {})), (DS,)))
        if unlisted := sorted(present - listed):
            raise TokenFileError(
                f"{join(folder, unlisted[0])}: no completion marker lists it ({len(unlisted)} such files): a leftover "
                f"of another run, or of an attempt that did not finish; remove it or finish that stage first"
            )
        if missing := sorted(listed - present):
            raise TokenFileError(f"{join(folder, missing[0])}: listed by a completion marker but missing")
    return [join(folder.rstrip("/"), name) for name in sorted(present)]
