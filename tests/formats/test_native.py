"""The C helper (``formats/scan.c``) against its reference, the numpy path: on the same blocks, the same contents,
the same kept pieces and the same checks, bit for bit; and where no compiler is, the numpy path runs and says so."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from typing import cast

import numpy as np
import pytest

from tests.support.stages import run
from tokenization.formats import contents, moves, native, source_pool
from tokenization.formats.contents import ContentsHasher, hash_parts, within
from tokenization.formats.ds import SplitWriter, TokenFileError
from tokenization.records import ContentsSum

SIZES = [0, 1, 7, 1000, 300_000]  # past a numpy sub-block


def on_path(monkeypatch, path: str) -> None:
    if path == "numpy":
        monkeypatch.setenv(native.NO_C, "1")
    else:
        monkeypatch.delenv(native.NO_C, raising=False)
    native.helper.cache_clear()
    if path == "c" and native.helper() is None:
        pytest.skip("the C helper cannot be built here")


def block(rng: np.random.Generator, size: int, dtype: type, with_loss: bool):
    top = np.iinfo(dtype).max
    tokens: np.ndarray = rng.integers(0, top, size, endpoint=True, dtype=np.int64).astype(dtype)
    tokens[rng.random(size) < 0.01] = top  # the largest id: its square wraps around 2^64 in 4 bytes
    loss = None
    if with_loss:
        loss = rng.integers(0, 2, size).astype(np.uint8)
        loss[rng.random(size) < 0.01] = 255  # loss + 1 wraps to 0 in the numpy path's uint8
        loss[rng.random(size) < 0.01] = 2
    cuts = np.sort(rng.integers(0, size + 1, max(1, size // 300)))  # duplicates, 0 and the end among them
    return tokens, loss, np.concatenate([[0], cuts]) if size else cuts


def hashed(tokens, loss, cuts, parts: int):
    """Contents, kept pieces and what was found, with the block given in ``parts`` consecutive parts and a second
    hasher cutting it elsewhere (every other cut)."""
    keep = np.arange(0, len(cuts) + 1, 3)
    first, second = ContentsHasher(keep=keep), ContentsHasher()
    found = []
    edges = np.linspace(0, len(tokens), parts + 1).astype(np.int64)
    for start, stop in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        inside = [within(c, start, stop) for c in (cuts, cuts[::2])]
        part_loss = None if loss is None else loss[start:stop]
        f = hash_parts([first, second], tokens[start:stop], part_loss, inside, check=True)
        found.append((f.id_top, f.loss_top, f.before.tolist()))
    kept = first.kept_pieces()
    return first.result(), second.result(), [k.tolist() for k in (kept.sums, kept.weighted, kept.lengths)], found


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("with_loss", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_the_helper_gives_the_numpy_paths_values(monkeypatch, dtype, with_loss, size) -> None:
    rng = np.random.default_rng(size)
    tokens, loss, cuts = block(rng, size, dtype, with_loss)
    results = {}
    for path in ("numpy", "c"):
        on_path(monkeypatch, path)
        results[path] = [hashed(tokens, loss, cuts, parts) for parts in (1, 3)]
    assert results["c"] == results["numpy"]
    (id_top, loss_top, _), *_ = results["c"][0][-1]  # one part
    assert id_top == (tokens.max() if size else 0)
    assert loss_top == (loss.max() if size and loss is not None else 0)


def test_the_numpy_path_gives_the_same_values_in_chunks(monkeypatch) -> None:
    """The numpy path sums a block's weights a chunk at a time: pieces across chunk edges, entries on them, empty
    pieces and parts that end inside a chunk hash as in one chunk, and as the helper hashes them."""
    rng = np.random.default_rng(7)
    tokens, loss, cuts = block(rng, 50_000, np.uint32, True)
    cuts = np.sort(np.concatenate([cuts, np.arange(0, 50_000, 1000), [999, 1001, 1001]]))  # on and beside edges
    on_path(monkeypatch, "numpy")
    whole = [hashed(tokens, loss, cuts, parts) for parts in (1, 3)]  # one chunk: 50,000 tokens
    monkeypatch.setattr(contents, "CHUNK", 1000)
    assert [hashed(tokens, loss, cuts, parts) for parts in (1, 3)] == whole  # 50 chunks, and 17 a part
    on_path(monkeypatch, "c")
    assert [hashed(tokens, loss, cuts, parts) for parts in (1, 3)] == whole


def test_a_damaged_index_gets_the_numpy_paths_values_on_both(monkeypatch) -> None:
    """Entries out of order (a damaged ``.ds.index`` that verify reads) never reach the helper, which would read
    past the block: both paths give the numpy path's values, which verify's report names."""
    rng = np.random.default_rng(1)
    tokens, loss, cuts = block(rng, 5000, np.uint16, True)
    swapped = cuts.copy()
    swapped[[5, 9]] = swapped[[9, 5]]
    for damaged in (swapped, np.sort(cuts)[::-1][2:-2]):
        results = []
        for path in ("numpy", "c"):
            on_path(monkeypatch, path)
            hasher = ContentsHasher()
            found = hasher.checked(tokens, within(damaged, 0, len(tokens)), loss)
            results.append((hasher.result(), found.id_top, found.loss_top, found.before.tolist()))
        assert results[0] == results[1]


def test_without_a_compiler_the_numpy_path_runs_and_the_log_says_so(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.delenv(native.NO_C, raising=False)
    monkeypatch.setenv(native.CACHE, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    monkeypatch.setenv("CC", "cc")
    native.helper.cache_clear()
    with caplog.at_level(logging.INFO, logger=native.__name__):
        assert native.helper() is None
    native.helper.cache_clear()
    assert "byte checks: the numpy path runs (the C helper could not be built: no C compiler" in caplog.text
    assert not list(tmp_path.iterdir())


def test_the_helper_is_built_once_into_the_cache_named_by_its_source(monkeypatch, tmp_path, caplog) -> None:
    if native.helper() is None and not os.environ.get(native.NO_C):
        pytest.skip("no C compiler here")
    monkeypatch.setenv(native.CACHE, str(tmp_path))
    monkeypatch.delenv(native.NO_C, raising=False)
    native.helper.cache_clear()
    with caplog.at_level(logging.INFO, logger=native.__name__):
        assert native.helper() is not None
    native.helper.cache_clear()
    (built,) = tmp_path.iterdir()
    assert built == native.built_path() and built.name.startswith("scan-") and built.suffix == ".so"
    assert f"byte checks: the C helper runs ({built})" in caplog.text
    assert native.build() == built  # made once: not again


def test_make_setup_builds_the_helper_or_says_the_numpy_path_runs(tmp_path) -> None:
    """``python -m tokenization.formats.native`` (``make setup``) builds it where a compiler is, and succeeds
    without one, saying that the numpy path runs: a clean clone works without gcc."""
    env = {**os.environ, native.CACHE: str(tmp_path / "with")}
    env.pop(native.NO_C, None)
    command = [sys.executable, "-m", "tokenization.formats.native"]
    if native.helper() is not None:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        assert "byte checks: the C helper runs" in done.stderr
    env |= {native.CACHE: str(tmp_path / "without"), "PATH": str(tmp_path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert "byte checks: the numpy path runs (the C helper could not be built: no C compiler" in done.stderr


@pytest.mark.usefixtures("byte_path")
@pytest.mark.parametrize("with_loss", [False, True])
def test_a_blocks_windows_are_read_in_one_call_into_their_places(tmp_path, with_loss) -> None:
    """``pread_each`` on both paths: each window's tokens (and loss bytes) end to end, in the order given, a window
    given twice read twice; a window past the file's end is an error naming the file."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 60_000, 100_000).astype(np.uint16)
    loss = rng.integers(0, 2, len(tokens)).astype(np.uint8)
    path = tmp_path / "x.ds"
    tokens.tofile(path)
    loss.tofile(f"{path}.loss")
    starts = rng.integers(0, len(tokens) - 300, 500)
    ends = starts + rng.integers(0, 300, 500)
    starts[7], ends[7] = starts[3], ends[3]
    source = source_pool._Source(str(path), 2, with_loss)
    try:
        expected = [np.concatenate([a[s:e] for s, e in zip(starts, ends, strict=True)]) for a in (tokens, loss)]
        assert np.array_equal(source.pread_each(0, starts, ends).view(np.uint16), expected[0])
        if with_loss:
            assert np.array_equal(source.pread_each(1, starts, ends), expected[1])
        with pytest.raises(TokenFileError, match=rf"{path}: ends before byte 200010"):
            source.pread_each(0, np.array([5, 99_990]), np.array([9, 100_005]))
    finally:
        source.close()


def test_the_helper_compiles_without_a_warning(tmp_path) -> None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler here")
    command = [compiler, *native.FLAGS, "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "x.so"), str(native.SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_tokenized_corpus_hashes_and_checks_alike_on_both_paths(
    monkeypatch, tmp_path, sample_corpus, sample_tokenizer
):
    """Real tokens: the sample corpus tokenized with its loss bytes, hashed and checked on each path in blocks of
    any size, gives the contents its writer recorded, and the same findings."""
    run([sample_corpus], tmp_path, sample_tokenizer, seed=1, save_loss=True)
    (ds,) = tmp_path.glob("*.ds")
    tokens, loss = np.fromfile(ds, "<u2"), np.fromfile(f"{ds}.loss", np.uint8)
    ends = np.fromfile(f"{ds}.index", "<u8").astype(np.int64)
    manifest = json.loads((tmp_path / "_manifests" / "00000.json").read_text())
    recorded = ContentsSum(**manifest["outputs"][0]["contents"]).value
    results = []
    for path in ("numpy", "c"):
        on_path(monkeypatch, path)
        for block in (1 << 22, 4099):
            hasher, found = ContentsHasher(), []
            for start in range(0, len(tokens), block):
                stop = min(len(tokens), start + block)
                f = hasher.checked(tokens[start:stop], within(ends, start, stop), loss[start:stop])
                found.append((f.id_top, f.loss_top, f.before.tolist()))
            results.append((hasher.result(), found if block == 4099 else None))
    assert results[0][0] == recorded and len({c for c, _ in results}) == 1
    assert results[1][1] == results[3][1]


class _Captured:
    """A writer that keeps what ``move_units`` gives it."""

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.loss: list[np.ndarray] = []

    def write(self, tokens, ends, index, loss) -> None:
        self.tokens.append(np.array(tokens))
        self.loss.append(np.array(loss))


def _sources(tmp_path, rng: np.random.Generator, sizes: list[int]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Token files of these many random tokens each, with their loss bytes: (path, tokens, loss) each."""
    files = []
    for i, size in enumerate(sizes):
        tokens = rng.integers(0, 60_000, size).astype(np.uint16)
        loss = rng.integers(0, 2, size).astype(np.uint8)
        path = tmp_path / f"{i}.ds"
        tokens.tofile(path)
        loss.tofile(f"{path}.loss")
        (tmp_path / f"{i}.ds.metadata").write_text(f"t|2\n{size}\n-")
        files.append((str(path), tokens, loss))
    return files


def _assert_moved(pool, files, source, starts, ends, block_tokens: int) -> None:
    """``move_units`` gives its writer every unit in the order given, with its loss bytes."""
    captured = _Captured()
    moves.move_units(pool, source, starts, ends, cast(SplitWriter, captured), None, block_tokens=block_tokens)
    for k, which in ((0, 1), (1, 2)):
        expected = np.concatenate([files[f][which][s:e] for f, s, e in zip(source, starts, ends, strict=True)])
        assert np.array_equal(np.concatenate([captured.tokens, captured.loss][k]), expected)


@pytest.mark.usefixtures("byte_path")
@pytest.mark.parametrize("span", [0, 10**9])
def test_a_blocks_units_are_put_in_their_places_from_every_source(tmp_path, span, monkeypatch) -> None:
    """``move_units`` on both paths (the helper's copies, Arrow's take), read as one span or a unit at a time: the
    units of two sources, one given twice (a mixture's repeat), some empty, in the order given, with their loss
    bytes."""
    rng = np.random.default_rng(5)
    monkeypatch.setattr(moves, "SPAN_READ_MAX_WASTE", span)
    files = _sources(tmp_path, rng, [5_000, 5_000])
    cuts = np.sort(rng.integers(0, 5_000, (2, 201)))  # each source's units: between its cuts, some empty
    source = np.repeat([0, 1], 200)
    starts, ends = cuts[:, :-1].ravel(), cuts[:, 1:].ravel()
    order = rng.permutation(400)
    order[9] = order[4]  # a unit given twice
    with source_pool.SourcePool([f for f, _, _ in files], 2, with_loss=True) as pool:
        _assert_moved(pool, files, source[order], starts[order], ends[order], block_tokens=3_000)


@pytest.mark.usefixtures("byte_path")
@pytest.mark.parametrize("span", [0, 10**9])
def test_a_merges_runs_of_units_are_read_straight_into_their_places(tmp_path, span, monkeypatch) -> None:
    """A merge's block: each source's units end to end in its order (some empty), the sources interleaved, runs
    longer than the helper's preadv takes at once (1,024 places): on both paths, read one span or a unit at a time,
    the block holds every unit in the order given, with its loss bytes; a run past a file's end names the file."""
    rng = np.random.default_rng(8)
    monkeypatch.setattr(moves, "SPAN_READ_MAX_WASTE", span)
    lengths = rng.integers(0, 9, (3, 2_500))
    cuts = np.cumsum(lengths, axis=1)
    files = _sources(tmp_path, rng, cuts[:, -1].tolist())
    source = np.repeat(np.arange(3), 2_500)[np.argsort(rng.random(3 * 2_500))]  # the sources interleaved...
    by_source = np.argsort(source, kind="stable")  # ...each source's units in its own order, as a merge takes them
    starts, ends = np.empty_like(source), np.empty_like(source)
    starts[by_source], ends[by_source] = (cuts - lengths).ravel(), cuts.ravel()
    with source_pool.SourcePool([f for f, _, _ in files], 2, with_loss=True) as pool:
        _assert_moved(pool, files, source, starts, ends, block_tokens=20_000)
        size = len(files[0][1])
        past = np.array([size - 5, size]), np.array([size, size + 3])
        with pytest.raises(TokenFileError, match=rf"{files[0][0]}: ends before byte {2 * (size + 3)}"):
            moves.move_units(pool, np.zeros(2, np.int64), *past, cast(SplitWriter, _Captured()), None)
