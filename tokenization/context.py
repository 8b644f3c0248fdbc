"""Context-window shuffle: each token file is cut into windows of ``window_size`` tokens (a training context
plus one) and the windows are permuted, so consecutive training samples come from different places.

The permutation is datatrove's DocumentTokenizerContextShuffler's: one ``default_rng(seed)`` per task, one
``permutation(n_windows)`` per file, drawn file after file. Unlike datatrove, nothing is lost: loss bytes move
with their windows, document ends inside a window move with it and every window end becomes an index entry,
the tail shorter than a window is kept at the end (and counted), and metadata and a manifest are written.
The task takes ``files[shard::num_shards]`` of the sorted input, so a folder can be shuffled by many tasks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import numpy as np

from tokenization import manifest
from tokenization.attempts import Attempt, attempt_at
from tokenization.errors import UsageError
from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileError, WrittenTokenFile
from tokenization.manifest import StageResult
from tokenization.options import Options, option
from tokenization.permute import SourcePool, fixed_units, permute_units
from tokenization.progress import Progress, ProgressMode
from tokenization.storage import open_fs, with_storage_options

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 2049


@dataclass(frozen=True, kw_only=True)
class ContextShuffleConfig(Options):
    """One context-shuffle task: its share of a folder's files, cut into windows and permuted."""

    input: str = option(flag="", help="a .ds file, or a folder or fsspec URL holding them")
    output: str = option(help="output folder or fsspec URL (file names are kept)")
    window_size: int = option(DEFAULT_WINDOW, minimum=1, help="tokens a window: a training context plus one")
    seed: int = option(0, minimum=0, help="shuffle seed: the same seed gives the same bytes")
    shard: int = option(0, minimum=0, help="this task's shard: files shard, shard + num shards, ... of the sorted list")
    num_shards: int = option(1, minimum=1, help="how many tasks share the folder's files")
    drop_tail: bool = option(False, help="drop each file's tail shorter than a window, as datatrove does (counted)")
    local_working_dir: str | None = option(None, help="local folder for staging (default: beside a local output)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard >= self.num_shards:
            raise UsageError(f"shard {self.shard} is outside 0..{self.num_shards - 1}")

    @property
    def stem(self) -> str:
        return f"context_{self.shard:05d}"


@dataclass
class ContextCounts:
    """What the task read and wrote: tokens written + tokens dropped = its files' tokens."""

    files: int = 0
    windows: int = 0
    tokens: int = 0
    tail_tokens_kept: int = 0
    tokens_dropped: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def shard_files(config: ContextShuffleConfig) -> list[str]:
    """The task's share of the input: one ``.ds`` file, or ``files[shard::num_shards]`` of a folder's."""
    fs, path = open_fs(config.input)
    files = manifest.token_files(config.input) if fs.isdir(path) else [config.input]
    return files[config.shard :: config.num_shards]


@with_storage_options
def context_shuffle(
    config: ContextShuffleConfig, progress: ProgressMode = None, owner: str | None = None
) -> StageResult[ContextCounts]:
    """Shuffle this task's files into ``config.output``, one output family per input file, under its name."""
    started = time.time()
    files = shard_files(config)
    sources = [TokenFile(url) for url in files]
    shown = Progress(f"context shuffle {config.stem}", sum(s.num_tokens for s in sources), "tok", progress)
    rng = np.random.default_rng(config.seed)  # one generator for the task, drawn file after file
    described = manifest.output_entries(files[0].rsplit("/", 1)[0]) if files else {}
    counts, outputs = ContextCounts(), []
    with attempt_at(config.output, config.stem, config.local_working_dir, owner) as attempt:
        for url, source in zip(files, sources, strict=True):
            counts.files += 1
            if source.num_tokens == 0:  # nothing to cut; datatrove's empty files stay behind
                continue
            written, full = _shuffle_file(config, url, source, rng, attempt, shown)
            attempt.place_families([written])
            nested = described.get(written.name, {}).get("pseudo_ends") is not None
            grid = manifest.pseudo_ends(0, written.tokens, config.window_size, full * config.window_size)
            outputs.append(written.to_json() | {"source": url, "pseudo_ends": "unknown" if nested else grid})
            tail = source.num_tokens - full * config.window_size
            counts.windows += full
            counts.tokens += written.tokens
            counts.tokens_dropped += tail if config.drop_tail else 0
            counts.tail_tokens_kept += 0 if config.drop_tail else tail
            log.info("context shuffle %s: %d windows of %d, tail %d", written.name, full, config.window_size, tail)
        shown.close()
        record = manifest.stage_record(
            manifest.CONTEXT_FORMAT,
            "context_shuffle",
            config,
            time.time() - started,
            seed=config.seed,
            inputs=files,
            counts=counts.to_json(),
            outputs=outputs,
        )
        attempt.commit(record, manifest.output_files(outputs))
    return StageResult(counts, record, attempt.id)


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
    windows, full = fixed_units(total, config.window_size)
    order = rng.permutation(full)
    if total > full * config.window_size and not config.drop_tail:
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
    pool = SourcePool([url], source.token_size, with_loss, cache_dir=attempt.work / "inputs")
    permute_units(pool, windows, order, writer, inner_ends=ends, progress=shown)
    pool.close()
    (written,) = writer.close()
    return written, full
