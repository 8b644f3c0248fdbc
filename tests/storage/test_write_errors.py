"""What a write error says: the file, and what the error alone does not say, only where it explains the error: the
free space of a full filesystem (never beside a permission error), and that a kernel's virtual filesystem
(``/proc``, ``/sys``) is no place a build can write, where the system says "No such file or directory"."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.support.processes import cli
from tokenization.storage.files import write_error


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_filesystem_names_its_free_space(tmp_path, code) -> None:
    error = write_error(OSError(code, os.strerror(code)), tmp_path / "f.ds")
    assert str(error).startswith(f"{tmp_path}/f.ds: {os.strerror(code)} (filesystem ") and " MiB free of " in str(error)
    assert error.errno == code


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT])
def test_other_errors_say_nothing_of_free_space(tmp_path, code) -> None:
    error = write_error(OSError(code, os.strerror(code)), tmp_path / "f.ds")
    assert str(error) == f"{tmp_path}/f.ds: {os.strerror(code)}" and error.errno == code


@pytest.mark.skipif(not Path("/proc/sys").is_dir(), reason="no /proc here")
def test_a_kernel_filesystem_is_a_location_the_build_cannot_write_to() -> None:
    path = "/proc/sys/builds/out/_CACHE.json"
    error = write_error(OSError(errno.ENOENT, "No such file or directory"), path)
    assert str(error).startswith(f"{path}: a location the build cannot write to: /proc")
    assert "proc filesystem" in str(error) and "free" not in str(error)


@pytest.mark.skipif(not Path("/proc/sys").is_dir(), reason="no /proc here")
def test_a_build_to_proc_sys_says_it_cannot_write_there(tmp_path, sample_corpus, sample_tokenizer) -> None:
    done = cli("build", str(sample_corpus), "--output", "/proc/sys/tokenized", "--tokenizer", str(sample_tokenizer))
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "a location the build cannot write to" in last, done.stderr
    assert "No such file or directory" in last and "MiB free" not in last


def test_a_permission_error_of_a_build_says_nothing_of_free_space(tmp_path, sample_corpus, sample_tokenizer) -> None:
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = cli("build", str(sample_corpus), "--output", str(locked / "out"), "--tokenizer", str(sample_tokenizer))
    assert done.returncode != 0 and "Permission denied" in done.stderr and "MiB free" not in done.stderr
