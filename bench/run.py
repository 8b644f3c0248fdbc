"""Benchmarks: this project against datatrove 0.10.1 on the same input, in the same run, alternating.

    python bench/run.py [--corpora DIR] [--tokenizer PATH] [--repeats N] [--out bench/RESULTS.md] [--smoke]

Every measurement runs in its own process, which reports its wall time and its own peak RSS, so stages do not
inherit each other's memory. Raw limits are measured alongside: HF ``encode_batch_fast`` alone (the ceiling of
any pipeline built on it) and ``cp`` of the same bytes. These are benchmarks, not tests: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
EOS = "<|endoftext|>"

# Each snippet runs in a fresh interpreter with ARGS (a dict) defined; it does the work being measured.
SNIPPETS = {
    "ours_tokenize": """
from tokenization.tokenize import TokenizeConfig, tokenize_rank
tokenize_rank(TokenizeConfig(inputs=[ARGS["corpus"]], output=ARGS["out"], tokenizer=ARGS["tokenizer"],
              eos_token=ARGS["eos"], seed=1234, local_working_dir=ARGS["out"] + "_work"), progress=False)
""",
    "datatrove_tokenize": """
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
LocalPipelineExecutor(pipeline=[JsonlReader(ARGS["corpus"]), DocumentTokenizer(ARGS["out"],
    tokenizer_name_or_path=ARGS["tokenizer"], eos_token=ARGS["eos"], seed=1234)], tasks=1, workers=1,
    logging_dir=ARGS["out"] + "_logs").run()
""",
    "hf_encode": """
import gzip, glob, orjson
from tokenizers import Tokenizer
texts = [orjson.loads(l)["text"] for f in sorted(glob.glob(ARGS["corpus"] + "/*.gz")) for l in gzip.open(f)]
import time
start = time.time()
Tokenizer.from_file(ARGS["tokenizer"]).encode_batch_fast([t for t in texts if t])
SECONDS = time.time() - start
""",
    "fast_encode": """
import gzip, glob, json, orjson
from tokenization.encoding import available_threads
from tokenization.fast_bpe import FastBPE
texts = [orjson.loads(l)["text"] for f in sorted(glob.glob(ARGS["corpus"] + "/*.gz")) for l in gzip.open(f)]
engine = FastBPE(json.load(open(ARGS["tokenizer"])), "text", available_threads())
import time
start = time.time()
engine.encode([t for t in texts if t])
SECONDS = time.time() - start
""",
    "ours_count": """
from tokenization.count import CountConfig, count_tokens
count_tokens(CountConfig(inputs=[ARGS["corpus"]], tokenizer=ARGS["tokenizer"], eos_token=ARGS["eos"]), progress=False)
""",
    "datatrove_count": """
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import TokensCounter
LocalPipelineExecutor(pipeline=[JsonlReader(ARGS["corpus"]), TokensCounter(ARGS["tokenizer"])], tasks=1, workers=1,
    logging_dir=ARGS["out"] + "_logs").run()
""",
    "ours_merge": """
from tokenization.merge import MergeConfig, merge
merge(MergeConfig(input=ARGS["ranks"], output=ARGS["out"], save_filename="m", seed=1))
""",
    "datatrove_merge": """
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.tokens import DocumentTokenizerMerger
LocalPipelineExecutor(pipeline=[DocumentTokenizerMerger(ARGS["ranks"], ARGS["out"], save_filename="m", seed=1,
    progress=False)], tasks=1, workers=1, logging_dir=ARGS["out"] + "_logs").run()
""",
    "ours_context": """
from tokenization.context import ContextShuffleConfig, context_shuffle
context_shuffle(ContextShuffleConfig(input=ARGS["ranks"], output=ARGS["out"], seed=1))
""",
    "datatrove_context": """
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.tokens import DocumentTokenizerContextShuffler
LocalPipelineExecutor(pipeline=[DocumentTokenizerContextShuffler(ARGS["ranks"], ARGS["out"], seed=1)], tasks=1,
    workers=1, logging_dir=ARGS["out"] + "_logs").run()
""",
    "ours_verify": """
from tokenization.verify import verify
assert verify(ARGS["ranks"]).ok
""",
}
RUNNER = """
import json, sys, time
ARGS = json.loads(sys.argv[1])
SECONDS = None
start = time.time()
exec(compile(sys.argv[2], "snippet", "exec"))
elapsed = SECONDS if SECONDS is not None else time.time() - start
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent, VmHWM belongs to this image only
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": elapsed, "rss_mb": peak / 1024}))
"""


def measure(name: str, args: dict) -> dict:
    out = args.get("out")
    if out:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out + "_logs", ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(args), SNIPPETS[name]], capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def copy_time(src: str, work: Path) -> float:
    import time

    dest = work / "cp-copy"
    shutil.rmtree(dest, ignore_errors=True)
    start = time.time()
    subprocess.run(["cp", "-r", src, str(dest)], check=True)
    os.sync()
    return time.time() - start


def synthetic_ranks(folder: Path, files: int, docs: int, low: int, high: int) -> int:
    """Rank files of random tokens and document lengths (the merge cost depends on lengths, not on text)."""
    from tokenization.formats.ds import TokenFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    total = 0
    for f in range(files):
        lengths = rng.integers(low, high, docs)
        writer = TokenFileWriter(folder / f"{f:05d}_00000_doc_shuffled.ds", tokenizer="gpt2", token_size=2,
                                 save_loss=False)  # fmt: skip
        writer.write(rng.integers(1, 50000, int(lengths.sum())).astype(np.uint16), np.cumsum(lengths))
        total += writer.close().tokens
    return total * 2


def link_corpus(source: Path, corpus: Path, copies: int) -> None:
    """The corpus files (without the instruct file, which has no text field), ``copies`` times over."""
    corpus.mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        for path in sorted(source.glob("*.jsonl.gz")):
            if not path.name.startswith("instruct_"):
                (corpus / f"{copy:03d}-{path.name}").symlink_to(path.resolve())


def memory_rows(work: Path, source: Path, base: dict, scale: int, docs: int) -> list[dict]:
    """Peak RSS of each stage on 1x and ``scale``x the input: flat, apart from the index arrays."""
    rows = []
    for copies in sorted({1, scale}):
        corpus = work / f"corpus-x{copies}"
        link_corpus(source, corpus, copies)
        ranks = work / f"ranks-x{copies}"
        token_mb = synthetic_ranks(ranks, 8, docs * copies // 4, 200, 600) / 1e6
        for label, name, args, mb in (
            ("tokenize + doc shuffle", "ours_tokenize", base | {"corpus": str(corpus)}, text_bytes(corpus) / 1e6),
            ("merge", "ours_merge", {"ranks": str(ranks)}, token_mb),
            ("context shuffle", "ours_context", {"ranks": str(ranks)}, token_mb),
        ):
            r = measure(name, args | {"out": str(work / f"{name}-x{copies}")})
            rows.append({"stage": label, "copies": copies, "input_mb": mb, "seconds": r["seconds"], "rss": r["rss_mb"]})
            print(rows[-1], flush=True)
            shutil.rmtree(work / f"{name}-x{copies}", ignore_errors=True)
        shutil.rmtree(ranks, ignore_errors=True)
    return rows


def text_bytes(corpus: Path) -> int:
    """UTF-8 bytes of text in the corpus, the unit of the tokenize and count throughputs."""
    import gzip

    import orjson

    return sum(len(orjson.loads(line).get("text", "").encode()) for p in corpus.iterdir() for line in gzip.open(p))


def best(name: str, args: dict, repeats: int) -> dict:
    runs = [measure(name, args) for _ in range(repeats)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", default=str(SHARED / "corpora"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2" / "tokenizer.json"))
    parser.add_argument(
        "--hf-tokenizer",
        default=str(SHARED / "tokenizers" / "mistral-7b" / "tokenizer.json"),
        help="a tokenizer the fast engine declines, to measure the HF path (EOS </s>)",
    )
    parser.add_argument("--scale", type=int, default=10, help="the memory table's largest input, in corpus copies")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, one repeat: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.corpora, args.tokenizer, args.hf_tokenizer, args.repeats, args.scale = (
            str(ROOT / "sample" / "corpus"),
            str(ROOT / "sample" / "tokenizer.json"),
            None,
            1,
            2,
        )

    work = Path(tempfile.mkdtemp(prefix="tokenization-bench-"))
    corpus = work / "corpus"
    corpus.mkdir()
    link_corpus(Path(args.corpora), corpus, copies=1)
    text_mb = text_bytes(corpus) / 1e6
    rows = []

    def stage(label: str, ours: str, theirs: str | None, stage_args: dict, mb: float, limit: float | None) -> None:
        results = {}
        for _ in range(args.repeats):  # alternate, so both see the same machine state
            for name in filter(None, (ours, theirs)):
                r = measure(name, stage_args | {"out": str(work / name)})
                if name not in results or r["seconds"] < results[name]["seconds"]:
                    results[name] = r
        o, t = results[ours], results.get(theirs)
        rows.append({"stage": label, "ours_s": o["seconds"], "ours_mbs": mb / o["seconds"], "ours_rss": o["rss_mb"],
                     "input_mb": mb,
                     "dt_s": t and t["seconds"], "dt_rss": t and t["rss_mb"],
                     "ratio": t and t["seconds"] / o["seconds"], "limit_s": limit})  # fmt: skip
        print(rows[-1], flush=True)

    base = {"corpus": str(corpus), "tokenizer": args.tokenizer, "eos": EOS}
    hf = best("hf_encode", base, args.repeats)["seconds"]
    fast = best("fast_encode", base, args.repeats)["seconds"]
    limit = f"HF {hf:.2f}, fast {fast:.2f}"
    stage("tokenize + doc shuffle", "ours_tokenize", "datatrove_tokenize", base, text_mb, limit)
    stage("count", "ours_count", "datatrove_count", base, text_mb, limit)
    if args.hf_tokenizer:
        mistral = base | {"tokenizer": args.hf_tokenizer, "eos": "</s>"}
        limit = f"HF {best('hf_encode', mistral, args.repeats)['seconds']:.2f}"
        label = f"tokenize + doc shuffle, {Path(args.hf_tokenizer).parent.name} (HF path)"
        stage(label, "ours_tokenize", "datatrove_tokenize", mistral, text_mb, limit)
    docs = 2_000 if args.smoke else 150_000
    small = work / "small"
    small_mb = synthetic_ranks(small, 8, docs, 200, 600) / 1e6
    small_cp = copy_time(str(small), work)
    stage("merge, ~400-token docs", "ours_merge", "datatrove_merge", {"ranks": str(small)}, small_mb, small_cp)
    large = work / "large"
    mb = synthetic_ranks(large, 8, docs // 50, 10_000, 30_000) / 1e6
    stage(
        "merge, ~20k-token docs",
        "ours_merge",
        "datatrove_merge",
        {"ranks": str(large)},
        mb,
        copy_time(str(large), work),
    )
    stage("context shuffle", "ours_context", "datatrove_context", {"ranks": str(small)}, small_mb, small_cp)
    stage("verify", "ours_verify", None, {"ranks": str(small)}, small_mb, None)
    memory = memory_rows(work, Path(args.corpora), base, args.scale, docs)
    write_table(rows, memory, Path(args.out), text_mb, args)
    shutil.rmtree(work, ignore_errors=True)


def write_table(rows: list[dict], memory: list[dict], out: Path, text_mb: float, args) -> None:
    machine = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    lines = [
        f"Benchmarks on {machine}; {text_mb:.1f} MB of text from `{args.corpora}`, tokenizer "
        f"`{Path(args.tokenizer).parent.name}`; best of {args.repeats}, alternating runs.",
        "",
        "| stage | ours (s) | ours MB/s | ours peak RSS (MB) | datatrove (s) | datatrove peak RSS (MB) | speed-up "
        "| limit (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        dt = f"{r['dt_s']:.2f} | {r['dt_rss']:.0f} | {r['ratio']:.2f}x" if r["dt_s"] else "- | - | -"
        limit = r["limit_s"] if isinstance(r["limit_s"], str) else f"{r['limit_s']:.2f}" if r["limit_s"] else "-"
        lines.append(
            f"| {r['stage']} | {r['ours_s']:.2f} | {r['ours_mbs']:.1f} | {r['ours_rss']:.0f} | {dt} | {limit} |"
        )
    lines += [
        "",
        "limit: for tokenize and count, HF `encode_batch_fast` alone and the fast engine alone (on every core); "
        "`cp` of the same bytes for the others. MB/s: text for tokenize and count, tokens for the others.",
        "",
        "Peak RSS as the input grows (tokenize: the corpus repeated; merge and context shuffle: ~400-token documents):",
        "",
        "| stage | input (MB) | seconds | peak RSS (MB) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m['stage']} | {m['input_mb']:.0f} | {m['seconds']:.2f} | {m['rss']:.0f} |" for m in memory]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
