"""The token counter: the tokenize stage's encoding without its output, for budgets and mixture weights.

It counts exactly what ``tokenize`` would write (same EOS, BOS and special-text policy, same empty and bad
records skipped) and writes a stats JSON: totals, per input file, and a histogram of document lengths in
tokens. With ``annotate`` it also writes every valid record back as JSON lines with a ``token_count`` field,
as datatrove's TokensCounter annotates documents (0 for an empty document, which the stage does not write).
"""

from __future__ import annotations

import gzip
import io
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard

from tokenization.inputs.listing import list_input_files
from tokenization.inputs.reader import DocumentReader
from tokenization.options import option
from tokenization.output import manifest
from tokenization.output.manifest import StageResult
from tokenization.progress import ProgressMode
from tokenization.records import CountedFile, CountStats, Rejected, StageParams
from tokenization.storage.folder import Folder, file_at
from tokenization.tokenizer.counts import Counts, RejectTally
from tokenization.tokenizer.documents import DocumentOptions, encoded_batches
from tokenization.tokenizer.encoding import Encoder


@dataclass(frozen=True, kw_only=True)
class CountConfig(DocumentOptions):
    """What to count and where to write the figures."""

    inputs: list[str] = option(flag="", help="input files, folders or globs (.jsonl[.gz|.zst], .parquet); fsspec URLs")
    stats_out: str | None = option(None, help="write the stats JSON here (a path or fsspec URL)")
    annotate: str | None = option(
        None, help="write every valid record back as JSON lines with a token_count field (.gz/.zst compress)"
    )


def count_tokens(config: CountConfig, progress: ProgressMode = None) -> StageResult[Counts, CountStats]:
    """Count; write the stats (and the annotated records) where asked."""
    started = time.time()
    annotate = file_at(config.annotate, config.storage_options) if config.annotate else None  # opened once, here
    stats_out = file_at(config.stats_out, config.storage_options) if config.stats_out else None
    encoder = config.encoder()
    renderer = config.renderer(encoder)
    files = list_input_files(config.inputs, config.storage_options).files
    with tempfile.TemporaryDirectory(prefix="tokenization-count-") as tmp:
        reader = config.reader(files, renderer, keep_data=annotate is not None)
        counts, per_file = encoder.exactly(lambda: _count_pass(config, encoder, reader, Path(tmp), annotate, progress))
        if annotate is not None:
            folder, name = annotate
            folder.place(Path(tmp) / name, name)
    c = counts.record()
    seconds = round(time.time() - started, 3)
    stats = CountStats(
        stage="count",
        **manifest.provenance(config, seconds, StageParams),
        tokenizer=encoder.describe(),
        rendering=None if renderer is None else renderer.describe(),
        docs=c.docs_written,
        tokens=c.tokens,
        loss_tokens=c.loss_tokens if config.renders_loss else None,
        empty=c.empty,
        rejected=c.rejected,
        docs_read=c.docs_read,
        blank_lines=c.blank_lines,
        special_token_literals=c.special_token_literals,
        mean_tokens_per_doc=round(c.tokens / c.docs_written, 3) if c.docs_written else 0,
        max_tokens_per_doc=c.longest,
        files=[CountedFile(url=f.url, bytes=f.size, **_file_counts(per_file[f.url])) for f in files],
        length_histogram=c.length_histogram,
        throughput=manifest.throughput(seconds, encoder.load_seconds, c.text_bytes, c.tokens),
    )
    if stats_out is not None:
        stats.write(*stats_out)
    return StageResult(counts, stats)


def _count_pass(
    config: CountConfig,
    encoder: Encoder,
    reader: DocumentReader,
    tmp: Path,
    annotate: tuple[Folder, str] | None,
    progress: ProgressMode,
) -> tuple[Counts, dict[str, Counter[str]]]:
    """One pass over the inputs: counts in total and per file, and the annotated records in ``tmp``."""
    counts = Counts()
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    tally = RejectTally("count", config.source, config.max_rejects, config.max_reject_fraction)

    def reject(item: Rejected) -> None:
        per_file[item.file]["rejected"] += 1
        tally(item)

    annotated = _open_annotation(tmp, annotate[1]) if annotate is not None else None
    batches = encoded_batches(
        reader,
        encoder=encoder,
        counts=counts,
        options=config,
        reject=reject,
        desc="count",
        save_loss=config.renders_loss,
        progress=progress,
    )
    try:
        for batch in batches:
            lengths = batch.token_counts()
            for record, n in zip(batch.records, lengths.tolist(), strict=True):
                stats = per_file[record.file]
                stats["docs" if record.text else "empty"] += 1
                stats["tokens"] += n
                if annotated is not None:
                    if record.data is None:  # the reader keeps each record's data when annotating
                        raise RuntimeError(f"{record.file}: line {record.line} was read without its data")
                    annotated.write(orjson.dumps(record.data | {"token_count": n}) + b"\n")
    finally:
        batches.close()  # an error stops the reading and encoding threads here, not at exit
        if annotated is not None:
            annotated.close()
    tally.check(counts)
    return counts, per_file


def _file_counts(stats: Counter[str]) -> dict[str, Any]:
    return {key: stats[key] for key in ("docs", "tokens", "empty", "rejected")}


class _Annotation:
    """A local JSON-lines file, compressed as its final name asks (``.gz``, ``.zst``), published when closed."""

    def __init__(self, path: Path, compression: str | None):
        self.name = str(path)
        self._raw = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._out: gzip.GzipFile | zstandard.ZstdCompressionWriter | io.BufferedWriter
        if compression == "gzip":
            self._out = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        elif compression == "zstd":
            self._out = zstandard.ZstdCompressor().stream_writer(self._raw, closefd=False)
        else:
            self._out = self._raw

    def write(self, data: bytes) -> None:
        self._out.write(data)

    def close(self) -> None:
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()


def _open_annotation(tmp: Path, name: str) -> _Annotation:
    """The annotated records of ``name`` (the final file's name, whose suffix says its compression), in ``tmp``."""
    compression = "gzip" if name.endswith(".gz") else "zstd" if name.endswith((".zst", ".zstd")) else None
    return _Annotation(tmp / name, compression)
