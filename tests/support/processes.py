"""The command line in a process of its own, its peak memory, and waiting on what a process does."""

from __future__ import annotations

import subprocess
import sys
import time


def cli(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """The command line in a process of its own; ``timeout``: seconds before a hang fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "tokenization.cli", *args], capture_output=True, text=True, timeout=timeout
    )


HUGE_RUN = """
import re
import sys
from tokenization.cli import main
code = main(sys.argv[1:])
status = open("/proc/self/status").read()
print(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1), file=sys.stderr)
sys.exit(code)
"""


def run_peak_kb(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """The command line in a process of its own, and its peak resident memory."""
    done = subprocess.run([sys.executable, "-c", HUGE_RUN, *args], capture_output=True, text=True, check=False)
    return done, int(done.stderr.strip().splitlines()[-1])


def wait_for(path_test, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path_test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
