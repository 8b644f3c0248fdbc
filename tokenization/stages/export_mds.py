"""A build's context windows as an MDS dataset (``formats.mds``), for trainers that read mosaicml streaming's
``StreamingDataset`` or litdata: written by publish for a build with ``mds`` (into ``{run}/mds``, before the build
record, which names its index's sha256), or by ``tokenization mds`` from any published build.

A sample is a window, in the order of the ``.ds`` files (sorted, as datatrove lists them) and of the windows in
each: ``tokens`` (its ids, the build's token size), ``loss`` (a byte a token, 0 = no loss; where the build saved
the loss mask) and ``doc_ends`` (uint32: the exclusive end of each document, or piece of one, in the window, as
``.ds.index`` marks them; the window's own end last), and a mixture's ``sources`` (each piece's source id, as
``.ds.source`` holds it, the ids named in ``sources.json``). A file's tail, shorter than a window, is its last sample
unless the build dropped tails. The bytes are moved, never decoded or re-tokenized: the samples' tokens, loss
bytes and ends are exactly the context files', which the export checks as it goes (every window's last index
entry at its end; every token and window of the build written).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import nullcontext
from typing import IO

import numpy as np

from tokenization.errors import UsageError
from tokenization.formats import token_file_names
from tokenization.formats.ds import LOSS_DTYPE, SOURCE, SOURCE_DTYPE, TokenFile, TokenFileError
from tokenization.formats.mds import HASH, INDEX, SHARD, SIZE_LIMIT, Column, MdsWriter
from tokenization.output import manifest
from tokenization.output.cache import OWN_FILE
from tokenization.output.runs import BUILD_MANIFEST, LATEST, RUN_CLAIM, Layout, read_build
from tokenization.progress import Progress, ProgressMode
from tokenization.records import BuildRecord, ContextManifest, MdsOutput
from tokenization.storage.folder import Folder, file_at

BLOCK_BYTES = 16 << 20  # tokens read at once: whole windows, ~16 MiB (a window's samples are encoded from it)
ENDS_DTYPE = np.dtype("<u4")  # a window of up to 2**32 tokens
SOURCES = "sources.json"  # beside a mixture's MDS: the names of its source ids, ["web", "code", ...]
EXPORTED = "_MDS.json"  # beside an export's MDS outside the run folder: which build it holds (its digest)
Columns = dict[str, np.ndarray]


def export_mds(
    run: Folder, out: Folder | None = None, size_limit: int = SIZE_LIMIT, progress: ProgressMode = None
) -> MdsOutput:
    """``tokenization mds``: the published build in ``run`` as MDS in ``out`` (default: the run's ``mds/``)."""
    if run.is_file():
        raise UsageError(f"{run.url} is a file: RUN_DIR is a published build's folder")
    record = read_build(run)
    if record is None:
        raise UsageError(f"{run.url}: no published build there (no _BUILD.json): MDS is written from one")
    layout = Layout(run)
    if not record.params.context_window:
        raise UsageError(
            f"{run.url}: the build has no context windows (built without --context-window): an MDS sample is one"
        )
    out = out or layout.mds
    own = out.same_as(layout.mds)
    if not own:
        _refuse_other(run, out, record)
    if record.mds is not None and out.location == layout.mds.location and size_limit != SIZE_LIMIT:
        raise UsageError(
            f"{out.url} holds the MDS that publish wrote in {SIZE_LIMIT:,}-byte shards, which the build record "
            "names: write other shard sizes elsewhere (--out)"
        )
    if not own:  # before any shard: an export killed midway is this build's to write again
        out.put(EXPORTED, json.dumps({"build": run.url, "digest": record.digest}).encode())
    written = write_mds(layout.context, out, window_of(layout.context), size_limit, progress)
    if written.tokens != record.tokens:
        raise TokenFileError(f"{written.folder}: wrote {written.tokens:,} tokens; the build has {record.tokens:,}")
    return written


def _refuse_other(run: Folder, out: Folder, record: BuildRecord) -> None:
    """A UsageError unless ``out``, other than the run's own ``mds/``, may take this build's MDS: a folder outside
    every build's run folder and every cache, not a builds output, holding no token files and no MDS but an earlier
    export of this build's (its ``_MDS.json`` names the build's digest). Any other would lose or corrupt what it
    holds, or mix the MDS with it."""
    for folder in out.and_above():
        if folder.is_file():
            raise UsageError(f"{folder.url} is a file: --out names the MDS dataset's folder")
        owner = next((name for name in (BUILD_MANIFEST, RUN_CLAIM, OWN_FILE) if folder.exists(name)), None)
        if owner == OWN_FILE:
            raise UsageError(
                f"{out.url} is inside the tokenization cache {folder.url}: MDS goes in a folder of its own"
            )
        if owner and folder.same_as(run):
            raise UsageError(
                f"{out.url} is inside the build's own folder, where MDS goes only in {Layout(run).mds.url}"
            )
        if owner:
            raise UsageError(
                f"{out.url} is inside the folder of another build, {folder.url} (it holds {owner}): "
                f"MDS of {run.url} goes in its own mds/ or in a folder outside every build's"
            )
    names = out.list()
    if LATEST in names:
        raise UsageError(
            f"{out.url} is a builds output (it holds {LATEST}, beside its builds): MDS goes in a folder of its own"
        )
    if tokens := token_file_names(names):
        raise UsageError(f"{out.url} holds token files ({tokens[0]}): MDS goes in a folder of its own")
    if any(name in (INDEX, SOURCES) or SHARD.fullmatch(name) for name in names):
        try:
            written_for = json.loads(out.read(EXPORTED))
        except (FileNotFoundError, ValueError):
            written_for = None
        if not isinstance(written_for, dict) or written_for.get("digest") != record.digest:
            of = f"of {written_for.get('build')}" if isinstance(written_for, dict) else f"that no {EXPORTED} names"
            raise UsageError(
                f"{out.url} holds an MDS dataset {of}, not of {run.url}: remove it, or choose another --out"
            )


def window_of(context: Folder) -> int:
    """The window of a build's context files, as the context shuffle that cut them recorded it: publish and
    ``tokenization mds`` both take it from here, so that a sample is always one window the files hold."""
    windows = set()
    for record in manifest.stage_records(context):
        if isinstance(record, ContextManifest):
            try:
                windows.add(record.context_window)
            except ValueError as exc:
                raise TokenFileError(f"{context.url}: a context manifest's {exc}") from None
    if len(windows) != 1:
        what = "no context manifest" if not windows else f"windows of {sorted(windows)} tokens"
        raise TokenFileError(f"{context.url}: {what}: MDS samples are the windows of one context shuffle")
    return windows.pop()


def write_mds(
    dataset: Folder, out: Folder, window: int, size_limit: int = SIZE_LIMIT, progress: ProgressMode = None
) -> MdsOutput:
    """The context files of ``dataset``, a sample a window, as MDS shards and ``index.json`` in ``out``."""
    sizes = dataset.sizes()
    urls = manifest.token_files(dataset)
    files = [TokenFile(url, listing=sizes, storage_options=dataset.options) for url in urls]
    token_size = files[0].token_size if files else 2  # (no file, no shard: the columns are written nowhere)
    with_loss = bool(files) and files[0].exists(".loss")
    for file in files[1:]:  # one dtype a column: a file unlike the first would be cast, or lose a column
        if _kind(file) != _kind(files[0]):
            raise TokenFileError(
                f"{file.url}: {_kind(file)}; {files[0].url}: {_kind(files[0])}: one MDS dataset holds one kind"
            )
    names = files[0].metadata.sources if files and files[0].metadata else ()
    columns = [Column("tokens", np.dtype(f"<u{token_size}")), Column("doc_ends", ENDS_DTYPE)]
    columns += [Column("loss", LOSS_DTYPE)] if with_loss else []
    columns += [Column("sources", SOURCE_DTYPE)] if names else []
    writer = MdsWriter(out, columns, size_limit)
    if names:  # the names of a mixture's source ids, before the index that makes the dataset whole
        out.put(SOURCES, json.dumps(list(names)).encode())
    else:
        out.remove(SOURCES)
    total = sum(file.num_tokens for file in files)
    tokens = windows = 0
    with Progress(f"MDS {out.url}", total, "tok", progress) as shown:
        for file in files:
            for values, lengths in _windows(dataset, file, window, with_loss):
                writer.write(values, lengths)
                tokens += len(values["tokens"])
                windows += len(lengths["tokens"])
            shown.update(tokens, windows=windows)
        index_sha256 = writer.finish()
    if (writer.samples, tokens) != (windows, total):
        raise TokenFileError(
            f"{out.url}: wrote {writer.samples:,} of {windows:,} windows, {tokens:,} of {total:,} tokens"
        )
    return MdsOutput(
        folder=out.url, shards=len(writer.shards), windows=windows, tokens=tokens, index_sha256=index_sha256
    )


def mds_problems(recorded: MdsOutput, out: Folder, read: bool = True) -> list[str]:
    """How the MDS in ``out`` differs from what a build record says publish wrote: its index's sha256; a shard the
    index names that is missing or of another size; with ``read``, a shard whose sha1 is not the index's."""
    try:
        index = out.read(INDEX)
    except FileNotFoundError:
        return [f"{out.url_of(INDEX)} is missing: the build record says publish wrote it"]
    if (digest := hashlib.sha256(index).hexdigest()) != recorded.index_sha256:
        return [f"{out.url_of(INDEX)}: sha256 {digest}, but the build record says {recorded.index_sha256}"]
    sizes = out.sizes()
    problems = []
    for shard in json.loads(index)["shards"]:
        name, size, sha1 = shard["raw_data"]["basename"], shard["raw_data"]["bytes"], shard["raw_data"]["hashes"][HASH]
        if name not in sizes:
            problems.append(f"{out.url_of(name)} is missing: the index names it")
        elif sizes[name] != size:
            problems.append(f"{out.url_of(name)}: {sizes[name]:,} bytes, but the index says {size:,}")
        elif read and hashlib.sha1(out.read(name), usedforsecurity=False).hexdigest() != sha1:
            problems.append(f"{out.url_of(name)}: its sha1 is not the {sha1} the index says")
    return problems


def _kind(file: TokenFile) -> str:
    """What makes a file's columns: its token size, its loss bytes, its sources."""
    sources = f", sources {','.join(file.metadata.sources)}" if file.metadata and file.metadata.sources else ""
    return f"{file.token_size} bytes a token, {'with' if file.exists('.loss') else 'no'} .loss{sources}"


def _windows(folder: Folder, file: TokenFile, window: int, with_loss: bool) -> Iterator[tuple[Columns, Columns]]:
    """The file's windows as samples, a block of whole windows at a time, in order: each column's values, and the
    length of each window's."""
    _, name = file_at(file.url)
    ends = np.asarray(file.ends, dtype=np.int64)
    sources = np.asarray(file.sources) if file.sources is not None else None
    if sources is not None and len(sources) != len(ends):
        raise TokenFileError(f"{file.url}{SOURCE}: {len(sources):,} bytes for {len(ends):,} index entries")
    total = file.num_tokens
    per_block = max(1, BLOCK_BYTES // (window * file.token_size)) * window
    with folder.open(name) as tokens, folder.open(name + ".loss") if with_loss else nullcontext() as loss:
        for first in range(0, total, per_block):
            count = min(per_block, total - first)
            block = _read(tokens, count, file.dtype, file.url)
            losses = _read(loss, count, LOSS_DTYPE, file.url + ".loss") if loss is not None else None
            bounds = np.append(np.arange(first, first + count, window), first + count)  # the block's windows
            cuts = np.searchsorted(ends, bounds, side="right")  # window i's entries: ends[cuts[i] : cuts[i + 1]]
            if np.any(cuts[1:] <= cuts[:-1]) or not np.array_equal(ends[cuts[1:] - 1], bounds[1:]):
                raise TokenFileError(f"{file.url}.index: an entry does not end each window of {window:,} tokens")
            inside = ends[cuts[0] : cuts[-1]] - np.repeat(bounds[:-1], np.diff(cuts))  # relative to their windows
            values = {"tokens": block, "doc_ends": inside}
            lengths = {"tokens": np.diff(bounds), "doc_ends": np.diff(cuts)}
            if losses is not None:
                values["loss"], lengths["loss"] = losses, lengths["tokens"]
            if sources is not None:  # a mixture's: each piece's source, as each document end
                values["sources"], lengths["sources"] = sources[cuts[0] : cuts[-1]], lengths["doc_ends"]
            yield values, lengths
    if len(ends) and ends[-1] != total:
        raise TokenFileError(f"{file.url}.index: its last entry is {ends[-1]:,}, the file holds {total:,} tokens")


def _read(stream: IO[bytes], count: int, dtype: np.dtype, label: str) -> np.ndarray:
    """The next ``count`` items of ``stream``; a TokenFileError naming the file if it ends before."""
    data = stream.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise TokenFileError(f"{label}: ended after {len(data):,} of the {count * dtype.itemsize:,} bytes expected")
    return np.frombuffer(data, dtype)
