"""The build report: what one build did, from its manifests alone, as JSON and as one self-contained HTML page.

``publish`` writes ``report.json`` and ``report.html`` into the run folder, next to the dataset, before the
build manifest that declares the build complete; ``tokenization report RUN_DIR`` writes them again from the
manifests. The plots are matplotlib SVG, inlined, so the page needs nothing else to display.
"""

from __future__ import annotations

import html
import io
from collections import Counter

import orjson

from tokenization import manifest
from tokenization.build import BUILD_MANIFEST, Layout, conservation, rank_manifests
from tokenization.storage import join, open_fs, write_bytes_atomic

REPORT_FORMAT = "corpus-tokenization/report/1"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
SETTINGS = (
    "seed", "num_ranks", "shuffle_documents", "shuffle_chunk_size", "max_tokens_per_file", "save_loss",
    "output_format", "merge_mode", "merge_max_tokens_per_file", "context_window", "num_context_shards",
    "eos_token", "engine", "threads",
)  # fmt: skip


def report_data(run_dir: str, build: dict | None = None) -> dict:
    """Everything the report shows, from the run's manifests (``build``: its build manifest, when it is not
    written yet)."""
    fs, path = open_fs(run_dir)
    if build is None:
        build = manifest.read_json(fs, join(path, BUILD_MANIFEST))
        if build is None:
            raise FileNotFoundError(f"{run_dir}: no {BUILD_MANIFEST}; the build is not complete or this is not a run")
    ranks = rank_manifests(Layout(run_dir).ranks, build["stages"]["tokenize"]["ranks"])
    missing = [rank for rank, found in enumerate(ranks) if found is None]
    if missing:
        raise FileNotFoundError(f"{Layout(run_dir).ranks}: no manifest for ranks {missing}")
    lengths: Counter = Counter()
    for rank in ranks:
        for row in rank["counts"].get("length_histogram", []):
            lengths[row["min_tokens"]] += row["docs"]
    stages = build.get("stages") or {}
    dropped = {
        "tokenize": sum(r["counts"]["tokens_dropped"] for r in ranks),
        "merge": (stages.get("merge") or {}).get("tokens_dropped", 0),
        "context_shuffle": (stages.get("context_shuffle") or {}).get("tokens_dropped", 0),
    }
    outputs = manifest.output_entries(build["dataset"])
    tokenizer = ranks[0]["tokenizer"]
    return {
        "format": REPORT_FORMAT,
        "run_id": build.get("run_id"),
        "run_dir": run_dir,
        "dataset": build["dataset"],
        "digest": build.get("digest"),
        "tokens": build["tokens"],
        "conservation": conservation(ranks),
        "ranks": [_rank_row(r) for r in ranks],
        "length_histogram": [
            {"min_tokens": low, "max_tokens": 2 * low - 1, "docs": lengths[low]} for low in sorted(lengths)
        ],
        "files": [
            {"name": name, "tokens": entry["tokens"], "index_entries": entry["index_entries"]}
            for name, entry in sorted(outputs.items())
        ],
        "tokens_dropped": dropped | {"total": sum(dropped.values())},
        "settings": {k: build.get("params", {}).get(k) for k in SETTINGS} | {"seed": build.get("seed")},
        "tokenizer": {
            "name": tokenizer["name"],
            "sha256": tokenizer["sha256"],
            "token_size": tokenizer["token_size"],
            "vocab_size": tokenizer["vocab_size"],
            "eos_token": tokenizer["eos_token"],
            "engines": sorted({r["tokenizer"].get("engine", "hf") for r in ranks}),
        },
        "stages": stages,
        "verify": build.get("verify"),
    }


def _rank_row(rank: dict) -> dict:
    c = rank["counts"]
    return {
        "rank": rank["rank"],
        "docs_read": c["docs_read"],
        "docs_written": c["docs_written"],
        "tokens": c["tokens_written"],
        "empty": c["empty"],
        "rejected": c["rejected"],
        "rejected_total": c["rejected_total"],
        "special_token_literals": c["special_token_literals_total"],
        "seconds": rank["seconds"],
        "load_seconds": rank["tokenizer"].get("load_seconds"),
        "text_mb_per_s": rank.get("throughput", {}).get("text_mb_per_s"),
        "engine": rank["tokenizer"].get("engine", "hf"),
    }


def write_report(run_dir: str, build: dict | None = None) -> dict:
    """Write ``report.json`` and ``report.html`` into the run folder, each atomically; return the data."""
    data = report_data(run_dir, build)
    fs, path = open_fs(run_dir)
    write_bytes_atomic(
        fs, join(path, REPORT_JSON), orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    )
    write_bytes_atomic(fs, join(path, REPORT_HTML), render_html(data).encode())
    return data


def render_html(data: dict) -> str:
    """One page: totals and the conservation check, the plots, per-rank and per-file tables, settings, verify."""
    c = data["conservation"]
    verify = data["verify"] or {}
    holds = "holds" if c["holds"] else "DOES NOT HOLD"
    totals = [
        ("documents read", c["docs_in"], "docs_in"),
        ("documents written", c["docs_out"], "docs_out"),
        ("empty (skipped)", c["empty"], "empty"),
        ("quarantined", c["quarantined"], "quarantined"),
        ("tokens", data["tokens"], "tokens"),
        ("tokens dropped (expected 0)", data["tokens_dropped"]["total"], "tokens_dropped"),
        ("output files", len(data["files"]), "files"),
    ]
    rank_rows = [
        [r["rank"], r["docs_read"], r["docs_written"], r["tokens"], r["empty"], _reasons(r["rejected"]),
         r["special_token_literals"], f"{r['seconds']:.1f}", _show(r["load_seconds"]), _show(r["text_mb_per_s"]),
         r["engine"]]
        for r in data["ranks"]
    ]  # fmt: skip
    file_rows = [[f["name"], f["tokens"], f["index_entries"]] for f in data["files"]]
    settings = [[k, _show(v)] for k, v in data["settings"].items()] + [
        [f"tokenizer {k}", _show(v)] for k, v in data["tokenizer"].items()
    ]
    verified = "passed" if verify.get("ok") else "FAILED"
    body = f"""
<h1>Corpus build <code>{_e(data["run_id"] or data["run_dir"])}</code></h1>
<p>Dataset <code>{_e(data["dataset"])}</code>, digest <code>{_e(data["digest"])}</code>.</p>
<p class="{"ok" if c["holds"] else "bad"}" id="conservation">Documents: {c["docs_in"]} read = {c["docs_out"]}
written + {c["empty"]} empty + {c["quarantined"]} quarantined ({holds}).</p>
<table id="totals">{"".join(f'<tr><th>{n}</th><td data-key="{k}">{v}</td></tr>' for n, v, k in totals)}</table>
<h2>Document length</h2>
<figure id="length-histogram">{_length_plot(data["length_histogram"])}</figure>
<h2>Tokens per output file</h2>
<figure id="file-tokens">{_files_plot(data["files"])}</figure>
{_table("files", ["file", "tokens", "index entries"], file_rows)}
<h2>Ranks</h2>
{
        _table(
            "ranks",
            [
                "rank",
                "docs read",
                "docs written",
                "tokens",
                "empty",
                "rejected",
                "special-token literals",
                "seconds",
                "tokenizer loading (s)",
                "MB/s of text",
                "engine",
            ],
            rank_rows,
        )
    }
<h2>Settings</h2>
{_table("settings", ["setting", "value"], settings)}
<h2>Verify</h2>
<p id="verify" class="{"ok" if verify.get("ok") else "bad"}">{verified}: {verify.get("files")} files,
{verify.get("tokens")} tokens recounted from the files.</p>
{"".join(f"<p class=note>{_e(n)}</p>" for n in verify.get("notes", []))}
"""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Corpus build {_e(data["run_id"] or "")}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: .5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: .2em .6em; text-align: left; }}
td {{ font-variant-numeric: tabular-nums; }}
.ok {{ color: #17642c; }} .bad {{ color: #a11; font-weight: bold; }}
figure {{ margin: 0; }} svg {{ max-width: 100%; height: auto; }}
</style></head><body>{body}</body></html>
"""


def _length_plot(rows: list[dict]) -> str:
    labels = [f"{r['min_tokens']}-{r['max_tokens']}" for r in rows]
    return _bar_svg(labels, [r["docs"] for r in rows], "tokens in a document (power-of-two buckets)", "documents")


def _files_plot(files: list[dict]) -> str:
    return _bar_svg([f["name"] for f in files], [f["tokens"] for f in files], "output file", "tokens")


def _bar_svg(labels: list[str], values: list[int], xlabel: str, ylabel: str) -> str:
    """A bar chart as inline SVG (text kept as text, so the page stays small and searchable)."""
    import matplotlib

    matplotlib.use("svg", force=True)
    from matplotlib import pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "corpus-tokenization"}):
        figure, axes = plt.subplots(figsize=(9, 3.2))
        axes.bar(range(len(values)), values, color="#3b6ea8")
        axes.set_xticks(range(len(values)), labels, rotation=45 if len(labels) > 6 else 0, ha="right", fontsize=8)
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        axes.spines[["top", "right"]].set_visible(False)
        figure.tight_layout()
        out = io.StringIO()
        figure.savefig(out, format="svg", metadata={"Date": None})
        plt.close(figure)
    svg = out.getvalue()
    return svg[svg.index("<svg") :]


def _table(table_id: str, header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def _reasons(rejected: dict) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in rejected.items()) or "0"


def _show(value) -> str:
    return "-" if value is None else str(value)


def _e(value) -> str:
    return html.escape(str(value))
