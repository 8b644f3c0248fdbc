"""scripts/run_stoppable.py, which ``make airflow`` runs ``airflow standalone`` through: one Ctrl-C stops the command
and every process it started, as Airflow's are (components in the command's process group, task processes in groups
of their own, some slow to stop), and nothing is left running. A dummy process tree stands in for Airflow."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import wait_for

WRAPPER = ROOT / "scripts" / "run_stoppable.py"
TREE = """
import os, signal, subprocess, sys, time
role, out = sys.argv[1], sys.argv[2]
if role in ("leader", "standalone"):  # standalone: starts its components, and on SIGINT stops the one it can
    kinds = ("component", "task", "stubborn") if role == "leader" else ("component",)  # (a quick one: no stragglers)
    children = [subprocess.Popen([sys.executable, __file__, child, out]) for child in kinds]
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


def test_it_stops_everything_when_no_one_reads_its_messages_any_more(tmp_path) -> None:
    """Its stderr's reader gone (a supervisor that stopped reading, a test that timed out), a message it wrote while
    stopping raised BrokenPipeError, and the runner died, leaving the command running."""
    wrapper = start(tmp_path, "leader")
    tree = pids(tmp_path, ("leader", "component", "task", "stubborn"))
    assert wrapper.stderr is not None
    wrapper.stderr.close()
    wrapper.send_signal(signal.SIGTERM)
    wrapper.wait(timeout=30)
    assert wrapper.returncode == 130 and [role for role, pid in tree.items() if alive(pid)] == []


def test_what_a_command_leaves_behind_when_it_exits_is_stopped_and_its_status_kept(tmp_path) -> None:
    wrapper = start(tmp_path, "exits")
    leftover = pids(tmp_path, ("leftover",))["leftover"]
    _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 3 and not alive(leftover)
    assert "SIGTERM to 1 process(es)" in stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_make_airflows_own_pid_stops_every_process(tmp_path, sig) -> None:
    """Issue 54: ``kill -INT`` of ``make airflow``'s pid stopped nothing (12 processes still there after 100 s): make
    forwards no SIGINT, and waits for its children. Stopped as a supervisor stops it, the signal to make's pid
    alone: the Makefile's own recipe and runner, a stand-in for ``airflow standalone``."""
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    (tmp_path / "home").mkdir()
    settings = [
        f"AIRFLOW_LOCAL_HOME={tmp_path / 'home'}",
        f"AIRFLOW_SERVER={sys.executable} {script} standalone {tmp_path}",
    ]
    make = subprocess.Popen(
        ["make", "-s", "-o", "airflow-init", "airflow", *settings],  # -o: not its set-up (uv sync, db migrate)
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of make's own, as a supervisor starts it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # (a background job starts with it ignored)
    )
    session = os.getsid(pids(tmp_path, ("standalone", "component"))["standalone"])  # the runner's child's own
    ours = lambda pid: os.getpgid(pid) == make.pid or os.getsid(pid) == session  # noqa: E731
    group = members(ours)
    assert make.pid in group and len(group) == 4, group  # make, the runner (make's exec'd child), standalone, its part
    os.kill(make.pid, sig)
    try:
        _, stderr = make.communicate(timeout=30)
    finally:  # nothing left behind, even by a failure
        for pid in members(ours):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert make.returncode == -sig, stderr  # make re-raises the signal once its child is done
    assert f"stopping {sys.executable} and every process" in stderr and [pid for pid in group if alive(pid)] == []


def members(belongs) -> list[int]:
    """The live processes for which ``belongs(pid)`` holds."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and alive(int(entry.name)) and belongs(int(entry.name)):
                found.append(int(entry.name))
        except (ProcessLookupError, PermissionError):
            continue
    return found
