"""Finding 12 of issue 22: an attempt that lost its lease changes nothing. A frozen attempt (its whole process
stopped, heartbeat included) is taken over; its successor commits; the frozen one wakes and must stop, leaving
the successor's marker, manifest and files as they were, on S3 (moto and SeaweedFS) and locally."""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import wait_for
from tests.support.s3 import ON_BOTH_STORES
from tests.support.tokenizers import EOS
from tokenization.errors import LeaseLost, WriteError
from tokenization.output import leases
from tokenization.output.attempts import Attempt, attempt_at
from tokenization.output.leases import FileLease, ObjectLease, new_holder
from tokenization.records import StageManifest, StageParams
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
from tokenization.stages.verify import verify
from tokenization.storage.conditions import put_if
from tokenization.storage.folder import Folder

OUT = "corpus/out"
LEASE = f"{OUT}/_leases/00000.json"
MARKER = "_completions/00000.json"
MANIFEST = "_manifests/00000.json"
# The base manifest: its ``counts`` is each stage's own, declared on the base for type checkers only.
MANIFEST_RECORD = StageManifest(  # type: ignore[call-arg]
    stage="tokenize", versions={}, params=StageParams(), seconds=0.0, peak_rss_mb=0.0, seed=7
)
REQUEST = re.compile(r'"(?:\x1b\[[\d;]*m)*(PUT|POST|DELETE) (\S+) HTTP/1\.1(?:\x1b\[[\d;]*m)*" (\d{3})')


def stored(fs) -> dict[str, tuple[str, object, bytes]]:
    """Every object of the output with its ETag, last-modified time and bytes. (Not the folders SeaweedFS keeps once
    their objects are deleted, such as an empty ``_leases``: they hold nothing, and AWS and moto have none.)"""
    fs.invalidate_cache()
    return {
        key: (info["ETag"], info["LastModified"], fs.cat_file(key))
        for key, info in sorted(fs.find(OUT, detail=True).items())
        if info["type"] == "file"
    }


def changes(s3, caplog) -> list[tuple[str, str, str]]:
    """The requests that could change the store since ``forget``: method, path, status. moto's server logs them
    (through ``werkzeug``); SeaweedFS is reached through a proxy that does."""
    if s3.proxy is not None:
        return [(r.method, r.path, str(r.status)) for r in s3.proxy.settled() if r.method in ("PUT", "POST", "DELETE")]
    return [hit for r in caplog.records if r.name == "werkzeug" for hit in REQUEST.findall(r.getMessage())]


def forget(s3, caplog, stuck: int = 0) -> None:
    """Start ``changes`` afresh, ``stuck`` requests of a stopped process still under way."""
    caplog.set_level(logging.INFO, logger="werkzeug")
    caplog.clear()
    if s3.proxy is not None:
        s3.proxy.settled(leaving=stuck)  # the last requests before are logged first, not after the clear
        s3.proxy.log.clear()


def rank_config(corpus: Path, tokenizer: Path, options: dict) -> TokenizeConfig:
    return TokenizeConfig(
        inputs=[str(corpus)],
        output=f"s3://{OUT}",
        tokenizer=str(tokenizer),
        seed=7,
        save_loss=True,
        eos_token=EOS,
        storage_options=options,
    )


class Freeze:
    """Stops the attempt running in the thread named ``frozen`` when it first calls ``owner.name`` with arguments
    that ``matches``, until ``wake``: that attempt stopped at a chosen step, its heartbeat silent (the heartbeat
    interval is made longer than the test), as a SIGSTOP would stop it."""

    def __init__(self, monkeypatch, owner, name: str, matches):
        self.stopped, self.woken = threading.Event(), threading.Event()
        call = getattr(owner, name)

        def frozen(*args, **kwargs):
            if threading.current_thread().name == "frozen" and not self.stopped.is_set() and matches(*args):
                self.stopped.set()
                assert self.woken.wait(60), "never woken"
            return call(*args, **kwargs)

        monkeypatch.setattr(owner, name, frozen)

    def wake(self) -> None:
        self.woken.set()


def every_call(*args) -> bool:
    return True


def at_path(suffix: str):
    return lambda folder, name, *rest: str(name).endswith(suffix)


GONE = "its lease object is gone: the attempt that took it over finished"
CHANGED = "was changed by another attempt after this one confirmed its lease"
FREEZES = {  # where the attempt stops (owner, function, which call), and why it finds its lease lost on waking
    "just after taking its lease": ((ObjectLease, "confirm", every_call), GONE),
    "between confirming its lease and removing the old marker": (
        (Folder, "remove", at_path(MARKER)),
        f"{OUT}/{MARKER} {CHANGED}",
    ),
    "before publishing its files": ((Attempt, "place_families", every_call), GONE),
    "between confirming its lease and writing its manifest": (
        (Folder, "put", at_path(MANIFEST)),
        f"{OUT}/{MANIFEST} {CHANGED}",
    ),
    "between confirming its lease and writing its marker": (
        (Folder, "put", at_path(MARKER)),
        f"{OUT}/{MARKER} {CHANGED}",
    ),
}


@ON_BOTH_STORES
@pytest.mark.parametrize("step", list(FREEZES))
def test_an_attempt_frozen_past_its_lease_changes_nothing_its_successor_committed(
    s3,
    sample_corpus,
    sample_tokenizer,
    monkeypatch,
    caplog,
    step,
) -> None:
    """A rank's attempt stopped at each kind of step (before a confirmation, or between one and its change), taken
    over by a successor that commits: on waking, every change it tries is refused and its successor's output
    stays as committed."""
    config = rank_config(sample_corpus, sample_tokenizer, s3.options)
    monkeypatch.setattr(leases, "HEARTBEAT_SECONDS", 3600.0)  # no beat during the test: the freeze is total
    # The test lapses the lease by setting its TTL to 0 during a freeze of seconds, not by waiting a TTL; a
    # confirmation must not take a renewal of seconds ago for a fresh one.
    monkeypatch.setattr(leases, "CONFIRM_AFTER", 0.0)
    tokenize_rank(config)  # an earlier build: the frozen attempt finds its marker and manifest
    where, reason = FREEZES[step]
    freeze = Freeze(monkeypatch, *where)
    outcome: list[BaseException | None] = []

    def frozen_attempt() -> None:
        try:
            tokenize_rank(config)
            outcome.append(None)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    first = threading.Thread(target=frozen_attempt, name="frozen", daemon=True)
    first.start()
    assert freeze.stopped.wait(60)
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 0.0)  # the frozen attempt is now past its TTL
    successor = tokenize_rank(config)
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 300.0)
    committed = stored(s3.fs)
    assert f"{OUT}/{MARKER}" in committed and LEASE not in committed
    forget(s3, caplog)
    freeze.wake()
    first.join(60)
    (error,) = outcome
    assert isinstance(error, LeaseLost), error
    assert str(error).startswith(f"{LEASE}: this attempt lost its lease and must not publish: {reason}")
    tried = changes(s3, caplog)  # by the woken attempt: its renewal, or its conditional change
    assert tried and all(status.startswith("4") for _, _, status in tried), tried  # all refused by the store
    assert stored(s3.fs) == committed
    marker = s3.fs.cat_file(f"{OUT}/{MARKER}")
    assert successor.record.attempt is not None
    assert successor.record.attempt.encode() in marker
    assert verify(Folder(f"s3://{OUT}", s3.options), str(sample_tokenizer), EOS).ok


@ON_BOTH_STORES
@pytest.mark.parametrize("step", ["lease", "publish"])
def test_a_stopped_command_woken_after_its_successor_committed_fails_and_changes_nothing(
    s3,
    sample_corpus,
    sample_tokenizer,
    caplog,
    step,
) -> None:
    """The reported case: ``tokenization tokenize`` SIGSTOPped (by itself, at a chosen step, through tests/faults)
    beyond its lease, retried, and woken by SIGCONT once the retry has committed."""
    env = os.environ | {
        "PYTHONPATH": f"{ROOT / 'tests' / 'faults'}:{ROOT}",
        "FSSPEC_S3_ENDPOINT_URL": s3.options["s3"]["endpoint_url"],
        "FAULT_LEASE_TTL": "1",
        "FAULT_HEARTBEAT": "0.1",
    }
    command = [sys.executable, "-m", "tokenization.cli", "tokenize", str(sample_corpus), "--output", f"s3://{OUT}"]
    command += ["--tokenizer", str(sample_tokenizer), "--seed", "7", "--save-loss", "--eos-token", EOS]
    first = subprocess.Popen(command, env=env | {"FAULT_FREEZE_AT": step}, stderr=subprocess.PIPE, text=True)
    _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns once it has stopped itself
    assert os.WIFSTOPPED(status), status
    time.sleep(1.5)  # its lease lapses: a TTL without renewal
    # a renewal it had half sent when it stopped stays under way until it goes on; nothing else runs yet
    stuck = s3.proxy.in_flight if s3.proxy is not None else 0
    retry = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True)
    assert retry.returncode == 0, retry.stderr
    committed = stored(s3.fs)
    forget(s3, caplog, stuck)
    first.send_signal(signal.SIGCONT)
    assert first.wait(60) == 1
    assert first.stderr is not None
    error = first.stderr.read().strip().splitlines()[-1]
    assert error.startswith(f"error: {LEASE}: this attempt lost its lease and must not publish: {GONE}"), error
    tried = changes(s3, caplog)
    assert tried and all(status.startswith("4") for _, _, status in tried), tried
    assert stored(s3.fs) == committed
    assert verify(Folder(f"s3://{OUT}", s3.options), str(sample_tokenizer), EOS).ok


@ON_BOTH_STORES
def test_a_renewal_that_finds_the_lease_deleted_loses_it_and_stops_every_change(s3, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(leases, "HEARTBEAT_SECONDS", 0.05)
    with attempt_at(Folder(f"s3://{OUT}", s3.options), "00000") as attempt:
        s3.fs.rm_file(LEASE)  # as the attempt that took it over does when it is done
        wait_for(lambda: attempt.lease.lost is not None, 30)  # the heartbeat found it: lost, not a warning
        before = stored(s3.fs)
        (tmp_path / "a.ds").write_bytes(b"tokens")
        for change in (
            lambda: attempt.place(tmp_path / "a.ds", "00000_unshuffled.ds"),
            lambda: attempt.write("00000_unshuffled.ds.metadata", b"meta"),
            lambda: attempt.remove(MARKER),
            lambda: attempt.commit(MANIFEST_RECORD, {}),
        ):
            with pytest.raises(LeaseLost, match="lost its lease and must not publish: its lease object is gone"):
                change()
    assert stored(s3.fs) == before == {}
    assert (tmp_path / "a.ds").exists()  # not moved anywhere


@ON_BOTH_STORES
def test_a_lease_the_store_failed_to_renew_for_a_ttl_is_lost(s3, monkeypatch) -> None:
    """Renewals that fail for a while are warnings; past a TTL a contender may hold the lease: lost."""
    monkeypatch.setattr(leases, "CONFIRM_AFTER", 0.0)  # every confirmation renews
    lease = ObjectLease(Folder(f"s3://{OUT}", s3.options), "00000")
    lease.acquire(new_holder("first"))

    def store_down(*args, **kwargs):
        raise OSError(errno.EIO, "connection reset by peer")

    monkeypatch.setattr(Folder, "put", store_down)
    with pytest.raises(WriteError, match=rf"^{LEASE}: connection reset by peer$"):
        lease.confirm()  # within the TTL: this change is not made, but the lease is not lost
    assert lease.lost is None
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 0.0)
    with pytest.raises(LeaseLost, match=r"it was not renewed for \d+ s \(\[Errno 5\] connection reset by peer\)"):
        lease.confirm()
    lease.release()
    assert s3.fs.exists(LEASE)  # perhaps another attempt's by now: left alone


@ON_BOTH_STORES
def test_every_renewal_changes_the_leases_etag_so_a_takeover_based_on_an_old_one_fails(s3, monkeypatch) -> None:
    """A contender reads a stale-looking lease, the holder renews, then the contender writes with If-Match on what
    it read: the renewal must have changed the ETag, or the contender wins a lease that is alive."""
    monkeypatch.setattr(leases, "CONFIRM_AFTER", 0.0)  # every confirmation renews
    lease = ObjectLease(Folder(f"s3://{OUT}", s3.options), "00000")
    lease.acquire(new_holder("holder"))
    read_by_contender = lease.etag
    lease.confirm()
    assert lease.etag != read_by_contender
    with pytest.raises(FileExistsError):
        put_if(s3.fs, LEASE, b'{"attempt": "contender"}', etag=read_by_contender)
    lease.confirm()  # still the holder's
    lease.release()


@ON_BOTH_STORES
def test_a_confirmation_renews_only_a_lease_last_renewed_over_a_tenth_of_its_ttl_ago(s3, monkeypatch) -> None:
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 10.0)  # a confirmation within 1 s of a renewal is free
    lease = ObjectLease(Folder(f"s3://{OUT}", s3.options), "00000")
    lease.acquire(new_holder("holder"))
    taken = lease.etag
    lease.confirm()
    assert lease.etag == taken  # no request: the lease was written a moment ago
    time.sleep(1.1)
    lease.confirm()
    assert lease.etag != taken
    lease.release()


@ON_BOTH_STORES
def test_a_rank_placing_many_files_writes_its_lease_once_or_twice_not_once_a_file(
    s3,
    sample_corpus,
    sample_tokenizer,
    caplog,
    monkeypatch,
) -> None:
    """A rank of 16 buckets places every bucket file, several at once, then its manifest and marker: its lease is
    written when taken (and renewed at most once more), where each change used to renew it. (A TTL ten times the
    usual: a loaded machine's rank may take longer than a tenth of one, after which a renewal is due anyway.)"""
    monkeypatch.setattr(leases, "LEASE_TTL_SECONDS", 10 * leases.LEASE_TTL_SECONDS)
    monkeypatch.setattr(leases, "HEARTBEAT_SECONDS", 10 * leases.HEARTBEAT_SECONDS)
    config = replace(rank_config(sample_corpus, sample_tokenizer, s3.options), num_buckets=16)
    forget(s3, caplog)
    result = tokenize_rank(config)
    requests = changes(s3, caplog)
    placed = [path for method, path, _ in requests if method == "PUT" and "/bucket000" in path]
    assert len(placed) == sum(len(entry.files) for entry in result.record.outputs) >= 16 * 3
    assert 1 <= sum(method == "PUT" and path.endswith(LEASE) for method, path, _ in requests) <= 2


def test_a_local_attempt_whose_lock_file_was_replaced_changes_nothing(tmp_path) -> None:
    with attempt_at(Folder(str(tmp_path)), "00000") as attempt:
        os.unlink(tmp_path / ".00000.lock")  # a person removed it; another attempt locked a new one
        successor = FileLease(str(tmp_path), "00000")
        successor.acquire(new_holder("successor"))
        (attempt.work / "a.ds").write_bytes(b"tokens")
        for change in (
            lambda: attempt.place(attempt.work / "a.ds", "00000_unshuffled.ds"),
            lambda: attempt.write(MARKER, b"{}"),
            lambda: attempt.remove(".00000.lock"),
            lambda: attempt.commit(MANIFEST_RECORD, {}),
        ):
            with pytest.raises(LeaseLost, match=r"\.00000\.lock: this attempt lost its lease .*lock file was removed"):
                change()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".00000.lock"]  # the successor's, still there
    assert b"successor" in (tmp_path / ".00000.lock").read_bytes()
    successor.release()


def test_leftovers_are_matched_by_the_stem_taken_literally(tmp_path) -> None:
    """A stem from a user's --save-filename may hold glob characters: only its own leftovers go."""
    staging = tmp_path / ".staging"
    for name in ("a[1].attempt-old", "a1.attempt-live", "r*.attempt-old", "r5.attempt-live"):
        (staging / name).mkdir(parents=True)
    for stem in ("a[1]", "r*"):
        with attempt_at(Folder(str(tmp_path)), stem):
            pass
    assert sorted(p.name for p in staging.iterdir()) == ["a1.attempt-live", "r5.attempt-live"]


def test_an_attempt_whose_lease_is_found_lost_stops_at_the_next_batch(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
) -> None:
    """Lost is for good: the rank does not encode the rest of its share for nothing."""
    from tokenization.stages.tokenize import first_pass

    real, batches = first_pass.encoded_batches, []

    def counted(*args, **kwargs):
        for batch in real(*args, **kwargs):
            batches.append(batch)
            yield batch

    def lost(self) -> None:
        if batches:  # found lost by the heartbeat once the first batch is out
            raise LeaseLost(f"{self.path}: taken over")

    monkeypatch.setattr(first_pass, "encoded_batches", counted)
    monkeypatch.setattr(FileLease, "check", lost)
    config = TokenizeConfig(
        inputs=[str(sample_corpus)], output=str(tmp_path), tokenizer=str(sample_tokenizer), eos_token=EOS, batch_size=8
    )
    with pytest.raises(LeaseLost, match="taken over"):
        tokenize_rank(config)
    assert len(batches) == 1 and not (tmp_path / "_completions").exists()
