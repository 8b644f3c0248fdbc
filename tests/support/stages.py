"""Each stage run in this process on its config's keywords, and what its token files hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.tokenizers import EOS
from tokenization.formats.ds import TokenFile, TokenFileWriter
from tokenization.records import RankCache, RankManifest
from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle
from tokenization.stages.merge import merge
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank


def cache_of(rank: RankManifest) -> RankCache:
    """A rank's account of its cache (a rank run with one)."""
    assert rank.cache is not None, "the rank ran without a cache"
    return rank.cache


def run(inputs, output, tokenizer, **options) -> dict:
    if not options.get("no_eos"):
        options.setdefault("eos_token", EOS)
    config = TokenizeConfig(inputs=[str(i) for i in inputs], output=str(output), tokenizer=str(tokenizer), **options)
    return tokenize_rank(config).to_json()


def merged(inputs: Path | str, output: Path | str, **options) -> dict:
    options.setdefault("save_filename", "merged")
    return merge(MergeConfig(input=str(inputs), output=str(output), **options)).to_json()


def shuffled(inputs, output, **options) -> dict:
    return context_shuffle(ContextShuffleConfig(input=str(inputs), output=str(output), **options)).to_json()


def documents(output: Path, pattern: str = "*.ds") -> list[list[int]]:
    docs = []
    for path in sorted(output.glob(pattern)):
        f = TokenFile(str(path))
        tokens, ends = np.asarray(f.tokens), np.asarray(f.ends, dtype=np.int64)
        docs.extend(np.split(tokens, ends[:-1]) if len(ends) else [])
    return [d.tolist() for d in docs]


def file_bytes(output: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(output.glob("*.ds*"))}


def synthetic_ranks(folder: Path, n_files: int, docs: int, seed: int = 0, token_size: int = 2) -> Path:
    """Rank-like token files with random document lengths; token values name their file and document."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(n_files):
        lengths = rng.integers(1, 800, size=docs)
        tokens = np.repeat(np.arange(docs) % 1000 + 1000 * f, lengths)
        writer = TokenFileWriter(
            folder / f"{f:05d}_00000_doc_shuffled.ds", tokenizer="tok", token_size=token_size, save_loss=True
        )
        writer.write(tokens, np.cumsum(lengths), (tokens % 3 > 0).astype(np.uint8))
        writer.close()
    return folder
