"""The merge: every rank file of a folder becomes one sequence of output files, globally reordered. One task.

* ``interleave`` (default) is datatrove's DocumentTokenizerMerger (``tokenization.orderings``): a seeded
  permutation of the list ``[f] * units_f`` over the sorted input files; each entry ``f`` takes the *next* unit of
  file ``f``, so the order inside a file is kept. Same inputs and seed, same bytes.
* ``shuffle`` is a true uniform permutation of every unit of every file. It holds the permutation of all units
  in memory: 8 bytes a unit, on top of the 8 bytes a unit of the loaded indexes.

Inputs are validated before anything is written. Output files are published one by one, each with a manifest
that records where in the ordering it ends; a merge killed at any point and run again with the same arguments
resumes after the last published file and produces the same bytes as an uninterrupted run.

Inputs may be remote, but they are read at random (a unit here, a unit there), so remote inputs are first
copied to the local working directory: run the merge on a worker with a large local disk.

The package: ``config`` (the options, and which of them decide the bytes), ``inputs`` (the rank files, checked
before anything is written), ``plan`` (the units, their order, a mixture's choice, the fingerprint), ``moves`` (the
units moved into files, and the proof that they hold every unit once) and ``resume`` (each file's checkpoint, and
what a merge run again keeps); ``merge`` here runs them and writes the record.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tokenization.formats.block_checks import Checks
from tokenization.formats.checks import OwnCheck
from tokenization.formats.contents import ShuffleCheckFailed
from tokenization.formats.ds import Metadata
from tokenization.output import manifest
from tokenization.output.attempts import Attempt, attempt_at
from tokenization.output.manifest import StageResult
from tokenization.progress import ProgressMode
from tokenization.records import (
    ContentsSum,
    FileSum,
    MergeCounts,
    MergeManifest,
    MergeParams,
    MergeTokenizer,
    SizedInput,
)
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.merge.inputs import MergeInputs
from tokenization.stages.merge.moves import InputNotAsRecorded, move
from tokenization.stages.merge.plan import Mixed, Prepared, prepare
from tokenization.stages.merge.resume import Checkpoints, completed_files, remove_outputs
from tokenization.storage.checksums import ALGORITHM, checksum
from tokenization.wording import counted

log = logging.getLogger(__name__)


def merge(
    config: MergeConfig, progress: ProgressMode = None, owner: str | None = None, checks: Checks | None = None
) -> StageResult[MergeCounts, MergeManifest]:
    """Run the merge, resuming when an earlier run of the same merge was interrupted. With ``checks`` (its files
    are the dataset: no context shuffle follows), each file is checked as it is written, before upload, as a
    context shuffle checks its own; the files an earlier attempt published are left to publish's reading."""
    started = time.time()
    prepared = prepare(config)
    stem = config.stem
    own = OwnCheck(checks, f"merge {stem}") if checks is not None else None
    with attempt_at(config.folder(config.output), stem, config.local_working_dir, owner) as attempt:
        done = completed_files(attempt, config, prepared.width, prepared.fingerprint)
        checkpoints = Checkpoints(attempt, prepared, done, own)
        log.info(
            "merge %s: %d inputs, %d units, %d tokens; %s already done, resuming at unit %d",
            stem,
            len(prepared.inputs.urls),
            prepared.total_units,
            prepared.total_tokens,
            counted(len(done), "file"),
            checkpoints.units_end,
        )
        try:
            read = move(config, prepared, attempt, checkpoints, progress)
        except (ShuffleCheckFailed, InputNotAsRecorded):  # a resumed merge would keep the files: none is trusted
            remove_outputs(attempt, config, keep=set())
            raise
        tails = int(prepared.tails.sum())
        mix = prepared.mix
        counts = MergeCounts(
            input_files=len(prepared.inputs.urls),
            units=prepared.total_units,
            index_entries=sum(e.index_entries for e in checkpoints.entries),
            tokens=checkpoints.tokens,
            partial_chunk_tokens=tails if prepared.keep_tails else 0,
            tokens_dropped=(0 if prepared.keep_tails else tails) if mix is None else _not_chosen(prepared, mix),
            resumed_files=len(done),
            contents_in=ContentsSum.of(read),
            contents_out=ContentsSum.of(checkpoints.contents),
            tokens_repeated=None if mix is None else _repeated(prepared, mix),
            sources=None if mix is None else mix.shares,
        )
        inputs = prepared.inputs
        record = MergeManifest(
            stage="merge",
            **manifest.provenance(config, time.time() - started, MergeParams),
            save_filename=config.save_filename,
            bucket=config.bucket,
            seed=config.seed,
            fingerprint=prepared.fingerprint,
            tokenizer=MergeTokenizer(
                name=inputs.tokenizer, sha256=inputs.tokenizer_sha256, token_size=inputs.token_size
            ),
            inputs=[SizedInput(url=u, bytes=s) for u, s in zip(inputs.urls, inputs.sizes, strict=True)],
            counts=counts,
            outputs=checkpoints.entries,
            checked=None if own is None else own.result(),
        )
        record = _commit(attempt, config, inputs, record)
    return StageResult(counts, record)


def _not_chosen(prepared: Prepared, mix: Mixed) -> int:
    """The tokens of the documents a mixture did not use."""
    return int(prepared.inputs.lengths()[mix.uses == 0].sum())


def _repeated(prepared: Prepared, mix: Mixed) -> int:
    """The tokens a mixture wrote beyond each document's first use."""
    return int((prepared.inputs.lengths() * np.maximum(mix.uses - 1, 0)).sum())


def _commit(attempt: Attempt, config: MergeConfig, inputs: MergeInputs, record: MergeManifest) -> MergeManifest:
    """The dataset's metadata (datatrove's ``{name}.ds.metadata``: all files' tokens), then manifest and marker. A
    bucket task knows only its bucket's tokens, so a bucketed merge leaves the total to each file's metadata."""
    files = record.output_files()
    if config.bucket is None:
        named = tuple(share.name for share in record.counts.sources or [])
        meta = Metadata(inputs.tokenizer, inputs.token_size, record.counts.tokens, named).render().encode()
        attempt.write(f"{config.save_filename}.ds.metadata", meta)
        files[f"{config.save_filename}.ds.metadata"] = FileSum.of(len(meta), checksum(meta), ALGORITHM)
    return attempt.commit(record, files)
