"""Fault injection for tests that run tasks in other processes (the Celery workers of the distributed test, a
command frozen past its lease): put this folder first on a process's PYTHONPATH, and

- name ranks in ``FAULT_RANKS``: each of them fails its first attempt in each run. A file a rank and run in
  ``FAULT_DIR`` remembers the attempt, whichever process makes the next one;
- set ``FAULT_LEASE_TTL`` and ``FAULT_HEARTBEAT`` (seconds) to shorten the object-store lease, so that a test can
  let one lapse in a second instead of five minutes;
- set ``FAULT_FREEZE_AT`` to ``lease`` (just after the attempt took its lease) or ``publish`` (just before it
  places its first file): the process then sends itself SIGSTOP there, once, heartbeat included, as a worker's
  session stopped by its host would be, and goes on when it gets SIGCONT;
- set ``FAULT_STALL_MERGE``: the first merge in ``FAULT_DIR``'s life stops for good right after it published its
  first file and that file's checkpoint, its lease still renewed, and says so with the file ``merge-stalled``
  there: a test then kills its worker mid-merge.

Production code knows nothing of this."""

import os
import signal
from pathlib import Path

RANKS = {int(rank) for rank in os.environ.get("FAULT_RANKS", "").split(",") if rank}
FREEZE_AT = os.environ.get("FAULT_FREEZE_AT", "")

if RANKS:
    from tokenization.builds.run import Build

    _tokenize = Build.tokenize

    def tokenize(self, rank, *args, **kwargs):
        marker = Path(os.environ["FAULT_DIR"]) / f"{self.claimed.claim.run_id}-rank-{rank}".replace("/", "_")
        if rank in RANKS and not marker.exists():
            marker.touch()
            raise RuntimeError(f"rank {rank}: failing its first attempt on purpose (tests/faults)")
        return _tokenize(self, rank, *args, **kwargs)

    Build.tokenize = tokenize  # type: ignore[method-assign]  # the fault, planted in the process under test

if os.environ.get("FAULT_LEASE_TTL") or os.environ.get("FAULT_HEARTBEAT") or FREEZE_AT:
    from tokenization.output import attempts, leases

    leases.LEASE_TTL_SECONDS = float(os.environ.get("FAULT_LEASE_TTL", leases.LEASE_TTL_SECONDS))
    leases.HEARTBEAT_SECONDS = float(os.environ.get("FAULT_HEARTBEAT", leases.HEARTBEAT_SECONDS))
    _frozen: set[str] = set()

    def stop_once(step: str) -> None:
        if step == FREEZE_AT and step not in _frozen:
            _frozen.add(step)
            os.kill(os.getpid(), signal.SIGSTOP)

    def freezing(step: str, call, after: bool):
        """``call``, with the whole process stopped before (or after) its first run when ``step`` is chosen."""

        def frozen(*args, **kwargs):
            if not after:
                stop_once(step)
            result = call(*args, **kwargs)
            if after:
                stop_once(step)
            return result

        return frozen

    # the faults, planted in the process under test
    leases.ObjectLease.acquire = freezing("lease", leases.ObjectLease.acquire, after=True)  # type: ignore[method-assign]
    attempts.Attempt.place_families = freezing("publish", attempts.Attempt.place_families, after=False)  # type: ignore[method-assign]

if os.environ.get("FAULT_STALL_MERGE"):
    import time

    from tokenization.stages.merge import resume

    _checkpoint = resume.Checkpoints.__call__

    def checkpoint_then_stall(self, *args, **kwargs):
        _checkpoint(self, *args, **kwargs)
        stalled = Path(os.environ["FAULT_DIR"]) / "merge-stalled"
        if not stalled.exists():
            stalled.touch()
            time.sleep(3600)

    resume.Checkpoints.__call__ = checkpoint_then_stall  # type: ignore[method-assign]  # the fault, planted
