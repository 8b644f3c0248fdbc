"""Runs a command so that one Ctrl-C stops it and everything it started: ``python scripts/run_stoppable.py CMD ...``.

``make airflow`` runs ``airflow standalone`` through it. Standalone starts a scheduler, a DAG processor, an API
server and a triggerer, and the scheduler's LocalExecutor starts its workers and a process group per task; a
SIGTERM to standalone alone left the scheduler and its workers running. Here the command runs in a session of its
own, and on SIGINT (Ctrl-C) or SIGTERM every process of that session is stopped, in steps:

1. SIGINT to the command alone: standalone takes it as "shut down cleanly", stops its components one by one and
   waits for them (a terminal's Ctrl-C, which also reaches the components, each at once, left the scheduler and
   its workers running: it needed SIGKILL);
2. after ``--grace`` seconds (60; standalone took 8-40 s on 2 busy cores), SIGTERM to every process of the session
   still running;
3. after ``--term-grace`` seconds more (5), SIGKILL to the rest.

A second Ctrl-C goes on to the next step at once. When the command exits by itself, what it left running in its
session is stopped the same way (from step 2). The exit status is the command's (130 when it was interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STEPS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies are left to their parents)."""
    proc = Path("/proc")
    if proc.is_dir():
        pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    else:  # macOS and the BSDs
        listed = subprocess.run(["ps", "-A", "-o", "pid="], capture_output=True, text=True, check=False).stdout
        pids = [int(p) for p in listed.split()]
    members = []
    for pid in pids:
        try:
            if os.getsid(pid) != sid or _zombie(pid):
                continue
        except (ProcessLookupError, PermissionError):
            continue
        members.append(pid)
    return members


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class Stopper:
    """Turns the signals this process receives into requests to go on to the next step."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.requests += 1


def run(command: list[str], grace: float, term_grace: float, poll: float = 0.1) -> int:
    stopper = Stopper()
    # Installed before the child starts: a handled signal is reset to its default in the child at exec, while an
    # ignored one (a background job of a non-interactive shell ignores SIGINT) would stay ignored.
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    child = subprocess.Popen(command, start_new_session=True)
    sid = child.pid  # the session's id, and its first process group's (the command's and what it forks)
    while child.poll() is None and stopper.requests == 0:
        time.sleep(poll)
    interrupted = stopper.requests > 0
    if interrupted:
        print(f"stopping {command[0]} and every process it started (Ctrl-C again to hurry)", file=sys.stderr)
    # Interrupted: from SIGINT; the leftovers of a command that exited by itself: from SIGTERM.
    for step in range(0 if interrupted else 1, len(STEPS)):
        members = session_members(sid)
        if not members:
            break
        if step == 0:  # the command alone, which stops what it started
            _signal_all([child.pid], signal.SIGINT)
        else:
            shown = ", ".join(map(str, members[:8])) + (" ..." if len(members) > 8 else "")
            print(f"{STEPS[step].name} to {len(members)} process(es) still running: {shown}", file=sys.stderr)
            _signal_all(members, STEPS[step])
        seen, deadline = stopper.requests, time.monotonic() + (grace if step == 0 else term_grace)
        while time.monotonic() < deadline and stopper.requests == seen and session_members(sid):
            child.poll()  # reaps the command as soon as it exits
            time.sleep(poll)
    status = child.wait()
    left = session_members(sid)
    if left:
        print(f"{len(left)} process(es) could not be stopped: {' '.join(map(str, left))}", file=sys.stderr)
    if interrupted:
        return 130
    return status if status >= 0 else 128 - status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grace", type=float, default=60.0, help="seconds from SIGINT to SIGTERM (60)")
    parser.add_argument("--term-grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL (5)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run")
    return run(command, args.grace, args.term_grace)


if __name__ == "__main__":
    sys.exit(main())
