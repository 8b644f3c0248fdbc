"""The report shows what shaped the dataset and what each rank did: a packed build's ``context_mode``, and no
"tokenizer loading" for ranks that took every file from the tokenization cache (they load no engine)."""

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
    assert again.record.params.to_json()["context_mode"] == "packed"
