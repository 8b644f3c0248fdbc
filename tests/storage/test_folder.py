"""A Folder is storage as a value: the same contract on a local disk and on S3, with the options it was given."""

from __future__ import annotations

import pytest

from tests.support.s3 import ON_BOTH_STORES
from tokenization.storage.folder import Folder, PutMode, UpdateIf


def _contract(folder: Folder) -> None:
    """What every caller relies on: names relative to the folder, whole writes, conditions kept, fresh listings."""
    assert folder.list() == [] and folder.sizes() == {} and not folder.exists("a.json")
    folder.put("a.json", b"first", PutMode.CREATE)
    with pytest.raises(FileExistsError):
        folder.put("a.json", b"second", PutMode.CREATE)  # create only: the first writer wins
    assert folder.read("a.json") == b"first"
    folder.put("a.json", b"third")  # overwrite, whatever is there
    folder.sub("sub").put("b.json", b"inner")
    assert folder.sizes()["a.json"] == 5  # (a subfolder's "size" is the store's own: 4096 locally, 0 on S3)
    assert sorted(folder.list()) == ["a.json", "sub"]
    assert folder.sub("sub").read("b.json") == b"inner" and folder.sub("sub").parent == folder
    assert folder.read_many(["a.json", "gone.json"]) == {"a.json": b"third", "gone.json": None}
    assert folder.url_of("a.json") == f"{folder.url.rstrip('/')}/a.json" and folder.sub("sub").name == "sub"
    folder.remove("a.json")
    folder.remove("a.json")  # gone already: no error
    assert not folder.exists("a.json")
    with pytest.raises(FileNotFoundError):
        folder.read("a.json")
    folder.remove_all()
    assert folder.list() == []


def test_a_local_folder_keeps_the_contract(tmp_path) -> None:
    _contract(Folder(str(tmp_path / "out")))


@ON_BOTH_STORES
def test_an_s3_folder_keeps_the_contract_with_the_options_it_was_given(s3) -> None:
    _contract(Folder("s3://corpus/out", s3.options))


@ON_BOTH_STORES
def test_an_update_replaces_only_the_version_it_read(s3) -> None:
    """LATEST's compare-and-swap: a writer that read an older version fails, and changes nothing."""
    folder = Folder("s3://corpus/out", s3.options)
    first = folder.put("LATEST", b"run-1\n", PutMode.CREATE)
    assert first is not None
    _, etag = folder.read_with_etag("LATEST")
    assert etag == first
    folder.put("LATEST", b"run-2\n", UpdateIf(etag))
    with pytest.raises(FileExistsError):
        folder.put("LATEST", b"run-3\n", UpdateIf(first))  # a version read before the change above
    assert folder.read("LATEST") == b"run-2\n"
    with pytest.raises(FileExistsError):
        folder.remove("LATEST", if_etag=first)  # nor is an old version's reader allowed to delete it
    assert folder.read("LATEST") == b"run-2\n"
