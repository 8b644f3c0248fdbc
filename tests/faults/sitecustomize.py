"""Fault injection for tests that run tasks in other processes (the Celery workers of the distributed test): put
this folder first on a process's PYTHONPATH and name ranks in ``FAULT_RANKS``; each of them fails its first attempt
in each run. A file a rank and run in ``FAULT_DIR`` remembers the attempt, whichever process makes the next one.
Production code knows nothing of this."""

import os
from pathlib import Path

RANKS = {int(rank) for rank in os.environ.get("FAULT_RANKS", "").split(",") if rank}

if RANKS:
    from tokenization.build import Build

    _tokenize = Build.tokenize

    def tokenize(self, rank, *args, **kwargs):
        marker = Path(os.environ["FAULT_DIR"]) / f"{self.plan.run_id}-rank-{rank}".replace("/", "_")
        if rank in RANKS and not marker.exists():
            marker.touch()
            raise RuntimeError(f"rank {rank}: failing its first attempt on purpose (tests/faults)")
        return _tokenize(self, rank, *args, **kwargs)

    Build.tokenize = tokenize
