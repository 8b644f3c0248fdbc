"""The build report's page, rendered from a real small build: the verdict first, figures written for people, and
nothing from a manifest ever read as markup. Also the "Corpus builds" page's template, without Airflow."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import SAMPLE_CORPUS, SAMPLE_TOKENIZER
from tests.support.stages import merged, run
from tokenization.builds.accounting import conservation, rank_manifests, stage_counts
from tokenization.builds.pages import date, duration, environment, integer, number, render, size
from tokenization.builds.report import INPUTS_SHOWN, _bar_svg, _unencoded, render_html, report_data, write_report
from tokenization.formats.native import CACHE
from tokenization.records import (
    Arrived,
    BuildInputs,
    BuildParams,
    BuildRecord,
    BuildTokenizer,
    MergeCounts,
    StageSummary,
    TokenizeSummary,
    VerifySummary,
)
from tokenization.storage.folder import Folder
from tokenization.tokenizer.encoding import NO_ENGINE

HOSTILE = "<script>alert(1)</script>"
NEW_FIELDS: dict[str, Any] = {
    "started": "2026-11-30T02:00:07.25+00:00",
    "finished": "2026-11-30T02:01:19.65+00:00",
    "wall_seconds": 72.4,
    "inputs": BuildInputs(
        spec=str(SAMPLE_CORPUS),
        files=4,
        bytes=93_401,
        skipped=1,
        hidden=0,
        arrived_after_plan=Arrived(files=1, first=["/data/in/a-late.jsonl"]),
    ),
}


@pytest.fixture(scope="module")
def small_build(tmp_path_factory) -> tuple[str, BuildRecord]:
    """The sample tokenized by two ranks and merged; its run folder and the build record ``publish`` would
    write, as an older build without times or inputs, with a run id that is markup."""
    run_dir = tmp_path_factory.mktemp("run")
    for rank in range(2):
        run([SAMPLE_CORPUS], run_dir / "ranks", SAMPLE_TOKENIZER, rank=rank, world_size=2, seed=5)
    merge = merged(run_dir / "ranks", run_dir / "merged", seed=5, merge_max_tokens_per_file=20_000)
    tokens = merge["counts"]["tokens"]
    ranks = rank_manifests(Folder(str(run_dir / "ranks")), 2)
    balance = conservation(ranks)
    build = BuildRecord(
        run_id=f"manual__{HOSTILE}",
        dataset=str(run_dir / "merged"),
        input=str(SAMPLE_CORPUS),
        seed=5,
        tokenizer=BuildTokenizer(name=str(SAMPLE_TOKENIZER), sha256=ranks[0].tokenizer.sha256, eos=None),
        params=BuildParams.of(
            {"input": str(SAMPLE_CORPUS), "tokenizer": str(SAMPLE_TOKENIZER), "num_ranks": 2, "seed": 5}
        ),
        started="2026-11-29T02:00:00+00:00",
        conservation=balance,
        tokens=tokens,
        digest="ab" * 32,
        files=[entry["name"] for entry in merge["outputs"]],
        stages=StageSummary(
            tokenize=TokenizeSummary(ranks=2, input_files=4, **asdict(balance)),
            merge=stage_counts(Folder(str(run_dir / "merged")), MergeCounts),
        ),
        verify=VerifySummary(ok=True, files=len(merge["outputs"]), tokens=tokens, notes=[f"a note {HOSTILE}"]),
    )
    return str(run_dir), build


def test_the_verdict_comes_first_and_figures_are_written_for_people(small_build) -> None:
    run_dir, build = small_build
    data = report_data(Folder(str(run_dir)), replace(build, **NEW_FIELDS))
    page = render_html(data)
    order = [page.index(f'id="{name}"') for name in ("verify", "conservation", "totals", "timing", "inputs")]
    assert order == sorted(order), order
    assert page.index("Verify passed") < page.index("Documents conservation holds") < page.index("documents read")

    tokens = data["build"]["tokens"]
    assert tokens > 1000 and f'<td data-key="tokens">{tokens:,}</td>' in page
    assert "template" not in data["settings"]  # the rendering settings show only when records were rendered
    assert data["mixture"] is None and "<h2>Mixture</h2>" not in page  # a build of one input has no sources
    assert f"{data['ranks'][0]['tokens']:,}" in page
    assert '<td data-key="engines">gigatoken</td>' in page and "[&#39;" not in page and "['" not in page
    assert '<td data-key="wall_seconds">1 min 12 s</td>' in page
    assert '<td data-key="started">2026-11-30 02:00 UTC</td>' in page
    assert '<td data-key="input_bytes">93.4 kB</td>' in page and '<td data-key="skipped">1</td>' in page
    assert re.search(r'<td data-key="tokens_per_s">[\d,]+ tokens/s</td>', page)
    assert '<td data-key="vocab_size">4,096 tokens</td>' in page and "None" not in page

    rank = data["ranks"][0]  # its peak memory and the fast engine's reloads to keep within its budget
    assert rank["peak_rss_mb"] > 50 and rank["engine_reloads"] == 0
    assert f'<td class="num">{rank["peak_rss_mb"]:,.0f} MiB</td>\n<td class="num">0</td>' in page
    data["ranks"][0] |= {"engine_reloads": 3, "engine_reload_seconds": 1.5}
    assert '<td class="num">3 (1.5 s)</td>' in render_html(data)


def test_ranks_that_encoded_nothing_show_why_not_a_rate(small_build) -> None:
    """A rank that built no engine encoded no text: without a cache (a rank of no file, or of no text), the page
    says "nothing encoded" where a rate of nothing would be; a rank that encoded shows its rate."""
    run_dir, _ = small_build
    ranks = rank_manifests(Folder(run_dir + "/ranks"), 2)
    assert ranks[0].cache is None and ranks[0].tokenizer.engine == "gigatoken" and _unencoded(ranks) is None
    idle = replace(ranks[0], tokenizer=replace(ranks[0].tokenizer, engine=NO_ENGINE))
    assert _unencoded([idle]) == "nothing encoded" and _unencoded([idle, ranks[1]]) is None


def test_values_from_manifests_are_escaped(small_build) -> None:
    run_dir, build = small_build
    page = render_html(report_data(Folder(str(run_dir)), build))
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 3  # the title, the heading, the verify note


def test_an_older_build_without_times_or_inputs_still_renders(small_build) -> None:
    run_dir, build = small_build
    data = report_data(Folder(str(run_dir)), build)
    assert data["build"]["wall_seconds"] is None and data["throughput"]["build"] is None
    sizes = [p.stat().st_size for p in SAMPLE_CORPUS.glob("*.jsonl.gz")]
    assert data["inputs"] == {
        "spec": str(SAMPLE_CORPUS),
        "files": len(sizes),
        "bytes": sum(sizes),
        "skipped": None,
        "hidden": None,
        "arrived_after_plan": None,
    }
    page = render_html(data)
    assert '<td data-key="wall_seconds">–</td>' in page and '<td data-key="tokens_per_s">–</td>' in page
    assert f'<td data-key="input_files">{len(sizes)}</td>' in page


def test_a_long_input_list_is_cut_after_twenty(small_build) -> None:
    run_dir, build = small_build
    data = report_data(Folder(str(run_dir)), build)
    data["input_files"] = [
        {"url": f"s3://corpus/part-{i:05d}.jsonl.gz", "bytes": 1500, "rank": 0, "cache": "hit"} for i in range(25)
    ]
    page = render_html(data)
    assert page.count("s3://corpus/part-") == INPUTS_SHOWN == 20 and "part-00019" in page and "part-00020" not in page
    assert '<tr class="more"><td>and 5 more</td><td class="num">7.5 kB</td>' in page


def test_report_json_carries_the_new_figures(small_build) -> None:
    run_dir, build = small_build
    write_report(Folder(str(run_dir)), replace(build, **NEW_FIELDS))
    saved = json.loads((Path(run_dir) / "report.json").read_text())
    page = (Path(run_dir) / "report.html").read_text()
    assert page.startswith("<!doctype html>") and '<td data-key="arrived">1</td>' in page
    assert "arrived after the build was planned are not in it; the next build\nreads them (1): <code>/data/" in page
    assert saved["build"]["wall_seconds"] == 72.4 and saved["build"]["started"] == NEW_FIELDS["started"]
    assert saved["inputs"] == NEW_FIELDS["inputs"].to_json()
    assert sorted(f["url"].rsplit("/", 1)[-1] for f in saved["input_files"]) == sorted(
        p.name for p in SAMPLE_CORPUS.glob("*.jsonl.gz")
    )
    text_bytes = saved["throughput"]["text_bytes"]
    assert saved["throughput"]["build"]["text_mb_per_s"] == round(text_bytes / 1e6 / 72.4, 3)
    assert saved["throughput"]["ranks"]["tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (integer(64_522), "64,522"),
        (integer(None), "–"),
        (size(23_947), "23.9 kB"),
        (size(1_234_567_890), "1.2 GB"),
        (size(512), "512 B"),
        (duration(3.44), "3.4 s"),
        (duration(72.4), "1 min 12 s"),
        (duration(7_500), "2 h 5 min"),
        (duration(None), "–"),
        (number(1_041_838.7, 0, "tokens/s"), "1,041,839 tokens/s"),
        (number(0.0034, 1, "MB/s"), "0.0034 MB/s"),
        (date("2026-11-30T03:00:41+01:00"), "2026-11-30 02:00 UTC"),
        (date(datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)), "2026-11-30 02:00 UTC"),
    ],
)
def test_filters(shown: str, expected: str) -> None:
    assert shown == expected


def test_the_builds_page_escapes_and_formats() -> None:
    row = {
        "run_id": HOSTILE,
        "state": "success",
        "started": "2026-11-30T02:00:07+00:00",
        "seconds": 72.4,
        "tokenizer": "meta-llama/Llama-3.1-8B",
        "input": "s3://corpus/2026-11/*.jsonl.gz",
        "seed": 1234,
        "tokens": 64_522,
        "docs": 308,
        "rejects": None,
        "reused": 0.981,
        "failure": None,
        "mixture": None,
        "footprint": {
            "folders": [
                {"name": "ranks", "held": 17_966, "removed": 196_174},
                {"name": "merged", "held": 11_587, "removed": 196_269},
                {"name": "context", "held": 205_737, "removed": 0},
            ],
            "cache": {"location": "/builds/.cache", "entries": 4, "bytes": 1_400_000_000, "tokens": 136_000_000},
        },
    }
    failed = row | {"run_id": "nightly", "state": "failed", "failure": {"task": "tokenize[2]", "cause": HOSTILE}}
    failed |= {"footprint": None}  # not published: nothing measured
    builds = [row, failed]
    page = render("builds.html.j2", dag_id="tokenize_corpus", builds=builds, report_url=lambda dag, run: f"/r/{run}")
    assert "<script" not in page and 'data-run-id="&lt;script&gt;alert(1)&lt;/script&gt;"' in page
    assert page.count('data-key="failure"') == 1  # a failed run names its task and cause, escaped
    assert "<code>tokenize[2]</code>: &lt;script&gt;alert(1)&lt;/script&gt;</div>" in page
    started = '<span class="nowrap">2026-11-30</span> <span class="nowrap">02:00 UTC</span>'  # wraps between the two
    shown = {"started": started, "duration": "1 min 12 s", "seed": "1234", "tokens": "64,522"}
    for key, text in (shown | {"docs": "308", "rejects": "–", "reused": "98.1%"}).items():
        assert f'data-key="{key}">{text}</td>' in page, key
    assert "<style>" in page and "border-collapse" in page  # the shared stylesheet, inline
    storage = [  # each stage folder's bytes once published, those of its token files removed, and the cache's
        '<div data-key="ranks"><span class="nowrap">ranks/ 18.0 kB</span> <span class="nowrap">(196 kB removed)</span>',
        '<div data-key="merged"><span class="nowrap">merged/ 11.6 kB</span> <span class="nowrap">(196 kB removed)',
        '<div data-key="context"><span class="nowrap">context/ 206 kB</span></div>',
        '<div class="nowrap" data-key="cache">cache 1.4 GB</div>',
    ]
    assert all(line in page for line in storage) and page.count('data-key="storage">') == 2
    assert '<td data-key="storage">–</td>' in page  # the failed run's
    assert 'data-key="mixture"' not in page  # builds of one input each


def test_a_page_from_its_kept_compile_is_the_page_compiled_again(small_build, tmp_path, monkeypatch) -> None:
    """Publish takes the templates' compiled code from the machine's cache folder, where the first publish left it
    (compiling them was a tenth of a next night's build): the report is the same from it, and where nothing can be
    kept (a file in the folder's place), compiled each time, as before."""
    run_dir, build = small_build
    data = report_data(Folder(str(run_dir)), build)
    monkeypatch.setenv(CACHE, str(tmp_path / "kept"))
    environment.cache_clear()  # (a new environment: none of this process's compiled templates in memory)
    page = render_html(data)
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert len(kept) == 3 and all(re.fullmatch(r"page-[0-9a-f]{40}\.jinja", name) for name in kept)  # with base, css
    environment.cache_clear()
    assert render_html(data) == page
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv(CACHE, str(tmp_path / "blocked"))
    environment.cache_clear()
    assert render_html(data) == page


def test_a_chart_is_svg_with_a_bar_and_a_tooltip_for_each_value() -> None:
    svg = str(_bar_svg(["<1", "1-2", "2-3"], [7, 0, 12_345], "tokens", "documents"))
    assert svg.startswith("<svg") and svg.endswith("</svg>") and svg.count("<rect") == 3
    assert "<title>&lt;1: 7</title>" in svg and "<title>2-3: 12,345</title>" in svg  # escaped, with its count
    assert ">15,000</text>" in svg and ">documents</text>" in svg  # a round top tick above the largest bar
    many = str(_bar_svg([f"f{k}" for k in range(100)], list(range(100)), "file", "tokens"))
    labels = re.findall(r">(f\d+)</text>", many)
    assert many.count("<rect") == 100 and labels == [f"f{k}" for k in range(0, 100, 3)]  # they do not overlap
