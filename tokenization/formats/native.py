"""The compiled helper, ``scan.c``: its one pass over a block (contents sums, id and loss checks, the token before
each index entry), its reads of a block's windows and its copies of a block's units into place, loaded with ctypes.
Where it cannot be had (no C compiler, a failed build, or ``TOKENIZATION_NO_C=1``, read once a process), the numpy
path runs instead (Arrow's ``take`` for the copies) and gives the same values; the log says which runs.

It is built on first use, or by ``make setup`` (``python -m tokenization.formats.native``), into a cache folder,
as a file named by the hash of its source: an editable install (``uv sync``) runs no build step when the source
changes, and the wheel of the Airflow image is installed where no compiler may be, so a build at installation
would be stale in one and absent in the other; keyed by its hash, a build is never stale and is made once a
machine. ``TOKENIZATION_NATIVE_CACHE`` moves the folder (default ``$XDG_CACHE_HOME/corpus-tokenization``, else
``~/.cache/corpus-tokenization``). Processes that build at once each write a file of their own and rename it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("scan.c")
NO_C = "TOKENIZATION_NO_C"
CACHE = "TOKENIZATION_NATIVE_CACHE"
FLAGS = ("-O3", "-shared", "-fPIC", "-std=gnu11")

_P, _I64 = ctypes.c_void_p, ctypes.c_int64


def cache_folder() -> Path:
    if folder := os.environ.get(CACHE):
        return Path(folder)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "corpus-tokenization"


def built_path() -> Path:
    """Where the build of this source, on this kind of machine, lives."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return cache_folder() / f"scan-{digest}-{platform.machine()}.so"


def build() -> Path:
    """The helper's build, made now unless it exists; OSError or CalledProcessError when it cannot be made."""
    target = built_path()
    if target.exists():
        return target
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        made = Path(scratch) / target.name
        subprocess.run([compiler, *FLAGS, "-o", str(made), str(SOURCE)], check=True, capture_output=True, text=True)
        os.replace(made, target)
    return target


@functools.cache
def helper() -> ctypes.CDLL | None:
    """The loaded helper, or None: the numpy path runs (the reason is logged, once a process)."""
    if os.environ.get(NO_C, "") not in ("", "0"):
        log.info("byte checks: the numpy path runs (%s is set)", NO_C)
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip().splitlines()[-1:] if isinstance(exc, subprocess.CalledProcessError) else [exc]
        log.info("byte checks: the numpy path runs (the C helper could not be built: %s)", *detail or ["?"])
        return None
    lib.tk_scan.argtypes = [_P, ctypes.c_int, _P, _I64, _P, _I64, _P, _P, _P, _P]
    lib.tk_scan.restype = ctypes.c_int
    lib.tk_pread.argtypes = [_P, _P, _P, _P, _I64, _P]
    lib.tk_pread.restype = _I64
    lib.tk_copy.argtypes = [_P, _I64, _P, _P, _I64, _P, _I64, _P]
    lib.tk_copy.restype = ctypes.c_int
    log.info("byte checks: the C helper runs (%s)", lib._name)
    return lib


def main() -> int:
    """Build the helper (``make setup``) and say which path runs."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return 0 if helper() is not None or os.environ.get(NO_C) or shutil.which("cc") is None else 1


if __name__ == "__main__":
    sys.exit(main())
