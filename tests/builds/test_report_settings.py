"""The report shows what shaped the dataset and what each rank did: a packed build's ``context_mode``, and no
"tokenizer loading" nor rates of encoding for ranks that took every file from the tokenization cache (they load no
engine and encode nothing)."""

from __future__ import annotations

import json
import re

from tests.support.builds import config_of
from tokenization.builds.run import Build


def test_a_packed_build_from_the_cache_reports_its_mode_and_no_tokenizer_loading(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    config = config_of(
        sample_corpus,
        tmp_path,
        sample_tokenizer,
        context_window=1025,
        context_mode="packed",
        num_context_shards=1,
        save_loss=True,
    )
    Build.start(config, "first").run()
    again = Build.start(config, "again").run()  # every file from the first build's cache
    run_dir = tmp_path / "out" / "again"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["settings"]["context_mode"] == "packed"
    assert [r["engine"] for r in report["ranks"]] == ["none", "none"]
    assert [r["load_seconds"] for r in report["ranks"]] == [None, None]
    html = (run_dir / "report.html").read_text()
    assert re.search(r'<th><code>context_mode</code></th><td data-key="context_mode">packed</td>', html)
    ranks = html[html.index('<table id="ranks">') :]
    assert "no tokenizer engine loaded" in ranks[: ranks.index("</table>")]
    # a rate of no text encoded says nothing: the page says where the text came from instead
    assert report["throughput"]["unencoded"] == "all from the cache"
    assert report["throughput"]["ranks"] == {"text_mb_per_s": None, "tokens_per_s": None}
    assert [(r["unencoded"], r["text_mb_per_s"], r["tokens_per_s"]) for r in report["ranks"]] == [
        ("all from the cache", None, None)
    ] * 2
    assert '<td data-key="rank_text_mb_per_s">all from the cache</td>' in html
    assert '<td data-key="rank_tokens_per_s">all from the cache</td>' in html
    assert ranks[: ranks.index("</table>")].count('<td class="num">all from the cache</td>') == 4
    assert "0.0 MB/s" not in html and ">0 tokens/s<" not in html and ">0.0<" not in ranks
    assert again.record.params.to_json()["context_mode"] == "packed"
