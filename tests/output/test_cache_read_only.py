"""A cache that cannot be written (a read-only mount): storing is best effort, so the build goes on with one
warning a process naming the cache and the error, reads the entries it holds, and stores none. The cache is made
read-only by a bind mount in a user namespace (``unshare``), which binds root as any user; without it, skipped."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

MOUNTED = 'mount --bind -o ro "$0" "$0" && exec "$@"'


def read_only(cache: Path, *args: object) -> subprocess.CompletedProcess:
    """The command line with ``cache`` mounted read-only for it alone."""
    command = ["unshare", "-rm", "sh", "-c", MOUNTED, str(cache), sys.executable, "-m", "tokenization.cli"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module", autouse=True)
def _mounts(tmp_path_factory) -> None:
    probe = tmp_path_factory.mktemp("probe")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    command = ["unshare", "-rm", "sh", "-c", MOUNTED, str(probe), "touch", str(probe / "x")]
    done = subprocess.run(command, capture_output=True)
    if done.returncode == 0 or (probe / "x").exists():
        pytest.skip("no read-only bind mount here (user namespaces off)")


def build(corpus: Path, output: Path, build_id: str, tokenizer: Path, cache: Path) -> list[object]:
    return [
        "build", corpus, "--output", output, "--tokenizer", tokenizer, "--build-id", build_id, "--cache", cache,
        "--num-ranks", 2, "--parallel", 1, "--seed", 3,
    ]  # fmt: skip


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "cannot be written" in line]


def test_a_read_only_cache_is_read_and_the_build_goes_on(tmp_path, sample_corpus, sample_tokenizer) -> None:
    cache = tmp_path / "cache"
    given = build(sample_corpus, tmp_path, "a", sample_tokenizer, cache)
    command = [sys.executable, "-m", "tokenization.cli", *map(str, given)]
    filled = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert filled.returncode == 0, filled.stderr
    held = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    done = read_only(cache, *build(sample_corpus, tmp_path, "b", sample_tokenizer, cache))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    [said] = warnings(done.stderr)  # once: both ranks ran in the one process (``--parallel 1``: the build's own)
    assert re.fullmatch(
        rf".* WARNING tokenization\.output\.cache: cache {re.escape(str(cache))} cannot be written "
        rf"\({re.escape(str(cache))}/uses/[0-9a-f]{{16}}/00000\.json: Read-only file system\): entries are read, "
        "none stored",
        said,
    ), said
    assert "cache: 4 of 4 input files from the cache" in done.stdout
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == held
    digest = re.compile(r"digest:  ([0-9a-f]{64})")
    assert digest.search(done.stdout)[1] == digest.search(filled.stdout)[1]  # type: ignore[index]


def test_an_empty_read_only_cache_is_said_once_and_the_build_tokenizes(tmp_path, sample_corpus, sample_tokenizer):
    cache = tmp_path / "cache"
    cache.mkdir()
    done = read_only(cache, *build(sample_corpus, tmp_path, "b", sample_tokenizer, cache))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    expected = (
        f"cache {cache} cannot be written ([Errno 30] Read-only file system: '{cache}/_CACHE.json'): entries are "
        "read, none stored"
    )
    assert {line.split(": ", 1)[-1] if "WARNING" in line else line for line in warnings(done.stderr)} == {expected}
    assert "its size is not measured" not in done.stderr
    assert "cache: 0 of 4 input files from the cache" in done.stdout
    assert list(cache.iterdir()) == []
