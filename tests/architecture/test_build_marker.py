"""The ``build`` marker: a test that runs a whole build, itself, through a helper of the tests or a fixture, or as
``tokenization build``, is marked, so that ``pytest -m "not build"`` leaves only the unit tests; a test that runs
one stage, or another command, is not."""

from __future__ import annotations

import subprocess
import sys

from tests.support.builds import in_process
from tests.support.paths import ROOT
from tests.support.processes import cli
from tests.support.whole_builds import runs_a_build

# Never called: what the marker reads is their code.


def built(config):
    return in_process(config)


def through_a_helper(config):
    return [built(config)]


def started_and_run(config):
    from tokenization.builds.run import Build

    return Build.start(config, "b").run()


def a_refused_build_command(folder):
    return cli("build", str(folder), "--seed", "1")


def in_another_process(folder):
    return subprocess.run([sys.executable, "-m", "tokenization.cli", "build", "--seed", "1"], cwd=folder)


def one_rank(config):
    from tokenization.builds.run import Build

    return Build.start(config, "b").tokenize(0, progress=False)


def verify_command(folder):
    return cli("verify", str(folder))


# Named here, not in a test: a test that names them would read as running a build itself.
WHOLE = (built, through_a_helper, started_and_run, a_refused_build_command, in_another_process)
NOT_WHOLE = (one_rank, verify_command)


def test_the_marker_reads_a_whole_build_through_helpers_and_commands() -> None:
    assert [runs_a_build(function) for function in WHOLE] == [True] * len(WHOLE)
    assert [runs_a_build(function) for function in NOT_WHOLE] == [False] * len(NOT_WHOLE)


def test_not_build_leaves_a_layers_unit_tests() -> None:
    """tests/formats/test_packing.py: one test packs a whole build (twice, parametrized); the others are units."""
    pytest = [sys.executable, "-m", "pytest", "-n0", "-p", "no:cacheprovider", "--co", "-q"]
    listed = subprocess.run(
        [*pytest, "-m", "build", "tests/formats/test_packing.py"], capture_output=True, text=True, cwd=ROOT
    )
    marked = [line.partition("[")[0] for line in listed.stdout.splitlines() if "::" in line]
    packed = "tests/formats/test_packing.py::test_a_packed_build_adds_up_its_real_tokens_apart_from_padding"
    assert marked == [packed, packed]
