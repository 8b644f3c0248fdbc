"""Context-window shuffle: each token file is cut into windows of ``context_window`` tokens (a training context
plus one) and the windows are permuted, so consecutive training samples come from different places.

The permutation is datatrove's DocumentTokenizerContextShuffler's (``tokenization.orderings``): one generator
per task, one permutation of the windows per file, drawn file after file. Unlike datatrove, nothing is lost: loss
bytes move with their windows, document ends inside a window move with it and every window end becomes an index
entry, the tail shorter than a window is kept at the end (and counted), and metadata and a manifest are written.
The task takes ``files[shard::num_shards]`` of the sorted input, so a folder can be shuffled by many tasks.

``context_mode: packed`` packs whole documents into the windows instead (``formats.packing``: Best-Fit Decreasing,
a document longer than a window cut into windows first), pads the rest of each window with ``pad_id`` at loss 0,
and shuffles the windows the same way. Every window then holds exactly ``context_window`` tokens, no document that
fits one is cut, and the index marks each document's end and each window's, so a reader that restarts positions at
document ends starts each document at 0.

Its files are a build's dataset, so the task checks each one before it uploads it (verify's checks,
``stages.verify.OwnCheck``), on the blocks as it writes them, never reading them back: as many tasks as there are
shards check the dataset, and publish then reads none of it. It proves its windows hold the file's pieces, each
once, from the file's record where it has one (a build's files), reading none of its bytes again; else by hashing
the file again as it moves its windows.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np

from tokenization import orderings
from tokenization.errors import UsageError
from tokenization.formats import sidecar
from tokenization.formats.block_checks import Checks
from tokenization.formats.checks import OwnCheck
from tokenization.formats.contents import Contents, ContentsHasher, ShuffleCheckFailed, check_kept
from tokenization.formats.ds import (
    SplitWriter,
    TokenFile,
    TokenFileError,
    WrittenTokenFile,
)
from tokenization.formats.kept import KeptPieces
from tokenization.formats.moves import fixed_units, move_units, prefix_end, starts_of
from tokenization.formats.packing import PackedFile, pack
from tokenization.formats.rejoin import Cuts, PieceCounts, cut_pieces, rejoined_contents
from tokenization.formats.source_pool import Blocks, SourcePool, contents_of
from tokenization.options import Options, option
from tokenization.output import manifest
from tokenization.output.attempts import Attempt, attempt_at
from tokenization.output.manifest import StageResult
from tokenization.progress import Progress, ProgressMode
from tokenization.records import (
    ContentsSum,
    ContextCounts,
    ContextManifest,
    ContextOutput,
    ContextParams,
    PadToken,
    PseudoEnds,
)
from tokenization.stages.context_padding import (
    packed_counts,
    padding_class,
    padding_classes,
    padding_contents,
    padding_file,
)
from tokenization.storage.concurrent import meanwhile
from tokenization.storage.folder import Folder, file_at

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 2049
TALLIED = (  # ContextCounts' fields, summed over files
    "windows",
    "tokens",
    "tail_tokens_kept",
    "tokens_dropped",
    "documents_whole",
    "documents_split",
    "split_pieces",
    "padding_tokens",
)


@dataclass(frozen=True, kw_only=True)
class ContextOptions(Options):
    """Context shuffle: the training windows files are cut into (context-shuffle and build share this)."""

    context_window: int = option(
        DEFAULT_WINDOW,
        minimum=0,
        title="Context window + 1",
        help="tokens a training window holds, plus one; the files are cut into such windows and shuffled (0 skips "
        "the context shuffle of a build)",
    )
    context_mode: Literal["windows", "packed"] = option(
        "windows",
        title="Context windows",
        help="windows: the files cut into windows, documents cut at every window's edge (datatrove's bytes); "
        "packed: whole documents packed into windows by Best-Fit Decreasing (one longer than a window cut into "
        "windows first), the rest of a window padding at loss 0 (needs save_loss)",
    )


@dataclass(frozen=True, kw_only=True)
class ContextShuffleConfig(ContextOptions):
    """One context-shuffle task: its share of a folder's files, cut into windows and permuted."""

    input: str = option(flag="", help="a .ds file, or a folder or fsspec URL holding them")
    output: str = option(help="output folder or fsspec URL (file names are kept)")
    seed: int = option(0, minimum=0, help="shuffle seed: the same seed gives the same bytes")
    shard: int = option(0, minimum=0, help="this task's shard: files shard, shard + num shards, ... of the sorted list")
    num_shards: int = option(1, minimum=1, help="how many tasks share the folder's files")
    drop_tail: bool = option(False, help="drop each file's tail shorter than a window, as datatrove does (counted)")
    local_working_dir: str | None = option(None, help="local folder for staging (default: beside a local output)")
    pad_id: int | None = option(None, minimum=0, help="with --context-mode packed: the token id padding a window")
    pad_token: str | None = option(None, help="with --context-mode packed: that token's text, for the manifest")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.context_window:
            raise UsageError("context_window must be at least 1: a build skips the context shuffle with 0")
        if self.context_mode == "packed" and self.pad_id is None:
            raise UsageError("--context-mode packed pads windows: give --pad-id (a build uses its tokenizer's pad)")
        if self.context_mode == "packed" and self.drop_tail:
            raise UsageError("--context-mode packed leaves no tail to drop: no --drop-tail")
        if self.shard >= self.num_shards:
            raise UsageError(f"shard {self.shard} is outside 0..{self.num_shards - 1}")

    @property
    def stem(self) -> str:
        return f"context_{self.shard:05d}"

    @property
    def padding_id(self) -> int:
        """``pad_id``, which packed windows need (a packed config is refused without it)."""
        if self.pad_id is None:
            raise UsageError("--context-mode packed pads windows: give --pad-id")
        return self.pad_id


def shard_files(config: ContextShuffleConfig, given: Folder) -> tuple[Folder, list[tuple[str, str]]]:
    """The task's share of the input ``given``, each file by its URL and name, and the folder that holds them: one
    ``.ds`` file, or ``files[shard::num_shards]`` of a folder's."""
    if given.is_folder():
        files = [(url, file_at(url)[1]) for url in manifest.token_files(given)]
        return given, files[config.shard :: config.num_shards]
    holder, name = file_at(config.input, config.storage_options)
    return holder, [(config.input, name)][config.shard :: config.num_shards]


def context_shuffle(
    config: ContextShuffleConfig, progress: ProgressMode = None, owner: str | None = None, checks: Checks | None = None
) -> StageResult[ContextCounts, ContextManifest]:
    """Shuffle this task's files into ``config.output``, one output family per input file, under its name, each
    checked before upload (ids and document ends against ``checks``, when a build knows its tokenizer)."""
    started = time.time()
    own = OwnCheck(checks or Checks(), f"context shuffle {config.stem}")
    given, output = config.folder(config.input), config.folder(config.output)  # the stage's folders, opened once
    holder, files = shard_files(config, given)
    sources = [TokenFile(url, storage_options=config.storage_options) for url, _ in files]
    rng = orderings.generator(config.seed)  # one generator for the task, drawn file after file
    described = manifest.output_entries(holder) if files else {}
    tally: Counter[str] = Counter()  # of ContextCounts' fields
    histogram = np.zeros(padding_classes(config.context_window), dtype=np.int64)
    outputs: list[ContextOutput] = []
    contents_in = contents_out = Contents()
    with attempt_at(output, config.stem, config.local_working_dir, owner) as attempt:

        def tally_file(url: str, source: TokenFile, recorded: Contents | None, shuffled: _Shuffled) -> None:
            """Count a file's shuffle, once its windows are proved, and place its family in the attempt."""
            nonlocal contents_in, contents_out, histogram
            written, full, packed, read = shuffled.written, shuffled.full, shuffled.packed, shuffled.read
            if recorded is not None and recorded != read:
                raise TokenFileError(
                    f"{url}: holds {read.describe()}, its manifest records {recorded.describe()}: it is not "
                    "the file its stage wrote"
                )
            contents_in += read
            grid = full * config.context_window  # whole windows' ends are not documents' ends
            if packed is not None:
                tally.update(packed_counts(packed))
                histogram += np.bincount(padding_class(packed.padding), minlength=len(histogram))
            else:
                tail = source.num_tokens - grid
                tally["tokens_dropped" if config.drop_tail else "tail_tokens_kept"] += tail
            if written is None:  # shorter than a window, its tail dropped: no file, the tokens counted
                return
            contents_out += written.contents
            entry = manifest.output_entry(written, ContextOutput, source=url, pseudo_ends=shuffled.pseudo)
            own.family(attempt.work, entry)
            attempt.place_families([written])
            outputs.append(entry)
            tally.update(windows=full, tokens=written.tokens)
            log.info("context shuffle %s: %d windows of %d", written.name, full, config.context_window)

        total = sum(s.num_tokens for s in sources)
        # A file's proof runs on a thread of its own while the next file's windows move: one core would otherwise
        # wait for it, file after file. Each is counted once the next has moved: one proof at a time beside moves.
        proving = ThreadPoolExecutor(1, thread_name_prefix="prove")
        blocks = Blocks(), Blocks()  # the block buffers of each file's moves, used again by the next file's
        with Progress(f"context shuffle {config.stem}", total, "tok", progress) as shown, proving:
            proved: tuple[str, TokenFile, Contents | None, Future[_Shuffled]] | None = None
            for (url, name), source in zip(files, sources, strict=True):
                if source.num_tokens == 0:  # nothing to cut; datatrove's empty files stay behind
                    continue
                found = described[name].entry if name in described else None  # the file's record, if any
                nested = found is not None and found.pseudo_ends is not None
                if nested and config.context_mode == "packed":
                    raise TokenFileError(f"{url}: its index holds chunk ends, not documents: nothing to pack")
                recorded = found.contents.value if found is not None and found.contents is not None else None
                moved = _one_file(config, url, name, source, rng, attempt, shown, own, nested, recorded, blocks)
                proof = proving.submit(moved)
                del moved  # the proof's call holds the file's arrays (its index, its pieces): gone once it has run
                if proved is not None:  # the file before, proved while this one moved
                    tally_file(*proved[:3], proved[3].result())
                proved = url, source, recorded, proof
            if proved is not None:
                tally_file(*proved[:3], proved[3].result())
        packed_mode = config.context_mode == "packed"
        counts = ContextCounts(
            files=len(files),
            padding_histogram=histogram.tolist() if packed_mode else [],
            **{k: tally[k] for k in TALLIED},
            contents_in=ContentsSum.of(contents_in),
            contents_out=ContentsSum.of(contents_out),
        )
        record = ContextManifest(
            stage="context_shuffle",
            **manifest.provenance(config, time.time() - started, ContextParams),
            seed=config.seed,
            inputs=[url for url, _ in files],
            counts=counts,
            outputs=outputs,
            checked=own.result(),
            pad=PadToken(id=config.padding_id, token=config.pad_token) if packed_mode else None,
        )
        record = attempt.commit(record, record.output_files())
    return StageResult(counts, record)


@dataclass(frozen=True)
class _Shuffled:
    """One file's windows written: the family (None: no window, the file's tokens all in a dropped tail), its whole
    windows, its packing (None: cut windows), the contents of the input file, and the index entries that are window
    ends, not document ends ("unknown": the input's index held chunk ends already)."""

    written: WrittenTokenFile | None
    full: int
    packed: PackedFile | None
    read: Contents
    pseudo: PseudoEnds | Literal["unknown"] | None


def _one_file(
    config: ContextShuffleConfig,
    url: str,
    name: str,
    source: TokenFile,
    rng: np.random.Generator,
    attempt: Attempt,
    shown: Progress,
    own: OwnCheck,
    nested: bool,
    recorded: Contents | None,
    blocks: tuple[Blocks, Blocks],
) -> Callable[[], _Shuffled]:
    """One file's windows in a permuted order: cut from the file (the tail last, unless dropped), or packed with
    its documents and padded to their end, checked by ``own`` as they are written; and the call that checks them
    again, which the caller makes: the windows hold the file's pieces, cut at their edges, each once. Cut windows
    of a file whose contents are ``recorded`` are joined again into its documents (``_rejoined``), by that call,
    which closes the file's sources; others are proved by reading the file again as they move, before it returns."""
    ends = _positions(source.ends)
    total = int(ends[-1]) if len(ends) else 0
    if source.num_tokens != total:
        raise TokenFileError(f"{url}: {source.num_tokens} tokens, but its index ends at {total}")
    packed, cuts = None, None
    if config.context_mode == "packed":
        if source.sources is not None:
            raise UsageError(f"{url}: a mixture's file; packed windows do not carry its documents' sources yet")
        packed = _packed(config, url, source, ends, rng)
        padding = padding_file(attempt.work / "padding" / "pad.ds", source, config.padding_id, packed.padding_tokens)
        urls, units, inner, full = [url, padding], (packed.source, packed.starts, packed.ends), None, packed.windows
        kept, every = total, np.asarray(packed.pieces.ends, dtype=np.int64)  # the pieces in stream order
    else:
        windows, full = fixed_units(total, config.context_window)
        keep_tail = total > full * config.context_window and not config.drop_tail
        order = orderings.with_tail(orderings.shuffled(rng, full), full, keep_tail)
        starts = starts_of(windows)
        of_source = np.zeros(len(order), np.uint8)  # every window's source, 0: a byte each, not 8
        urls, units, inner = [url], (of_source, starts[order], windows[order]), [ends]
        kept = prefix_end(windows, len(order))  # the dropped tail aside
        cuts = Cuts(ends, windows[: len(order)])  # every piece's end, its document's or its window's: never whole
        del order, starts  # 8 bytes a window each, which the units hold again as they move
    with_loss = source.loss is not None
    grid = full * config.context_window  # whole windows' ends are not documents' ends; the output holds them all
    pseudo: PseudoEnds | Literal["unknown"] | None
    pseudo = "unknown" if nested else manifest.pseudo_ends(0, grid, config.context_window, grid)
    rejoin = recorded is not None and cuts is not None  # cut windows, proved from the record
    plan = cut_pieces(cuts, units[1], units[2]) if cuts is not None and rejoin else None  # the pieces it keeps
    kept_at = attempt.work / "kept" / name
    parts = None if plan is None else KeptPieces(kept_at, plan.chosen, plan.numbers, plan.counts.every)
    writer = SplitWriter(
        attempt.work,
        lambda _: name,
        tokenizer=source.tokenizer,
        token_size=source.token_size,
        save_loss=with_loss,
        observe=lambda path: own.watch(path, pseudo),
        keep_pieces=parts,
        keep_hashes=source.sources is not None,  # a mixture's: its sidecar gives them their sources
        expected_tokens=int((units[2] - units[1]).sum()),
        cached=False,  # a build's last files: read again only by publish's MDS export, when asked (in order)
    )
    inputs = attempt.work / "inputs" / name  # a file's own: its proof, which deletes it, runs beside the next's moves
    pool = SourcePool(
        urls, source.token_size, with_loss, cache_dir=inputs, storage_options=config.storage_options, blocks=blocks
    )
    with ExitStack() as opened:
        opened.enter_context(pool)
        if parts is not None and plan is not None and recorded is not None and cuts is not None:  # (rejoin)
            opened.callback(parts.remove)
            with writer:
                move_units(pool, *units, writer, inner, progress=shown)
            mixed = units[1] if source.sources is not None else None  # a mixture's, to find its pieces' sources
            if mixed is None:
                parts.sealed()  # the numbers it kept by let go before the proof runs
            del units, inner  # the proof holds the plan's counts, the cuts and the kept pieces (on disk)

            def prove(
                held: ExitStack, parts: KeptPieces, counts: PieceCounts, cuts: Cuts, recorded: Contents
            ) -> _Shuffled:
                with held:
                    written = _with_sources(writer.written, source, ends, mixed, config.context_window, parts)
                    read = _rejoined(url, pool, written, parts, counts, cuts, kept, recorded, source.sources)
                return _Shuffled(written, full, packed, read, pseudo)

            return partial(prove, opened.pop_all(), parts, plan.counts, cuts, recorded)
        if cuts is not None:
            every = cuts.every()
        spans = (ends, total), (every[every <= kept], kept)
        sourced = None if source.sources is None else [_of_pieces(source.sources, ends, c) for c, _ in spans]
        with meanwhile(partial(contents_of, sources=sourced), pool, 0, *spans) as contents:  # read again
            with writer:
                move_units(pool, *units, writer, inner, progress=shown)
            read, expected = contents.result()
    written = _with_sources(writer.written, source, ends, units[1], config.context_window)
    if packed is not None:
        expected += padding_contents(packed.padding, config.padding_id, source.dtype)
    check_kept(f"context shuffle of {url}", expected, written.contents if written else Contents())
    return partial(_Shuffled, written, full, packed, read, pseudo)


def _positions(index: np.ndarray) -> np.ndarray:
    """An index's entries as int64, the mapped file viewed, not copied (8 bytes a document): a damaged entry past
    2^63 reads as negative either way."""
    index = np.asarray(index)
    return index.view(np.int64) if index.dtype == np.uint64 else index.astype(np.int64)


def _of_pieces(sources: np.ndarray, ends: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """The source of each piece of a stream cut at ``cuts`` (the pieces' ends, sorted): that of the document whose
    index entry in ``ends`` comes first after the piece's first token."""
    starts = np.concatenate([[0], cuts[:-1]]).astype(np.int64)
    return np.asarray(sources)[np.searchsorted(ends, starts, side="right")]


def _with_sources(
    written: list[WrittenTokenFile],
    source: TokenFile,
    ends: np.ndarray,
    starts: np.ndarray | None,
    window: int,
    parts: KeptPieces | None = None,
) -> WrittenTokenFile | None:
    """The file's windows (None: none), with a mixture's ``.source`` sidecar when its input has one: each piece's
    source is that of the document its first token comes from, found from where its window starts in the input
    (``starts``: in output order; every window is whole but a kept tail, which comes last). The pieces its writer
    kept (``parts``) get theirs too, for the proof that joins them again; they are sealed either way."""
    sources = source.sources
    if not written or sources is None or source.metadata is None or starts is None:
        if parts is not None:
            parts.sealed()
        return written[0] if written else None
    (family,) = written
    pieces = np.asarray(TokenFile(str(family.path), source.token_size).ends, dtype=np.int64)
    first = np.concatenate([[0], pieces[:-1]])  # each piece's first token in the output
    at = starts[first // window] + first % window  # and in the input
    documents = np.searchsorted(ends, at, side="right")
    of_pieces = np.asarray(sources)[documents]
    (family,) = sidecar.attach([family], of_pieces, source.metadata.sources)
    if parts is not None:  # every piece of a window holds a token: one an entry
        parts.sealed(of_pieces)
    return family


def _rejoined(
    url: str,
    pool: SourcePool,
    written: WrittenTokenFile | None,
    parts: KeptPieces,
    counts: PieceCounts,
    cuts: Cuts,
    kept: int,
    recorded: Contents,
    sources: np.ndarray | None,
) -> Contents:
    """The file's contents, from its windows as written (None: no window), the pieces of them that window edges cut,
    which its writer kept (``parts``), and its dropped tail, read alone (``formats.rejoin.rejoined_contents``),
    each piece of its mixture source where the file has ``sources`` (one a document). When they are not its
    record, the file is read to tell a bug of the shuffle (refused here) from a file that is not the one its stage
    wrote (its contents returned, which the caller refuses)."""
    ends = cuts.index
    total = int(ends[-1])
    behind = cuts.after(kept)
    of_tail = None if sources is None else _of_pieces(sources, ends, np.concatenate([[kept], behind]))[1:]
    tail = ContentsHasher(keep=np.arange(len(behind)), sources=of_tail)  # every piece of it
    tokens, loss = pool.read(0, kept, total)
    tail.add(tokens, behind - kept, loss)
    tail.result()
    done = written.contents if written is not None else Contents()
    read = rejoined_contents(done, parts.reader(), counts, cuts, tail.kept_pieces())
    if read == recorded:
        return read
    (held,) = contents_of(pool, 0, (ends, total), sources=None if sources is None else [sources])
    if held == recorded:
        raise ShuffleCheckFailed(
            f"context shuffle of {url} wrote other pieces than it read: its windows do not join again into the "
            f"file's documents ({recorded.describe()}): a bug, so nothing of it is published; please report it with "
            "this line"
        )
    return held


def _packed(
    config: ContextShuffleConfig, url: str, source: TokenFile, ends: np.ndarray, rng: np.random.Generator
) -> PackedFile:
    """The file's documents packed into windows (``formats.packing.pack``), once its loss bytes and pad are checked."""
    if source.loss is None:
        raise TokenFileError(
            f"{url}.loss is missing: packed windows pad at loss 0, so every token needs its loss "
            "(tokenize with --save-loss)"
        )
    if config.padding_id > np.iinfo(source.dtype).max:
        raise UsageError(f"--pad-id {config.pad_id} does not fit {url}'s {source.token_size}-byte tokens")
    return pack(ends, config.context_window, rng)
