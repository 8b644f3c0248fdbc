"""The fork server a build's workers come from, started first by ``tokenization build`` (``builds.forkserver``)."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver
from pathlib import Path

from tokenization.builds import forkserver as server_of_workers


def signals(pid: int, kind: str) -> set[int]:
    """The signals a process blocks (``SigBlk``) or ignores (``SigIgn``), from its ``/proc`` status."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    mask = int(next(line for line in status if line.startswith(f"{kind}:")).split()[1], 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def test_the_server_started_first_leaves_ctrl_c_to_the_build_and_is_the_one_the_workers_come_from() -> None:
    """Started before the build imports and plans (its imports then run on another core), the server neither
    takes Ctrl-C while it imports (it printed their KeyboardInterrupt) nor after, and it is the one the build's
    workers are forked from later, not a second one started then."""
    server_of_workers.start()
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # the one running, by its pid
    assert server is not None and signal.SIGINT in signals(server, "SigBlk") | signals(server, "SigIgn")
    server_of_workers.start()
    with ProcessPoolExecutor(2, mp_context=server_of_workers.context()) as pool:
        assert {pool.submit(os.getppid).result() for _ in range(2)} == {server}
    assert forkserver._forkserver._forkserver_pid == server  # type: ignore[attr-defined]
