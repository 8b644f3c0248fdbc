"""The benchmark's mixture rows run on the smoke run's sizes: a first mixture build tokenizes every file, the re-mix
at other weights none (its tokens all from the cache), and each build reaches every source's share (the bench itself
refuses a build that tokenized what it should not have, or a source more than one of its documents off its target).
"""

from __future__ import annotations

import re

import pytest

from bench.run import MIXTURE_SOURCES, MIXTURE_WEIGHTS
from tests.bench.test_bench_smoke import NUMBER, RATIO, bench, tables

SHARE = re.compile(r"(?P<name>[\w-]+) (?P<share>\d+\.\d\d)% \((?P<target>\d+)%(?:, used (?P<used>\d+\.\d\d)x)?\)")


@pytest.mark.long
def test_a_remix_tokenizes_nothing_and_reaches_its_shares(tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    done = bench("--smoke", "--only", "mixture", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    first, remix = tables(text)["mixture build"]
    files = sum(files for _, _, files, _ in MIXTURE_SOURCES.values())
    assert first["mixture build"] == "first, empty cache" and remix["mixture build"].startswith("re-mix: other weights")
    assert (first["files from the cache"], remix["files from the cache"]) == (f"0 of {files}", f"{files} of {files}")
    assert first["whole build / first build"] == "1.00x" and RATIO.fullmatch(remix["whole build / first build"])
    assert float(remix["tokenize stage, ranks' time (s)"]) < float(first["tokenize stage, ranks' time (s)"])
    for row, weights in zip((first, remix), MIXTURE_WEIGHTS, strict=True):
        assert all(
            NUMBER.fullmatch(row[h]) for h in ("whole build (s)", "sources' text (MB)", "largest miss (mean documents)")
        )
        assert int(row["tokens written"].replace(",", "")) > 0
        cell = row["share of the tokens (target), by source"]
        shares = list(SHARE.finditer(cell))
        assert ", ".join(m[0] for m in shares) == cell, cell
        assert [m["name"] for m in shares] == list(MIXTURE_SOURCES)
        total = sum(weights.values())
        for m in shares:
            target = weights[m["name"]] / total
            assert int(m["target"]) == round(100 * target) and abs(float(m["share"]) / 100 - target) < 0.01, m[0]
        repeated = {m["name"] for m in shares if m["used"]}  # the one source allowed to repeat does, at both weights
        assert repeated == {name for name, (*_, most) in MIXTURE_SOURCES.items() if most > 1}
    assert re.search(r"The re-mix took \d+% of the first build's time \(\d+\.\dx faster\)", text)
