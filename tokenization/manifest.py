"""Per-rank manifests, quarantine files and completion markers: the record that makes a shard trustworthy.

Layout inside an output folder, beside the token files::

    _manifests/{stem}.json      seed, tokenizer hash, inputs, params, counts, checksum of every output file
    _quarantine/{stem}.jsonl    rejected records: file, line, reason, raw line
    _completions/{stem}.json    written last (see ``tokenization.attempts``): the attempt, the manifest's sha256,
                                and every published file with its size and sha256
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import resource
from collections.abc import Iterable
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


MANIFESTS, COMPLETIONS, QUARANTINE = "_manifests", "_completions", "_quarantine"  # subfolders of an output


def manifest_name(stem: str) -> str:
    return f"{MANIFESTS}/{stem}.json"


def marker_name(stem: str) -> str:
    return f"{COMPLETIONS}/{stem}.json"


def quarantine_name(stem: str) -> str:
    return f"{QUARANTINE}/{stem}.jsonl"


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


class RecordError(ValueError):
    """A record (a manifest, a completion marker) that cannot be read as one: truncated, not a JSON object, or a
    field missing or of the wrong type. One line names the file and the field, never a traceback."""

    def __init__(self, path: str, what: str, kind: str = "manifest"):
        super().__init__(f"{path}: not a valid {kind}: {what}")


# The fields that readers of each record rely on, with their JSON types: checked on reading, so that a damaged
# record is one RecordError and never a KeyError or TypeError deep inside a stage.
FILE_FIELDS = {"bytes": int, "sha256": str}
OUTPUT_FIELDS = {"name": str, "tokens": int, "index_entries": int, "files": dict}
STAGE_FIELDS = {"format": str, "stage": str, "params": dict, "counts": dict, "outputs": list}
CHECKPOINT_FIELDS = OUTPUT_FIELDS | {"fingerprint": str, "units_start": int, "units_end": int}
MARKER_FIELDS = {"manifest": str, "sha256": str, "attempt": str, "files": dict}
RANK_FIELDS = {"counts": dict, "inputs": list}
COUNT_FIELDS = dict.fromkeys(("docs_read", "docs_written", "empty", "tokens", "tokens_written", "tokens_dropped"), int)
COUNT_FIELDS |= {"rejected": dict}
INPUT_FIELDS = {"url": str, "bytes": int}
JSON_TYPES = {int: "an integer", str: "a string", dict: "an object", list: "an array"}


def read_json(fs: fsspec.AbstractFileSystem, path: str, kind: str = "manifest") -> dict | None:
    """A JSON object's content, or None when the file does not exist; anything but an object is a RecordError."""
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None
    return _parse_json(data, path, kind)


def _parse_json(data: bytes, path: str, kind: str = "manifest") -> dict:
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecordError(path, str(exc), kind) from None
    return _fields(record, {}, path, kind, "")


def manifest_record(data: bytes, path: str) -> dict:
    """A manifest from its bytes: a stage manifest (it has outputs), or a merge checkpoint (one output entry)."""
    record = _parse_json(data, path)
    if "outputs" not in record and "format" not in record:
        return _with_files(record, path, "manifest", "", CHECKPOINT_FIELDS)
    _fields(record, STAGE_FIELDS, path, "manifest", "")
    for i, entry in enumerate(record["outputs"]):
        _with_files(entry, path, "manifest", f"outputs[{i}]", OUTPUT_FIELDS)
    return record


def marker_record(data: bytes, path: str) -> dict:
    """A completion marker from its bytes (see ``Attempt.commit``)."""
    return _with_files(_parse_json(data, path, "completion marker"), path, "completion marker", "", MARKER_FIELDS)


def read_manifest(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """A manifest, checked, or None when it does not exist."""
    try:
        return manifest_record(fs.cat_file(path), path)
    except FileNotFoundError:
        return None


def read_rank_manifest(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """A rank's manifest, checked with the counts and inputs the books add up, or None when it does not exist."""
    record = read_manifest(fs, path)
    if record is not None:
        _fields(record, RANK_FIELDS, path, "manifest", "")
        _fields(record["counts"], COUNT_FIELDS, path, "manifest", "counts")
        for i, entry in enumerate(record["inputs"]):
            _fields(entry, INPUT_FIELDS, path, "manifest", f"inputs[{i}]")
    return record


def _with_files(record: object, path: str, kind: str, at: str, fields: dict[str, type]) -> dict:
    """A record with ``fields``, whose ``files`` are each ``{bytes, sha256}``."""
    _fields(record, fields, path, kind, at)
    for name, info in record["files"].items():
        _fields(info, FILE_FIELDS, path, kind, f"{at}.files[{orjson.dumps(name).decode()}]".lstrip("."))
    return record


def _fields(record: object, fields: dict[str, type], path: str, kind: str, at: str) -> dict:
    """``record`` is an object holding each of ``fields`` with its type, or a RecordError names the first that is
    not (``at``: where the record sits in its file)."""
    if not isinstance(record, dict):
        raise RecordError(path, f"{at or 'the file'} is {_shown(record)}, not an object", kind)
    for key, expected in fields.items():
        where = f"{at}.{key}" if at else key
        if key not in record:
            raise RecordError(path, f"{where} is missing", kind)
        value = record[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            raise RecordError(path, f"{where} is {_shown(value)}, not {JSON_TYPES[expected]}", kind)
    return record


def _shown(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:40] + "…"


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
    fs, path = open_fs(join(folder, MANIFESTS))
    names = [name for name in list_names(fs, path) if name.endswith(".json")]
    return entries_by_name(read_manifest(fs, join(path, name)) for name in names)


def entries_by_name(manifests: Iterable[dict | None]) -> dict[str, dict]:
    """The output entries of these manifests by file name, each with its ``_manifest``. A stage manifest's entry
    wins over a merge checkpoint's: its completion marker vouches for it."""
    entries: dict[str, dict] = {}
    for record in sorted(filter(None, manifests), key=lambda record: "outputs" in record):
        for entry in record.get("outputs", [record]):
            entries[entry["name"]] = entry | {"_manifest": record}
    return entries


def completion_markers(fs: fsspec.AbstractFileSystem, out_path: str) -> dict[str, dict]:
    """Every completion marker of an output folder, by stem, checked."""
    folder = join(out_path, COMPLETIONS)
    markers = {}
    for name in list_names(fs, folder):
        if name.endswith(".json"):
            with contextlib.suppress(FileNotFoundError):  # removed since the listing: an attempt starting
                markers[name.removesuffix(".json")] = marker_record(fs.cat_file(join(folder, name)), join(folder, name))
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
