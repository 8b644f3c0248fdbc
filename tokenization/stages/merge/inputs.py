"""The merge's inputs, checked before anything is written: the rank files of its folder (or of its bucket), their
indexes, sizes, tokenizer and, for a mixture, their ``.source`` sidecars against what their ranks recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from tokenization.errors import UsageError
from tokenization.formats import names
from tokenization.formats.ds import (
    SOURCE,
    SOURCE_DTYPE,
    TokenFile,
    TokenFileError,
)
from tokenization.output import manifest
from tokenization.output.manifest import Described
from tokenization.records import RankManifest
from tokenization.stages.merge.config import MergeConfig
from tokenization.storage.checksums import checksum
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import StorageOptions, file_at


@dataclass
class MergeInputs:
    """The validated inputs: names, token size, tokenizer, and every file's index entries (concatenated)."""

    urls: list[str]
    token_size: int
    tokenizer: str
    tokenizer_sha256: str | None
    ends: np.ndarray  # all index entries, file after file
    offsets: np.ndarray  # file f's entries are ends[offsets[f]:offsets[f + 1]]
    sizes: list[int]
    pseudo_ends: bool  # some input's index holds chunk or window boundaries besides document ends
    sources: np.ndarray | None = None  # a mixture's: each index entry's source, file after file

    def file_ends(self, f: int) -> np.ndarray:
        return self.ends[self.offsets[f] : self.offsets[f + 1]]

    def tokens(self, f: int) -> int:
        ends = self.file_ends(f)
        return int(ends[-1]) if len(ends) else 0

    def lengths(self) -> np.ndarray:
        """Each index entry's tokens, file after file."""
        starts = np.concatenate([[0], self.ends[:-1]]).astype(np.int64)[: len(self.ends)]
        starts[self.offsets[:-1][np.diff(self.offsets) > 0]] = 0  # each file's first entry starts at its token 0
        return self.ends.astype(np.int64) - starts


class NoInputs(TokenFileError):
    """A merge finds no rank file: a build says why (``builds.accounting.nothing_read``)."""


def validate_inputs(
    urls: list[str],
    save_loss: bool,
    entries: list[Described],
    storage_options: StorageOptions | None = None,
    sources: list[str] | None = None,
) -> MergeInputs:
    """Check every input before anything is written; a mix of token sizes or tokenizers is an error. ``entries``:
    those of the inputs that their manifests describe; ``storage_options`` open the URLs. A mixture's inputs
    (``sources``: its names) each hold a ``.source`` sidecar naming those sources, read too."""
    if not urls:
        raise NoInputs("no .ds files to merge")
    listing = file_at(urls[0], storage_options)[0].sizes()  # the sizes of every file, not a HEAD each

    def opened(url: str) -> tuple[TokenFile, np.ndarray]:  # raises when a .metadata is missing: never assumed
        f = TokenFile(url, listing=listing, storage_options=storage_options)
        return f, np.asarray(f.ends, dtype=np.int64)

    read = map_concurrently(opened, urls)  # each input's metadata and index: requests in flight at once
    first = read[0][0]
    distinct = {e.tokenizer_sha256 for e in entries if e.tokenizer_sha256 is not None}
    if len(distinct) > 1:
        raise TokenFileError(f"inputs were tokenized with different tokenizers (sha256 {sorted(distinct)})")
    # a file names the tokenizer as typed: ranks tokenized by hand may name one tokenizer (one sha256) two ways
    pinned = len(distinct) == 1 and len(entries) == len(urls) and all(e.tokenizer_sha256 for e in entries)
    ends_list, sizes, sources_list = [], [], []
    for f, ends in read:
        if f.token_size != first.token_size:
            raise TokenFileError(f"{f.url}: token_size {f.token_size} differs from {first.url}'s {first.token_size}")
        if f.tokenizer != first.tokenizer and not pinned:
            raise TokenFileError(f"{f.url}: tokenizer {f.tokenizer!r} differs from {first.url}'s {first.tokenizer!r}")
        total = int(ends[-1]) if len(ends) else 0
        if f.num_tokens != total or f.size("") % f.token_size:
            raise TokenFileError(f"{f.url}: {f.size('')} bytes, but its index ends at token {total}")
        if len(ends) and (ends[0] < 0 or np.any(np.diff(ends) < 0)):
            raise TokenFileError(f"{f.url}.index: entries are not non-decreasing")
        if save_loss:
            if not f.exists(".loss"):
                raise TokenFileError(f"{f.url}.loss is missing (merge without save_loss, or re-tokenize with it)")
            if f.size(".loss") != total:
                raise TokenFileError(f"{f.url}.loss: {f.size('.loss')} bytes for {total} tokens")
        ends_list.append(ends)
        sizes.append(f.size(""))
        if sources is not None:
            sources_list.append(_sources_of(f, len(ends), sources))
    return MergeInputs(
        urls=urls,
        token_size=first.token_size,
        tokenizer=first.tokenizer,
        tokenizer_sha256=distinct.pop() if distinct else None,
        ends=np.concatenate(ends_list) if ends_list else np.empty(0, np.int64),
        offsets=np.concatenate([[0], np.cumsum([len(e) for e in ends_list])]).astype(np.int64),
        sizes=sizes,
        pseudo_ends=any(e.entry.pseudo_ends for e in entries),
        sources=np.concatenate(sources_list) if sources is not None else None,
    )


def _sources_of(f: TokenFile, entries: int, names: list[str]) -> np.ndarray:
    """A mixture's input's ``.source`` sidecar, checked: one source a document, of the mixture's sources."""
    found = f.sources
    named = list(f.metadata.sources) if f.metadata else []
    if found is None or named != names:
        why = "no .source sidecar" if found is None else f"sources {named}, not the mixture's {names}"
        raise TokenFileError(f"{f.url}: {why}: not a rank file of this mixture; tokenize it again")
    if len(found) != entries or (len(found) and int(found.max()) >= len(names)):
        raise TokenFileError(f"{f.url}.source: {len(found):,} entries for {entries:,} documents, or an unknown source")
    return np.asarray(found, dtype=np.int64)


def check_sidecars(inputs: MergeInputs, named: list[str], described: dict[str, Described]) -> None:
    """Each input's ``.source`` sidecar is the one its rank recorded (its marker's checksum): a byte changed to
    another valid source would move documents between sources, which the contents (each piece's source is in them)
    would find only once the merge had read every input; this says so first, naming the file."""
    sources = cast(np.ndarray, inputs.sources)
    for f, name in enumerate(named):
        held = sources[inputs.offsets[f] : inputs.offsets[f + 1]].astype(SOURCE_DTYPE).tobytes()
        recorded = described[name].entry.files.get(name + SOURCE) if name in described else None
        if recorded is None or checksum(held, recorded.algorithm) != recorded.checksum:
            raise TokenFileError(
                f"{inputs.urls[f]}{SOURCE}: not the sidecar its rank recorded (no record, or another checksum): "
                "tokenize that rank again"
            )


def bucket_inputs(config: MergeConfig, bucket: int) -> tuple[list[str], dict[str, Described]]:
    """The rank files of this merge's ``bucket`` (``config.bucket``), from its folder alone, and their entries, the
    only ones kept of the ranks' manifests; every rank must have scattered into the same buckets, this one among
    them."""
    within = names.bucket_folder(bucket)
    given = config.folder(config.input)
    records = manifest.stage_records(given, within)
    drawn = {record.num_buckets if isinstance(record, RankManifest) else None for record in records}
    num_buckets = next(iter(drawn)) if len(drawn) == 1 else None
    if num_buckets is None:
        found = ", ".join(map(str, sorted(drawn, key=str))) or "no manifests"
        raise TokenFileError(f"{config.input}: a bucketed merge needs ranks of one num_buckets, found {found}")
    if bucket >= num_buckets:
        raise UsageError(f"bucket {bucket} is outside 0..{num_buckets - 1}: the ranks drew {num_buckets} buckets")
    urls = manifest.token_files(given, within)
    if not urls:
        raise NoInputs(
            f"{config.input}: no rank drew a document for bucket {bucket} of {num_buckets}: use fewer buckets"
        )
    return urls, manifest.entries_by_name(records)
