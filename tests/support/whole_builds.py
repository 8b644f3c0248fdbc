"""Which tests run a whole build (tokenize to publish), for the ``build`` marker, so that ``pytest -m "not build"``
runs a layer's unit tests in seconds. A test runs one when its function, a fixture it uses, or a helper of the
tests either calls (followed through the code of ``tests/``) refers to an entry point of a whole build: a helper
that runs one, ``Build.start(...).run()``, or the command line's ``build``. The tests of minutes (marked ``long``:
the deployments, the bench) run whole builds too; tests/conftest.py lists any module this reading misses."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import CodeType, ModuleType
from typing import Any, TypeGuard

# Helpers that run a whole build, by their qualified names (no import of the library here: collecting a layer's
# unit tests loads only what they import).
RUN_A_BUILD = {
    "tests.support.builds.in_process",
    "tests.support.builds.until_publish",
    "tests.support.dag_runs.run_dag",
}
BUILD = "tokenization.builds.run.Build"  # a whole build where its ``run`` is called
COMMAND_LINES = {"tests.support.processes.cli", "tests.support.processes.run_peak_kb", "tokenization.cli.main"}
OURS = ("tests", "tokenization")  # the modules an entry point or a helper that calls one is in


def qualified(value: object) -> str:
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"


def codes(code: CodeType) -> Iterator[CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from codes(const)


def strings(consts: tuple[object, ...]) -> set[str]:
    """The strings among a code's constants, those of constant tuples too (``["build", "--seed", "1"]``)."""
    found: set[str] = set()
    for const in consts:
        if isinstance(const, str):
            found.add(const)
        elif isinstance(const, (tuple, frozenset)):
            found |= strings(tuple(const))
    return found


def referred(code: CodeType, names: dict[str, Any]) -> Iterator[tuple[str, object]]:
    """What a function's code refers to by name, qualified, with the object where it is at hand: its globals, the
    attributes named of our modules among them, and what it imports itself (each module it imports with each name
    it uses: a few false pairs, never a miss)."""
    imported = [name for name in code.co_names if name.startswith(OURS)]
    yield from ((f"{module}.{name}", None) for module in imported for name in code.co_names)
    ours = [v for v in names.values() if isinstance(v, ModuleType) and v.__name__.startswith(OURS)]
    for name in code.co_names:
        if name in names:
            yield qualified(names[name]), names[name]
        for module in ours:
            if name in vars(module):  # not getattr: no module's lazy attributes loaded
                yield qualified(vars(module)[name]), vars(module)[name]


def helper(value: object) -> TypeGuard[Callable[..., Any]]:
    """A function of the tests, which the reading follows (not this module's own, which names the entry points)."""
    module = getattr(value, "__module__", None) or ""
    return inspect.isfunction(value) and module.startswith("tests") and module != __name__


def runs_a_build(function: Callable[..., Any], seen: set[CodeType] | None = None) -> bool:
    """Whether ``function``, or a helper of the tests it calls, runs a whole build."""
    function = inspect.unwrap(function)
    if not hasattr(function, "__code__"):
        return False
    seen = set() if seen is None else seen
    for code in codes(function.__code__):
        if code in seen:
            continue
        seen.add(code)
        consts = strings(code.co_consts)
        command = "build" in consts  # `tokenization build`, in this process or another
        if command and "tokenization.cli" in consts:
            return True
        for name, value in referred(code, function.__globals__):
            if name in RUN_A_BUILD or (name == BUILD and "run" in code.co_names) or (command and name in COMMAND_LINES):
                return True
            if helper(value) and runs_a_build(value, seen):
                return True
    return False
