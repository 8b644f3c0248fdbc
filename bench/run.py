"""Benchmarks: this project against datatrove 0.10.1 on the same input, in the same run, alternating.

    python -m bench.run [--corpora DIR] [--tokenizer PATH] [--tokenizers DIR] [--big-mb MB] [--repeats N]
                        [--books-ranks N] [--books-buckets N] [--only ROWS] [--out FILE] [--smoke]

A full run (20-30 minutes, most of it datatrove on the GB row and the simulated S3 rows, plus the books row's,
which makes ~3 million sparse files at its 4,096 ranks) rewrites bench/RESULTS.md;
``--only merge,context`` reruns some rows and prints them, writing only to ``--out``.

Every measurement runs in its own process, which reports its wall time and its own peak RSS, so stages do not
inherit each other's memory. Limits are measured alongside, so that a speed-up over datatrove is not read as
closeness to what the machine allows: HF ``encode_batch_fast`` alone and gigatoken ``encode_batch`` alone (loading
excluded; it is reported apart) for the encoding rows, ``cp -r`` + ``sync`` of the same bytes for the byte-moving
rows. These are benchmarks, not tests: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import filecmp
import gzip
import hashlib
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import zstandard

from bench import workloads
from bench.workloads import Workload
from tokenization.formats import DS
from tokenization.formats.names import rank_stem
from tokenization.publish import manifest
from tokenization.publish.records import CompletionMarker, FileSum, InputFile, RankManifest
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
SAMPLE_CORPUS, SAMPLE_TOKENIZER = ROOT / "sample" / "corpus", ROOT / "sample" / "tokenizer.json"
RESULTS = ROOT / "bench" / "RESULTS.md"
EOS = "<|endoftext|>"
OTHER_TOKENIZERS = {"llama3": "<|end_of_text|>", "mistral-7b": "</s>"}  # a uint32 one, and one that adds a BOS
ROWS = (
    "tokenize",
    "count",
    *OTHER_TOKENIZERS,
    "1gb",
    "amortized",
    "merge",
    "context",
    "packing",
    "verify",
    "memory",
    "nightly",
    "publish",
    "s3",
    "books",
)
NIGHTLY_FILES = 50  # input files of the nightly rows' corpus; one changed the next night is 2% of them
AMORTIZED = ("mistral-7b", 10)  # the tokenizer and corpus copies of the amortized row
PACK_DOCUMENTS = 10_000_000  # the documents Best-Fit Decreasing packs alone: ~10.35 M pieces
PUBLISH_COPIES = (4, 16)  # the publish rows: builds of the corpus this many times over, 4x apart
# The simulated S3 of the s3 rows: bytes a second a connection moves, each way, and seconds a request waits before
# its first byte (S3: 20-50 ms). The cap is low enough that 8 connections stay under what moto serves on this
# 2-core machine in a process of its own (~80 MB/s), so that the cap, not the simulator, limits each stream.
S3_BANDWIDTH = 10e6
S3_LATENCY = 0.03
CORPUS_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
BOOKS_PLAN = hashlib.sha256(b"bench books").hexdigest()  # the plan digest the books rows' ranks are made under
COMPARED = (DS, f"{DS}.index", f"{DS}.loss")

# The encoders whose speed alone is the limit of the encoding rows, by the name the tables give them.
ENGINES: dict[str, Workload] = {"HF": workloads.hf_encode, "gigatoken": workloads.gigatoken_encode}


def measure(workload: Workload, args: dict, env: dict[str, str] | None = None) -> dict:
    """One run of a workload in a fresh interpreter (with more environment variables: ``env``): its seconds, peak
    RSS and (encoders) load seconds."""
    shutil.rmtree(args["out"], ignore_errors=True)
    shutil.rmtree(args["out"] + "_logs", ignore_errors=True)
    command = [sys.executable, "-m", "bench.workloads", workload.__name__, json.dumps(args)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=os.environ | (env or {}))
    if done.returncode:
        raise RuntimeError(f"{workload.__name__} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternating(plan: dict[Workload, int], args: dict, work: Path) -> dict[Workload, list[dict]]:
    """Each workload's runs, as many as ``plan`` says, interleaved so that all see the same machine state (page
    cache, clock, other load) rather than one getting the quiet minute."""
    runs: dict[Workload, list[dict]] = {workload: [] for workload in plan}
    for i in range(max(plan.values())):
        for workload, times in plan.items():
            if i < times:
                runs[workload].append(measure(workload, args | {"out": str(work / workload.__name__)}))
    return runs


def fastest(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def engine_limits(args: dict, repeats: int, work: Path) -> dict[str, dict[str, float]]:
    """Per engine, its best encode time and best load time over ``repeats`` alternating runs."""
    runs = alternating(dict.fromkeys(ENGINES.values(), repeats), args, work)
    return {
        engine: {key: min(r[key] for r in runs[encode]) for key in ("seconds", "load_seconds")}
        for engine, encode in ENGINES.items()
    }


def copy_time(src: Path, work: Path) -> float:
    """``cp -r`` then ``sync``: what moving these bytes through the page cache to disk costs at the least."""
    dest = work / "cp-copy"
    shutil.rmtree(dest, ignore_errors=True)
    start = time.time()
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
    os.sync()
    return time.time() - start


def synthetic_ranks(folder: Path, files: int, lengths: Lengths, loss: bool = False) -> int:
    """Rank files of random tokens, each holding documents of the ``lengths`` drawn for it (the merge cost depends
    on lengths, not on text), with loss bytes if asked; their token bytes."""
    from tokenization.formats.ds import TokenFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    total = 0
    for f in range(files):
        doc_lengths = lengths(rng)
        path = folder / rank_file(f, files)
        writer = TokenFileWriter(path, tokenizer="gpt2", token_size=2, save_loss=loss)
        tokens = rng.integers(1, 50000, int(doc_lengths.sum())).astype(np.uint16)
        writer.write(tokens, np.cumsum(doc_lengths), (tokens % 2).astype(np.uint8) if loss else None)
        total += writer.close().tokens
    return total * 2


Lengths = Callable[[np.random.Generator], np.ndarray]


def uniform(docs: int, low: int, high: int) -> Lengths:
    """``docs`` document lengths from ``low`` to ``high`` tokens, evenly."""
    return lambda rng: rng.integers(low, high, docs)


def rank_file(rank: int, ranks: int) -> str:
    """The name a doc-shuffled rank gives its token file (the paths only name it)."""
    config = TokenizeConfig(inputs=["input"], output="ranks", tokenizer="tokenizer.json", rank=rank, world_size=ranks)
    return config.output_name(0)


def link_corpus(source: Path, corpus: Path, copies: int) -> None:
    """The corpus's JSON-lines files (plain, .gz or .zst; not the shared ``instruct_`` file, which has no text
    field), ``copies`` times over."""
    corpus.mkdir(parents=True, exist_ok=True)
    found = sorted(p for p in source.iterdir() if p.name.endswith(CORPUS_SUFFIXES))
    for copy in range(copies):
        for path in found:
            if not path.name.startswith("instruct_"):
                (corpus / f"{copy:03d}-{path.name}").symlink_to(path.resolve())


def text_bytes(corpus: Path, text_key: str) -> int:
    """UTF-8 bytes of text in the corpus, the unit of the tokenize and count throughputs."""
    from tokenization.text.sources import DocumentReader, Record, list_input_files

    reader = DocumentReader(list_input_files([str(corpus)]).files, text_key)
    return sum(len(r.text.encode()) for r in reader if isinstance(r, Record))


def same_bytes(ours: Path, theirs: Path, suffixes: tuple[str, ...]) -> str:
    """Whether two outputs hold the same files with these suffixes, byte for byte (streamed: the 1 GB row's files
    do not fit comfortably in memory twice)."""

    def names(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if p.name.endswith(suffixes))

    found = names(ours)
    equal = found == names(theirs) and all(filecmp.cmp(ours / n, theirs / n, shallow=False) for n in found)
    if found and equal:
        return "yes"
    return "same documents without our BOS" if DS in suffixes and same_without_bos(ours, theirs) else "no"


def same_without_bos(ours: Path, theirs: Path) -> bool:
    """Whether our documents, each without its first token, are datatrove's, in the same order: datatrove drops
    the BOS that a tokenizer's post-processor adds (huggingface/datatrove#345), which ours keeps."""
    from tokenization.formats.ds import TokenFile

    a, b = ([TokenFile(str(p)) for p in sorted(folder.glob("*.ds"))] for folder in (ours, theirs))
    if not a or len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        ends = np.asarray(x.ends, dtype=np.int64)
        body = np.ones(len(x.tokens), dtype=bool)
        body[ends - np.diff(ends, prepend=0)] = False
        shifted = ends - np.arange(1, len(ends) + 1)
        if not (np.array_equal(x.tokens[body], y.tokens) and np.array_equal(shifted, np.asarray(y.ends))):
            return False
    return True


def size(mb: float) -> str:
    return f"{mb / 1000:.2f} GB" if mb >= 1000 else f"{mb:.1f} MB"


@dataclass
class Bench:
    """The rows of the speed table, each ours against datatrove (if it has the stage) and against its limits."""

    work: Path
    repeats: int
    rows: list[dict] = field(default_factory=list)
    loads: list[dict] = field(default_factory=list)  # each tokenizer's load time, per engine

    def compare(
        self,
        label: str,
        ours: Workload,
        theirs: Workload | None,
        args: dict,
        mb: float,
        limits: dict,
        compare: tuple[str, ...] = COMPARED,
        runs: tuple[int, int] | None = None,
    ) -> None:
        """One row. ``compare``: the suffixes whose bytes must equal datatrove's (none: not compared); ``runs``:
        (ours, datatrove) run counts, when datatrove is too slow for ``repeats`` of it."""
        ours_runs, their_runs = runs or (self.repeats, self.repeats)
        plan = {ours: ours_runs} | ({theirs: their_runs} if theirs else {})
        best = {name: fastest(results) for name, results in alternating(plan, args, self.work).items()}
        o, t = best[ours], best.get(theirs)
        cp = limits.get("cp + sync")
        row = {
            "stage": label,
            "ours_s": o["seconds"],
            "ours_mbs": mb / o["seconds"],
            "ours_rss": o["rss_mb"],
            "dt_s": t and t["seconds"],
            "dt_rss": t and t["rss_mb"],
            "speedup": t and t["seconds"] / o["seconds"],
            "same": same_bytes(self.work / ours.__name__, self.work / theirs.__name__, compare)
            if t and compare
            else None,
            "vs_cp": cp and o["seconds"] / cp,
        }
        self.rows.append(row | limits)
        print(self.rows[-1], flush=True)


# (header, key, format) of each table; a missing value prints as "-".
SPEED_COLUMNS = (
    ("stage", "stage", "{}"),
    ("ours (s)", "ours_s", "{:.2f}"),
    ("ours MB/s", "ours_mbs", "{:.1f}"),
    ("ours peak RSS (MB)", "ours_rss", "{:.0f}"),
    ("datatrove (s)", "dt_s", "{:.2f}"),
    ("datatrove peak RSS (MB)", "dt_rss", "{:.0f}"),
    ("speed-up", "speedup", "{:.2f}x"),
    ("same bytes", "same", "{}"),
    ("HF alone (s)", "HF", "{:.2f}"),
    ("gigatoken alone (s)", "gigatoken", "{:.2f}"),
    ("cp + sync (s)", "cp + sync", "{:.2f}"),
    ("ours / cp + sync", "vs_cp", "{:.2f}x"),
)
LOAD_COLUMNS = (
    ("tokenizer", "tokenizer", "{}"),
    ("HF load (s)", "HF", "{:.2f}"),
    ("gigatoken load (s)", "gigatoken", "{:.2f}"),
)
NIGHTLY_COLUMNS = (
    ("build", "build", "{}"),
    ("input files", "files", "{}"),
    ("files tokenized", "tokenized", "{}"),
    ("whole build (s)", "build_s", "{:.2f}"),
    ("tokenize stage, ranks' time (s)", "tokenize_s", "{:.2f}"),
    ("whole build / first night", "build_ratio", "{:.2f}x"),
    ("tokenize stage / first night", "tokenize_ratio", "{:.2f}x"),
)
S3_COLUMNS = (
    ("task", "stage", "{}"),
    ("streams a file", "streams", "{}"),
    ("tokens (MB)", "mb", "{:.1f}"),
    ("seconds", "seconds", "{:.2f}"),
    ("x one stream", "speedup", "{:.2f}x"),
)
PUBLISH_COLUMNS = (
    ("dataset", "dataset", "{}"),
    ("tokens", "tokens", "{:,}"),
    ("token files (MB)", "mb", "{:.1f}"),
    ("publish (s)", "publish_s", "{:.2f}"),
    ("reading every byte (s)", "verify_s", "{:.2f}"),
)
MEMORY_COLUMNS = (
    ("stage", "stage", "{}"),
    ("input (MB)", "input_mb", "{:.1f}"),
    ("seconds", "seconds", "{:.2f}"),
    ("peak RSS (MB)", "rss", "{:.0f}"),
)
PACKING_COLUMNS = (
    ("context windows", "mode", "{}"),
    ("seconds", "seconds", "{:.2f}"),
    ("peak RSS (MB)", "rss", "{:.0f}"),
    ("windows", "windows", "{:,}"),
    ("documents cut", "cut", "{:,}"),
    ("share of documents cut", "cut_share", "{:.1%}"),
    ("padding", "padding", "{:.3%}"),
    ("bytes a piece", "bytes_a_piece", "{:.0f}"),
)
BOOKS_COLUMNS = (
    ("ranks", "ranks", "{:,}"),
    ("buckets", "buckets", "{}"),
    ("buckets written", "written", "{}"),
    ("rank files", "files", "{:,}"),
    ("markers (MB)", "markers_mb", "{:.1f}"),
    ("manifests (MB)", "manifests_mb", "{:.1f}"),
    ("folder made (s)", "made_s", "{:.1f}"),
    ("sensor (s)", "sensor_s", "{:.2f}"),
    ("sensor peak RSS (MB)", "sensor_rss", "{:.0f}"),
    ("publish books (s)", "publish_s", "{:.2f}"),
    ("publish books peak RSS (MB)", "publish_rss", "{:.0f}"),
)


def section(title: str, columns: tuple[tuple[str, str, str], ...], rows: list[dict], explanation: str) -> list[str]:
    """A table of the report with its title above and what it measures below."""
    return ["", title, "", *markdown_table(columns, rows), "", explanation]


def markdown_table(columns: tuple[tuple[str, str, str], ...], rows: list[dict]) -> list[str]:
    def cell(row: dict, key: str, fmt: str) -> str:
        return "-" if row.get(key) is None else fmt.format(row[key])

    lines = ["| " + " | ".join(header for header, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(row, key, fmt) for _, key, fmt in columns) + " |" for row in rows]


# The stages that encode text: label, workloads (ours, datatrove's), and the outputs compared byte for byte.
ENCODING_STAGES = {
    "tokenize": ("tokenize + doc shuffle", workloads.ours_tokenize, workloads.datatrove_tokenize, COMPARED),
    "count": ("count", workloads.ours_count, workloads.datatrove_count, ()),
}


def encoding_rows(bench: Bench, base: dict, mb: float, stages: list[str]) -> None:
    """These encoding stages with one tokenizer, each against HF alone and gigatoken alone on the same texts."""
    name = Path(base["tokenizer"]).parent.name
    limits = engine_limits(base, bench.repeats, bench.work)
    bench.loads.append({"tokenizer": name} | {engine: limit["load_seconds"] for engine, limit in limits.items()})
    encode = {engine: limit["seconds"] for engine, limit in limits.items()}
    for stage in stages:
        label, ours, theirs, compare = ENCODING_STAGES[stage]
        bench.compare(f"{label}, {name}", ours, theirs, base, mb, encode, compare=compare)


def big_row(bench: Bench, source: Path, base: dict, mb: float, target_mb: float) -> None:
    """Tokenize on at least ``target_mb`` of text (the corpus linked enough times): datatrove once, as it takes
    minutes, and ours at most twice."""
    copies = math.ceil(target_mb / mb)
    corpus = bench.work / "corpus-big"
    link_corpus(source, corpus, copies)
    label = f"tokenize + doc shuffle, {Path(base['tokenizer']).parent.name}, {size(mb * copies)} ({copies} copies)"
    runs = (min(2, bench.repeats), 1)
    args = base | {"corpus": str(corpus)}
    bench.compare(label, workloads.ours_tokenize, workloads.datatrove_tokenize, args, mb * copies, {}, runs=runs)


def amortized_row(bench: Bench, source: Path, base: dict, mb: float, copies: int) -> None:
    """Tokenize on ``copies`` of the corpus against HF alone and gigatoken alone on the same texts: a process's
    fixed costs (start, imports, loading, the last batch) spread over that much more text. No datatrove: the
    smaller rows compare with it."""
    corpus = bench.work / "corpus-amortized"
    link_corpus(source, corpus, copies)
    args = base | {"corpus": str(corpus)}
    limits = engine_limits(args, 1, bench.work)  # HF alone takes a minute here
    encode = {engine: limit["seconds"] for engine, limit in limits.items()}
    label = f"tokenize + doc shuffle, {Path(base['tokenizer']).parent.name}, {size(mb * copies)} ({copies} copies)"
    bench.compare(label, workloads.ours_tokenize, None, args, mb * copies, encode)


def byte_rows(bench: Bench, docs: int, wanted: set[str]) -> None:
    """Merge and context shuffle of synthetic ranks, against ``cp`` + ``sync`` of the same bytes; and verify."""
    small = bench.work / "small"
    small_mb = synthetic_ranks(small, 8, uniform(docs, 200, 600)) / 1e6
    small_cp = {"cp + sync": copy_time(small, bench.work)}
    ranks = {"ranks": str(small)}
    if "merge" in wanted:
        merges = (workloads.ours_merge, workloads.datatrove_merge)
        bench.compare("merge, ~400-token docs", *merges, ranks, small_mb, small_cp)
        large = bench.work / "large"
        large_mb = synthetic_ranks(large, 8, uniform(docs // 50, 10_000, 30_000)) / 1e6
        large_cp = {"cp + sync": copy_time(large, bench.work)}
        args = {"ranks": str(large)}
        bench.compare("merge, ~20k-token docs", *merges, args, large_mb, large_cp)
    if "context" in wanted:  # datatrove's index holds only window ends; ours also carries document ends, and loss
        shuffles = (workloads.ours_context, workloads.datatrove_context)
        bench.compare("context shuffle", *shuffles, ranks, small_mb, small_cp, compare=(DS,))
    if "verify" in wanted:
        bench.compare("verify", workloads.ours_verify, None, ranks, small_mb, {})


def packing_rows(work: Path, docs: int, pack_documents: int, repeats: int) -> list[dict]:
    """Packed context windows beside cut ones, on the same rank files of web-length documents with loss bytes;
    and Best-Fit Decreasing alone on ``pack_documents``."""
    ranks = work / "web"
    mb = synthetic_ranks(ranks, 8, lambda rng: workloads.web_lengths(rng, docs), loss=True) / 1e6
    modes = {"windows": workloads.ours_context_windows, "packed": workloads.ours_context_packed}
    runs = alternating(dict.fromkeys(modes.values(), repeats), {"ranks": str(ranks)}, work)
    rows = []
    for mode, workload in modes.items():
        best = fastest(runs[workload])
        counts = best["counts"]
        rows.append(
            {
                "mode": f"{mode}, 8 files of {counts['documents'] // 8:,} documents ({size(mb)} of tokens)",
                "seconds": best["seconds"],
                "rss": best["rss_mb"],
                "windows": counts["windows"],
                "cut": counts["documents_cut"],
                "cut_share": counts["documents_cut"] / counts["documents"],
                "padding": counts["padding_tokens"] / counts["tokens"],
            }
        )
        print(rows[-1], flush=True)
    shutil.rmtree(ranks, ignore_errors=True)
    args = {"out": str(work / "pack"), "documents": pack_documents}
    best = fastest([measure(workloads.ours_pack, args) for _ in range(repeats)])
    counts = best["counts"]
    rows.append(
        {
            "mode": f"Best-Fit Decreasing alone, {counts['pieces']:,} pieces of {counts['documents']:,} documents",
            "seconds": best["seconds"],
            "rss": best["rss_mb"],
            "windows": counts["windows"],
            "padding": counts["padding_tokens"] / (counts["windows"] * workloads.WINDOW),
            "bytes_a_piece": (best["rss_mb"] - best["base_rss_mb"]) * 2**20 / counts["pieces"],
        }
    )
    print(rows[-1], flush=True)
    return rows


def memory_rows(work: Path, source: Path, base: dict, text_mb: float, scale: int, docs: int) -> list[dict]:
    """Peak RSS of each stage on 1x and ``scale``x the input: flat, apart from the index arrays."""
    rows = []
    for copies in sorted({1, scale}):
        corpus = work / f"corpus-x{copies}"
        link_corpus(source, corpus, copies)
        ranks = work / f"ranks-x{copies}"
        token_mb = synthetic_ranks(ranks, 8, uniform(docs * copies // 4, 200, 600)) / 1e6
        for label, workload, args, mb in (
            ("tokenize + doc shuffle", workloads.ours_tokenize, base | {"corpus": str(corpus)}, text_mb * copies),
            ("merge", workloads.ours_merge, {"ranks": str(ranks)}, token_mb),
            ("context shuffle", workloads.ours_context, {"ranks": str(ranks)}, token_mb),
        ):
            out = work / f"{workload.__name__}-x{copies}"
            r = measure(workload, args | {"out": str(out)})
            rows.append({"stage": label, "input_mb": mb, "seconds": r["seconds"], "rss": r["rss_mb"]})
            print(rows[-1], flush=True)
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ranks, ignore_errors=True)
    return rows


def nightly_rows(work: Path, source: Path, base: dict, repeats: int) -> list[dict]:
    """A whole build on the corpus dealt into ``NIGHTLY_FILES`` files, with an empty tokenization cache, then the
    next night's build after one file (2% of them) changed in place: each night's best of ``repeats``, the whole
    build's time and its tokenize stage's (the ranks' seconds, summed), and the next night's over the first's."""
    corpus = work / "nightly-corpus"
    deal_corpus(source, corpus, NIGHTLY_FILES)
    changed = corpus / f"part-{NIGHTLY_FILES // 2:03d}.jsonl.gz"
    original = changed.read_bytes()
    runs: dict[str, list[dict]] = {"first": [], "next": []}
    for _ in range(repeats):
        builds = work / "nightly-builds"
        shutil.rmtree(builds, ignore_errors=True)
        changed.write_bytes(original)
        for night in runs:
            if night == "next":
                changed.write_bytes(rewritten(original))
            args = base | {"corpus": str(corpus), "builds": str(builds), "build_id": night, "out": str(work / "x")}
            took = measure(workloads.ours_build, args)
            cache = json.loads((builds / night / "_BUILD.json").read_text())["cache"]
            runs[night].append(took | {"cache": cache})
    changed.write_bytes(original)
    first, following = (fastest(runs[night]) for night in runs)
    rows = []
    for label, night in (("first night, empty cache", first), ("next night, 2% of files changed", following)):
        cache = night["cache"]
        rows.append(
            {
                "build": label,
                "files": cache["files_hit"] + cache["files_missed"],
                "tokenized": cache["files_missed"],
                "build_s": night["seconds"],
                "tokenize_s": cache["tokenize_seconds"],
                "build_ratio": night["seconds"] / first["seconds"],
                "tokenize_ratio": cache["tokenize_seconds"] / first["cache"]["tokenize_seconds"],
            }
        )
        print(rows[-1], flush=True)
    return rows


def publish_rows(work: Path, source: Path, base: dict, repeats: int, copies_made: tuple[int, ...]) -> list[dict]:
    """Publish alone, for whole builds of the corpus ``copies_made`` times over, beside reading every byte of the
    same dataset (what publish did before the stages checked their own files)."""
    rows = []
    for copies in copies_made:
        corpus, builds = work / f"publish-corpus-x{copies}", work / f"publish-builds-x{copies}"
        link_corpus(source, corpus, copies)
        args = base | {"corpus": str(corpus), "builds": str(builds), "build_id": "night", "out": str(work / "x")}
        measure(workloads.ours_build, args)
        record = builds / "night" / "_BUILD.json"
        built = json.loads(record.read_text())
        publishes = []
        for _ in range(repeats):
            record.unlink()
            publishes.append(measure(workloads.ours_publish, args))
        reading = [measure(workloads.ours_reread, args) for _ in range(repeats)]
        dataset = Path(built["dataset"])
        rows.append(
            {
                "dataset": f"{copies}x the corpus",
                "tokens": built["tokens"],
                "mb": sum(p.stat().st_size for p in dataset.iterdir() if p.is_file()) / 1e6,
                "publish_s": fastest(publishes)["seconds"],
                "verify_s": fastest(reading)["seconds"],
            }
        )
        print(rows[-1], flush=True)
        shutil.rmtree(builds, ignore_errors=True)
    return rows


def s3_rows(work: Path, docs: int, repeats: int) -> list[dict]:
    """A merge and a context shuffle whose inputs and outputs are on a simulated S3 (moto, behind a proxy that caps
    each connection at ``S3_BANDWIDTH`` and delays each request by ``S3_LATENCY``; each in a process of its own), a
    file moving over one connection, then over ``TRANSFER_STREAMS``: what several streams buy a task."""
    import s3fs

    from harness.cluster import s3_in_processes
    from tokenization.io.storage import TRANSFER_STREAMS

    ranks = work / "s3-ranks"
    mb = (
        synthetic_ranks(ranks, 2, uniform(docs * 5 // 2, 200, 600)) / 1e6
    )  # 300 MB files: multipart uploads, as at scale
    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    rows = []
    with s3_in_processes(S3_BANDWIDTH, S3_LATENCY) as endpoint:
        s3 = s3fs.S3FileSystem(key="bench", secret="bench", endpoint_url=endpoint)
        s3.mkdir("bench")
        s3.put(str(ranks) + "/", "bench/ranks/", recursive=True, max_concurrency=TRANSFER_STREAMS)
        args = {"ranks": "s3://bench/ranks", "endpoint": endpoint}
        for stage, workload in (("merge", workloads.s3_merge), ("context shuffle", workloads.s3_context)):
            for streams in sorted({1, TRANSFER_STREAMS}):
                env = credentials | {"TOKENIZATION_S3_STREAMS": str(streams)}
                out = f"s3://bench/{workload.__name__}-{streams}"  # a new output each run: none resumes another
                runs = [measure(workload, args | {"out": f"{out}-{i}"}, env) for i in range(repeats)]
                seconds = fastest(runs)["seconds"]
                one = next((row["seconds"] for row in rows if row["stage"] == stage and row["streams"] == 1), seconds)
                rows.append(
                    {"stage": stage, "streams": streams, "mb": mb, "seconds": seconds, "speedup": one / seconds}
                )
                print(rows[-1], flush=True)
    return rows


def books_rows(work: Path, ranks: int, buckets: int) -> list[dict]:
    """The two places that add up every rank's records, at ``ranks`` complete ranks of ``buckets`` buckets (made
    by ``books_folder``), each once in its own process: the sensor's check, and publish's books."""
    folder, planned = work / "books-ranks", work / "books-planned.json"
    start = time.time()
    row = {"ranks": ranks, "buckets": buckets, **books_folder(folder, planned, work / "books-cache", ranks, buckets)}
    row["made_s"] = time.time() - start
    args = {"ranks": str(folder), "num_ranks": ranks, "plan": BOOKS_PLAN, "planned": str(planned)}
    for key, workload in (("sensor", workloads.ours_sensor_books), ("publish", workloads.ours_publish_books)):
        took = measure(workload, args | {"out": str(work / "x")})
        row |= {f"{key}_s": took["seconds"], f"{key}_rss": took["rss_mb"]}
    print(row, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return [row]


def books_folder(folder: Path, planned: Path, cache: Path, ranks: int, buckets: int) -> dict:
    """A rank folder of ``ranks`` complete ranks, made in minutes where tokenizing them would take days: one real
    rank of the bundled sample (its documents land in the buckets they land in), its records cloned under every
    other rank's name, and every token file a marker lists made sparse, of its recorded size (the books look at
    sizes, never at bytes, and a hole takes no disk). The plan's input files go to ``planned``; returns the folder's
    figures for the table."""
    config = TokenizeConfig(
        inputs=[str(SAMPLE_CORPUS)],
        output=str(folder),
        tokenizer=str(SAMPLE_TOKENIZER),
        eos_token=EOS,
        num_buckets=buckets,
        cache=str(cache),  # as in a build, so that the cache's summary has something to add up
    )
    tokenize_rank(config, progress=False)
    sample, marker = (
        record.loads((folder / name(config.stem)).read_bytes(), name(config.stem))
        for record, name in ((RankManifest, manifest.manifest_name), (CompletionMarker, manifest.marker_name))
    )
    check_inodes(folder, ranks * len(marker.files))
    read = [f for rank in range(ranks) for f in clone_rank(folder, sample, marker, rank, ranks)]
    planned.write_text(json.dumps([f.to_json() for f in read]))
    return {
        "written": len(sample.outputs),
        "files": ranks * len(marker.files),
        "markers_mb": folder_mb(folder / manifest.COMPLETIONS),
        "manifests_mb": folder_mb(folder / manifest.MANIFESTS),
    }


def clone_rank(folder: Path, sample: RankManifest, marker: CompletionMarker, rank: int, ranks: int) -> list[InputFile]:
    """Rank 0's records as rank ``rank``'s of ``ranks`` (its files' names, input files of its own, the books' plan),
    the marker holding the new manifest's sha256, written with its token files; the input files it read."""
    stem = rank_stem(rank)

    def named(name: str) -> str:
        return name.replace(f"/{rank_stem(0)}_", f"/{stem}_", 1)  # bucket00007/00000_00000_... names rank 0

    def moved(url: str) -> str:
        parent, name = url.rsplit("/", 1)
        return f"{parent}/{stem}/{name}"

    clone = replace(
        sample,
        rank=rank,
        world_size=ranks,
        params=sample.params | {"rank": rank, "world_size": ranks},
        plan=BOOKS_PLAN,
        inputs=[replace(f, url=moved(f.url)) for f in sample.inputs],
        outputs=[replace(e, name=named(e.name), files=renamed(e.files, named)) for e in sample.outputs],
        cache=sample.cache and replace(sample.cache, files=[replace(f, url=moved(f.url)) for f in sample.cache.files]),
    )
    data = clone.dumps()
    (folder / manifest.manifest_name(stem)).write_bytes(data)
    files = renamed(marker.files, named)
    sparse_files(folder, files)
    sha256 = hashlib.sha256(data).hexdigest()
    cloned = replace(marker, manifest=manifest.manifest_name(stem), sha256=sha256, files=files)
    (folder / manifest.marker_name(stem)).write_bytes(cloned.dumps())
    return clone.inputs


def renamed(files: dict[str, FileSum], named: Callable[[str], str]) -> dict[str, FileSum]:
    return {named(name): info for name, info in files.items()}


def sparse_files(folder: Path, files: dict[str, FileSum]) -> None:
    """Each file of its recorded size and no block on disk; millions of them, so no pathlib and no ``with``."""
    root, flags = str(folder), os.O_WRONLY | os.O_CREAT
    for name, info in files.items():
        fd = os.open(f"{root}/{name}", flags, 0o644)
        os.ftruncate(fd, info.bytes)
        os.close(fd)


def check_inodes(folder: Path, files: int) -> None:
    """Refuse to start what would fill the file system's inodes (a file system that does not count them: go)."""
    stats = os.statvfs(folder)
    if stats.f_files and stats.f_favail < 2 * files:
        raise RuntimeError(f"{folder}: {files:,} files wanted, {stats.f_favail:,} inodes free; fewer --books-ranks")


def folder_mb(folder: Path) -> float:
    return sum(entry.stat().st_size for entry in os.scandir(folder)) / 1e6


def deal_corpus(source: Path, corpus: Path, files: int) -> None:
    """The corpus's documents (as ``link_corpus`` takes them) dealt into ``files`` gzipped JSON-lines files."""
    linked = corpus.with_name(corpus.name + "-source")
    link_corpus(source, linked, copies=1)
    lines = [line for path in sorted(linked.iterdir()) for line in _lines(path)]
    corpus.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        (corpus / f"part-{k:03d}.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[k::files]), mtime=0))


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return [line + b"\n" for line in data.split(b"\n") if line.strip()]


def rewritten(gzipped: bytes) -> bytes:
    """The file with one character of its first document changed, as a night's edit of the corpus."""
    data = bytearray(gzip.decompress(gzipped))
    at = data.index(b'"text":') + len(b'"text":')
    at = data.index(b'"', at) + 1
    data[at] = ord("Q") if data[at] != ord("Q") else ord("R")
    return gzip.compress(bytes(data), mtime=0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpora", default=str(SHARED / "corpora"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2" / "tokenizer.json"))
    others = " and ".join(OTHER_TOKENIZERS)
    parser.add_argument("--tokenizers", default=str(SHARED / "tokenizers"), help=f"the folder holding {others}")
    parser.add_argument("--big-mb", type=float, default=1000, help="the text the 1gb row reaches, in MB")
    parser.add_argument("--scale", type=int, default=10, help="the memory table's largest input, in corpus copies")
    parser.add_argument("--text-key", default="text", help="the field holding the text (default: text)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--books-ranks", type=int, default=4096, help="ranks of the books row (default: 4096)")
    parser.add_argument("--books-buckets", type=int, default=512, help="buckets of the books row (default: 512)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(ROWS), help=f"rows, of {','.join(ROWS)}")
    parser.add_argument("--out", help=f"where the tables go (default: {RESULTS.relative_to(ROOT)} on a full run)")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, one repeat: checks that it runs")
    args = parser.parse_args()
    if unknown := set(args.only) - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}; rows are {','.join(ROWS)}")
    full = set(args.only) == set(ROWS) and not args.smoke
    args.out = args.out or (str(RESULTS) if full else None)
    if args.smoke:
        args.corpora, args.tokenizer = str(SAMPLE_CORPUS), str(SAMPLE_TOKENIZER)
        args.repeats, args.scale, args.big_mb = 1, 2, 1.0
        args.books_ranks, args.books_buckets = 8, 4
        args.only = [row for row in args.only if row not in OTHER_TOKENIZERS]  # the sample has one tokenizer
    return args


def main() -> None:
    args = parse_args()
    wanted = set(args.only)
    work = Path(tempfile.mkdtemp(prefix="tokenization-bench-"))
    corpus = work / "corpus"
    link_corpus(Path(args.corpora), corpus, copies=1)
    text_mb = text_bytes(corpus, args.text_key) / 1e6
    bench, memory = Bench(work, args.repeats), []
    base = {"corpus": str(corpus), "tokenizer": args.tokenizer, "eos": EOS, "text_key": args.text_key}
    if stages := [stage for stage in ENCODING_STAGES if stage in wanted]:
        encoding_rows(bench, base, text_mb, stages)
    for name, eos in OTHER_TOKENIZERS.items():
        if name in wanted:
            other = {"tokenizer": str(Path(args.tokenizers) / name / "tokenizer.json"), "eos": eos}
            encoding_rows(bench, base | other, text_mb, ["tokenize"])
    if "1gb" in wanted:
        big_row(bench, Path(args.corpora), base, text_mb, args.big_mb)
    if "amortized" in wanted:
        name, copies = AMORTIZED
        other = {"tokenizer": str(Path(args.tokenizers) / name / "tokenizer.json"), "eos": OTHER_TOKENIZERS[name]}
        amortized = (base, 2) if args.smoke else (base | other, copies)  # the sample has one tokenizer
        amortized_row(bench, Path(args.corpora), amortized[0], text_mb, amortized[1])
    docs = 2_000 if args.smoke else 150_000
    if wanted & {"merge", "context", "verify"}:
        byte_rows(bench, docs, wanted)
    pack_documents = 100_000 if args.smoke else PACK_DOCUMENTS
    packing = packing_rows(work, docs, pack_documents, args.repeats) if "packing" in wanted else []
    if "memory" in wanted:
        memory = memory_rows(work, Path(args.corpora), base, text_mb, args.scale, docs)
    nightly = nightly_rows(work, Path(args.corpora), base, args.repeats) if "nightly" in wanted else []
    s3 = s3_rows(work, docs, args.repeats) if "s3" in wanted else []
    copies = (1, 4) if args.smoke else PUBLISH_COPIES
    publish = publish_rows(work, Path(args.corpora), base, args.repeats, copies) if "publish" in wanted else []
    books = books_rows(work, args.books_ranks, args.books_buckets) if "books" in wanted else []
    text = "\n".join(report(bench, packing, memory, nightly, publish, s3, books, text_mb, args)) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    shutil.rmtree(work, ignore_errors=True)


def report(
    bench: Bench,
    packing: list[dict],
    memory: list[dict],
    nightly: list[dict],
    publish: list[dict],
    s3: list[dict],
    books: list[dict],
    text_mb: float,
    args: argparse.Namespace,
) -> list[str]:
    """The speed table with its limits, the tokenizers' load times, the packing table, the memory table, the
    nightly builds' table, the publish table, the S3 streams table and the books table, in Markdown."""
    machine = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    big = f" (the GB row: datatrove once, ours best of {min(2, args.repeats)})" if "1gb" in args.only else ""
    lines = [
        f"Benchmarks on {machine}; {text_mb:.1f} MB of text from `{args.corpora}`; best of {args.repeats} "
        f"alternating runs{big}.",
        "",
        *markdown_table(SPEED_COLUMNS, bench.rows),
        "",
        "Each stage's time is a whole process: start, imports, loading the tokenizer (below), reading, writing. "
        "Limits: HF `encode_batch_fast` alone and gigatoken `encode_batch` alone, on every core, on the same texts "
        "already in memory, loading excluded; for the byte-moving rows, `cp -r` then `sync` of the same files, and "
        "ours / cp + sync is ours divided by it. MB/s: text for tokenize and count, tokens for the "
        "others. same bytes: the .ds, .ds.index and .ds.loss files equal datatrove's (the context shuffle: the .ds; "
        "its index also carries document ends, which datatrove's loses). Ours runs with datatrove's semantics "
        "where the defaults differ (literal special-token text encoded as the special token, the context tail "
        "dropped); with a tokenizer whose post-processor adds a BOS (Mistral) the bytes differ by design, as "
        "datatrove drops that BOS (huggingface/datatrove#345), and the documents are compared without it. "
        "The GB row repeats the same corpus, which warms "
        "gigatoken's word cache: a real corpus of that size, with more distinct words, tokenizes slower.",
    ]
    if bench.loads:
        lines += ["", "Tokenizer load, in its own process (part of each stage's time):", ""]
        lines += markdown_table(LOAD_COLUMNS, bench.loads)
    if packing:
        lines += section(
            f"Packed context windows ({workloads.WINDOW} tokens) beside cut ones:",
            PACKING_COLUMNS,
            packing,
            "The context shuffle (one task, a whole process) of rank files whose document lengths are drawn as web "
            "text's (log-normal, median 245 tokens, 1.5% longer than a window), with loss bytes. windows: cut at "
            "every window's edge, the tail kept; documents cut: those a window's edge falls inside. packed: whole "
            "documents packed by Best-Fit Decreasing, only those longer than a window cut (into window-sized "
            "pieces), padding at loss 0. Best-Fit Decreasing alone: `formats.packing.pack` on lengths drawn the same "
            "way, made first and untimed; bytes a piece: its peak RSS above what the process held before it.",
        )
    if memory:
        grows = "tokenize: the corpus repeated; merge and context shuffle: ~400-token documents"
        lines += ["", f"Peak RSS as the input grows ({grows}):", ""]
        lines += markdown_table(MEMORY_COLUMNS, memory)
    if nightly:
        lines += section(
            f"Nightly builds with the tokenization cache ({NIGHTLY_FILES} input files, 4 ranks):",
            NIGHTLY_COLUMNS,
            nightly,
            "A whole build (`tokenization build`, 2 processes at a time: tokenize, merge, context shuffle, verify, "
            "publish), then the next night's under a new build id, after one input file was rewritten in place. The "
            "tokenize stage's time is its ranks' seconds, summed (tokenizer loading included): what the cache saves "
            "of a night's worker time. The stages after it move every byte each night.",
        )
    if publish:
        lines += section(
            "Publish as the dataset grows (a whole build, then its publish alone):",
            PUBLISH_COLUMNS,
            publish,
            "Each its own time, imports and the build's plan aside. Publish checks the records, one listing's "
            "sizes and the books, and writes the report; the context-shuffle tasks checked their own files before "
            "upload, so it reads no token byte. Reading every byte: verify of the same dataset against the "
            "tokenizer, which is what publish did before.",
        )
    if s3:
        cap = f"{S3_BANDWIDTH / 1e6:.0f} MB/s a connection, {S3_LATENCY * 1e3:.0f} ms a request"
        lines += section(
            f"Tasks on a simulated S3 ({cap}), a file over one connection or several:",
            S3_COLUMNS,
            s3,
            "Each a whole process, its input read from and its output written to moto behind a proxy with that cap "
            "and latency (`harness.cluster.s3_in_processes`: moto's server and the proxy each in a process of its "
            "own); MB: the task's tokens, read once and written once. Streams: `TOKENIZATION_S3_STREAMS` (a download "
            "in ranged GETs of 32 MiB, an upload in parts of 64 MiB, 4 at once). x one stream: the same task's "
            "time over one connection, divided by this one.",
        )
    if books:
        lines += section(
            "Adding up every rank's records, at many ranks of many buckets (one run each):",
            BOOKS_COLUMNS,
            books,
            "The rank folder is one real rank of the bundled sample, tokenized into that many buckets (its documents "
            "fill the buckets written), its manifest and completion marker cloned under every other rank's name, "
            "with input files of its own, and each token file a marker lists made as a sparse file of its recorded "
            "size: folder made is all of that. The sensor: `incomplete_ranks` with the plan, which lists the folder "
            "and each bucket folder (32 at a time, keeping an 8-byte digest a file) and reads every marker and "
            "manifest, 32 ranks at a time. Publish books: `rank_manifests`, then `conservation` against the plan's "
            "input files and `cache_summary`, as publish calls them. Each its own time in its own process, imports "
            "aside; peak RSS is the process's, imports included.",
        )
    return lines


if __name__ == "__main__":
    main()
