"""A file is one file however its path is spelled, and only regular files are read (issue 51).

Locally a file is its device and inode: a symlink, a hard link or a ``..`` reaches the same one. One input that
reaches a file twice reads it once and says so; two mixture sources that reach one file are refused, naming both
paths. A device, a FIFO, a socket, a link loop or a dangling link among the inputs is refused by name at plan: a
link to ``/dev/zero`` used to be hashed forever, a loop was a traceback."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from tests.support.corpus import write_jsonl
from tests.support.tokenizers import EOS
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import list_input_files
from tokenization.inputs.local import ONLY_REGULAR, LocalFile
from tokenization.mixing.spec import MixtureError


def _corpus(root: Path) -> Path:
    write_jsonl(root / "web" / "a.jsonl", [{"text": f"web document {i}"} for i in range(3)])
    write_jsonl(root / "code" / "b.jsonl", [{"text": f"code document {i}"} for i in range(3)])
    return root


def test_one_input_that_reaches_a_file_by_several_paths_reads_it_once_and_says_so(tmp_path, caplog) -> None:
    web = _corpus(tmp_path) / "web"
    dotdot = tmp_path / "code" / ".." / "web" / "a.jsonl"
    os.link(web / "a.jsonl", web / "hard.jsonl")
    (web / "soft.jsonl").symlink_to("a.jsonl")
    caplog.set_level(logging.WARNING)
    listing = list_input_files([str(web), str(dotdot)])
    assert [f.url for f in listing.files] == [str(web / "a.jsonl")]
    assert listing.files[0].size == (web / "a.jsonl").stat().st_size
    for other in [web / "hard.jsonl", web / "soft.jsonl", dotdot]:
        assert f"{web / 'a.jsonl'} and {other} are one file: it is read once, as {web / 'a.jsonl'}" in caplog.text


def _mixture_build(tmp_path: Path, web: str, other: str) -> None:
    sources = [{"name": "web", "input": web, "weight": 1}, {"name": "w2", "input": other, "weight": 1}]
    config = BuildConfig(
        output=str(tmp_path / "out"),
        tokenizer=str(Path(__file__).parents[2] / "sample" / "tokenizer.json"),
        mixture={"tokens": None, "sources": sources},
        eos_token=EOS,
        num_ranks=1,
    )
    Build.start(config, "twice")


@pytest.mark.parametrize("spelling", ["dotdot", "symlinked folder", "hard links"])
def test_two_mixture_sources_that_reach_one_file_are_refused_naming_both_paths(tmp_path, spelling) -> None:
    root = _corpus(tmp_path / "src")
    web = root / "web"
    if spelling == "dotdot":
        other = root / "code" / ".." / "web"
    elif spelling == "symlinked folder":
        other = root / "linked"
        other.symlink_to(web, target_is_directory=True)
    else:
        other = root / "copy"
        other.mkdir()
        os.link(web / "a.jsonl", other / "a.jsonl")
    with pytest.raises(MixtureError) as refused:
        _mixture_build(tmp_path, f"{web}/", str(other))
    assert str(refused.value) == (
        f"{web / 'a.jsonl'} of mixture source 'web' and {other / 'a.jsonl'} of 'w2' are one file: a file belongs to "
        "one source; narrow their inputs"
    )


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


NOT_REGULAR = {
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "(a symbolic link to /dev/zero) is a character device"),
    "loop": (lambda p: p.symlink_to(p.name), "(a symbolic link to loop.jsonl) is a symbolic link loop"),
    "dangling": (lambda p: p.symlink_to("gone.jsonl"), "(a symbolic link to gone.jsonl) is a dangling symbolic link"),
    "fifo": (_fifo, "is a FIFO (a named pipe)"),
    "socket": (_socket, "is a socket"),
    # named, a link to a folder is a folder to list
    "folder": (lambda p: p.symlink_to(p.parent, target_is_directory=True), "(a symbolic link to {folder}) is a folder"),
}


@pytest.mark.parametrize(
    ("kind", "named"),
    [(kind, False) for kind in NOT_REGULAR] + [(kind, True) for kind in NOT_REGULAR if kind != "folder"],
)
def test_only_regular_files_are_read_and_any_other_is_refused_by_name(tmp_path, kind, named) -> None:
    make, what = NOT_REGULAR[kind]
    folder = tmp_path / "in"
    write_jsonl(folder / "good.jsonl", [{"text": "kept"}])
    bad = folder / "loop.jsonl"
    make(bad)
    with pytest.raises(InputError) as refused:
        list_input_files([str(bad) if named else str(folder)])
    assert str(refused.value) == f"{bad} {what.format(folder=folder)}; {ONLY_REGULAR}"


def test_a_local_file_is_its_device_and_inode(tmp_path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    (tmp_path / "b.jsonl").symlink_to(path)
    st = path.stat()
    local = LocalFile.of(str(tmp_path / "b.jsonl"))
    assert local == LocalFile(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert local.key == LocalFile.of(str(path)).key == (st.st_dev, st.st_ino)
