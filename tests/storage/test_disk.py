"""A local path is the Disk's: what fsspec's LocalFileSystem says of it, without importing fsspec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fsspec.implementations.local import LocalFileSystem

from tokenization.storage.disk import DISK


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A folder of a file, a subfolder, a link to each and a dangling link; the working folder its parent."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_bytes(b"0123456789")
    (root / "sub" / "b.jsonl").write_bytes(b"xy")
    (root / "to_a").symlink_to(root / "a.jsonl")
    (root / "to_sub").symlink_to(root / "sub")
    (root / "dangling").symlink_to(root / "gone")
    monkeypatch.chdir(tmp_path)
    return root


@pytest.mark.parametrize("spelled", ["root", "./root/", "file://{root}", "file:{root}", "local://{root}", "{root}/"])
def test_the_disk_reads_a_path_as_fsspec_does(tree, spelled: str) -> None:
    """The same absolute path, infos, listing, tree and answers, however the path is spelled: a listing's names,
    sizes and types, and the links followed as fsspec follows them, are what the inputs and the cache record."""
    path, fsspec_local = spelled.format(root=tree), LocalFileSystem()
    assert DISK._strip_protocol(path) == fsspec_local._strip_protocol(path) == str(tree)
    by_name = lambda infos: sorted(map(_as_fsspec, infos), key=lambda info: info["name"])  # noqa: E731
    assert by_name(DISK.ls(path, detail=True)) == by_name(fsspec_local.ls(path, detail=True))
    assert sorted(DISK.ls(path)) == sorted(fsspec_local.ls(path))
    assert {p: _as_fsspec(info) for p, info in DISK.find(path).items()} == fsspec_local.find(path, detail=True)
    for info in DISK.find(path).values():  # with what fsspec does not say, which a local listing's files take
        st = os.lstat(info["name"])
        assert (info["dev"], info["mtime_ns"], info["ctime_ns"]) == (st.st_dev, st.st_mtime_ns, st.st_ctime_ns)
    for name in ("a.jsonl", "sub", "to_a", "to_sub", "dangling", "missing"):
        inner = f"{path.rstrip('/')}/{name}"
        assert DISK.exists(inner) == fsspec_local.exists(inner)
        assert (DISK.isdir(inner), DISK.isfile(inner)) == (fsspec_local.isdir(inner), fsspec_local.isfile(inner))
    assert _as_fsspec(DISK.info(f"{path.rstrip('/')}/to_a")) == fsspec_local.info(f"{path.rstrip('/')}/to_a")
    assert DISK.cat_file(f"{path.rstrip('/')}/a.jsonl", 2, -2) == b"234567"
    assert DISK.glob(f"{path.rstrip('/')}/**/*.jsonl", detail=True) == fsspec_local.glob(
        f"{path.rstrip('/')}/**/*.jsonl", detail=True
    )


def _as_fsspec(info: dict) -> dict:
    """An info as fsspec gives it: without the ``stat`` fields the disk's infos add (``inputs.local``)."""
    return {k: v for k, v in info.items() if k not in ("dev", "mtime_ns", "ctime_ns")}


def test_a_local_folder_is_used_without_importing_fsspec(tmp_path) -> None:
    """A folder on a local path is written, listed, read and removed with no fsspec imported (asyncio with it):
    ~0.07 s of CPU at the start of every command."""
    code = (
        "import json, sys\n"
        "from tokenization.storage.folder import Folder, PutMode\n"
        "folder = Folder(sys.argv[1])\n"
        "folder.put('a.json', b'1', PutMode.CREATE); folder.sub('s').put('b.json', b'22')\n"
        "seen = [sorted(folder.list()), folder.read('a.json').decode(), sorted(folder.found())]\n"
        "seen.append(folder.size('a.json'))\n"
        "folder.remove_all()\n"
        "print(json.dumps([seen, folder.exists(), [m for m in ('fsspec', 'asyncio') if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[["a.json", "s"], "1", ["a.json", "s/b.json"], 1], False, []]
