"""The tokenize stage: one rank's share of the input becomes shuffled ``.ds`` files, a manifest and a marker.

Pass 1 encodes documents in order into a local working file and records their ends. Pass 2 permutes
documents (then, optionally, fixed-size chunks) by moving bytes, never re-tokenizing. The permutations are
datatrove's: ``numpy.random.default_rng(seed)``, one generator per rank, the document permutation drawn
first and the chunk permutation second, so the same seed gives the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tokenization import manifest
from tokenization.attempts import Attempt, attempt_at
from tokenization.documents import (
    BATCH_BYTES,
    DEFAULT_MAX_REJECT_FRACTION,
    DEFAULT_MAX_REJECTS,
    Counts,
    RejectTally,
    TooManyRejects,
    check_document_options,
    encoded_batches,
)
from tokenization.encoding import Encoder, EngineChoice, SpecialTextPolicy
from tokenization.errors import UsageError
from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileWriter, WrittenTokenFile
from tokenization.formats.megatron import MegatronWriter
from tokenization.permute import SourcePool, fixed_units, permute_units
from tokenization.progress import ProgressMode
from tokenization.sources import DocumentReader, list_input_files, shard
from tokenization.storage import join, list_names, remove_if_exists, writing

log = logging.getLogger(__name__)

QUARANTINE = "quarantine.jsonl"  # in the attempt's working folder, published as _quarantine/{stem}.jsonl


@dataclass
class TokenizeConfig:
    """One rank's parameters; defaults follow datatrove's DocumentTokenizer where they are sound."""

    inputs: list[str]
    output: str
    tokenizer: str
    text_key: str = "text"
    id_key: str = "id"
    eos_token: str | None = None  # None: the tokenizer's own end-of-text token
    no_eos: bool = False
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
    max_rejects: int | None = DEFAULT_MAX_REJECTS
    max_reject_fraction: float | None = DEFAULT_MAX_REJECT_FRACTION
    special_text: SpecialTextPolicy = "text"
    output_format: Literal["ds", "megatron"] = "ds"
    batch_size: int = 10000
    batch_bytes: int = BATCH_BYTES
    engine: EngineChoice = "auto"
    threads: int | None = None

    def encoder(self) -> Encoder:
        return Encoder(self.tokenizer, self.eos_token, self.special_text, self.engine, self.threads, no_eos=self.no_eos)

    def __post_init__(self) -> None:
        for name in ("shuffle_chunk_size", "max_tokens_per_file", "batch_size", "batch_bytes", "world_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")
        check_document_options(self.text_key, self.eos_token, self.no_eos, self.max_rejects, self.max_reject_fraction)
        if not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.drop_last_chunk and not self.shuffle_chunk_size:
            raise UsageError("drop_last_chunk needs shuffle_chunk_size")
        if self.output_format not in ("ds", "megatron"):
            raise UsageError(f"output_format must be ds or megatron, got {self.output_format!r}")
        if self.output_format == "megatron" and self.save_loss:
            raise UsageError("Megatron's indexed dataset has no loss mask: save_loss needs the ds format")

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
        return f"{self.stem}_{sub:05d}_{self.kind}.{'bin' if self.output_format == 'megatron' else 'ds'}"

    @property
    def writer_class(self) -> type:
        return MegatronWriter if self.output_format == "megatron" else TokenFileWriter


def rank_file_pattern(stem: str) -> re.Pattern:
    """Every token file a rank with this stem may have written, in any mode and attempt."""
    return re.compile(rf"{re.escape(stem)}_(\d{{5}}_)?(unshuffled|doc_shuffled|chunk_shuffled)\.(ds(\.\w+)?|bin|idx)")


def tokenize_rank(config: TokenizeConfig, progress: ProgressMode = None, owner: str | None = None) -> dict:
    """Run one rank end to end and return its manifest. Re-running a rank replaces its output completely; a second
    attempt at the same rank while one runs is refused (``owner`` names this attempt's caller in that message)."""
    started = time.time()
    encoder = config.encoder()  # fails before any data is read
    listing = list_input_files(config.inputs)
    files = shard(listing.files, config.rank, config.world_size)
    log.info(
        "rank %d/%d: %d input files, %d bytes", config.rank, config.world_size, len(files), sum(f.size for f in files)
    )
    with attempt_at(config.output, config.stem, config.local_working_dir, owner) as attempt:
        quarantine = attempt.work / QUARANTINE
        try:
            counts, reader, written = encoder.exactly(
                lambda: _encode_pass(config, encoder, files, attempt.work, progress)
            )
        except TooManyRejects:  # publish what was quarantined: it is what the user needs to look at
            attempt.publish(quarantine, manifest.quarantine_name(config.stem))
            raise
        log.info("rank %d: pass 1 done, %d documents, %d tokens", config.rank, counts.docs_written, counts.tokens)
        if (config.shuffle_documents or config.shuffle_chunk_size) and written:
            written = _shuffle(config, encoder, written[0].path, counts, attempt.work)
            log.info("rank %d: pass 2 done, %s", config.rank, config.kind)
        counts.tokens_written = sum(w.tokens for w in written)
        outputs, start = [], 0
        chunk = config.shuffle_chunk_size  # chunk ends in the index are not document ends: say where, for verify
        full = (counts.tokens - counts.partial_chunk_tokens - counts.tokens_dropped) if chunk else 0
        for w in written:
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
        ) | {"skipped_inputs": listing.skipped}
        _publish(config, attempt, written, quarantine, result)
    log.info("rank %d: %d files published to %s", config.rank, len(written), config.output)
    return result | {"attempt": attempt.id}


def _encode_pass(
    config: TokenizeConfig, encoder: Encoder, files: list, work: Path, progress: ProgressMode
) -> tuple[Counts, DocumentReader, list[WrittenTokenFile]]:
    """Pass 1: encode the rank's documents in input order into the working directory, rejects to quarantine."""
    counts = Counts()
    reader = DocumentReader(files, config.text_key, config.id_key)
    direct = not (config.shuffle_documents or config.shuffle_chunk_size)
    writer = SplitWriter(
        work,
        config.output_name if direct else (lambda _: "unshuffled.ds"),
        tokenizer=config.tokenizer,
        token_size=encoder.token_size,
        save_loss=config.save_loss,
        max_tokens=config.max_tokens_per_file if direct else None,
        writer_class=config.writer_class if direct else TokenFileWriter,
    )
    where = f"rank {config.rank}"
    quarantine = work / QUARANTINE
    with writing(quarantine), open(quarantine, "wb") as bad:
        try:
            tally = RejectTally(
                counts, where, config.text_key, config.max_rejects, config.max_reject_fraction, sink=bad
            )
            for batch in encoded_batches(reader, encoder, counts, config, tally, where, progress):
                ends = np.cumsum(batch.encoded.lengths)
                writer.write(batch.encoded.tokens, ends, ends, batch.encoded.loss)
        finally:  # on errors too: no buffered byte of a failed attempt may reach a file that a retry reopens
            written = writer.close()
    tally.check()
    return counts, reader, written


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
            writer_class=config.writer_class if last else TokenFileWriter,
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
    writer = SplitWriter(
        work, config.output_name, max_tokens=config.max_tokens_per_file, writer_class=config.writer_class, **options
    )
    pool = SourcePool([str(source)], encoder.token_size, config.save_loss)
    permute_units(pool, chunk_ends, order, writer, inner_ends=doc_ends)
    return writer.close()


def _publish(
    config: TokenizeConfig, attempt: Attempt, written: list[WrittenTokenFile], quarantine: Path, result: dict
) -> None:
    """Replace the rank's previous output with the new files, then the manifest, then the marker."""
    fs, out_path = attempt.fs, attempt.out_path
    keep = {f.name for w in written for f in w.files}
    pattern = rank_file_pattern(config.stem)
    for name in list_names(fs, out_path):
        if pattern.fullmatch(name) and name not in keep:
            fs.rm_file(join(out_path, name))
    for w in written:
        for f in w.files:
            attempt.publish(w.path.with_name(f.name), f.name)
    files = manifest.output_files(result["outputs"])
    bad = manifest.quarantine_name(config.stem)
    if quarantine.stat().st_size:
        files[bad] = {"bytes": quarantine.stat().st_size, "sha256": hashlib.sha256(quarantine.read_bytes()).hexdigest()}
        attempt.publish(quarantine, bad)
    else:
        remove_if_exists(fs, join(out_path, bad))
    attempt.commit(result, files)
