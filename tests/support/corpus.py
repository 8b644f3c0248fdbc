"""Input files: JSON lines written, the bundled sample's records, and the texts of the shared corpora."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.paths import SAMPLE_CORPUS, shared_path


def write_jsonl(path: Path, records: Sequence[dict[str, Any] | str]) -> Path:
    """Records as JSON lines (strings are written verbatim), gzip-compressed when the name ends in .gz."""
    data = "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def sample_records() -> list[dict]:
    records: list[dict] = []
    for path in sorted(SAMPLE_CORPUS.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            records.extend(json.loads(line) for line in handle)
    return records


def corpus_texts() -> list[str]:
    """Every document of every shared corpus (the instruct file as prompt + response)."""
    texts = []
    for path in sorted(shared_path("corpora").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                texts.append(record.get("text") or record.get("prompt", "") + record.get("response", ""))
    return texts
