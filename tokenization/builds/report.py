"""The build report: what one build did, from its manifests alone, as JSON and as one self-contained HTML page.

``publish`` writes ``report.json`` and ``report.html`` into the run folder, next to the dataset, before the
build manifest that declares the build complete; ``tokenization report RUN_DIR`` writes them again from the
manifests. The page is ``templates/report.html.j2``; its plots are SVG written here, inlined, so it needs nothing
else to display.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson
from markupsafe import Markup, escape

from tokenization.builds.accounting import rank_manifests
from tokenization.builds.pages import render
from tokenization.errors import MissingError
from tokenization.output import manifest
from tokenization.output.runs import BUILD_MANIFEST, Layout, read_build
from tokenization.records import BuildInputs, BuildRecord, BuildSummary, RankManifest, Retention, Throughput
from tokenization.storage.folder import Folder, StorageOptions
from tokenization.tokenizer.encoding import NO_ENGINE

# /4 had no mixture; /3 no footprint or ranks' memory; /2 no packing; /1 copied the build record's figures
REPORT_FORMAT = "corpus-tokenization/report/5"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
NO_RATES = Throughput(text_mb_per_s=None, tokens_per_s=None)
INPUTS_SHOWN = 20  # the page lists this many input files, then how many more; report.json has them all
CHART_W, CHART_H = 900, 320  # a chart's size in pixels (the page scales it down to fit)
CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 80, 10, 10, 90  # its margins: the axes' labels
CHART_LABELS = 40  # labels under a chart's axis at most: with more bars, every second (third, ...) one
SETTINGS = (
    "seed",
    "num_ranks",
    "split_input_mb",
    "shuffle_documents",
    "shuffle_chunk_size",
    "max_tokens_per_file",
    "save_loss",
    "output_format",
    "merge_mode",
    "merge_max_tokens_per_file",
    "context_window",
    "context_mode",
    "num_context_shards",
    "mds",
    "eos_token",
    "engine",
    "threads",
    "memory_budget_mb",
)
RENDERING = ("template", "loss_fields", "messages_key", "chat_template", "loss_roles")  # when records are rendered


def report_data(
    run: Folder,
    build: BuildRecord | None = None,
    retention: Retention | None = None,
    ranks: list[RankManifest] | None = None,
) -> dict[str, Any]:
    """Everything the report shows: the build record itself (``build``, when it is not written yet), and what the
    run's rank manifests (``ranks``, when they were read already) add to it, with the builds that retention deleted
    when there were any."""
    build = build or _build_record(run)
    if ranks is None:
        ranks = rank_manifests(Layout(run).ranks, build.stages.tokenize.ranks)
    lengths: Counter[int] = Counter()
    for rank in ranks:
        for row in rank.counts.length_histogram:
            lengths[row.min_tokens] += row.docs
    merge = build.stages.merge
    chose = build.stages.tokenize.tokens_not_chosen  # the ranks held them and did not move them (``builds.choice``)
    not_chosen = merge.tokens_dropped + (chose or 0) if merge is not None and merge.sources is not None else None
    dropped = {
        "tokenize": sum(r.counts.tokens_dropped for r in ranks),
        "merge": merge.tokens_dropped if merge is not None and not_chosen is None else 0,
        "context_shuffle": build.stages.context_shuffle.tokens_dropped if build.stages.context_shuffle else 0,
    }
    outputs = manifest.output_entries(run.sub(Folder(build.dataset).name))
    tokenizer = ranks[0].tokenizer
    input_files = _input_files(ranks)
    return {
        "format": REPORT_FORMAT,
        "build": build.to_json(),
        "run_dir": run.url,
        "ranks": [_rank_row(r) for r in ranks],
        "length_histogram": [
            {"min_tokens": low, "max_tokens": 2 * low - 1, "docs": lengths[low]} for low in sorted(lengths)
        ],
        "files": [
            {"name": name, "tokens": d.entry.tokens, "index_entries": d.entry.index_entries}
            for name, d in sorted(outputs.items())
        ],
        "tokens_dropped": dropped | {"total": sum(dropped.values())},
        "tokens_not_chosen": not_chosen,
        "tokens_moved": None
        if chose is None
        else {"ranks": build.conservation.tokens, "held": build.conservation.tokens + chose},
        "packing": _packing(build),
        "loss": _loss(ranks),
        "settings": _settings(build),
        "tokenizer": {
            "name": tokenizer.name,
            "sha256": tokenizer.sha256,
            "token_size": tokenizer.token_size,
            "vocab_size": tokenizer.vocab_size,
            "eos_token": tokenizer.eos_token,
            "engines": _engines(ranks),
        },
        "throughput": _throughput(ranks, build.tokens, build.wall_seconds),
        "inputs": _inputs_summary(build, input_files),
        "input_files": input_files,
        "retention": retention and retention.to_json(),
        "footprint": _footprint(build),
        "mixture": _mixture(build),
    }


def _mixture(build: BuildRecord) -> dict[str, Any] | None:
    """A mixture's books, source by source, each with whether its documents add up, and whether they all do (None:
    a build of one input)."""
    if build.mixture is None:
        return None
    sources = [account.to_json() | {"holds": account.holds} for account in build.mixture]
    return {"sources": sources, "holds": all(source["holds"] for source in sources)}


def _footprint(build: BuildRecord) -> dict[str, Any] | None:
    """What the build takes on storage: each stage folder's bytes, held and removed, their totals, and the cache's
    size with its bytes a token (None: a build made before footprints were measured)."""
    footprint = build.footprint
    if footprint is None:
        return None
    cache = footprint.cache
    return {
        "folders": [folder.to_json() for folder in footprint.folders],
        "held": footprint.held,
        "removed": footprint.removed,
        "cache": cache and cache.to_json() | {"bytes_per_token": cache.bytes_per_token},
    }


def _packing(build: BuildRecord) -> dict[str, Any] | None:
    """Packed windows' books (``context_mode`` packed): documents whole and split, padding, and windows by their
    padding (classes 0, 1, 2-3, 4-7, ... tokens)."""
    counts = build.stages.context_shuffle
    if counts is None or not counts.padding_histogram:
        return None
    return {
        "windows": counts.windows,
        "documents_whole": counts.documents_whole,
        "documents_split": counts.documents_split,
        "split_pieces": counts.split_pieces,
        "padding_tokens": counts.padding_tokens,
        "padding_share": counts.padding_tokens / max(1, counts.tokens),
        "histogram": [
            {"min_tokens": 0 if k == 0 else 1 << (k - 1), "max_tokens": 0 if k == 0 else (1 << k) - 1, "windows": n}
            for k, n in enumerate(counts.padding_histogram)
        ],
    }


def _engines(ranks: list[RankManifest]) -> list[str]:
    """The engines of the ranks that encoded text (``none`` when the cache held every file)."""
    return sorted({r.tokenizer.engine for r in ranks} - {NO_ENGINE}) or [NO_ENGINE]


def _unencoded(ranks: list[RankManifest]) -> str | None:
    """What the page says instead of the ``ranks``' rates when they encoded no text (they built no engine), whose
    rates would be of nothing: every file taken from the cache, or no text to encode; None when they encoded."""
    if not ranks or any(r.tokenizer.engine != NO_ENGINE for r in ranks):
        return None
    served = [f.hit for r in ranks if r.cache for f in r.cache.files]
    return "all from the cache" if served and all(served) else "nothing encoded"


def _throughput(ranks: list[RankManifest], tokens: int, wall_seconds: float | None) -> dict[str, Any]:
    """The build's rates over its wall time, and a rank's over its own time tokenizing (loading apart), of the
    text it encoded: what the cache gave aside (none when the ranks encoded nothing, ``unencoded`` says why)."""
    text_bytes = sum(r.counts.text_bytes for r in ranks)
    taken = [f.taken() for r in ranks if r.cache for f in r.cache.files]  # a hit's, a grown file's earlier part
    ranks_rate = manifest.throughput(
        sum(r.seconds for r in ranks),
        sum(r.tokenizer.load_seconds or 0 for r in ranks),
        text_bytes - sum(t for t, _ in taken),
        sum(r.counts.tokens for r in ranks) - sum(n for _, n in taken),
    )
    unencoded = _unencoded(ranks)
    return {
        "text_bytes": text_bytes,
        "build": manifest.throughput(wall_seconds, 0, text_bytes, tokens).to_json() if wall_seconds else None,
        "ranks": (NO_RATES if unencoded else ranks_rate).to_json(),
        "unencoded": unencoded,
    }


def _inputs_summary(build: BuildRecord, input_files: list[dict[str, Any]]) -> dict[str, Any]:
    """The build record's account of its inputs; for builds from before it kept one, what the ranks read."""
    if build.inputs is not None:
        return build.inputs.to_json()
    read = BuildInputs(spec=build.input, files=len(input_files), bytes=sum(f["bytes"] for f in input_files))
    return read.to_json()


def _input_files(ranks: list[RankManifest]) -> list[dict[str, Any]]:
    """Every file (or part of one) the ranks read, with its bytes, its rank and how the cache served it (``hit``,
    ``miss``, or None without a cache: a rank's cache records its inputs in their order), by name."""
    rows = []
    for r in ranks:
        served = [("hit" if f.hit else "miss") for f in r.cache.files] if r.cache else [None] * len(r.inputs)
        rows += [
            {"url": f.name, "bytes": f.span_bytes, "rank": r.rank, "cache": cache}
            for f, cache in zip(r.inputs, served, strict=True)
        ]
    return sorted(rows, key=lambda f: f["url"])


def _settings(build: BuildRecord) -> dict[str, Any]:
    """The settings that shape the dataset; how records were rendered, when they were."""
    shown = SETTINGS + (RENDERING if build.params.renders_records else ())
    return build.settings(shown) | {"seed": build.seed}


def _loss(ranks: list[RankManifest]) -> dict[str, Any]:
    """Tokens that carry loss, and their share of the tokens encoded; None without loss masks (or from a build
    made before ranks counted them)."""
    counted = [r.counts.loss_tokens for r in ranks if r.saves_loss and r.counts.loss_tokens is not None]
    if len(counted) < len(ranks):
        return {"tokens": None, "share": None}
    tokens = sum(counted)
    encoded = sum(r.counts.tokens for r in ranks)
    return {"tokens": tokens, "share": tokens / encoded if encoded else None}


def _rank_row(rank: RankManifest) -> dict[str, Any]:
    c = rank.counts
    unencoded = _unencoded([rank])
    rates = NO_RATES if unencoded or rank.throughput is None else rank.throughput
    return {
        "rank": rank.rank,
        "docs_read": c.docs_read,
        "docs_written": c.docs_written,
        "tokens": c.tokens_written,
        "empty": c.empty,
        "rejected": c.rejected,
        "rejected_total": c.rejected_total,
        "special_token_literals": c.special_token_literals_total,
        "loss_share": _loss([rank])["share"],
        "seconds": rank.seconds,
        # a rank that took every file from the cache built no engine: its reading of the tokenizer file is no
        # "tokenizer loading" (the engine column says none)
        "load_seconds": None if rank.tokenizer.engine == NO_ENGINE else rank.tokenizer.load_seconds,
        # HF's tokenizer taken as its process held it (the plan's, or an earlier rank's): not loaded by this rank
        "tokenizer_held": bool(rank.tokenizer.tokenizer_held) and rank.tokenizer.engine != NO_ENGINE,
        "text_mb_per_s": rates.text_mb_per_s,
        "tokens_per_s": rates.tokens_per_s,
        "unencoded": unencoded,
        "engine": rank.tokenizer.engine,
        "peak_rss_mb": rank.peak_rss_mb,
        "engine_reloads": rank.tokenizer.engine_reloads,
        "engine_reload_seconds": rank.tokenizer.engine_reload_seconds,
        "files_from_cache": rank.cache and f"{sum(f.hit for f in rank.cache.files)} of {len(rank.cache.files)}",
    }


def write_report(
    run: Folder,
    build: BuildRecord | None = None,
    retention: Retention | None = None,
    ranks: list[RankManifest] | None = None,
) -> BuildRecord:
    """Write ``report.json`` and ``report.html`` into the run folder, each atomically; return the build record they
    show."""
    build = build or _build_record(run)
    data = report_data(run, build, retention, ranks)
    run.put(REPORT_JSON, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    run.put(REPORT_HTML, render_html(data).encode())
    return build


def _build_record(run: Folder) -> BuildRecord:
    build = read_build(run)
    if build is None:
        raise MissingError(f"{run.url}: no {BUILD_MANIFEST}; the build is not complete or this is not a run")
    return build


def render_html(data: dict[str, Any]) -> str:
    """The page: the verdict first, then totals, time, inputs, tokenizer, plots, tables, settings, verify notes."""
    plots = {"length": _length_plot(data["length_histogram"]), "files": _files_plot(data["files"])}
    if data.get("packing"):
        rows = data["packing"]["histogram"]
        labels = [f"{r['min_tokens']}-{r['max_tokens']}" if r["max_tokens"] else "0" for r in rows]
        plots["padding"] = _bar_svg(labels, [r["windows"] for r in rows], "padding tokens in a window", "windows")
    if data.get("mixture"):
        plots["mixture"] = _mixture_plot(data["mixture"]["sources"])
    return render("report.html.j2", report=data, plots=plots, inputs_shown=INPUTS_SHOWN)


def _length_plot(rows: list[dict[str, Any]]) -> Markup:
    labels = [f"{r['min_tokens']}-{r['max_tokens']}" for r in rows]
    return _bar_svg(labels, [r["docs"] for r in rows], "tokens in a document (power-of-two buckets)", "documents")


def _files_plot(files: list[dict[str, Any]]) -> Markup:
    return _bar_svg([f["name"] for f in files], [f["tokens"] for f in files], "output file", "tokens")


def _mixture_plot(sources: list[dict[str, Any]]) -> Markup:
    """Each source's share of the tokens reached, its target marked across its bar (in percent, to 0.1)."""
    return _bar_svg(
        [s["name"] for s in sources],
        [round(100 * s["share"], 1) for s in sources],
        "source",
        "share of the tokens",
        unit="%",
        targets=[round(100 * s["target"], 1) for s in sources],
    )


def _bar_svg(
    labels: list[str],
    values: Sequence[float],
    xlabel: str,
    ylabel: str,
    unit: str = "",
    targets: Sequence[float] | None = None,
) -> Markup:
    """A bar chart as inline SVG, written here (a plotting library took ~0.8 s of every build's publish to import
    and draw two charts): text kept as text, so the page stays small and searchable; each bar's label and value in
    its tooltip; at most ``CHART_LABELS`` labels under the axis, evenly spaced, when there are more bars. With
    ``targets``, a dark mark across each bar at its target, which the tooltip names too."""
    top = math.ceil(max([*values, *(targets or [])], default=0))
    step = _tick_step(top)
    ticks = list(range(0, top + step, step)) if top else [0]
    high = ticks[-1] or 1
    plot_w, plot_h = CHART_W - CHART_LEFT - CHART_RIGHT, CHART_H - CHART_TOP - CHART_BOTTOM
    slot = plot_w / max(1, len(values))
    slanted = len(labels) > 6
    every = max(1, -(-len(labels) // CHART_LABELS))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" '
        f'viewBox="0 0 {CHART_W} {CHART_H}" font-family="sans-serif" font-size="11" role="img">'
    ]
    for tick in ticks:
        y = CHART_TOP + plot_h * (1 - tick / high)
        parts.append(
            f'<line x1="{CHART_LEFT}" x2="{CHART_W - CHART_RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
            f'<text x="{CHART_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:,}{unit}</text>'
        )
    for k, (label, value) in enumerate(zip(labels, values, strict=True)):
        x, height = CHART_LEFT + k * slot, plot_h * value / high
        shown = f"{escape(label)}: {value:,}{unit}"
        if targets:
            shown += f" (target {targets[k]:,}{unit})"
        parts.append(
            f'<rect x="{x + slot * 0.1:.1f}" y="{CHART_TOP + plot_h - height:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{height:.1f}" fill="#3b6ea8"><title>{shown}</title></rect>'
        )
        if targets:
            y = CHART_TOP + plot_h * (1 - targets[k] / high)
            parts.append(
                f'<line x1="{x + slot * 0.05:.1f}" x2="{x + slot * 0.95:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="#1f2328" stroke-width="3"><title>{shown}</title></line>'
            )
        if k % every == 0:
            cx, cy = x + slot / 2, CHART_TOP + plot_h + 14
            turn = (
                f' transform="rotate(-45 {cx:.1f} {cy:.1f})" text-anchor="end"' if slanted else ' text-anchor="middle"'
            )
            parts.append(f'<text x="{cx:.1f}" y="{cy:.1f}"{turn}>{escape(label)}</text>')
    base = CHART_TOP + plot_h
    parts.append(
        f'<line x1="{CHART_LEFT}" x2="{CHART_W - CHART_RIGHT}" y1="{base}" y2="{base}" stroke="#333"/>'
        f'<text x="{CHART_LEFT + plot_w / 2:.1f}" y="{CHART_H - 6 if slanted else base + 36}" text-anchor="middle" '
        f'font-size="12">'
        f"{escape(xlabel)}</text>"
        f'<text x="14" y="{CHART_TOP + plot_h / 2:.1f}" transform="rotate(-90 14 {CHART_TOP + plot_h / 2:.1f})" '
        f'text-anchor="middle" font-size="12">{escape(ylabel)}</text></svg>'
    )
    return Markup("".join(parts))


def _tick_step(top: int) -> int:
    """A round step (1, 2 or 5 times a power of ten) that cuts ``[0, top]`` into at most five intervals."""
    power = 1
    while True:
        for factor in (1, 2, 5):
            if power * factor * 5 >= top:
                return power * factor
        power *= 10


def read_report(run_dir: str, options: StorageOptions | None) -> str:
    """A run's report as published, read with ``options``; FileNotFoundError until its build publishes."""
    return Folder(run_dir, options).read(REPORT_HTML).decode()


def published_summary(data: object, where: str) -> BuildSummary:
    """What a build's publish returned (as XCom holds it, ``where``), checked: a RecordError says what is wrong."""
    return BuildSummary.from_json(data, where)
