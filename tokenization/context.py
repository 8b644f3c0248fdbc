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
from tokenization.attempts import attempt_at
from tokenization.errors import UsageError
from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileError
from tokenization.permute import SourcePool, fixed_units, permute_units
from tokenization.progress import Progress, ProgressMode
from tokenization.storage import open_fs

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 2049


@dataclass
class ContextShuffleConfig:
    input: str
    output: str
    window_size: int = DEFAULT_WINDOW
    seed: int = 0
    shard: int = 0
    num_shards: int = 1
    drop_tail: bool = False
    local_working_dir: str | None = None

    def __post_init__(self) -> None:
        if self.window_size <= 0:
            raise UsageError(f"window_size must be positive, got {self.window_size}")
        if not 0 <= self.shard < self.num_shards:
            raise UsageError(f"shard {self.shard} is outside 0..{self.num_shards - 1}")

    @property
    def stem(self) -> str:
        return f"context_{self.shard:05d}"


def shard_files(config: ContextShuffleConfig) -> list[str]:
    """The task's share of the input: one ``.ds`` file, or ``files[shard::num_shards]`` of a folder's."""
    fs, path = open_fs(config.input)
    files = manifest.token_files(config.input) if fs.isdir(path) else [config.input]
    return files[config.shard :: config.num_shards]


def context_shuffle(config: ContextShuffleConfig, progress: ProgressMode = None, owner: str | None = None) -> dict:
    """Shuffle this task's files into ``config.output`` (same file names); return the task's manifest."""
    started = time.time()
    files = shard_files(config)
    sources = [TokenFile(url) for url in files]
    shown = Progress(f"context shuffle {config.stem}", sum(s.num_tokens for s in sources), "tok", progress)
    rng = np.random.default_rng(config.seed)
    described = manifest.output_entries(files[0].rsplit("/", 1)[0]) if files else {}
    outputs, counts = [], {"files": 0, "windows": 0, "tokens": 0, "tail_tokens_kept": 0, "tokens_dropped": 0}
    with attempt_at(config.output, config.stem, config.local_working_dir, owner) as attempt:
        work = attempt.work
        for url, source in zip(files, sources, strict=True):
            ends = np.asarray(source.ends, dtype=np.int64)
            total = int(ends[-1]) if len(ends) else 0
            if source.num_tokens != total:
                raise TokenFileError(f"{url}: {source.num_tokens} tokens, but its index ends at {total}")
            windows, full = fixed_units(total, config.window_size)
            order = rng.permutation(full)
            tail = total - full * config.window_size
            if tail and not config.drop_tail:
                order = np.append(order, full)
            with_loss = source.loss is not None
            name = url.rsplit("/", 1)[-1]
            writer = SplitWriter(
                work, lambda _, n=name: n, tokenizer=source.metadata.tokenizer, token_size=source.token_size,
                save_loss=with_loss,
            )  # fmt: skip
            pool = SourcePool([url], source.token_size, with_loss, cache_dir=work / "inputs")
            permute_units(pool, windows, order, writer, inner_ends=ends, progress=shown)
            pool.close()
            for written in writer.close():
                for f in written.files:
                    attempt.publish(written.path.with_name(f.name), f.name)
                nested = described.get(name, {}).get("pseudo_ends") is not None
                grid = manifest.pseudo_ends(0, written.tokens, config.window_size, full * config.window_size)
                entry = written.to_json() | {"source": url, "pseudo_ends": "unknown" if nested else grid}
                outputs.append(entry)
                counts["tokens"] += written.tokens
            counts["files"] += 1
            counts["windows"] += full
            counts["tail_tokens_kept" if not config.drop_tail else "tokens_dropped"] += tail
            log.info("context shuffle %s: %d windows of %d, tail %d", name, full, config.window_size, tail)
        shown.close()
        result = {
            "format": manifest.CONTEXT_FORMAT,
            "stage": "context_shuffle",
            "seed": config.seed,
            "versions": manifest.versions(),
            "params": asdict(config),
            "inputs": files,
            "counts": counts,
            "outputs": outputs,
            "seconds": round(time.time() - started, 3),
        }
        attempt.commit(result, manifest.output_files(outputs))
    return result | {"attempt": attempt.id}
