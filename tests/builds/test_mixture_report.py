"""A mixture's report, summary and builds-page row, from a real small build of three sources: each source's share
reached against its target, what it gave, and its books, with the figures of its build record."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.support.builds import in_process
from tests.support.corpus import write_jsonl
from tests.support.paths import SAMPLE_TOKENIZER
from tests.support.tokenizers import EOS
from tokenization.builds.complete import Published, summary
from tokenization.builds.config import BuildConfig
from tokenization.builds.pages import render
from tokenization.builds.report import published_summary, render_html, report_data
from tokenization.builds.run import Build
from tokenization.records import BuildSummary, SourceShare
from tokenization.storage.folder import Folder

WORDS = {"web": ["alpha", "beta", "gamma"], "code": ["def", "return", "class"], "math": ["sum", "prime", "lemma"]}
DOCS = {"web": 80, "code": 20, "math": 80}  # code holds too few tokens for its share: it is used again


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Published:
    """Web, code and math at 60/30/10% of 3,000 tokens, code up to 3 times, published in this process."""
    root = tmp_path_factory.mktemp("mixture")
    rng = random.Random(0)
    for name, words in WORDS.items():
        texts = [f"{name} " + " ".join(rng.choices(words, k=rng.randint(5, 40))) for _ in range(DOCS[name])]
        write_jsonl(root / name / "part-0.jsonl", [{"text": text} for text in texts])
    mixture = {
        "tokens": 3_000,
        "sources": [
            {"name": "web", "input": str(root / "web"), "weight": 0.6},
            {"name": "code", "input": str(root / "code"), "weight": 0.3, "max_repetition": 3},
            {"name": "math", "input": str(root / "math"), "weight": 0.1},
        ],
    }
    config = BuildConfig(
        output=str(root / "out"),
        tokenizer=str(SAMPLE_TOKENIZER),
        mixture=mixture,
        eos_token=EOS,
        seed=7,
        num_ranks=2,
        context_window=256,
    )
    return in_process(Build.start(config, "mix"))


def run_dir(published: Published) -> Path:
    return Path(published.record.dataset).parent


def test_the_report_has_a_row_for_each_source_with_its_books(mixed) -> None:
    recorded = json.loads((run_dir(mixed) / "_BUILD.json").read_text())["mixture"]
    saved = json.loads((run_dir(mixed) / "report.json").read_text())
    assert saved["format"] == "corpus-tokenization/report/5"
    assert saved["mixture"] == {"sources": [row | {"holds": True} for row in recorded], "holds": True}

    web, code, math = saved["mixture"]["sources"]
    assert [web["name"], code["name"], math["name"]] == ["web", "code", "math"]
    assert [web["target"], code["target"], math["target"]] == [0.6, 0.3, 0.1]
    for source in (web, code, math):
        assert abs(source["share"] - source["target"]) < 0.02, source  # within a document of its target
        assert source["docs_read"] == DOCS[source["name"]] == source["docs_chosen"] + source["docs_not_chosen"]
    assert sum(source["tokens_chosen"] for source in (web, code, math)) == mixed.record.tokens
    assert code["docs_repeated"] > 0 and code["uses"] > code["docs_chosen"]  # too small: used again
    assert code["tokens_chosen"] > code["tokens_available"]
    assert (web["docs_repeated"], web["uses"]) == (0, web["docs_chosen"]) and web["docs_not_chosen"] > 0
    not_chosen = mixed.record.stages.merge.tokens_dropped  # the merge's books: the documents it did not use
    assert saved["tokens_not_chosen"] == not_chosen > 0 and saved["tokens_dropped"]["total"] == 0


def test_the_page_shows_each_source_against_its_target(mixed) -> None:
    page = render_html(report_data(Folder(str(run_dir(mixed))), mixed.record))
    assert page.index("<h2>Mixture</h2>") < page.index("<h2>Input files</h2>")
    assert "<strong>Documents conservation by source holds</strong>" in page
    for account in mixed.record.mixture or []:
        row = page[page.index(f'<tr data-source="{account.name}">') :].split("</tr>", 1)[0]
        shown = {
            "name": f"<code>{account.name}</code>",
            "target": f"{account.target:.1%}",
            "share": f"{account.share:.1%}",
            "docs_chosen": f"{account.docs_chosen:,}",
            "uses": f"{account.uses:,}",
            "tokens_chosen": f"{account.tokens_chosen:,}",
            "holds": "holds",
        }
        for key, text in shown.items():
            assert f'data-key="{key}">{text}</td>' in row, (account.name, key)
        reached = f"{round(100 * account.share, 1):,}%"  # the chart's bar and its target mark, with both in a tooltip
        assert f"<title>{account.name}: {reached} (target {round(100 * account.target, 1):,}%)</title>" in page
    chart = page[page.index('<figure id="mixture-shares">') :].split("</figure>", 1)[0]
    assert chart.count("<rect") == 3 and chart.count('stroke-width="3"') == 3 and ">60%</text>" in chart


def test_the_summary_has_a_line_for_each_source(mixed) -> None:
    lines = summary(mixed.record).splitlines()
    mixture = [line for line in lines if line.startswith("mixture: ")]
    assert lines.index(mixture[0]) == next(k for k, line in enumerate(lines) if line.startswith("tokens: ")) + 1
    web, code, math = mixed.record.mixture or []
    assert mixture == [
        f"mixture: web {web.share:.1%} of the tokens (target 60.0%): {web.docs_chosen:,} of its 80 documents chosen, "
        "0 repeated",
        f"mixture: code {code.share:.1%} of the tokens (target 30.0%): {code.docs_chosen:,} of its 20 documents "
        f"chosen, {code.docs_repeated:,} repeated ({code.uses:,} uses in all)",
        f"mixture: math {math.share:.1%} of the tokens (target 10.0%): {math.docs_chosen:,} of its 80 documents "
        "chosen, 0 repeated",
    ]


def test_the_builds_page_summary_carries_the_shares(mixed) -> None:
    shares = mixed.summary().mixture
    assert shares == [SourceShare(name=a.name, target=a.target, share=a.share) for a in mixed.record.mixture or []]
    sent = mixed.summary().to_json()  # as XCom holds it
    assert published_summary(sent, "XCom") == mixed.summary()
    older = {key: value for key, value in sent.items() if key != "mixture"}  # a build of one input, or older
    assert published_summary(older, "XCom").mixture is None
    assert "mixture" not in BuildSummary.from_json(older, "XCom").to_json()  # written as before


def test_the_builds_page_shows_each_source_in_the_input_cell(mixed) -> None:
    record = mixed.record
    row = {
        "run_id": "mix",
        "state": "success",
        "started": record.started,
        "seconds": 12.0,
        "tokenizer": record.tokenizer.name,
        "input": record.input,
        "seed": record.seed,
        "tokens": record.tokens,
        "docs": record.conservation.docs_out,
        "rejects": 0,
        "reused": None,
        "failure": None,
        "footprint": None,
        "mixture": [share.to_json() for share in mixed.summary().mixture or []],
    }
    page = render("builds.html.j2", dag_id="tokenize_corpus", builds=[row], report_url=lambda dag, run: f"/r/{run}")
    cell = page[page.index('<td data-key="input">') :].split("</td>", 1)[0]
    assert cell.startswith('<td data-key="input"><code>web=/<wbr>')  # the sources' inputs, then their shares
    for share in mixed.summary().mixture or []:
        shown = f'{share.name} {share.share:.1%} <span class="muted">(target {share.target:.1%})</span>'
        assert f'<div class="nowrap" data-source="{share.name}">{shown}</div>' in cell
