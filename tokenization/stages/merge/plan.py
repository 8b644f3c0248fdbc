"""The plan of a merge, decided before a byte is written: how its inputs are cut into units and in which order
they come, a mixture's choice of documents and their uses, the totals, the file numbers' width and the
fingerprint a resumed merge must share."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import orjson

from tokenization import mixing, orderings
from tokenization.formats.ds import TokenFileError
from tokenization.options import params
from tokenization.output import manifest
from tokenization.output.manifest import Described
from tokenization.records import (
    ContentsSum,
    Mixture,
    RankManifest,
    Record,
    SourceCounts,
    SourceMix,
)
from tokenization.stages.merge.config import IRRELEVANT_TO_BYTES, MergeConfig
from tokenization.stages.merge.inputs import MergeInputs, bucket_inputs, check_sidecars, validate_inputs
from tokenization.storage.folder import file_at


@dataclass
class Units:
    """How the merge cuts each file into units, and in which order they come."""

    inputs: MergeInputs
    chunk: int | None
    counts: np.ndarray  # full units per file (documents, or whole chunks)

    def bounds(self, files: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ranges of unit ``local[i]`` of file ``files[i]``."""
        if self.chunk:
            return local * self.chunk, (local + 1) * self.chunk
        g = self.inputs.offsets[files] + local
        ends = self.inputs.ends[g]
        starts = np.where(local > 0, self.inputs.ends[np.maximum(g - 1, 0)], 0)
        return starts, ends


def plan_ordering(config: MergeConfig, units: Units) -> tuple[np.ndarray, np.ndarray | None]:
    """``(file_ids, perm)``: entry j of the output is unit ``perm[j]`` (global, file-major) in shuffle mode,
    else the next unit of file ``file_ids[j]``."""
    n_files = len(units.counts)
    dtype = np.uint16 if n_files <= np.iinfo(np.uint16).max + 1 else np.uint32
    file_ids = np.repeat(np.arange(n_files, dtype=dtype), units.counts)
    if not config.shuffle:
        return file_ids, None
    if config.merge_mode == "shuffle":
        return file_ids, orderings.merge_order(config.seed, len(file_ids))
    if config.bucket is not None:
        return file_ids, orderings.bucket_order(config.seed, config.bucket, len(file_ids))
    orderings.interleave(config.seed, file_ids)
    return file_ids, None


@dataclass(frozen=True)
class Prepared:
    """Everything decided before a byte is written: the inputs, how they are cut into units, the totals, the
    width of the file numbers and the fingerprint a resumed merge must share."""

    inputs: MergeInputs
    units: Units
    tokens: np.ndarray  # per input file
    tails: np.ndarray  # per input file: tokens after its last whole chunk (0 without chunks)
    keep_tails: bool
    total_tokens: int
    total_units: int
    width: int
    fingerprint: str
    recorded: list[ContentsSum | None]  # per input file: its contents, as its stage recorded them (None: unknown)
    mix: Mixed | None = None  # a mixture's choice


@dataclass(frozen=True)
class Mixed:
    """A mixture's choice in this merge (or bucket): how many times each input document is used (``uses``, file
    after file), the uses in output order (``order``: document ids), the source of each document, and what each
    source gave (``tokenization.mixing``)."""

    names: list[str]
    sources: np.ndarray
    uses: np.ndarray
    order: np.ndarray
    shares: list[SourceMix]


def prepare(config: MergeConfig) -> Prepared:
    given = config.folder(config.input)
    mixture = config.mixture
    if config.bucket is None:
        urls, described = manifest.token_files(given), manifest.output_entries(given)
    else:
        urls, described = bucket_inputs(config, config.bucket)
    named = [url.removeprefix(given.location + "/") for url in urls]
    entries = [described[name] for name in named if name in described]
    source_names = mixture.names if mixture else None
    inputs = validate_inputs(urls, config.save_loss, entries, config.storage_options, source_names)
    if mixture is not None:
        check_sidecars(inputs, named, described)
    recorded = [_recorded(described.get(name), config.save_loss) for name in named]
    chunk = config.shuffle_chunk_size
    tokens = np.array([inputs.tokens(f) for f in range(len(urls))], dtype=np.int64)
    counts = tokens // chunk if chunk else np.diff(inputs.offsets)
    tails = (tokens - counts * chunk) if chunk else np.zeros(len(urls), np.int64)
    keep_tails = bool(chunk) and not config.drop_last_chunk
    total_tokens = int(tokens.sum()) - (0 if keep_tails else int(tails.sum()))
    total_units = int(counts.sum()) + (int(np.count_nonzero(tails)) if keep_tails else 0)
    mix = None if mixture is None else _mixed(config, mixture, inputs, manifest.stage_records(given))
    if mix is not None:  # a mixture writes its uses
        total_units, total_tokens = len(mix.order), sum(share.tokens_chosen for share in mix.shares)
    most_files = min(-(-total_tokens // config.merge_max_tokens_per_file), total_units)  # every file holds >= 1 unit
    width = max(3, len(str(max(0, most_files - 1))))  # datatrove's 3 digits, wider only past 1,000 files
    units = Units(inputs, chunk, counts)
    fingerprint = _fingerprint(config, inputs, width)
    prepared = (inputs, units, tokens, tails, keep_tails, total_tokens, total_units, width, fingerprint, recorded)
    return Prepared(*prepared, mix=mix)


def _mixed(config: MergeConfig, mixture: Mixture, inputs: MergeInputs, records: Sequence[Record]) -> Mixed:
    """The mixture's choice for this merge's documents: each source's target (``mixing.merge_targets``), then the
    uses and their order (``tokenization.mixing``)."""
    ranks = [record for record in records if isinstance(record, RankManifest)]
    if not ranks or any(rank.sources is None for rank in ranks):
        raise TokenFileError(f"{config.input}: its ranks recorded no sources: they were not tokenized for a mixture")
    counts = [cast(list[SourceCounts], rank.sources) for rank in ranks]
    targets = mixing.merge_targets(mixture, counts, config.bucket)
    sources = cast(np.ndarray, inputs.sources)
    lengths = inputs.lengths()
    part = 0 if config.bucket is None else config.bucket + 1
    found = None if config.choice is None or part else mixing.read_choice(config.folder(config.choice))
    planned = None if found is None else mixing.joined(list(found.values()))
    if planned is not None:  # the ranks wrote the chosen documents: chosen again from all, as the plan chose
        sources, lengths = planned.sources, planned.lengths
    uses, shares = mixing.choose(mixture, targets, sources, lengths, config.seed, part)
    order = mixing.interleaved(sources, lengths, uses, orderings.mixture_draws(config.seed, part))
    if planned is None:
        return Mixed(mixture.names, sources, uses, order, shares)
    held = _held(config, inputs, planned, uses)
    return Mixed(mixture.names, sources[held], uses[held], (np.cumsum(uses > 0) - 1)[order], shares)


def _held(config: MergeConfig, inputs: MergeInputs, planned: mixing.RankChoice, uses: np.ndarray) -> np.ndarray:
    """The documents (of all the plan chose from) that the ranks wrote: exactly those of some use, as the plan chose
    them (its uses), the same tokens and sources, in the same order; else the merge stops before a byte moves."""
    held = np.flatnonzero(uses > 0)
    if not (
        np.array_equal(planned.uses, uses)
        and np.array_equal(inputs.lengths(), planned.lengths[held])
        and np.array_equal(cast(np.ndarray, inputs.sources), planned.sources[held])
    ):
        raise TokenFileError(
            f"{config.input}: its rank files do not hold the documents the plan chose ({len(inputs.ends):,} "
            f"documents, {len(held):,} chosen): tokenize the ranks again"
        )
    return held


def _recorded(described: Described | None, save_loss: bool) -> ContentsSum | None:
    """An input's contents as its stage recorded them, when they are what the merge reads: with its loss bytes
    exactly when the merge moves them (None: the file must be hashed)."""
    if described is None or (f"{described.entry.name}.loss" in described.entry.files) != save_loss:
        return None
    return described.entry.contents


def _fingerprint(config: MergeConfig, inputs: MergeInputs, width: int) -> str:
    """Everything that decides the output bytes: a resumed run must agree on all of it."""
    plan = {
        "inputs": [[file_at(u)[1], s] for u, s in zip(inputs.urls, inputs.sizes, strict=True)],
        "index_entries": len(inputs.ends),
        "params": {k: v for k, v in params(config).items() if k not in IRRELEVANT_TO_BYTES},
        "width": width,
        "numpy": np.__version__,
    }
    # a record among the params (the mixture) in its JSON, as the manifest records it
    options = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
    return hashlib.sha256(orjson.dumps(plan, default=Record.to_json, option=options)).hexdigest()
