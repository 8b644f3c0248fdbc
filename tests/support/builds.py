"""A whole build in this process: its config, and its steps one after another (no process started for a step
keeps a test quick)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support.tokenizers import EOS
from tokenization.builds.config import BuildConfig


def config_of(inputs, tmp_path, tokenizer, **options) -> BuildConfig:
    settings: dict[str, Any] = {"seed": 3, "num_ranks": 2, "context_window": 0, "eos_token": EOS} | options
    return BuildConfig(input=str(inputs), output=str(tmp_path / "out"), tokenizer=str(tokenizer), **settings)


def in_process(build, keep: int | None = None):
    """What ``Build.run`` does, step by step in this process: no process started for a step keeps a test quick.
    Returns the build as published."""
    until_publish(build)
    return build.publish(keep)


def until_publish(build) -> None:
    """Every step of ``Build.run`` but publish, in this process."""
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    for bucket in build.merge_buckets:
        build.merge(bucket, progress=False)
    shards = build.context_shards()
    for shard in shards:
        build.context_shuffle(shard, len(shards), progress=False)


def published_run(build) -> Path:
    """The run folder of ``build``, published in this process (``in_process``)."""
    in_process(build)
    return Path(build.layout.run_dir)


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of a run folder, under its name: a test that damages it leaves the original to the others."""
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))
