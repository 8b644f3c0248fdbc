"""The benchmark script runs end to end on the bundled sample (a smoke test: nothing is asserted about time), and
its tables say what they claim: which rows, which limit each row is held against, and datatrove's bytes. One smoke
run, every row, serves every test of its tables (each row's own run gave the same rows, at the smoke's one repeat,
for as long again)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.run import MIXTURE_SOURCES, MIXTURE_WEIGHTS
from tests.support.paths import ROOT

NUMBER = re.compile(r"\d+\.\d+")
RATIO = re.compile(r"\d+\.\d+x")
SHARE = re.compile(r"(?P<name>[\w-]+) (?P<share>\d+\.\d\d)% \((?P<target>\d+)%(?:, used (?P<used>\d+\.\d\d)x)?\)")


def bench(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bench.run", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Each Markdown table in ``text``, by its first header, as rows of cells by header."""
    found: dict[str, list[dict[str, str]]] = {}
    for block in re.findall(r"(?:^\|.*\|\n)+", text, flags=re.MULTILINE):
        header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines()]
        found[header[0]] = [dict(zip(header, row, strict=True)) for row in rows]
    return found


def column(rows: list[dict[str, str]], header: str) -> list[str]:
    return [row[header] for row in rows]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> str:
    """The tables of one smoke run of every row."""
    out = tmp_path_factory.mktemp("bench") / "RESULTS.md"
    done = bench("--smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out.read_text()


@pytest.mark.long
def test_bench_smoke_writes_the_tables(smoke) -> None:
    speed, grown = smoke.split("Peak RSS as the input grows")
    memory, later_text = grown.split("Cost as the work grows")
    rows, loads = tables(speed)["stage"], tables(speed)["tokenizer"]

    stages = column(rows, "stage")
    assert stages[:2] == ["tokenize + doc shuffle, sample", "count, sample"]
    many_copies = r"tokenize \+ doc shuffle, sample, \d+\.\d MB \(the real corpus, \d+ times over\)"
    assert re.fullmatch(many_copies, stages[2]) and re.fullmatch(many_copies, stages[3])  # the GB, amortized rows
    byte_stages = ["merge, ~400-token docs", "merge, ~20k-token docs", "context shuffle", "MDS export of the windows"]
    assert stages[4:] == [*byte_stages, "verify"]
    with_datatrove = rows[:3] + rows[4:7]  # all but the amortized row, MDS (datatrove writes none) and verify
    assert all(RATIO.fullmatch(speed_up) for speed_up in column(with_datatrove, "speed-up"))
    assert column(rows, "same bytes") == ["yes", "-", "yes", "-", "yes", "yes", "yes", "-", "-"]

    encoding, byte_moving = [*rows[:2], rows[3]], rows[4:8]  # the limits: engines alone, or cp + sync
    for header in ("HF alone (s)", "gigatoken alone (s)"):
        assert all(NUMBER.fullmatch(cell) for cell in column(encoding, header))
        assert set(column([rows[2], *rows[4:]], header)) == {"-"}
    assert all(NUMBER.fullmatch(cell) for cell in column(byte_moving, "cp + sync (s)"))
    assert all(RATIO.fullmatch(cell) for cell in column(byte_moving, "ours / cp + sync"))
    assert set(column(rows[:4] + rows[8:], "cp + sync (s)")) == {"-"}

    packing = tables(speed)["context windows"]  # cut and packed windows of the same files, then packing alone
    assert [row["context windows"].split(",")[0] for row in packing] == [
        "windows",
        "packed",
        "Best-Fit Decreasing alone",
    ]
    cut, packed, alone = packing
    assert cut["padding"] == "0.000%" and float(packed["padding"].rstrip("%")) < 1
    assert int(packed["documents cut"].replace(",", "")) < int(cut["documents cut"].replace(",", ""))
    assert "pieces of 100,000 documents" in alone["context windows"] and alone["bytes a piece"].isdigit()

    assert [row["tokenizer"] for row in loads] == ["sample"]
    assert all(NUMBER.fullmatch(row[engine]) for row in loads for engine in ("HF load (s)", "gigatoken load (s)"))

    memory_rows = column(tables(memory)["stage"], "stage")
    with_records = "context shuffle, with records"  # the same documents in 8 files and in one: the proof's memory
    memory_stages = [
        "tokenize + doc shuffle",
        "merge",
        "context shuffle",
        f"{with_records}, 8 files",
        f"{with_records}, 1 file",
    ]
    assert [" ".join(row.split(" ")[:6]) for row in memory_rows] == memory_stages * 2, memory_rows
    assert memory_rows[3].split(" of ")[1] == memory_rows[4].split(" of ")[1]
    later = tables(later_text)
    scale = later["stage"]  # one rank on generated text of each size, then the merge and context of the largest
    assert [(row["stage"], row["input"]) for row in scale[:4]] == [
        ("tokenize + doc shuffle, sample", "2.0 MB of text"),
        ("tokenize + doc shuffle, sample", "4.0 MB of text"),
        ("tokenize + doc shuffle, sample, no memory budget", "4.0 MB of text"),  # what the budget costs
        ("tokenize + doc shuffle, sample", "8.0 MB of text"),
    ]
    assert column(scale[4:], "stage") == ["merge", "context shuffle"]
    assert all(re.fullmatch(r"\d+\.\d MB of tokens \(the 8\.0 MB of text\)", row["input"]) for row in scale[4:])
    assert all(NUMBER.fullmatch(row[h]) for row in scale for h in ("seconds", "MB/s")) and all(
        row["peak RSS (MB)"].isdigit() for row in scale
    )
    assert all(row["engine reloads"].isdigit() and NUMBER.fullmatch(row["reloading (s)"]) for row in scale[:4])
    assert {row[h] for row in scale[4:] for h in ("engine reloads", "reloading (s)")} == {"-"}
    nights = later["build"]
    assert [(row["input files"], row["files tokenized"]) for row in nights] == [("50", "50"), ("50", "1")]
    published = later["dataset"]
    assert column(published, "dataset") == ["1x the corpus", "4x the corpus"]  # the smoke run's sizes
    tokens = [int(cell.replace(",", "")) for cell in column(published, "tokens")]
    assert tokens[1] == 4 * tokens[0] > 0  # the corpus four times over: four times the tokens
    assert all(
        NUMBER.fullmatch(cell) for row in published for cell in (row["publish (s)"], row["reading every byte (s)"])
    )
    tasks = later["task"]  # on the simulated S3, one connection a file, then several
    assert [(row["task"], row["streams a file"]) for row in tasks] == [
        ("merge", "1"),
        ("merge", "8"),
        ("context shuffle", "1"),
        ("context shuffle", "8"),
    ]
    assert all(NUMBER.fullmatch(row["seconds"]) for row in tasks)
    assert [row["x one stream"] for row in tasks][::2] == ["1.00x", "1.00x"] and all(
        RATIO.fullmatch(row["x one stream"]) for row in tasks
    )
    books = later["ranks"]  # the sensor's check and publish's books over cloned ranks: the smoke run's sizes
    assert [(row["ranks"], row["buckets"], row["buckets written"]) for row in books] == [("8", "4", "4")]
    assert int(books[0]["rank files"]) == 8 * 4 * 3  # each bucket's .ds, .ds.index and .ds.metadata, a rank
    figures = ("markers (MB)", "manifests (MB)", "folder made (s)", "sensor (s)", "publish books (s)")
    assert all(NUMBER.fullmatch(books[0][header]) for header in figures)
    assert all(books[0][header].isdigit() for header in ("sensor peak RSS (MB)", "publish books peak RSS (MB)"))


def test_bench_refuses_unknown_rows() -> None:
    done = bench("--only", "tokenize,nonsense")
    assert done.returncode == 2
    assert "unknown rows ['nonsense']" in done.stderr


@pytest.mark.long
def test_the_next_night_rows_say_what_it_read(smoke) -> None:
    """Issue 52, 7: the next night on the smoke sizes, its inputs out of the page cache: without a key the hits read
    their inputs again; with one, no unchanged byte is read."""
    rows = tables(smoke)["next night"]
    assert column(rows, "next night") == [
        "4 files of 0.2 MB, one changed",
        "the same, with a cache key",
        "12 files of 0.07 MB, two of a rank changed",
        "300 one-line files, none changed",
    ]
    assert column(rows, "unchanged input read")[1] == "0%"
    for ratios in ("next / first", "ranks / first night", "CPU next / first"):
        assert all(RATIO.fullmatch(ratio) for ratio in column(rows, ratios)), ratios
    assert all(float(cpu) > 0 for cpu in column(rows, "CPU, next night (s)"))
    assert all(int(rss) > 0 for rss in column(rows, "peak RSS, a worker (MB)"))  # the workers' own, not 0


@pytest.mark.long
def test_a_remix_tokenizes_nothing_and_reaches_its_shares(smoke) -> None:
    """The mixture rows on the smoke sizes: a first mixture build tokenizes every file, the re-mix at other weights
    none (its tokens all from the cache), and each reaches every source's share within a mean document."""
    text = smoke
    first, remix = tables(text)["mixture build"]
    files = sum(files for _, _, files, _ in MIXTURE_SOURCES.values())
    assert first["mixture build"] == "first, empty cache" and remix["mixture build"].startswith("re-mix: other weights")
    assert (first["files from the cache"], remix["files from the cache"]) == (f"0 of {files}", f"{files} of {files}")
    assert first["whole build / first build"] == "1.00x" and RATIO.fullmatch(remix["whole build / first build"])
    assert float(remix["tokenize stage, ranks' time (s)"]) < float(first["tokenize stage, ranks' time (s)"])
    assert first["ranks moved, of the tokens they held"].startswith("100% of ")
    moved = re.fullmatch(r"(\d+)% of [\d,]+", remix["ranks moved, of the tokens they held"])
    assert moved and int(moved[1]) < 100  # the re-mix's ranks moved the chosen documents only
    for row, weights in zip((first, remix), MIXTURE_WEIGHTS, strict=True):
        assert all(
            NUMBER.fullmatch(row[h]) for h in ("whole build (s)", "sources' text (MB)", "largest miss (mean documents)")
        )
        assert int(row["tokens written"].replace(",", "")) > 0
        cell = row["share of the tokens (target), by source"]
        shares = list(SHARE.finditer(cell))
        assert ", ".join(m[0] for m in shares) == cell, cell
        assert [m["name"] for m in shares] == list(MIXTURE_SOURCES)
        total = sum(weights.values())
        for m in shares:
            target = weights[m["name"]] / total
            assert int(m["target"]) == round(100 * target) and abs(float(m["share"]) / 100 - target) < 0.01, m[0]
        repeated = {m["name"] for m in shares if m["used"]}  # the one source allowed to repeat does, at both weights
        assert repeated == {name for name, (*_, most) in MIXTURE_SOURCES.items() if most > 1}
    assert re.search(r"The re-mix took \d+% of the first build's time \(\d+\.\dx faster\)", text)
