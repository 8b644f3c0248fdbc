"""The benchmark script runs end to end on the bundled sample (a smoke test: nothing is asserted about time), and
its tables say what they claim: which rows, which limit each row is held against, and datatrove's bytes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

NUMBER = re.compile(r"\d+\.\d+")
RATIO = re.compile(r"\d+\.\d+x")


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


@pytest.mark.long
def test_bench_smoke_writes_the_tables(tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    done = bench("--smoke", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    speed, grown = out.read_text().split("Peak RSS as the input grows")
    memory, later_text = grown.split("Cost as the work grows")
    rows, loads = tables(speed)["stage"], tables(speed)["tokenizer"]

    stages = column(rows, "stage")
    assert stages[:2] == ["tokenize + doc shuffle, sample", "count, sample"]
    many_copies = r"tokenize \+ doc shuffle, sample, \d+\.\d MB \(the real corpus, \d+ times over\)"
    assert re.fullmatch(many_copies, stages[2]) and re.fullmatch(many_copies, stages[3])  # the GB, amortized rows
    assert stages[4:] == ["merge, ~400-token docs", "merge, ~20k-token docs", "context shuffle", "verify"]
    with_datatrove = rows[:3] + rows[4:-1]  # all but the amortized row and verify
    assert all(RATIO.fullmatch(speed_up) for speed_up in column(with_datatrove, "speed-up"))
    assert column(rows, "same bytes") == ["yes", "-", "yes", "-", "yes", "yes", "yes", "-"]

    encoding, byte_moving = [*rows[:2], rows[3]], rows[4:7]  # the limits: engines alone, or cp + sync
    for header in ("HF alone (s)", "gigatoken alone (s)"):
        assert all(NUMBER.fullmatch(cell) for cell in column(encoding, header))
        assert set(column([rows[2], *rows[4:]], header)) == {"-"}
    assert all(NUMBER.fullmatch(cell) for cell in column(byte_moving, "cp + sync (s)"))
    assert all(RATIO.fullmatch(cell) for cell in column(byte_moving, "ours / cp + sync"))
    assert set(column(rows[:4] + rows[7:], "cp + sync (s)")) == {"-"}

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

    assert column(tables(memory)["stage"], "stage") == ["tokenize + doc shuffle", "merge", "context shuffle"] * 2
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
