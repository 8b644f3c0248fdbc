"""Where a stage's records sit in its output folder, and reading them back by folder (their shapes and checks
are ``tokenization.records``).

Layout inside an output folder, beside the token files::

    _manifests/{stem}.json      seed, tokenizer hash, inputs, params, counts, checksum of every output file
    _quarantine/{stem}.jsonl    rejected records: file, line, reason, raw line
    _completions/{stem}.json    written last (see ``tokenization.output.attempts``): the attempt, the manifest's
                                sha256, and every published file with its size and sha256
"""

from __future__ import annotations

import functools
import platform
import resource
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, overload

import numpy as np

from tokenization.formats import DS, token_file_names
from tokenization.formats.ds import TokenFileError, WrittenTokenFile
from tokenization.options import Options, params
from tokenization.records import (
    CompletionMarker,
    ContentsSum,
    MergeOutput,
    OutputEntry,
    PseudoEnds,
    RankManifest,
    StageManifest,
    StageParams,
    StageRecord,
    Throughput,
    stage_manifest,
)
from tokenization.storage.concurrent import in_batches
from tokenization.storage.folder import Folder
from tokenization.version import __version__

MANIFESTS, COMPLETIONS, QUARANTINE = "_manifests", "_completions", "_quarantine"  # subfolders of an output


def manifest_name(stem: str) -> str:
    return f"{MANIFESTS}/{stem}.json"


def marker_name(stem: str) -> str:
    return f"{COMPLETIONS}/{stem}.json"


def quarantine_name(stem: str) -> str:
    return f"{QUARANTINE}/{stem}.jsonl"


def versions() -> dict[str, Any]:
    """Library versions that decide the bytes: numpy's Generator streams may change between releases."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, Any]:
    """Looked up once a process, as every manifest names them."""
    return {
        "corpus-tokenization": __version__,
        "numpy": np.__version__,
        "tokenizers": _tokenizers_version(),
        "python": platform.python_version(),
    }


def _tokenizers_version() -> str:
    """HF tokenizers' version: its ``__version__`` where the stage imported it (tokenize, count), else its package
    metadata, so that a stage that encodes nothing imports neither tokenizers (~20 ms) nor, where it does, the
    metadata's reader (~17 ms of imports, ~2.5 ms a lookup: 3% of a GPT-2 rank of 42 MB)."""
    if (tokenizers := sys.modules.get("tokenizers")) is not None:
        return str(tokenizers.__version__)
    import importlib.metadata

    return importlib.metadata.version("tokenizers")


def provenance(config: Options, seconds: float, kind: type[StageParams]) -> dict[str, Any]:
    """The fields every stage manifest shares (``records.StageManifest``): the library versions that decide the
    bytes, the config's params as the stage's ``kind`` of params (never its storage options), how many seconds the
    stage took and the peak memory of the process that ran it (what a worker must hold for such a task)."""
    return {
        "versions": versions(),
        "params": kind.of(params(config)),
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # Linux counts KiB
    }


C = TypeVar("C")
R = TypeVar("R", bound=StageRecord)
T = TypeVar("T")


@dataclass(frozen=True)
class StageResult(Generic[C, R]):
    """What a stage did: its counts, typed for callers, and the record it wrote (a manifest names the attempt that
    wrote it)."""

    counts: C
    record: R

    @property
    def outputs(self) -> list[str]:
        """The names of the token files the stage published, in order."""
        return [entry.name for entry in self._entries]

    @property
    def tokens(self) -> int:
        """Tokens in the files the stage published."""
        return sum(entry.tokens for entry in self._entries)

    @property
    def _entries(self) -> Sequence[OutputEntry]:
        return self.record.outputs if isinstance(self.record, StageManifest) else []  # a count writes no files

    @property
    def seconds(self) -> float:
        return self.record.seconds

    def to_json(self) -> dict[str, Any]:
        return self.record.to_json()


def throughput(seconds: float, load_seconds: float, text_bytes: int, tokens: int) -> Throughput:
    """Rates of the work itself: UTF-8 bytes of text (not of compressed input) and tokens a second, without the
    tokenizer's loading, which the manifest reports on its own (``tokenizer.load_seconds``)."""
    working = seconds - load_seconds
    if working <= 0:
        return Throughput(text_mb_per_s=None, tokens_per_s=None)
    return Throughput(text_mb_per_s=round(text_bytes / 1e6 / working, 3), tokens_per_s=round(tokens / working, 1))


def pseudo_ends(start: int, tokens: int, every: int | None, until: int) -> PseudoEnds | None:
    """The chunk or window boundaries in the index of a file that covers tokens ``[start, start + tokens)`` of
    a stream cut every ``every`` tokens up to ``until`` (``start`` is on the grid): what ``verify`` must not
    mistake for document ends. ``None`` when every entry is a document end."""
    if not every or start >= until:
        return None
    return PseudoEnds(every=every, until=min(start + tokens, until) - start)


E = TypeVar("E", bound=OutputEntry)


@overload
def output_entry(written: WrittenTokenFile, **fields: Any) -> OutputEntry: ...


@overload
def output_entry(written: WrittenTokenFile, kind: type[E], **fields: Any) -> E: ...


def output_entry(written: WrittenTokenFile, kind: type[OutputEntry] = OutputEntry, **fields: Any) -> OutputEntry:
    """A written file family as a manifest lists it (``kind``: a stage's own entry, with its ``fields``)."""
    files = {written.published(f.name): f.sum for f in written.files}
    contents = ContentsSum.of(written.contents)
    return kind(
        name=written.name,
        tokens=written.tokens,
        index_entries=written.index_entries,
        files=files,
        contents=contents,
        **fields,
    )


@dataclass(frozen=True)
class Described:
    """An output file family, and the record that lists it: a stage manifest, or a merge checkpoint."""

    entry: OutputEntry
    listed_by: StageManifest | MergeOutput

    @property
    def tokenizer_sha256(self) -> str | None:
        """Of the tokenizer that made the file, when its record says."""
        return self.listed_by.tokenizer_sha256 if isinstance(self.listed_by, StageManifest) else None

    @property
    def num_buckets(self) -> int | None:
        """How many buckets the rank that wrote the file scattered into (None: not bucketed, or not a rank's)."""
        return self.listed_by.num_buckets if isinstance(self.listed_by, RankManifest) else None


def output_entries(folder: Folder, within: str | None = None) -> dict[str, Described]:
    """Every output file that the manifests in ``folder/_manifests`` describe, by file name; with ``within``, only
    those in that subfolder (``stage_records``)."""
    return entries_by_name(stage_records(folder, within))


def stage_records(folder: Folder, within: str | None = None) -> list[StageManifest | MergeOutput]:
    """The manifests in ``folder/_manifests``, read a batch at a time, concurrently. With ``within`` (a bucket's
    folder of a rank folder) each keeps only its entries of files in that subfolder: a bucket task holds its own
    bucket's entries, not every bucket's."""
    records = (record for _, record in _read_listed(folder.sub(MANIFESTS), stage_manifest))
    return [record if within is None else _only_within(record, within) for record in records]


def _only_within(record: T, within: str) -> T:
    if isinstance(record, StageManifest):
        return replace(record, outputs=[e for e in record.outputs if e.name.startswith(f"{within}/")])
    if isinstance(record, CompletionMarker):
        return replace(record, files={n: f for n, f in record.files.items() if n.startswith(f"{within}/")})
    return record


def _read_listed(folder: Folder, parse: Callable[[bytes, str], T]) -> Iterator[tuple[str, T]]:
    """The ``.json`` records directly in ``folder``, each with its name, read a batch at a time, concurrently; one
    removed since the listing (an attempt starting) is left out."""
    for batch in in_batches([name for name in folder.list() if name.endswith(".json")]):
        for name, data in folder.read_many(batch).items():
            if data is not None:
                yield name, parse(data, folder.url_of(name))


def entries_by_name(manifests: Iterable[StageManifest | MergeOutput]) -> dict[str, Described]:
    """The output entries of these manifests by file name. A stage manifest's entry wins over a merge
    checkpoint's: its completion marker vouches for it."""
    entries: dict[str, Described] = {}
    for record in sorted(manifests, key=lambda record: isinstance(record, StageManifest)):
        for entry in record.outputs if isinstance(record, StageManifest) else [record]:
            entries[entry.name] = Described(entry, record)
    return entries


def completion_markers(folder: Folder, within: str | None = None) -> dict[str, CompletionMarker]:
    """Every completion marker of an output folder, by stem, checked; with ``within``, each listing only its files
    in that subfolder."""
    listed = _read_listed(folder.sub(COMPLETIONS), CompletionMarker.loads)
    return {
        name.removesuffix(".json"): marker if within is None else _only_within(marker, within)
        for name, marker in listed
    }


def token_files(folder: Folder, within: str | None = None) -> list[str]:
    """The ``.ds`` files of a folder (of its subfolder ``within``, a bucket's) that a stage should read, sorted by
    name as datatrove lists them.

    A folder written by this package holds completion markers, and then exactly the ``.ds`` files they list count:
    a ``.ds`` file that no marker lists (a leftover of another run, an attempt that did not finish) is an error, as
    is a listed one that is missing. A folder without markers (datatrove's output, say) gives every ``.ds`` file.
    """
    prefix = f"{within}/" if within else ""
    here = (folder.sub(within) if within else folder).list()
    present = {prefix + name for name in token_file_names(here, (DS,))}
    markers = completion_markers(folder, within)
    if markers:
        listed = set(token_file_names((n for marker in markers.values() for n in marker.files), (DS,)))
        if unlisted := sorted(present - listed):
            raise TokenFileError(
                f"{folder.url_of(unlisted[0])}: no completion marker lists it ({len(unlisted)} such files): a "
                f"leftover of another run, or of an attempt that did not finish; remove it or finish that stage first"
            )
        if missing := sorted(listed - present):
            raise TokenFileError(f"{folder.url_of(missing[0])}: listed by a completion marker but missing")
    return [folder.url_of(name) for name in sorted(present)]
