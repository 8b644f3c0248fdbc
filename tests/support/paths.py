"""Where things are: the repository, its bundled sample, and the real data beside it (``../shared/data``)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_CORPUS = ROOT / "sample" / "corpus"
SAMPLE_TOKENIZER = ROOT / "sample" / "tokenizer.json"
SHARED = ROOT.parent / "shared" / "data"


def shared_path(*parts: str) -> Path:
    """A file of ``../shared/data``, or skip: a user's clone has no shared data."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the real tokenizers and corpora live in ../shared/data beside the repo")
    return path
