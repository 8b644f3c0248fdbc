"""A Folder is storage as a value: the same contract on a local disk and on S3, with the options it was given."""

from __future__ import annotations

import pytest

from tests.support.s3 import ON_BOTH_STORES
from tokenization.storage.folder import Folder, PutMode, UpdateIf, file_at


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
    _, seen = folder.read_versioned("LATEST")
    assert seen == UpdateIf(first)
    folder.put("LATEST", b"run-2\n", seen)
    with pytest.raises(FileExistsError):
        folder.put("LATEST", b"run-3\n", UpdateIf(first))  # a version read before the change above
    assert folder.read("LATEST") == b"run-2\n"
    with pytest.raises(FileExistsError):
        folder.remove("LATEST", UpdateIf(first))  # nor is an old version's reader allowed to delete it
    assert folder.read("LATEST") == b"run-2\n"


def test_a_store_that_enforces_no_condition_is_looked_at_first(tmp_path) -> None:
    """On a store without If-Match (fsspec's memory store, as GCS or a filer through fsspec), ``put`` and
    ``remove`` under ``UpdateIf`` compare the version read (a digest of the bytes) before the change: an older
    version's holder changes nothing."""
    folder = Folder(f"memory://{tmp_path.name}/out")
    assert not folder.enforces_conditions and folder.version("lease.json") is PutMode.OVERWRITE
    first = folder.put("lease.json", b"holder 1", PutMode.CREATE)
    assert first is not None and folder.read_stamped("lease.json").version == first
    second = folder.put("lease.json", b"holder 2", UpdateIf(first))
    with pytest.raises(FileExistsError):
        folder.put("lease.json", b"holder 3", UpdateIf(first))  # read before the change above
    with pytest.raises(FileExistsError):
        folder.remove("lease.json", UpdateIf(first))
    assert folder.read("lease.json") == b"holder 2"
    folder.remove("lease.json", UpdateIf(second))
    assert not folder.exists("lease.json")
    folder.remove("lease.json", UpdateIf(second))  # gone already: no error
    with pytest.raises(FileNotFoundError):
        folder.put("lease.json", b"holder 4", UpdateIf(second))  # removed by another writer since


@ON_BOTH_STORES
def test_the_version_of_a_file_is_the_condition_to_replace_only_it(s3) -> None:
    """``version`` gives CREATE while there is none, and the ETag once there is: a writer that looked before
    another's change fails, and so does one that looked before another's creation."""
    folder = Folder("s3://corpus/out", s3.options)
    absent = folder.version("a.json")
    assert absent is PutMode.CREATE and folder.read_versioned("a.json") == (None, PutMode.CREATE)
    folder.put("a.json", b"first", absent)
    with pytest.raises(FileExistsError):
        folder.put("a.json", b"late", absent)
    seen = folder.version("a.json")
    folder.put("a.json", b"second", folder.version("a.json"))
    with pytest.raises(FileExistsError):
        folder.remove("a.json", seen)
    folder.remove("a.json", absent)  # none was there when looked at: nothing of that writer's to remove
    assert folder.read_versioned("a.json") == (b"second", folder.version("a.json"))


def test_a_file_is_a_folder_and_a_name(tmp_path) -> None:
    assert file_at("s3://bucket/run/_BUILD.json") == (Folder("s3://bucket/run"), "_BUILD.json")
    assert file_at("/a.json") == (Folder("/"), "a.json") and file_at("a.json") == (Folder("."), "a.json")
    run = Folder(str(tmp_path / "run"))
    assert run.name_of(run.sub("ranks").sub("b")) == "ranks/b" and run.name_of(Folder(str(tmp_path))) is None
    assert Folder(str(tmp_path) + "/").same_as(Folder(str(tmp_path))) and not run.at_top and Folder("/x").at_top
    run.sub("ranks").put("b/x.ds", b"x")
    run.sub("ranks").put("b/_manifests/x.json", b"{}")
    assert sorted(run.walk()) == [("ranks/b/_manifests/x.json", 2), ("ranks/b/x.ds", 1)]
    run.sub("ranks").remove_files(["b/x.ds"])
    assert run.sub("ranks").sub("b").exists() and not run.sub("ranks").exists("b/x.ds")
    run.sub("ranks").remove_files(["b/_manifests/x.json"])
    assert not run.sub("ranks").exists("b/_manifests")  # left empty: removed too, locally


def _files_in_and_out(folder: Folder, tmp_path) -> None:
    """What the cache asks of a folder: a whole tree listed at once with sizes and times, a bounded read, a local
    file kept while its copy is stored, and a stored file brought back to local disk."""
    assert folder.found() == {} and not folder.exists("a/x.bin", fresh=True)
    source = tmp_path / "x.bin"
    source.write_bytes(b"0123456789")
    folder.link_in(source, "a/x.bin")
    folder.sub("a").sub("b").put("y.json", b"{}")
    assert source.read_bytes() == b"0123456789"  # the local file stays
    found = folder.found()
    assert {name: size for name, (size, _) in found.items()} == {"a/x.bin": 10, "a/b/y.json": 2}
    assert all(written > 0 for _, written in found.values())
    assert folder.head("a/x.bin", 4) == b"0123" and folder.head("a/x.bin", 100) == b"0123456789"
    assert folder.exists("a/x.bin", fresh=True)
    back = tmp_path / "back" / "x.bin"
    back.parent.mkdir()
    folder.link_out("a/x.bin", back)
    assert back.read_bytes() == b"0123456789"
    folder.sub("a").sub("b").remove("y.json")
    folder.sub("a").sub("b").remove_if_empty()
    folder.sub("a").remove_if_empty()  # it holds x.bin: stays
    assert set(folder.found()) == {"a/x.bin"} and not folder.exists("a/b")


def test_a_local_folder_links_files_in_and_out(tmp_path) -> None:
    folder = Folder(str(tmp_path / "cache"))
    _files_in_and_out(folder, tmp_path)
    assert (tmp_path / "x.bin").stat().st_ino == (tmp_path / "cache" / "a" / "x.bin").stat().st_ino  # no byte copied
    assert Folder(str(tmp_path / "x.bin")).found() == {"": (10, (tmp_path / "x.bin").stat().st_mtime)}


@ON_BOTH_STORES
def test_an_s3_folder_copies_files_in_and_out(s3, tmp_path) -> None:
    _files_in_and_out(Folder("s3://corpus/cache", s3.options), tmp_path)


def test_map_concurrently_does_every_item_and_raises_the_first_error_in_their_order() -> None:
    """Each item once, results in the items' order, on threads; an error leaves no item undone, and the error of
    the first failing item (not the first to fail in time) is the one raised."""
    import threading
    import time

    from tokenization.storage.concurrent import map_concurrently

    seen: list[int] = []
    threads: set[int] = set()

    def slow_square(k: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.001 * (k % 3))
        seen.append(k)
        if k in (7, 3):
            raise ValueError(f"item {k}")
        return k * k

    assert map_concurrently(lambda k: k * k, list(range(50)), workers=4) == [k * k for k in range(50)]
    assert map_concurrently(lambda k: k, [], workers=4) == []
    with pytest.raises(ValueError, match="item 3"):
        map_concurrently(slow_square, list(range(20)), workers=4)
    assert sorted(seen) == list(range(20)) and len(threads) > 1
    seen.clear()
    with pytest.raises(ValueError, match="item 3"):  # fewer items than threads: a future each
        map_concurrently(slow_square, list(range(8)), workers=16)
    assert sorted(seen) == list(range(8))
