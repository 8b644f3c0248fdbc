"""``tokenization cache list`` and ``prune`` on what a user may point them at: the root folder, and a cache damaged
by hand (an entry's marker replaced by a folder, or a FIFO), which is listed without that entry and cleaned by prune."""

from __future__ import annotations

import os
import re

from tests.support.processes import cli
from tokenization.output.cache import ENTRIES
from tokenization.output.cache.names import SIZES


def test_the_root_folder_is_named_when_it_is_no_cache() -> None:
    done = cli("cache", "list", "/")
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == (
        "error: /: not a tokenization cache (it has no _CACHE.json), so nothing in it is listed or removed; a cache "
        "made by an earlier version gets one from the next build that uses it, when the folder holds only what a "
        "cache holds"
    )


def test_a_marker_that_is_a_folder_is_left_out_of_the_list_and_pruned(tmp_path, sample_corpus, sample_tokenizer):
    cache = tmp_path / "cache"
    built = cli("build", str(sample_corpus), "--output", str(tmp_path), "--tokenizer", str(sample_tokenizer),
                "--cache", str(cache), "--build-id", "b")  # fmt: skip
    assert built.returncode == 0, built.stderr
    markers = sorted((cache / ENTRIES).iterdir())
    damaged = markers[0]
    damaged.unlink()
    (damaged / "x").mkdir(parents=True)
    listed = cli("cache", "list", str(cache))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"cache {cache}: {len(markers) - 1} entries, ")
    assert damaged.name[:12] not in listed.stdout and markers[1].name[:12] in listed.stdout
    assert re.search(rf" WARNING [\w.]+: {re.escape(str(damaged))}: a folder, so damaged; left out\n", listed.stderr)
    pruned = cli("cache", "prune", str(cache), "--older-than", "30d")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout == f"cache {cache}: removed 1 entry, 0 B\n"
    assert sorted((cache / ENTRIES).iterdir()) == markers[1:]
    again = cli("cache", "list", str(cache))
    assert "damaged" not in again.stderr and again.stdout.startswith(f"cache {cache}: {len(markers) - 1} entries, ")


def test_a_fifo_in_a_markers_place_or_the_sizes_place_blocks_nothing(tmp_path, sample_corpus, sample_tokenizer):
    """A FIFO (``mkfifo``) put where the cache keeps a record held ``open`` until a writer came: the build, the
    listing and prune hung for good. Each now reads it as damaged, at once: a miss, left out, removed."""
    cache = tmp_path / "cache"
    build = ["build", str(sample_corpus), "--output", str(tmp_path), "--tokenizer", str(sample_tokenizer),
             "--cache", str(cache), "--num-ranks", "1", "--seed", "5"]  # fmt: skip
    assert cli(*build, "--build-id", "a").returncode == 0
    markers = sorted((cache / ENTRIES).iterdir())
    damaged = markers[0]
    damaged.unlink()
    os.mkfifo(damaged)
    (cache / SIZES).unlink()
    os.mkfifo(cache / SIZES)
    again = cli(*build, "--build-id", "b", timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"{damaged}: not a valid cache entry: it is not a regular file (a FIFO, a device" in again.stderr
    assert f"{cache / SIZES}: not a valid cache sizes: it is not a regular file" in again.stderr
    first, second = ((tmp_path / b / "context").glob("*.ds") for b in "ab")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert damaged.is_file() and (cache / SIZES).is_file()  # stored anew, and the sizes written again
    damaged.unlink()
    os.mkfifo(damaged)
    listed = cli("cache", "list", str(cache), timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"cache {cache}: {len(markers) - 1} entries, ")
    assert f"{damaged}: not a regular file (a FIFO, a device or a socket), so damaged; left out" in listed.stderr
    pruned = cli("cache", "prune", str(cache), "--older-than", "30d", timeout=60)
    assert pruned.stdout == f"cache {cache}: removed 1 entry, 0 B\n" and not damaged.exists()
