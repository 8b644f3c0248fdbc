"""An input file's format and compression, told by its name, and the error of input that cannot be read."""

from __future__ import annotations

import posixpath

from tokenization.errors import TokenizationError
from tokenization.records import InputFile

JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_EXTENSION = ".parquet"


class InputError(TokenizationError, ValueError):
    """Input cannot be read: no files, an unknown format, or corrupt compressed data (the message names it)."""


def file_format(url: str) -> tuple[str, str | None]:
    """``("jsonl"|"parquet", compression)`` from the name, or raise :class:`InputError`."""
    name = posixpath.basename(url).lower()
    compression = next((c for ext, c in COMPRESSIONS.items() if name.endswith(ext)), None)
    if compression:
        name = name.rsplit(".", 1)[0]
    if name.endswith(PARQUET_EXTENSION) and compression is None:
        return "parquet", None
    if name.endswith(JSONL_EXTENSIONS):
        return "jsonl", compression
    raise InputError(f"{url}: unsupported input format (expected .jsonl[.gz|.zst] or .parquet)")


# Bytes of text a byte of a compressed input holds, at least, about: JSON lines of text compress 3-4 times (the
# shared corpora: 13.3 MB of gzip hold 43 MB of text), and so do parquet's pages.
COMPRESSED_TEXT_RATIO = 3


def text_bytes_about(file: InputFile) -> int:
    """About how many bytes of text reading ``file`` gives, without reading it: what a rank weighs encoding it on HF
    against building the fast engine by (a gzip file counted by its own bytes passed for a third of its text)."""
    form, compression = file_format(file.url)
    return file.span_bytes * (COMPRESSED_TEXT_RATIO if compression or form == "parquet" else 1)
