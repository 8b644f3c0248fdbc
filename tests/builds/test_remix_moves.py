"""A re-mix pays for what it chooses (``builds.choice``): with every file of a mixture's sources in the cache, the
ranks move only the documents some source's share uses, the merge reads only those, and the dataset's bytes are
those of a build without the cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.builds import in_process
from tests.support.corpus import write_jsonl
from tests.support.tokenizers import EOS
from tokenization import mixing
from tokenization.builds.complete import summary
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.formats.ds import TokenFile, TokenFileError
from tokenization.output.runs import PlanConflict
from tokenization.records import RankManifest
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

LETTERS = {"web": "abcdefg", "code": "hijklmn", "math": "opqrstu"}
DOCS = {"web": 600, "code": 120, "math": 300}


def sources(root: Path) -> dict[str, str]:
    """Each source's folder: two files of documents of 5 to 60 words of its own letters."""
    rng = np.random.default_rng(4)
    for name, letters in LETTERS.items():
        for part in range(2):
            texts = [
                " ".join("".join(rng.choice(list(letters), rng.integers(2, 8))) for _ in range(rng.integers(5, 60)))
                for _ in range(DOCS[name] // 2)
            ]
            write_jsonl(root / name / f"part-{part}.jsonl", [{"text": text} for text in texts])
            hour_ago = time.time_ns() - 3600 * 10**9  # not written as its rank hashed it (git's racy case): the
            os.utime(root / name / f"part-{part}.jsonl", ns=(hour_ago, hour_ago))  # next plan knows its sha256
    return {name: str(root / name) for name in LETTERS}


def config(output: Path, tokenizer: Path, inputs: dict[str, str], weights: tuple, **options) -> BuildConfig:
    mixture = {
        "tokens": 12_000,
        "sources": [
            {"name": name, "input": inputs[name], "weight": weight, "max_repetition": 3}
            for name, weight in zip(LETTERS, weights, strict=True)
        ],
    }
    settings = {"seed": 11, "num_ranks": 3, "context_window": 300, "save_loss": True, "keep_intermediate": True}
    return BuildConfig(
        output=str(output), tokenizer=str(tokenizer), mixture=mixture, eos_token=EOS, **settings | options
    )


def rank_records(run_dir: Path) -> list[RankManifest]:
    return [
        RankManifest.loads(path.read_bytes(), str(path)) for path in sorted(run_dir.glob("ranks/_manifests/*.json"))
    ]


def test_a_remix_moves_only_the_documents_it_chooses_and_makes_the_bytes_of_a_build_without_the_cache(
    tmp_path, sample_tokenizer
) -> None:
    inputs = sources(tmp_path / "data")
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.6, 0.3, 0.1)), "first"))
    remix_config = config(tmp_path / "out", sample_tokenizer, inputs, (0.2, 0.5, 0.3))
    remix = in_process(Build.start(remix_config, "remix")).record
    assert remix.cache is not None and (remix.cache.files_hit, remix.cache.files_missed) == (6, 0)
    ranks = rank_records(tmp_path / "out" / "remix")
    held = sum(rank.counts.tokens for rank in ranks)
    moved = sum(rank.counts.tokens_written for rank in ranks)
    # each rank held every token of its files and wrote those of the chosen documents only, each once
    assert all(rank.counts.tokens_not_chosen is not None for rank in ranks)
    assert [r.counts.tokens_written + (r.counts.tokens_not_chosen or 0) for r in ranks] == [
        r.counts.tokens for r in ranks
    ]
    written = [TokenFile(str(path)) for path in sorted((tmp_path / "out" / "remix" / "ranks").glob("*.ds"))]
    assert sum(file.num_tokens for file in written) == moved
    distinct = sum(a.tokens_chosen for a in remix.mixture or []) - remix.stages.merge.tokens_repeated
    assert moved == distinct < held
    assert remix.stages.merge is not None and remix.stages.merge.tokens_dropped == 0  # nothing left to leave out
    assert remix.conservation.tokens_not_chosen == held - moved
    for stage in ("ranks", "merged", "context"):  # the kept rank files hold what their records say
        assert verify(Folder(str(tmp_path / "out" / "remix" / stage))).ok, stage
    report = json.loads((tmp_path / "out" / "remix" / "report.json").read_text())
    assert report["tokens_moved"] == {"ranks": moved, "held": held}
    assert report["tokens_not_chosen"] == held - moved
    assert f"{moved:,} of {held:,}" in (tmp_path / "out" / "remix" / "report.html").read_text()
    lines = summary(remix).splitlines()
    assert (
        f"moved: the ranks moved {moved:,} of the {held:,} tokens they held (the chosen documents); "
        + (f"{held - moved:,} not chosen stayed where they were")
        in lines
    )
    assert f"tokens: {remix.tokens:,} in 1 file, 0 dropped, {held - moved:,} not chosen by the mixture" in lines[4]
    # the same mixture without the cache: every document moved, the same bytes
    alone = in_process(
        Build.start(config(tmp_path / "alone", sample_tokenizer, inputs, (0.2, 0.5, 0.3), cache="off"), "remix")
    )
    assert alone.record.conservation.tokens_not_chosen is None and alone.record.conservation.tokens == held
    assert alone.record.digest == remix.digest


def test_an_entry_gone_between_the_plan_and_its_rank_gives_the_same_bytes(tmp_path, sample_tokenizer) -> None:
    """The plan chose from the cache's entries; the cache lost them before the ranks ran (a prune): the ranks
    tokenize the files again, to the very documents the plan chose from, and write the chosen ones, a rank's in
    several files."""
    inputs = sources(tmp_path / "data")
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.6, 0.3, 0.1)), "first"))
    several = {"max_tokens_per_file": 2_000}  # each rank's chosen documents in files of their own, in order
    build = Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.2, 0.5, 0.3), **several), "remix")
    assert (tmp_path / "out" / "remix" / "choice" / "_CHOSEN.json").exists()
    shutil.rmtree(tmp_path / "out" / ".cache")
    remix = in_process(build).record
    assert remix.cache is not None and remix.cache.files_missed == 6
    assert len(list((tmp_path / "out" / "remix" / "ranks").glob("00000_*.ds"))) > 1
    alone = in_process(
        Build.start(config(tmp_path / "alone", sample_tokenizer, inputs, (0.2, 0.5, 0.3), cache="off"), "remix")
    )
    assert remix.conservation.tokens_not_chosen and alone.record.digest == remix.digest


def test_a_rank_whose_records_say_it_held_back_more_than_it_held_fails_verify(tmp_path, sample_tokenizer) -> None:
    """A chosen rank's records rewritten to say it left a token more aside, its marker made to match: verify
    says so, naming its manifest."""
    inputs = sources(tmp_path / "data")
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.6, 0.3, 0.1)), "first"))
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.2, 0.5, 0.3)), "remix"))
    ranks = tmp_path / "out" / "remix" / "ranks"
    path, marker_path = ranks / "_manifests" / "00001.json", ranks / "_completions" / "00001.json"
    data = json.loads(path.read_text())
    data["counts"]["tokens_not_chosen"] += 1
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    marker = json.loads(marker_path.read_text())
    marker["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    marker_path.write_text(json.dumps(marker, sort_keys=True))
    c = data["counts"]
    report = verify(Folder(str(ranks)))
    assert not report.ok
    assert (
        f"held {c['tokens']:,} tokens of {c['docs_written']:,} documents, but wrote {c['tokens_written']:,} tokens "
        f"of {c['contents_out']['pieces']:,} documents and left {c['tokens_not_chosen']:,} not chosen: a rank that "
        "writes the documents a mixture chose writes each of them once, and nothing else"
    ) in str(report.problems), report.problems


def test_a_rank_whose_documents_are_not_those_the_plan_chose_from_stops(tmp_path, sample_tokenizer) -> None:
    """The plan chose from other documents than the rank holds (here: its choice says each is a token longer): the
    rank stops before it writes, naming what it holds and what was planned; it never writes another mixture."""
    inputs = sources(tmp_path / "data")
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.6, 0.3, 0.1)), "first"))
    build = Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.2, 0.5, 0.3)), "remix")
    folder = Folder(str(tmp_path / "out" / "remix" / "choice"))
    planned = mixing.read_choice(folder)
    assert planned is not None
    mixing.save_choice(folder, planned | {"00000": replace(planned["00000"], lengths=planned["00000"].lengths + 1)})
    held, docs = int(planned["00000"].lengths.sum()), len(planned["00000"].lengths)
    with pytest.raises(PlanConflict) as stopped:
        build.tokenize(0, progress=False)
    assert str(stopped.value) == (
        f"rank 0: its documents are not those the plan chose the mixture from ({docs:,} documents of {held:,} "
        f"tokens, planned {docs:,} of {held + docs:,}; files tokenized again since the plan: none): run the build "
        "under a new build id"
    )
    assert not list((tmp_path / "out" / "remix" / "ranks").glob("*.ds"))


def test_a_merge_whose_rank_files_are_not_the_chosen_documents_stops(tmp_path, sample_tokenizer) -> None:
    """The choice changed after the ranks wrote (its list made to match): the merge, which chooses again from the
    plan's lengths, finds the rank files do not hold what it chose, and stops before a byte moves."""
    inputs = sources(tmp_path / "data")
    in_process(Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.6, 0.3, 0.1)), "first"))
    build = Build.start(config(tmp_path / "out", sample_tokenizer, inputs, (0.2, 0.5, 0.3)), "remix")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    folder = Folder(str(tmp_path / "out" / "remix" / "choice"))
    planned = mixing.read_choice(folder)
    assert planned is not None
    mixing.save_choice(folder, planned | {"00001": replace(planned["00001"], uses=planned["00001"].uses[::-1])})
    with pytest.raises(TokenFileError, match="its rank files do not hold the documents the plan chose"):
        build.merge(progress=False)
    assert not list((tmp_path / "out" / "remix" / "merged").glob("*.ds"))
