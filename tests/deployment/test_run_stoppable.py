"""scripts/run_stoppable.py, which ``make airflow`` runs ``airflow standalone`` through: one Ctrl-C stops the command
and every process it started, as Airflow's are (components in the command's process group, task processes in groups
of their own, some slow to stop), and nothing is left running. A dummy process tree stands in for Airflow."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.processes import wait_for

WRAPPER = ROOT / "scripts" / "run_stoppable.py"
TREE = """
import os, signal, subprocess, sys, time
role, out = sys.argv[1], sys.argv[2]
if role == "leader":  # standalone: starts its components, and on SIGINT stops the one it can
    children = [subprocess.Popen([sys.executable, __file__, child, out]) for child in ("component", "task", "stubborn")]
    with open(os.path.join(out, role + ".pid"), "w") as f:
        f.write(str(os.getpid()))
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        children[0].terminate()
        children[0].wait()
        sys.exit(0)
elif role == "task":  # a task process: a process group of its own, out of a terminal's Ctrl-C reach
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
elif role == "stubborn":  # a process that outlives SIGINT and SIGTERM
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(out, role + ".pid"), "w") as f:
    f.write(str(os.getpid()))
if role == "exits":  # a command that starts a child and exits by itself, with status 3
    subprocess.Popen([sys.executable, __file__, "leftover", out])  # which outlives it
    while not os.path.exists(os.path.join(out, "leftover.pid")):
        time.sleep(0.05)
    sys.exit(3)
while True:
    time.sleep(0.05)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def start(tmp_path: Path, role: str, ignore_sigint: bool = False) -> subprocess.Popen:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    command = [sys.executable, str(WRAPPER), "--grace", "2", "--term-grace", "1", "--"]
    return subprocess.Popen(
        [*command, sys.executable, str(script), role, str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        # a background job of a non-interactive shell starts with SIGINT ignored: the wrapper must not inherit that
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )


def pids(tmp_path: Path, roles: tuple[str, ...]) -> dict[str, int]:
    wait_for(lambda: all((tmp_path / f"{r}.pid").exists() and (tmp_path / f"{r}.pid").read_text() for r in roles))
    return {r: int((tmp_path / f"{r}.pid").read_text()) for r in roles}


def test_one_ctrl_c_stops_the_command_and_everything_it_started(tmp_path) -> None:
    wrapper = start(tmp_path, "leader", ignore_sigint=True)
    tree = pids(tmp_path, ("leader", "component", "task", "stubborn"))
    assert all(alive(pid) for pid in tree.values())
    began = time.monotonic()
    wrapper.send_signal(signal.SIGINT)
    _, stderr = wrapper.communicate(timeout=30)
    took = time.monotonic() - began
    assert wrapper.returncode == 130
    assert [role for role, pid in tree.items() if alive(pid)] == []
    # SIGINT stopped the command, which stopped its component; the task process took SIGTERM; the stubborn one SIGKILL
    assert "SIGTERM to 2 process(es)" in stderr and "SIGKILL to 1 process(es)" in stderr, stderr
    assert 3 <= took < 15, took


def test_sigterm_stops_it_too(tmp_path) -> None:
    wrapper = start(tmp_path, "leader")
    tree = pids(tmp_path, ("leader", "component", "task", "stubborn"))
    wrapper.send_signal(signal.SIGTERM)
    wrapper.communicate(timeout=30)
    assert wrapper.returncode == 130 and [role for role, pid in tree.items() if alive(pid)] == []


def test_what_a_command_leaves_behind_when_it_exits_is_stopped_and_its_status_kept(tmp_path) -> None:
    wrapper = start(tmp_path, "exits")
    leftover = pids(tmp_path, ("leftover",))["leftover"]
    _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 3 and not alive(leftover)
    assert "SIGTERM to 1 process(es)" in stderr
