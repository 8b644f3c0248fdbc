"""The capacity plan's projection (bench/scale_plan.py) is arithmetically consistent, and docs/scaling.md shows what
the script computes today: a plan whose numbers drift from its model is worse than none."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import fields, replace
from itertools import pairwise

import pytest

from tests.conftest import ROOT
from tokenization.storage import part_size

_spec = importlib.util.spec_from_file_location("scale_plan", ROOT / "bench" / "scale_plan.py")
plan = sys.modules["scale_plan"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(plan)

DEFAULT = plan.Scenario()
SCENARIOS = [
    DEFAULT,
    replace(DEFAULT, ranks=4096, buckets=1024, context_shards=1024, merge_slots=256),
    replace(DEFAULT, tokens=3e11, ranks=64, buckets=16, context_shards=16, merge_slots=4, save_loss=True),
    replace(DEFAULT, bucket_prefixes=True, distributed_verify=True, min_part_mib=64, concurrency=2),
]


@pytest.mark.parametrize("s", SCENARIOS)
def test_task_instances_are_ranks_buckets_shards_and_the_fixed_tasks(s) -> None:
    costs = plan.stages(s, True, s.workers)
    shards = min(s.context_shards, plan.merged_files(s, True))
    assert sum(c.tasks for c in costs) == s.ranks + s.buckets + shards + len(plan.FIXED_TASKS)
    assert [c.stage for c in costs if c.tasks == 1 and c.pool == "one"] == list(plan.FIXED_TASKS)
    assert f"{s.ranks + s.buckets + shards + 4:,} task instances = {s.ranks:,} ranks" in plan.render(s)


@pytest.mark.parametrize("s", SCENARIOS)
@pytest.mark.parametrize("bucketed", [True, False])
def test_every_stage_that_writes_token_files_writes_the_dataset_once(s, bucketed: bool) -> None:
    tokens = s.tokens * (s.token_bytes + s.save_loss)
    assert s.dataset_bytes == pytest.approx(tokens + 8 * s.tokens / s.doc_tokens)
    for cost in (plan.tokenize_cost(s, bucketed), plan.merge_cost(s, bucketed), plan.context_cost(s, bucketed)):
        assert cost.tasks * cost.upload == pytest.approx(s.dataset_bytes), cost.stage  # shards divide the files
    merge = plan.merge_cost(s, bucketed)
    metadata = s.ranks * plan.rank_files(s, bucketed) * (s.marker_bytes + s.manifest_bytes)
    assert merge.tasks * merge.read == pytest.approx(s.dataset_bytes + merge.tasks * metadata)


def test_interleave_merge_holds_16_bytes_a_document_and_the_whole_dataset() -> None:
    s = DEFAULT
    merge = plan.merge_cost(s, False)
    arrays = merge.ram - s.merge_rss_mb * plan.MB - s.ranks * s.entries_ram_bytes
    assert arrays == pytest.approx(16 * s.docs)
    assert s.docs == pytest.approx(37.5e9) and arrays == pytest.approx(600e9)  # the 15 T-token plan
    assert merge.disk == pytest.approx(s.dataset_bytes * (1 + 1 / math.ceil(s.tokens / s.max_tokens_per_file)))


def test_a_bucket_needs_its_share_of_memory_and_disk() -> None:
    one, two = replace(DEFAULT, ranks=1), replace(DEFAULT, ranks=1, buckets=2 * DEFAULT.buckets)
    per_doc = [
        plan.merge_cost(s, True).ram - s.merge_rss_mb * plan.MB - s.buckets * s.entries_ram_bytes for s in (one, two)
    ]
    assert per_doc[0] == pytest.approx(2 * per_doc[1]) == pytest.approx(18 * DEFAULT.docs / DEFAULT.buckets)
    assert plan.merge_cost(one, True).disk == pytest.approx(2 * plan.merge_cost(two, True).disk)


@pytest.mark.parametrize("s", SCENARIOS)
@pytest.mark.parametrize("bucketed", [True, False])
def test_more_workers_never_make_a_build_slower(s, bucketed: bool) -> None:
    walls = [plan.wall_seconds(s, bucketed, 2**k)["total"] for k in range(14)]
    assert all(later <= earlier for earlier, later in pairwise(walls))
    stages = plan.wall_seconds(s, bucketed, s.workers)
    assert stages.pop("total") == pytest.approx(sum(stages.values()))


def test_uploads_count_the_requests_storage_makes() -> None:
    s = DEFAULT
    assert plan.upload_requests(s, 1e6) == 1  # below two parts: one PUT
    for size in (1e9, 3e10, 2e12):
        assert plan.upload_requests(s, size) == math.ceil(size / part_size(int(size))) + 2
        assert plan.upload_requests(s, size) < 10_000
    assert plan.upload_requests(replace(s, min_part_mib=64), 1e9) == math.ceil(1e9 / (64 << 20)) + 2
    assert [plan.list_pages(n) for n in (0, 1000, 1001, 12_582_912)] == [1, 1, 2, 12_583]


def test_the_proposed_changes_relieve_what_they_claim() -> None:
    s = DEFAULT
    assert plan.publish_cost(replace(s, distributed_verify=True), True).seconds(s) < plan.publish_cost(s, True).seconds(
        s
    )
    spread = plan.request_rates(replace(s, bucket_prefixes=True), s.workers)["PUT/s"][0]
    assert spread < plan.request_rates(s, s.workers)["PUT/s"][0]
    fewer = plan.tokenize_cost(replace(s, min_part_mib=64), True).puts
    assert fewer < plan.tokenize_cost(s, True).puts


def test_every_field_is_a_flag_and_the_report_is_written_between_markers(tmp_path) -> None:
    for f in fields(plan.Scenario):
        flag, value = "--" + f.name.replace("_", "-"), getattr(DEFAULT, f.name)
        argv = [flag] if value is False else [flag, str(value)]
        assert plan.parse_args(argv)[0] == replace(DEFAULT, **{f.name: value or True}), flag
    argv = ["--tokenize-mb-s", "36", "--bucket-prefixes", "--ranks", "2048", "--out", str(tmp_path / "x.md")]
    assert plan.parse_args(argv) == (
        replace(DEFAULT, tokenize_mb_s=36, bucket_prefixes=True, ranks=2048),
        tmp_path / "x.md",
    )
    doc = tmp_path / "doc.md"
    doc.write_text(f"# prose\n{plan.BEGIN}\nstale\n{plan.END}\nmore prose\n")
    plan.write("fresh\n", doc)
    assert doc.read_text() == f"# prose\n{plan.BEGIN}\nfresh\n{plan.END}\nmore prose\n"


def test_the_report_has_its_sections_and_a_row_a_worker_count() -> None:
    report = plan.render(DEFAULT)
    for heading in (
        "### 15 T tokens",
        "#### S3 requests and bytes, whole stage",
        "#### Airflow",
        "#### Wall time",
        "#### Limits, the closest first",
        "#### What the proposed changes buy",
        "#### Inputs",
    ):
        assert heading in report
    for workers in DEFAULT.worker_counts():
        assert f"\n| {workers:,} | {workers * DEFAULT.concurrency:,} |" in report
    assert "| merge (interleave, one task) | 1 |" in report
    assert plan.render(DEFAULT) == report  # deterministic


def test_docs_show_what_the_script_computes() -> None:
    text = (ROOT / "docs" / "scaling.md").read_text()
    generated = text.split(plan.BEGIN, 1)[1].split(plan.END, 1)[0]
    assert generated == "\n" + plan.render(DEFAULT), (
        "regenerate: .venv/bin/python bench/scale_plan.py --out docs/scaling.md"
    )
