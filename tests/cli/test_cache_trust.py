"""The tokenization cache as a nightly user meets it through ``tokenization build``: a remembered row of a local file
that names another input's sha256, what the summary and ``_BUILD.json`` say of rows corrected, and what the report
says of a file grown by lines appended."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import orjson

from tests.support.processes import cli
from tokenization.output.cache import ENTRIES, KNOWN

HOUR_NS = 3600 * 10**9
FUTURE_NS = 10**19 - 1  # a hashed_ns no rank writes: the forged row wins over the one its rank remembered


def corpus(folder: Path) -> Path:
    """Three JSON-lines files of different documents, last modified an hour ago (no racy mtime)."""
    folder.mkdir(parents=True)
    for name, docs in [("a", 40), ("b", 50), ("c", 30)]:
        lines = [json.dumps({"text": f"{name} document {i} " + "words and more " * (i % 7)}) for i in range(docs)]
        path = folder / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        then = time.time_ns() - HOUR_NS
        os.utime(path, ns=(then, then))
    return folder


def build(inputs: Path, output: Path, tokenizer: Path, build_id: str, *options: str) -> dict:
    """A build through the command line, one rank (its files in a known order); its ``_BUILD.json``, with its
    summary (``stdout``)."""
    args = ["--output", str(output), "--tokenizer", str(tokenizer), "--build-id", build_id, "--num-ranks", "1"]
    done = cli("build", str(inputs), *args, "--num-context-shards", "1", "--seed", "5", *options)
    assert done.returncode == 0, done.stderr
    record = orjson.loads((output / build_id / "_BUILD.json").read_bytes())
    return record | {"stdout": done.stdout}


def forge(cache: Path, url: str, sha256: str) -> None:
    """Make every remembered row of ``url`` name ``sha256``, as whoever can write the cache can."""
    forged = 0
    for record in sorted((cache / KNOWN).iterdir()):
        data = orjson.loads(record.read_bytes())
        if url in data["files"]:
            fields = data["files"][url].split(",")
            fields[5:7] = [str(FUTURE_NS), sha256]
            data["files"][url] = ",".join(fields)
            record.write_bytes(orjson.dumps(data))
            forged += 1
    assert forged, f"no row of {url}"


def markers(cache: Path) -> dict[str, str]:
    """Each entry's marker name, by the file it was stored from."""
    return {
        orjson.loads(path.read_bytes())["source"]["url"]: path.name for path in sorted((cache / ENTRIES).glob("*.json"))
    }


def test_a_row_forged_with_another_inputs_sha256_removes_no_entry(tmp_path, sample_tokenizer) -> None:
    """A row of a.jsonl forged to name b.jsonl's sha256: the plan takes it, the rank finds b's entry and its sample
    finds it unfit for a. That entry is b's, sound: it stays (b is not tokenized again the next night), a is encoded,
    stored under its real sha256 and its row corrected. Before, b's entry was removed as unfit."""
    inputs = corpus(tmp_path / "in")
    out, cache = tmp_path / "out", tmp_path / "out/.cache"
    build(inputs, out, sample_tokenizer, "first")
    before = markers(cache)
    forge(cache, str(inputs / "a.jsonl"), hashlib.sha256((inputs / "b.jsonl").read_bytes()).hexdigest())

    forged = build(inputs, out, sample_tokenizer, "forged")
    assert (forged["cache"]["files_hit"], forged["cache"]["files_missed"]) == (2, 1)
    assert markers(cache) == before  # b's entry kept, a's as it was
    after = build(inputs, out, sample_tokenizer, "after")
    assert (after["cache"]["files_hit"], after["cache"]["files_missed"]) == (3, 0)
    without = build(inputs, tmp_path / "off", sample_tokenizer, "forged", "--cache", "off")
    assert forged["digest"] == without["digest"]


def test_the_summary_and_the_report_count_the_rows_corrected(tmp_path, sample_tokenizer) -> None:
    """Rows found wrong by hashing (one naming another input's sha256, one naming none) are counted in
    ``_BUILD.json``'s cache record, and said in the summary and the report; the next night, none is."""
    inputs = corpus(tmp_path / "in")
    out, cache = tmp_path / "out", tmp_path / "out/.cache"
    build(inputs, out, sample_tokenizer, "first")
    forge(cache, str(inputs / "a.jsonl"), hashlib.sha256((inputs / "b.jsonl").read_bytes()).hexdigest())
    forge(cache, str(inputs / "c.jsonl"), "f" * 64)

    forged = build(inputs, out, sample_tokenizer, "forged")
    assert forged["cache"]["rows_corrected"] == 2
    assert "cache: 2 remembered identities were wrong and corrected" in forged["stdout"].splitlines()
    report = (out / "forged/report.html").read_text()
    assert '<th>remembered identities wrong and corrected</th><td data-key="rows_corrected">2</td>' in report
    after = build(inputs, out, sample_tokenizer, "after")
    assert "rows_corrected" not in after["cache"] and "corrected" not in after["stdout"]
    assert 'data-key="rows_corrected"' not in (out / "after/report.html").read_text()


def test_a_grown_files_earlier_part_counts_as_reused_and_its_ranks_loading_is_said(tmp_path, sample_tokenizer) -> None:
    """A file grown by a line: its earlier bytes and tokens, taken from the cache, count as input and tokens reused
    (they counted as none); its rank took HF's tokenizer as its process held it (the plan's), so its "tokenizer
    loading" of 0.00 s says so."""
    inputs = tmp_path / "in"
    corpus(inputs)
    for name in ["b.jsonl", "c.jsonl"]:
        (inputs / name).unlink()
    grown = inputs / "a.jsonl"
    first = build(inputs, tmp_path / "out", sample_tokenizer, "first")
    earlier = grown.stat().st_size
    with open(grown, "a") as out:
        out.write('{"text": "one more line appended"}\n')

    record = build(inputs, tmp_path / "out", sample_tokenizer, "next")
    cache = record["cache"]
    assert (cache["files_hit"], cache["files_missed"], cache["files_grown"]) == (0, 1, 1)
    assert (cache["bytes_reused"], cache["tokens_reused"]) == (earlier, first["tokens"])
    assert "(0.0% of the bytes, 0 tokens)" not in record["stdout"]
    report = (tmp_path / "out/next/report.html").read_text()
    assert f'data-key="bytes_reused">{earlier / 1000:.1f} kB ({earlier / grown.stat().st_size:.1%})' in report
    assert re.search(r"[0-9.]+ s \(HF&#39;s, loaded earlier in its process\)</td>", report)
