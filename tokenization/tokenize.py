"""The tokenize stage: one rank's share of the input becomes shuffled ``.ds`` files, a manifest and a marker.

Pass 1 encodes documents in order into a local working file and records their ends. Pass 2 permutes
documents (then, optionally, fixed-size chunks) by moving bytes, never re-tokenizing. The permutations are
datatrove's: ``numpy.random.default_rng(seed)``, one generator per rank, the document permutation drawn
first and the chunk permutation second, so the same seed gives the same bytes.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from tokenization import manifest
from tokenization.encoding import Encoder, SpecialTextPolicy
from tokenization.formats.ds import SplitWriter, TokenFile, WrittenTokenFile
from tokenization.permute import SourcePool, fixed_units, permute_units
from tokenization.sources import DocumentReader, Record, Rejected, list_input_files, shard
from tokenization.storage import join, list_names, open_fs, publish_file, remove_if_exists, working_dir

log = logging.getLogger(__name__)

BATCH_BYTES = 1 << 20  # UTF-8 bytes a batch; a token costs ~150 bytes inside an Encoding, and is >= 1 byte


class TooManyRejects(RuntimeError):
    """More bad records than ``max_rejects`` allows."""


@dataclass
class TokenizeConfig:
    """One rank's parameters; defaults follow datatrove's DocumentTokenizer where they are sound."""

    inputs: list[str]
    output: str
    tokenizer: str
    text_key: str = "text"
    id_key: str = "id"
    eos_token: str | None = None
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    save_filename: str | None = None
    shuffle_documents: bool = True
    shuffle_chunk_size: int | None = None
    drop_last_chunk: bool = False
    max_tokens_per_file: int | None = None
    save_loss: bool = False
    local_working_dir: str | None = None
    max_rejects: int | None = 1000
    special_text: SpecialTextPolicy = "text"
    batch_size: int = 10000
    batch_bytes: int = BATCH_BYTES

    def __post_init__(self) -> None:
        for name in ("shuffle_chunk_size", "max_tokens_per_file", "batch_size", "batch_bytes", "world_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_rejects is not None and self.max_rejects < 0:
            raise ValueError(f"max_rejects must be >= 0, got {self.max_rejects}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.drop_last_chunk and not self.shuffle_chunk_size:
            raise ValueError("drop_last_chunk needs shuffle_chunk_size")

    @property
    def stem(self) -> str:
        """datatrove's name prefix for this rank: ``{save_filename}_{rank:05d}`` (empty parts left out)."""
        return "_".join(x for x in (self.save_filename, f"{self.rank:05d}") if x)

    @property
    def kind(self) -> str:
        if self.shuffle_chunk_size:
            return "chunk_shuffled"
        return "doc_shuffled" if self.shuffle_documents else "unshuffled"

    def output_name(self, sub: int) -> str:
        return f"{self.stem}_{sub:05d}_{self.kind}.ds"


@dataclass
class Counts:
    """What happened to every record this rank read: docs_read = docs_written + empty + sum(rejected)."""

    docs_read: int = 0
    docs_written: int = 0
    empty: int = 0
    rejected: Counter = field(default_factory=Counter)
    blank_lines: int = 0
    text_bytes: int = 0
    tokens: int = 0
    tokens_written: int = 0
    tokens_dropped: int = 0
    partial_chunk_tokens: int = 0
    special_token_literals: Counter = field(default_factory=Counter)

    def to_json(self) -> dict:
        data = asdict(self)
        data["rejected"] = dict(sorted(self.rejected.items()))
        data["rejected_total"] = sum(self.rejected.values())
        data["special_token_literals"] = dict(sorted(self.special_token_literals.items()))
        data["special_token_literals_total"] = sum(self.special_token_literals.values())
        return data


def rank_file_pattern(stem: str) -> re.Pattern:
    """Every token file a rank with this stem may have written, in any mode and attempt."""
    return re.compile(rf"{re.escape(stem)}_(\d{{5}}_)?(unshuffled|doc_shuffled|chunk_shuffled)\.ds(\.\w+)?")


def tokenize_rank(config: TokenizeConfig, progress: bool | None = None) -> dict:
    """Run one rank end to end and return its manifest. Re-running a rank replaces its output completely."""
    started = time.time()
    encoder = Encoder(config.tokenizer, config.eos_token, config.special_text)  # fails before any data is read
    files = shard(list_input_files(config.inputs), config.rank, config.world_size)
    log.info(
        "rank %d/%d: %d input files, %d bytes", config.rank, config.world_size, len(files), sum(f.size for f in files)
    )
    out_fs, out_path = open_fs(config.output)
    manifest.remove_marker(out_fs, out_path, config.stem)
    with working_dir(config.local_working_dir, out_fs, out_path, config.stem) as work:
        counts = Counts()
        quarantine = work / "quarantine.jsonl"
        reader = DocumentReader(files, config.text_key, config.id_key)
        direct = not (config.shuffle_documents or config.shuffle_chunk_size)
        writer = SplitWriter(
            work,
            config.output_name if direct else (lambda _: "unshuffled.ds"),
            tokenizer=config.tokenizer,
            token_size=encoder.token_size,
            save_loss=config.save_loss,
            max_tokens=config.max_tokens_per_file if direct else None,
        )
        try:
            _encode_all(config, encoder, reader, writer, counts, quarantine, progress)
        except TooManyRejects:  # publish what was quarantined: it is what the user needs to look at
            publish_file(quarantine, out_fs, manifest.quarantine_path(out_path, config.stem))
            raise
        written = writer.close()
        counts.blank_lines = reader.blank_lines
        log.info("rank %d: pass 1 done, %d documents, %d tokens", config.rank, counts.docs_written, counts.tokens)
        if not direct and written:
            written = _shuffle(config, encoder, written[0].path, counts, work)
            log.info("rank %d: pass 2 done, %s", config.rank, config.kind)
        counts.tokens_written = sum(w.tokens for w in written)
        outputs, start = [], 0
        for w in written:  # chunk ends in the index are not document ends: say where they are, for verify
            chunk = config.shuffle_chunk_size
            full = (counts.tokens - counts.partial_chunk_tokens - counts.tokens_dropped) if chunk else 0
            outputs.append(w.to_json() | {"pseudo_ends": manifest.pseudo_ends(start, w.tokens, chunk, full)})
            start += w.tokens
        result = manifest.rank_manifest(
            stage="tokenize",
            config=config,
            encoder=encoder,
            inputs=files,
            counts=counts.to_json(),
            outputs=outputs,
            seconds=time.time() - started,
            input_bytes=reader.total_bytes,
        )
        _publish(config, out_fs, out_path, written, quarantine, result)
    log.info("rank %d: %d files published to %s", config.rank, len(written), config.output)
    return result


def _encode_all(
    config: TokenizeConfig,
    encoder: Encoder,
    reader: DocumentReader,
    writer: SplitWriter,
    counts: Counts,
    quarantine: Path,
    progress: bool | None,
) -> None:
    """Pass 1: read, encode in bounded batches, append to ``writer``; quarantine bad records."""
    batch: list[Record] = []
    batch_bytes = 0
    bar = tqdm(
        total=reader.total_bytes, unit="B", unit_scale=True, desc=f"rank {config.rank}", disable=_no_bar(progress)
    )

    def flush() -> None:
        nonlocal batch, batch_bytes
        if not batch:
            return
        ranges = [r.no_loss_ranges for r in batch] if config.save_loss else None
        encoded = encoder.encode([r.text for r in batch], ranges)
        ends = np.cumsum(encoded.lengths)
        writer.write(encoded.tokens, ends, ends, encoded.loss)
        counts.docs_written += len(batch)
        counts.tokens += len(encoded.tokens)
        counts.special_token_literals.update(encoded.special_literals)
        bar.update(reader.bytes_read - bar.n)
        bar.set_postfix(docs=counts.docs_written, tokens=counts.tokens, refresh=False)
        batch, batch_bytes = [], 0

    with open(quarantine, "wb") as bad:
        for item in reader:
            counts.docs_read += 1
            if isinstance(item, Rejected):
                counts.rejected[item.reason] += 1
                bad.write(manifest.dumps_line(item.to_json()))
                rejected = sum(counts.rejected.values())
                if config.max_rejects is not None and rejected > config.max_rejects:
                    raise TooManyRejects(
                        f"rank {config.rank}: {rejected} rejected records exceed max_rejects={config.max_rejects}; "
                        f"latest: {item.file} line {item.line}: {item.reason}"
                    )
            elif not item.text:
                counts.empty += 1
            else:
                size = len(item.text.encode("utf-8"))
                batch.append(item)
                batch_bytes += size
                counts.text_bytes += size
                if len(batch) >= config.batch_size or batch_bytes >= config.batch_bytes:
                    flush()
        flush()
    bar.update(reader.total_bytes - bar.n)
    bar.close()


def _shuffle(
    config: TokenizeConfig, encoder: Encoder, unshuffled: Path, counts: Counts, work: Path
) -> list[WrittenTokenFile]:
    """Pass 2: the document permutation, then the chunk permutation, each a byte move through the engine."""
    rng = np.random.default_rng(config.seed)
    options = {"tokenizer": config.tokenizer, "token_size": encoder.token_size, "save_loss": config.save_loss}
    source = unshuffled
    if config.shuffle_documents:
        ends = np.asarray(TokenFile(str(source), encoder.token_size).ends, dtype=np.int64)
        order = rng.permutation(len(ends))
        last = not config.shuffle_chunk_size
        writer = SplitWriter(
            work,
            config.output_name if last else (lambda _: "doc_shuffled.ds"),
            max_tokens=config.max_tokens_per_file if last else None,
            **options,
        )
        permute_units(SourcePool([str(source)], encoder.token_size, config.save_loss), ends, order, writer)
        written = writer.close()
        if last:
            return written
        source = written[0].path
    doc_ends = np.asarray(TokenFile(str(source), encoder.token_size).ends, dtype=np.int64)
    total = int(doc_ends[-1])
    chunk_ends, full = fixed_units(total, config.shuffle_chunk_size)
    order = rng.permutation(full)
    tail = total - full * config.shuffle_chunk_size
    if tail and config.drop_last_chunk:
        counts.tokens_dropped += tail
    elif tail:
        order = np.append(order, full)
        counts.partial_chunk_tokens = tail
    writer = SplitWriter(work, config.output_name, max_tokens=config.max_tokens_per_file, **options)
    pool = SourcePool([str(source)], encoder.token_size, config.save_loss)
    permute_units(pool, chunk_ends, order, writer, inner_ends=doc_ends)
    return writer.close()


def _publish(
    config: TokenizeConfig, fs, out_path: str, written: list[WrittenTokenFile], quarantine: Path, result: dict
) -> None:
    """Replace the rank's previous output with the new files, then the manifest, then the marker."""
    fs.makedirs(out_path, exist_ok=True)
    keep = {f.name for w in written for f in w.files}
    pattern = rank_file_pattern(config.stem)
    for name in list_names(fs, out_path):
        if pattern.fullmatch(name) and name not in keep:
            fs.rm_file(join(out_path, name))
    for w in written:
        for f in w.files:
            publish_file(w.path.with_name(f.name), fs, join(out_path, f.name))
    bad = manifest.quarantine_path(out_path, config.stem)
    if quarantine.stat().st_size:
        publish_file(quarantine, fs, bad)
    else:
        remove_if_exists(fs, bad)
    manifest.commit(fs, out_path, config.stem, result)


def _no_bar(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: ``None`` lets tqdm show a bar only on a terminal."""
    return None if progress is None else not progress
