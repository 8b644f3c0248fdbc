"""The benchmark script runs end to end on the bundled sample (a smoke test: nothing is asserted about time)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_bench_smoke_writes_the_table(tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    speed, memory = out.read_text().split("Peak RSS as the input grows")
    rows = [line for line in speed.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    stages = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert stages == ["tokenize + doc shuffle", "count", "merge, ~400-token docs", "merge, ~20k-token docs",
                      "context shuffle", "verify"]  # fmt: skip
    assert all("x |" in row for row in rows[:-1])  # a ratio to datatrove for every stage it has
    assert [row.split(" | ")[7] for row in rows] == ["yes", "-", "yes", "yes", "yes", "-"]  # datatrove's bytes
    grown = [line.split(" | ")[:2] for line in memory.splitlines() if line.startswith("| ") and "---" not in line]
    assert [stage for stage, _ in grown[1:]] == ["| tokenize + doc shuffle", "| merge", "| context shuffle"] * 2
