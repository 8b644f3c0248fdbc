"""The merge's moves: every unit not yet published, in the planned order, into files that publish themselves as
they close, while the inputs are read again for the proof that the files hold every unit once."""

from __future__ import annotations

import numpy as np

from tokenization.formats.contents import Contents, check_kept, sorted_union
from tokenization.formats.ds import SplitWriter, TokenFileError
from tokenization.formats.moves import move_units
from tokenization.formats.source_pool import SourcePool, contents_of, uses_contents
from tokenization.output.attempts import Attempt
from tokenization.progress import Progress, ProgressMode
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.merge.plan import Mixed, Prepared, Units, plan_ordering
from tokenization.stages.merge.resume import Checkpoints
from tokenization.storage.concurrent import meanwhile

UNITS_PER_SLICE = 1 << 20  # ordering entries turned into byte moves at a time


class InputNotAsRecorded(TokenFileError):
    """An input of the merge is not the file its record describes: the files merged from it are not trusted."""


def move(
    config: MergeConfig, prepared: Prepared, attempt: Attempt, checkpoints: Checkpoints, progress: ProgressMode
) -> Contents:
    """Move every unit not yet published, in the planned order, into files that publish themselves as they close;
    then check that the files hold every unit of the inputs once. Returns the contents of the inputs."""
    inputs, units = prepared.inputs, prepared.units
    done = len(checkpoints.entries)
    writer = SplitWriter(
        attempt.work,
        lambda sub: config.file_name(sub + done, prepared.width),
        tokenizer=inputs.tokenizer,
        token_size=inputs.token_size,
        save_loss=config.save_loss,
        max_tokens=config.merge_max_tokens_per_file,
        close_at_limit=True,
        on_close=checkpoints,
        observe=checkpoints.watch if checkpoints.own else None,
        keep_hashes=prepared.mix is not None,  # a mixture's: its sidecars give them their sources
        expected_tokens=prepared.total_tokens - checkpoints.tokens,
    )
    inner = [inputs.file_ends(f) for f in range(len(inputs.urls))] if units.chunk else None
    mix = prepared.mix
    file_ids, perm = plan_ordering(config, units) if mix is None else (np.zeros(0, np.uint16), mix.order)
    resume, ordered = checkpoints.units_end, len(file_ids) if perm is None else len(perm)
    cursor = np.bincount(file_ids[:resume], minlength=len(inputs.urls)).astype(np.int64)
    pool = SourcePool(
        inputs.urls,
        inputs.token_size,
        config.save_loss,
        config.max_open_files,
        attempt.work / "inputs",
        config.storage_options,
    )
    with pool, Progress(f"merge {config.stem}", prepared.total_tokens, "tok", progress) as shown:
        pool.fetch(inputs.sizes)
        with meanwhile(_input_contents, prepared, pool) as contents:  # the inputs read again while their units move
            with writer:  # its end publishes the last file
                shown.update(checkpoints.tokens, units=resume, tokens=checkpoints.tokens)
                for a in range(min(resume, ordered), ordered, UNITS_PER_SLICE):
                    b = min(ordered, a + UNITS_PER_SLICE)
                    files, local = _slice_units(file_ids, perm, units, cursor, a, b)
                    starts, ends = units.bounds(files, local)
                    move_units(pool, files, starts, ends, writer, inner, progress=shown)
                if prepared.keep_tails:  # the partial last chunk of each file, in file order, after every full chunk
                    pending = np.flatnonzero(prepared.tails)[max(0, resume - ordered) :]
                    chunk_starts = units.counts[pending] * units.chunk
                    move_units(pool, pending, chunk_starts, prepared.tokens[pending], writer, inner, progress=shown)
            read, kept = contents.result()
        if kept != checkpoints.contents and mix is None:  # a bug, unless an input is not what its record says
            _refuse_inputs_not_as_recorded(prepared, pool)  # (a mixture's were held to their records as they were read)
    check_kept(f"merge {config.stem}", kept, checkpoints.contents)
    return read


def _refuse_inputs_not_as_recorded(prepared: Prepared, pool: SourcePool) -> None:
    """Read every input that has a record again, and refuse the first whose bytes are not what it records: the
    proof took the inputs' contents from their records, so an input changed since its stage wrote it would
    otherwise read as a bug of the merge."""
    for f, recorded in enumerate(prepared.recorded):
        if recorded is None:
            continue
        (held,) = contents_of(pool, f, (prepared.inputs.file_ends(f), int(prepared.tokens[f])))
        _refuse_unless_recorded(prepared, f, held)


def _refuse_unless_recorded(prepared: Prepared, f: int, held: Contents) -> None:
    """Refuse input ``f`` when it has a record and its bytes, which hold ``held``, are not what it records."""
    recorded = prepared.recorded[f]
    if recorded is not None and held != recorded.value:
        raise InputNotAsRecorded(
            f"{prepared.inputs.urls[f]}: holds {held.describe()}, its manifest records "
            f"{recorded.value.describe()}: it is not the file its stage wrote"
        )


def _input_contents(prepared: Prepared, pool: SourcePool) -> tuple[Contents, Contents]:
    """What the merge read (its inputs cut at their indexes) and what its files must hold (cut into its units, the
    dropped tails aside): from the inputs' records when all hold them and the units are their documents, else hashed
    from the input files (datatrove's, or cut into chunks)."""
    chunk = prepared.units.chunk
    if prepared.mix is not None:
        return _mixed_contents(prepared, prepared.mix, pool)
    known = [recorded for recorded in prepared.recorded if recorded is not None]
    if not chunk and len(known) == len(prepared.recorded):
        read = Contents.total(recorded.value for recorded in known)
        return read, read
    read = kept = Contents()
    for f in range(len(prepared.inputs.urls)):
        ends, tokens = prepared.inputs.file_ends(f), int(prepared.tokens[f])
        if not chunk:
            (whole,) = contents_of(pool, f, (ends, tokens))
            read, kept = read + whole, kept + whole
            continue
        full = int(prepared.units.counts[f]) * chunk
        limit = tokens if prepared.keep_tails else full
        units = sorted_union(ends[ends <= limit], np.arange(chunk, full + 1, chunk))
        whole, cut = contents_of(pool, f, (ends, tokens), (units, limit))
        read, kept = read + whole, kept + cut
    return read, kept


def _mixed_contents(prepared: Prepared, mix: Mixed, pool: SourcePool) -> tuple[Contents, Contents]:
    """What a mixture's merge read (its inputs whole), and what its files must hold: each document as many times
    as it is used, each of its source, hashed from the input files (a document's hash is not in its rank's
    records); an input whose record says otherwise is refused, naming it (its whole is what its rank recorded)."""
    read = kept = Contents()
    offsets = prepared.inputs.offsets
    for f in range(len(prepared.inputs.urls)):
        uses, sources = (mine[offsets[f] : offsets[f + 1]] for mine in (mix.uses, mix.sources))
        whole, used = uses_contents(pool, f, prepared.inputs.file_ends(f), int(prepared.tokens[f]), uses, sources)
        _refuse_unless_recorded(prepared, f, whole)
        read, kept = read + whole, kept + used
    return read, kept


def _slice_units(
    file_ids: np.ndarray, perm: np.ndarray | None, units: Units, cursor: np.ndarray, a: int, b: int
) -> tuple[np.ndarray, np.ndarray]:
    """Files and unit numbers within their file for ordering entries ``a..b``; advances ``cursor``."""
    if perm is not None:  # shuffle mode: a global unit id -> (file, unit in file)
        starts = np.concatenate([[0], np.cumsum(units.counts)])
        global_ids = perm[a:b]
        files = np.searchsorted(starts, global_ids, side="right") - 1
        return files, global_ids - starts[files]
    files = file_ids[a:b].astype(np.int64)
    by_file = np.argsort(files, kind="stable")
    sorted_files = files[by_file]
    firsts = np.searchsorted(sorted_files, sorted_files, side="left")
    rank = np.empty(len(files), dtype=np.int64)
    rank[by_file] = np.arange(len(files)) - firsts
    local = cursor[files] + rank
    cursor += np.bincount(files, minlength=len(cursor))
    return files, local
