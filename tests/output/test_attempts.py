"""Attempts never interfere: two at once, a killed one, a full disk, and the S3 lease; nothing temporary stays."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.corpus import sample_records, write_jsonl
from tests.support.processes import wait_for
from tests.support.s3 import ON_BOTH_STORES
from tests.support.stages import file_bytes
from tests.support.tokenizers import EOS
from tokenization.errors import AttemptConflict, LeaseLost
from tokenization.output import leases
from tokenization.output.attempts import attempt_at
from tokenization.output.leases import FileLease, ObjectLease, new_holder
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

RANK_ARGS = ("--seed", "7", "--save-loss", "--max-tokens-per-file", "30000", "--eos-token", EOS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The sample, 40 times over: a rank that takes a few seconds, so that attempts overlap."""
    folder = tmp_path_factory.mktemp("corpus")
    records = sample_records()
    for part in range(4):
        write_jsonl(folder / f"part-{part}.jsonl.gz", [r | {"id": f"{part}-{i}"} for i in range(10) for r in records])
    return folder


def tokenize(corpus: Path, output: Path, tokenizer: Path, **popen) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "tokenization.cli",
        "tokenize",
        str(corpus),
        "--output",
        str(output),
        "--tokenizer",
        str(tokenizer),
        *RANK_ARGS,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def errors_of(process: subprocess.Popen[str]) -> str:
    """What a rank started by ``tokenize`` wrote to its stderr."""
    assert process.stderr is not None
    return process.stderr.read()


def leftovers(output: Path) -> list[str]:
    """Anything temporary in an output folder: staging folders, temporary files, lock files."""
    return sorted(
        str(p.relative_to(output))
        for p in output.rglob("*")
        if ".tmp-" in p.name or p.name in (".staging",) or p.name.endswith(".lock")
    )


@pytest.fixture(scope="module")
def clean(corpus, sample_tokenizer, tmp_path_factory) -> dict[str, bytes]:
    output = tmp_path_factory.mktemp("clean")
    done = tokenize(corpus, output, sample_tokenizer)
    assert done.wait() == 0, errors_of(done)
    return file_bytes(output)


@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_two_attempts_at_once_never_mix(tmp_path, corpus, sample_tokenizer, clean, delay) -> None:
    """Finding 1: two attempts of one rank started together (or one while the other runs)."""
    first = tokenize(corpus, tmp_path, sample_tokenizer)
    time.sleep(delay)
    second = tokenize(corpus, tmp_path, sample_tokenizer)
    results = [(p.wait(), errors_of(p)) for p in (first, second)]
    assert [code for code, _ in results].count(0) >= 1, results
    for code, stderr in results:
        if code:
            assert "is writing this output; two attempts at once would mix their files" in stderr, stderr
            assert stderr.count("\n") == 1 + stderr.count(" INFO ")  # one error line besides the log
    assert (tmp_path / "_completions" / "00000.json").exists()
    assert file_bytes(tmp_path) == clean
    assert verify(Folder(str(tmp_path)), str(sample_tokenizer), EOS).ok
    assert leftovers(tmp_path) == []


def test_a_second_attempt_is_refused_naming_the_first(tmp_path, corpus, sample_tokenizer, clean) -> None:
    first = tokenize(corpus, tmp_path, sample_tokenizer)
    wait_for(lambda: (tmp_path / ".00000.lock").exists() and (tmp_path / ".staging").exists())
    first.send_signal(signal.SIGSTOP)  # held mid-attempt, however fast it is, until the second has been refused
    assert first.poll() is None and (tmp_path / ".00000.lock").exists()
    second = tokenize(corpus, tmp_path, sample_tokenizer)
    assert second.wait() == 1
    first.send_signal(signal.SIGCONT)
    refusal = errors_of(second).strip().splitlines()[-1]
    assert refusal.startswith(f"error: {tmp_path}/.00000.lock: attempt ") and f"pid {first.pid}" in refusal
    assert first.wait() == 0 and file_bytes(tmp_path) == clean and leftovers(tmp_path) == []


def test_a_killed_attempts_leftovers_go_with_the_next_attempt(tmp_path, corpus, sample_tokenizer, clean) -> None:
    first = tokenize(corpus, tmp_path, sample_tokenizer)
    wait_for(lambda: any((tmp_path / ".staging").glob("00000.attempt-*/segments/*/segment.ds")))
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert [p.name.split(".")[0] for p in (tmp_path / ".staging").iterdir()] == ["00000"]  # what it left
    second = tokenize(corpus, tmp_path, sample_tokenizer)  # the lock died with the process
    assert second.wait() == 0, errors_of(second)
    assert file_bytes(tmp_path) == clean and leftovers(tmp_path) == []


def _file_size_limit(limit: int):
    def apply() -> None:  # a write past the limit fails with EFBIG, as a full disk fails with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_write_error_names_the_file_and_leaves_nothing(tmp_path, corpus, sample_tokenizer, clean) -> None:
    """Finding 10: a disk that fills up mid-rank."""
    failed = tokenize(corpus, tmp_path, sample_tokenizer, preexec_fn=_file_size_limit(200_000))
    assert failed.wait() == 1
    error = errors_of(failed).strip().splitlines()[-1]
    assert error.startswith(f"error: {tmp_path}/.staging/00000.attempt-"), error
    assert "File too large (filesystem " in error and " MiB free of " in error
    assert leftovers(tmp_path) == [] and not (tmp_path / "_completions").exists()
    again = tokenize(corpus, tmp_path, sample_tokenizer)
    assert again.wait() == 0 and file_bytes(tmp_path) == clean


def test_the_file_lease_is_exclusive_and_released(tmp_path) -> None:
    holder = new_holder("test one")
    lease = FileLease(str(tmp_path), "00003")
    lease.acquire(holder)
    with pytest.raises(AttemptConflict, match=rf"attempt {holder.attempt} \(test one, host .*, pid {os.getpid()},"):
        FileLease(str(tmp_path), "00003").acquire(new_holder("test two"))
    FileLease(str(tmp_path), "00004").acquire(new_holder("another stem"))  # other stems are not held up
    lease.confirm()
    lease.release()
    assert not (tmp_path / ".00003.lock").exists()
    FileLease(str(tmp_path), "00003").acquire(new_holder("test three"))


def test_attempts_of_outputs_that_share_a_working_directory_stay_apart(tmp_path) -> None:
    work = str(tmp_path / "work")
    a, b = Folder(str(tmp_path / "a")), Folder(str(tmp_path / "b"))
    with attempt_at(a, "00000", work) as one, attempt_at(b, "00000", work) as two:
        assert one.work.parent != two.work.parent and one.work.exists() and two.work.exists()
    assert list((tmp_path / "work").rglob("*.attempt-*")) == []


def test_attempts_at_many_stems_at_once_share_their_staging_folder(tmp_path) -> None:
    """Issue 37: an attempt that finished removed the shared .staging while another was making its folder in it
    (a build of 64 ranks failed 2 times in 11, with FileNotFoundError)."""

    def attempt(stem: str) -> None:
        with attempt_at(Folder(str(tmp_path)), stem) as made:
            assert made.work.is_dir()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(attempt, [f"{stem:05d}" for stem in range(600)]))
    assert leftovers(tmp_path) == []


@ON_BOTH_STORES
def test_the_s3_lease_is_conditional_and_taken_over_only_when_stale(s3, monkeypatch) -> None:
    first, second = (
        ObjectLease(Folder("s3://corpus/out", s3.options), "00000"),
        ObjectLease(Folder("s3://corpus/out", s3.options), "00000"),
    )
    first.acquire(new_holder("first"))
    with pytest.raises(AttemptConflict, match=r"_leases/00000.json: attempt .* \(first, .*renewed \d+ s ago"):
        second.acquire(new_holder("second"))
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 0.0)  # the first attempt stalls past the TTL
    second.acquire(new_holder("second"))
    with pytest.raises(LeaseLost, match="this attempt lost its lease and must not publish"):
        first.confirm()
    second.confirm()
    first.release()  # not its lease any more: it must leave it alone
    assert s3.fs.exists("corpus/out/_leases/00000.json")
    second.release()
    assert not s3.fs.exists("corpus/out/_leases/00000.json")
