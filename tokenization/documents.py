"""From records to encoded batches, shared by ``tokenize`` and ``count`` so both see the same documents.

Every record read is counted as exactly one of: written (encoded), empty (skipped, as datatrove does) or
rejected (handed to the caller's ``reject``); blank lines are counted apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

from tokenization.encoding import Encoded, Encoder
from tokenization.sources import DocumentReader, Record, Rejected

BATCH_BYTES = 1 << 20  # UTF-8 bytes a batch; a token costs ~150 bytes inside an Encoding, and is >= 1 byte


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


@dataclass
class Batch:
    """Records in input order, empty ones included; ``encoded`` covers the non-empty ones, in the same order."""

    records: list[Record]
    encoded: Encoded

    def token_counts(self) -> np.ndarray:
        """Tokens per record, 0 for an empty one (the stage writes nothing for it)."""
        counts = np.zeros(len(self.records), dtype=np.int64)
        counts[[i for i, r in enumerate(self.records) if r.text]] = self.encoded.lengths
        return counts


def encoded_batches(
    reader: DocumentReader,
    encoder: Encoder,
    counts: Counts,
    options,
    reject: Callable[[Rejected], None],
    desc: str,
    progress: bool | None = None,
) -> Iterator[Batch]:
    """Encode the reader's documents in batches bounded by ``options.batch_size`` documents and
    ``options.batch_bytes`` bytes of text, with loss bytes when ``options.save_loss``. A progress bar shows on a
    terminal (``progress=None``) or when asked."""
    bar = tqdm(
        total=reader.total_bytes,
        unit="B",
        unit_scale=True,
        desc=desc,
        disable=None if progress is None else not progress,
    )
    records: list[Record] = []
    size = 0

    def flush() -> Batch:
        texts = [r for r in records if r.text]
        ranges = [r.no_loss_ranges for r in texts] if options.save_loss else None
        encoded = encoder.encode([r.text for r in texts], ranges)
        counts.docs_written += len(texts)
        counts.tokens += len(encoded.tokens)
        counts.special_token_literals.update(encoded.special_literals)
        bar.update(reader.bytes_read - bar.n)
        bar.set_postfix(docs=counts.docs_written, tokens=counts.tokens, refresh=False)
        return Batch(records, encoded)

    for item in reader:
        counts.docs_read += 1
        if isinstance(item, Rejected):
            counts.rejected[item.reason] += 1
            reject(item)
            continue
        if not item.text:
            counts.empty += 1
        text_bytes = len(item.text.encode("utf-8"))
        counts.text_bytes += text_bytes
        records.append(item)
        size += text_bytes
        if len(records) >= options.batch_size or size >= options.batch_bytes:
            yield flush()
            records, size = [], 0
    if records:
        yield flush()
    counts.blank_lines = reader.blank_lines
    bar.update(reader.total_bytes - bar.n)
    bar.close()
