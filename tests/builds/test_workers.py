"""The fork server a build's workers come from, started first by ``tokenization build`` (``builds.workers``)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver

from tokenization.builds import workers


def test_the_server_started_first_is_the_one_the_workers_come_from() -> None:
    """Started before the build imports and plans (its imports then run on another core), the server is the one
    the build's workers are forked from later, not a second one started then."""
    workers.start()
    server = forkserver._forkserver._forkserver_pid
    workers.start()
    with ProcessPoolExecutor(2, mp_context=workers.context()) as pool:
        assert {pool.submit(os.getppid).result() for _ in range(2)} == {server}
    assert forkserver._forkserver._forkserver_pid == server
