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

With ``--follow-parent`` (``make airflow`` gives it), a fatal signal sent to the parent process alone, or the
parent's death, is a Ctrl-C too. GNU make, sent SIGINT (a supervisor's or an IDE's stop button, ``kill -INT`` of
its pid), forwards it to no child and waits for its children to exit, so nothing stopped; SIGTERM it forwards. What
make does show is that, sent SIGHUP, SIGINT, SIGQUIT or SIGTERM, it resets that signal to its default disposition
before it waits: the parent's caught signals (``SigCgt`` in ``/proc/{pid}/status``, Linux) losing one is the
request. Requests within ``COALESCE`` seconds are one: make forwards the SIGTERM that it is itself sent, and a
terminal's Ctrl-C reaches both.
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
FATAL = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)  # what make takes as "stop", and resets
COALESCE = 1.0  # seconds within which stop requests are one (the parent's and this process's own)


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
    """Turns the signals this process receives (and, when followed, its parent's) into requests to go on to the next
    step."""

    def __init__(self, parent: Parent | None = None) -> None:
        self.requests, self.parent = 0, parent
        self._last = float("-inf")

    def __call__(self, signum: int, frame: object) -> None:
        self.request()

    def request(self) -> None:
        now = time.monotonic()
        if now - self._last >= COALESCE:
            self.requests += 1
        self._last = now

    def watch(self) -> None:
        """Called every poll: a request once the followed parent was sent a fatal signal or died."""
        if self.parent is not None and self.parent.stopping():
            self.parent = None  # one request: what follows is up to this process's own signals
            self.request()


class Parent:
    """The parent process (make) as seen from here: whether it was sent a fatal signal, or died."""

    def __init__(self) -> None:
        self.pid = os.getppid()
        self.caught = self._caught()

    def _caught(self) -> set[int] | None:
        """The fatal signals the parent catches (None where /proc cannot tell)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), None)
        return None if mask is None else {sig for sig in FATAL if mask >> (sig - 1) & 1}

    def stopping(self) -> bool:
        if os.getppid() != self.pid:  # it died: this process was handed to another
            return True
        now = self._caught()
        return self.caught is not None and now is not None and bool(self.caught - now)


def say(message: str) -> None:
    """A line on stderr, where a reader may have gone (a supervisor that stopped reading): stopping goes on."""
    with contextlib.suppress(OSError):
        print(message, file=sys.stderr, flush=True)


def run(command: list[str], grace: float, term_grace: float, poll: float = 0.1, follow_parent: bool = False) -> int:
    stopper = Stopper(Parent() if follow_parent else None)
    # Installed before the child starts: a handled signal is reset to its default in the child at exec, while an
    # ignored one (a background job of a non-interactive shell ignores SIGINT) would stay ignored.
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    child = subprocess.Popen(command, start_new_session=True)
    sid = child.pid  # the session's id, and its first process group's (the command's and what it forks)
    while child.poll() is None and stopper.requests == 0:
        time.sleep(poll)
        stopper.watch()
    interrupted = stopper.requests > 0
    if interrupted:
        say(f"stopping {command[0]} and every process it started (Ctrl-C again to hurry)")
    # Interrupted: from SIGINT; the leftovers of a command that exited by itself: from SIGTERM.
    for step in range(0 if interrupted else 1, len(STEPS)):
        members = session_members(sid)
        if not members:
            break
        if step == 0:  # the command alone, which stops what it started
            _signal_all([child.pid], signal.SIGINT)
        else:
            shown = ", ".join(map(str, members[:8])) + (" ..." if len(members) > 8 else "")
            say(f"{STEPS[step].name} to {len(members)} process(es) still running: {shown}")
            _signal_all(members, STEPS[step])
        seen, deadline = stopper.requests, time.monotonic() + (grace if step == 0 else term_grace)
        while time.monotonic() < deadline and stopper.requests == seen and session_members(sid):
            child.poll()  # reaps the command as soon as it exits
            time.sleep(poll)
            stopper.watch()
    status = child.wait()
    left = session_members(sid)
    if left:
        say(f"{len(left)} process(es) could not be stopped: {' '.join(map(str, left))}")
    if interrupted:
        return 130
    return status if status >= 0 else 128 - status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grace", type=float, default=60.0, help="seconds from SIGINT to SIGTERM (60)")
    parser.add_argument("--term-grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL (5)")
    parser.add_argument(
        "--follow-parent", action="store_true", help="stop also when the parent (make) is sent a fatal signal or dies"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run")
    return run(command, args.grace, args.term_grace, follow_parent=args.follow_parent)


if __name__ == "__main__":
    sys.exit(main())
