"""What our bytes are held against, each in a process of its own: datatrove 0.10.1's pipeline, and the trainers'
readers (torch, megatron-core, datatrove's reader) in the environment ``make trainer-env`` installs, and mosaicml
streaming in the one ``make streaming-env`` installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.tokenizers import EOS


def in_trainer_env(script: str, *args: str, cwd: Path | None = None) -> str:
    """What ``script`` prints, run by the trainers' environment (torch, megatron-core, datatrove's reader), or skip."""
    return _in_env(".venv-trainers", "`make trainer-env` installs the trainers' readers", script, *args, cwd=cwd)


def in_streaming_env(script: str, *args: str, cwd: Path | None = None) -> str:
    """What ``script`` prints, run by mosaicml streaming's environment (MDS's reader and writer), or skip."""
    return _in_env(".venv-streaming", "`make streaming-env` installs mosaicml streaming", script, *args, cwd=cwd)


def _in_env(venv: str, installs: str, script: str, *args: str, cwd: Path | None) -> str:
    python = ROOT / venv / "bin" / "python"
    if not (python.parent.parent / "ready").exists():
        pytest.skip(f"{python.parent.parent} is absent: {installs}")
    # Bytecode written on first use (uv installed the streaming env's torch without it): ~6 s of CPU an import less.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_datatrove(
    inputs: Path, output: Path, tokenizer: Path, ranks: int, *, seed: int, eos: str | None = EOS, **options
) -> Path:
    """datatrove 0.10.1's JsonlReader + DocumentTokenizer; ``options`` go to DocumentTokenizer."""
    step = f"""DocumentTokenizer({str(output)!r}, tokenizer_name_or_path={str(tokenizer)!r}, eos_token={eos!r},
                                 seed={seed}, **options)"""
    return _datatrove(f"JsonlReader({str(inputs)!r}), {step}", ranks, output, options)


def run_datatrove_merger(inputs: Path, output: Path, *, seed: int, **options) -> Path:
    """datatrove 0.10.1's DocumentTokenizerMerger; ``options`` go to it."""
    step = f"DocumentTokenizerMerger({str(inputs)!r}, {str(output)!r}, seed={seed}, progress=False, **options)"
    return _datatrove(step, 1, output, options)


def run_datatrove_context_shuffler(inputs: Path, output: Path, *, seed: int, **options) -> Path:
    step = f"DocumentTokenizerContextShuffler({str(inputs)!r}, {str(output)!r}, seed={seed}, **options)"
    return _datatrove(step, 1, output, options)


def _datatrove(steps: str, tasks: int, output: Path, options: dict) -> Path:
    """Run a datatrove pipeline in a subprocess (its logger and executor stay out of the test process)."""
    script = f"""
import json, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerContextShuffler, DocumentTokenizerMerger
options = json.loads(sys.argv[1])
LocalPipelineExecutor(pipeline=[{steps}], tasks={tasks}, workers=1, logging_dir={str(output) + "_logs"!r}).run()
"""
    subprocess.run([sys.executable, "-c", script, json.dumps(options)], check=True, capture_output=True)
    return output
