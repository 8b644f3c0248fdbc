"""Context-window shuffle: each token file is cut into windows of ``context_window`` tokens (a training context
plus one) and the windows are permuted, so consecutive training samples come from different places.

The permutation is datatrove's DocumentTokenizerContextShuffler's: one ``default_rng(seed)`` per task, one
``permutation(n_windows)`` per file, drawn file after file. Unlike datatrove, nothing is lost: loss bytes move
with their windows, document ends inside a window move with it and every window end becomes an index entry,
the tail shorter than a window is kept at the end (and counted), and metadata and a manifest are written.
The task takes ``files[shard::num_shards]`` of the sorted input, so a folder can be shuffled by many tasks.

Its files are a build's dataset, so the task checks each one on local disk before it uploads it (verify's checks,
``stages.verify.OwnCheck``): the bytes are read again where they are, by as many tasks as there are shards, and
publish then reads none of them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileError, WrittenTokenFile
from tokenization.formats.permute import SourcePool, fixed_units, permute_units
from tokenization.io.errors import UsageError
from tokenization.io.options import Options, option
from tokenization.io.progress import Progress, ProgressMode
from tokenization.io.storage import open_fs, with_storage_options
from tokenization.publish import manifest
from tokenization.publish.attempts import Attempt, attempt_at
from tokenization.publish.manifest import StageResult
from tokenization.publish.records import ContextCounts, ContextManifest, ContextOutput
from tokenization.stages.verify import Checks, OwnCheck

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 2049
TALLIED = ("windows", "tokens", "tail_tokens_kept", "tokens_dropped")  # ContextCounts' fields, summed over files


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

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.context_window:
            raise UsageError("context_window must be at least 1: a build skips the context shuffle with 0")
        if self.shard >= self.num_shards:
            raise UsageError(f"shard {self.shard} is outside 0..{self.num_shards - 1}")

    @property
    def stem(self) -> str:
        return f"context_{self.shard:05d}"


def shard_files(config: ContextShuffleConfig) -> list[str]:
    """The task's share of the input: one ``.ds`` file, or ``files[shard::num_shards]`` of a folder's."""
    fs, path = open_fs(config.input)
    files = manifest.token_files(config.input) if fs.isdir(path) else [config.input]
    return files[config.shard :: config.num_shards]


@with_storage_options
def context_shuffle(
    config: ContextShuffleConfig, progress: ProgressMode = None, owner: str | None = None, checks: Checks | None = None
) -> StageResult[ContextCounts, ContextManifest]:
    """Shuffle this task's files into ``config.output``, one output family per input file, under its name, each
    checked before upload (ids and document ends against ``checks``, when a build knows its tokenizer)."""
    started = time.time()
    own = OwnCheck(checks or Checks(), f"context shuffle {config.stem}")
    files = shard_files(config)
    sources = [TokenFile(url) for url in files]
    rng = np.random.default_rng(config.seed)  # one generator for the task, drawn file after file
    described = manifest.output_entries(files[0].rsplit("/", 1)[0]) if files else {}
    tally: Counter = Counter()  # of ContextCounts' fields
    outputs: list[ContextOutput] = []
    with attempt_at(config.output, config.stem, config.local_working_dir, owner) as attempt:
        total = sum(s.num_tokens for s in sources)
        with Progress(f"context shuffle {config.stem}", total, "tok", progress) as shown:
            for url, source in zip(files, sources, strict=True):
                if source.num_tokens == 0:  # nothing to cut; datatrove's empty files stay behind
                    continue
                written, full = _shuffle_file(config, url, source, rng, attempt, shown)
                nested = written.name in described and described[written.name].entry.pseudo_ends is not None
                grid = manifest.pseudo_ends(0, written.tokens, config.context_window, full * config.context_window)
                pseudo = "unknown" if nested else grid
                entry = manifest.output_entry(written, ContextOutput, source=url, pseudo_ends=pseudo)
                own.family(attempt.work, entry)
                attempt.place_families([written])
                outputs.append(entry)
                tail = source.num_tokens - full * config.context_window
                tally.update(windows=full, tokens=written.tokens)
                tally["tokens_dropped" if config.drop_tail else "tail_tokens_kept"] += tail
                log.info(
                    "context shuffle %s: %d windows of %d, tail %d", written.name, full, config.context_window, tail
                )
        counts = ContextCounts(files=len(files), **{k: tally[k] for k in TALLIED})
        record = ContextManifest(
            stage="context_shuffle",
            **manifest.provenance(config, time.time() - started),
            seed=config.seed,
            inputs=files,
            counts=counts,
            outputs=outputs,
            checked=own.result(),
        )
        record = attempt.commit(record, record.output_files())
    return StageResult(counts, record)


def _shuffle_file(
    config: ContextShuffleConfig,
    url: str,
    source: TokenFile,
    rng: np.random.Generator,
    attempt: Attempt,
    shown: Progress,
) -> tuple[WrittenTokenFile, int]:
    """One file's windows in a permuted order, the tail last (unless dropped); returns the file and its number
    of whole windows."""
    ends = np.asarray(source.ends, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    if source.num_tokens != total:
        raise TokenFileError(f"{url}: {source.num_tokens} tokens, but its index ends at {total}")
    windows, full = fixed_units(total, config.context_window)
    order = rng.permutation(full)
    if total > full * config.context_window and not config.drop_tail:
        order = np.append(order, full)
    name = url.rsplit("/", 1)[-1]
    with_loss = source.loss is not None
    writer = SplitWriter(
        attempt.work,
        lambda _: name,
        tokenizer=source.metadata.tokenizer,
        token_size=source.token_size,
        save_loss=with_loss,
    )
    with writer, SourcePool([url], source.token_size, with_loss, cache_dir=attempt.work / "inputs") as pool:
        permute_units(pool, windows, order, writer, inner_ends=ends, progress=shown)
    (written,) = writer.written
    return written, full
