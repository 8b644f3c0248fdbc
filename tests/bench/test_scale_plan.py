"""The capacity plan's projection (bench/scale_plan/) is arithmetically consistent, and docs/scaling.md shows what
the script computes today: a plan whose numbers drift from its model is worse than none."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from itertools import pairwise
from typing import Any

import pytest

from bench.scale_plan import model, report
from tests.support.paths import ROOT
from tokenization.storage.files import part_size

DEFAULT = model.Scenario()
SCENARIOS = [
    DEFAULT,
    replace(DEFAULT, ranks=4096, buckets=1024, context_shards=1024, merge_slots=256),
    replace(DEFAULT, tokens=3e11, ranks=64, buckets=16, context_shards=16, merge_slots=4, save_loss=True),
    replace(DEFAULT, bucket_prefixes=True, distributed_verify=True, min_part_mib=64, concurrency=2),
]


@pytest.mark.parametrize("s", SCENARIOS)
def test_task_instances_are_ranks_buckets_shards_and_the_fixed_tasks(s) -> None:
    costs = model.stages(s, True, s.workers)
    shards = min(s.context_shards, model.merged_files(s, True))
    assert sum(c.tasks for c in costs.values()) == s.ranks + s.buckets + shards + len(model.FIXED_TASKS)
    assert [name for name, c in costs.items() if c.tasks == 1 and c.pool == "one"] == list(model.FIXED_TASKS)
    assert f"{s.ranks + s.buckets + shards + 4:,} task instances = {s.ranks:,} ranks" in report.render(s)


@pytest.mark.parametrize("s", SCENARIOS)
@pytest.mark.parametrize("bucketed", [True, False])
def test_every_stage_that_writes_token_files_writes_the_dataset_once(s, bucketed: bool) -> None:
    tokens = s.tokens * (s.token_bytes + s.save_loss)
    assert s.dataset_bytes == pytest.approx(tokens + 8 * s.tokens / s.doc_tokens)
    for cost in (model.tokenize_cost(s, bucketed), model.merge_cost(s, bucketed), model.context_cost(s, bucketed)):
        cached = 2 if cost.stage == "tokenize" and s.cache else 1  # a rank also stores its files' tokens in the cache
        assert cost.tasks * cost.upload == pytest.approx(cached * s.dataset_bytes), cost.stage
    merge = model.merge_cost(s, bucketed)
    metadata = s.ranks * model.rank_files(s, bucketed) * (s.marker_bytes + s.manifest_bytes)
    assert merge.tasks * merge.read == pytest.approx(s.dataset_bytes + merge.tasks * metadata)


def test_interleave_merge_holds_16_bytes_a_document_and_the_whole_dataset() -> None:
    s = DEFAULT
    merge = model.merge_cost(s, False)
    arrays = merge.ram - s.merge_rss_mb * model.MB - s.ranks * s.entries_ram_bytes
    assert arrays == pytest.approx(16 * s.docs)
    assert s.docs == pytest.approx(37.5e9) and arrays == pytest.approx(600e9)  # the 15 T-token plan
    assert merge.disk == pytest.approx(s.dataset_bytes * (1 + 1 / math.ceil(s.tokens / s.max_tokens_per_file)))


def test_a_bucket_needs_its_share_of_memory_and_disk() -> None:
    one, two = replace(DEFAULT, ranks=1), replace(DEFAULT, ranks=1, buckets=2 * DEFAULT.buckets)
    per_doc = [
        model.merge_cost(s, True).ram
        - s.merge_rss_mb * model.MB
        - s.entries_ram_bytes  # the one rank's entry of this bucket, kept
        - s.buckets * s.manifest_ram_bytes  # its manifest, parsed
        for s in (one, two)
    ]
    assert per_doc[0] == pytest.approx(2 * per_doc[1]) == pytest.approx(18 * DEFAULT.docs / DEFAULT.buckets)
    assert model.merge_cost(one, True).disk == pytest.approx(2 * model.merge_cost(two, True).disk)


@pytest.mark.parametrize("s", SCENARIOS)
@pytest.mark.parametrize("bucketed", [True, False])
def test_more_workers_never_make_a_build_slower(s, bucketed: bool) -> None:
    walls = [model.wall_seconds(s, bucketed, 2**k)["total"] for k in range(14)]
    assert all(later <= earlier for earlier, later in pairwise(walls))
    stages = model.wall_seconds(s, bucketed, s.workers)
    assert stages.pop("total") == pytest.approx(sum(stages.values()))


def test_uploads_count_the_requests_storage_makes() -> None:
    s = DEFAULT
    assert model.upload_requests(s, 1e6) == 1  # below two parts: one PUT
    for size in (1e9, 3e10, 2e12):
        assert model.upload_requests(s, size) == math.ceil(size / part_size(int(size))) + 2
        assert model.upload_requests(s, size) < 10_000
    assert model.upload_requests(replace(s, min_part_mib=8), 1e9) == math.ceil(1e9 / (8 << 20)) + 2
    assert [model.list_pages(n) for n in (0, 1000, 1001, 12_582_912)] == [1, 1, 2, 12_583]


def test_each_change_relieves_what_it_claims() -> None:
    s = DEFAULT
    assert s.distributed_verify and s.min_part_mib == 64 and s.streams > 1 and s.bucket_prefixes  # today's code
    reading = model.publish_cost(replace(s, distributed_verify=False), True).seconds(s)
    assert model.publish_cost(s, True).seconds(s) < reading / 100
    one_folder = replace(s, bucket_prefixes=False)
    assert model.request_rates(s, s.workers)["GET/s"][0] < model.request_rates(one_folder, s.workers)["GET/s"][0]
    tokenize = model.tokenize_cost(s, True)  # a confirmation renews the lease at most once a tenth of a TTL
    assert tokenize.lease_puts <= 3 + tokenize.seconds(s) / 6  # not one a placed file
    small = SCENARIOS[1]  # 7 MB bucket files: a rank places 32 at once
    assert model.tokenize_cost(small, True).waits < small.buckets * small.families / 10
    assert model.sensor_cost(s, True).ram < model.sensor_cost(one_folder, True).ram / 10
    assert model.merge_cost(s, True).lists < model.merge_cost(one_folder, True).lists / 100
    assert model.tokenize_cost(s, True).puts < model.tokenize_cost(replace(s, min_part_mib=8), True).puts
    slow = replace(s, s3_mb_s=20)  # 8 connections move less than a slot's share of the network: streams add up
    one_stream, c = replace(slow, streams=1), s.concurrency
    many = slow.download_bytes_s(c)
    assert many == pytest.approx(one_stream.download_bytes_s(c) * s.streams * s.streams_efficiency)  # as measured
    assert model.merge_cost(slow, True).transfer_s(slow) < model.merge_cost(one_stream, True).transfer_s(one_stream)
    assert s.streams * s.s3_mb_s * s.streams_efficiency * model.MB > s.network_share(s.concurrency)  # the plan's


def test_a_stage_lasts_at_least_its_requests_over_what_the_store_answers_a_second() -> None:
    s = replace(SCENARIOS[2], store_requests_s=1.0)  # a store that answers a request a second
    merge = model.merge_cost(s, True)
    assert merge.requests == merge.gets + merge.lists + merge.puts > merge.waits  # records read many at once
    walls = [model.stage_seconds(x, merge, x.workers) for x in (s, replace(s, store_requests_s=math.inf))]
    assert walls[0] == pytest.approx(merge.tasks * merge.requests) and walls[0] > walls[1]
    cpu = replace(s, request_cpu_s=2 * s.request_cpu_s)  # a request's CPU, at a slot's share of one core
    assert merge.requests_s(cpu) - merge.requests_s(s) == pytest.approx(merge.requests * s.request_cpu_s)
    half = replace(s, slot_cores=0.5)
    assert merge.requests_s(half) - merge.requests_s(s) == pytest.approx(merge.requests * s.request_cpu_s)


def test_every_field_is_a_flag_and_the_report_is_written_between_markers(tmp_path) -> None:
    for f in fields(model.Scenario):
        name, value = f.name.replace("_", "-"), getattr(DEFAULT, f.name)
        if isinstance(value, bool):  # a switch, turned the other way
            argv, expected = [f"--no-{name}" if value else f"--{name}"], not value
        else:
            argv, expected = [f"--{name}", str(value)], value
        changed: dict[str, Any] = {f.name: expected}
        assert report.parse_args(argv)[0] == replace(DEFAULT, **changed), name
    argv = ["--tokenize-mb-s", "36", "--bucket-prefixes", "--ranks", "2048", "--out", str(tmp_path / "x.md")]
    assert report.parse_args(argv) == (
        replace(DEFAULT, tokenize_mb_s=36, bucket_prefixes=True, ranks=2048),
        tmp_path / "x.md",
    )
    doc = tmp_path / "doc.md"
    doc.write_text(f"# prose\n{report.BEGIN}\nstale\n{report.END}\nmore prose\n")
    report.write("fresh\n", doc)
    assert doc.read_text() == f"# prose\n{report.BEGIN}\nfresh\n{report.END}\nmore prose\n"


def test_the_report_has_its_sections_and_a_row_a_worker_count() -> None:
    text = report.render(DEFAULT)
    for heading in (
        "### 15 T tokens",
        "#### S3 requests and bytes, whole stage",
        "#### Airflow",
        "#### Wall time",
        "#### Limits, the closest first",
        "#### What each change buys",
        "#### Inputs",
    ):
        assert heading in text
    for workers in DEFAULT.worker_counts():
        assert f"\n| {workers:,} | {workers * DEFAULT.concurrency:,} |" in text
    assert "| merge (interleave, one task) | 1 |" in text
    assert report.render(DEFAULT) == text  # deterministic


def test_the_plan_counts_its_reading_of_local_and_s3_inputs() -> None:
    """Issue 52, 7: the plan's time at 15 T tokens with its inputs on S3 (listed: ETags) and on a shared file system
    (each file's stat; it reads no byte), and each rank's hashing of its share of the new or changed files (on its
    slot's cores, within its share of its worker's network): the first night was 11.1 h in the plan's one task."""
    s = DEFAULT
    s3, first, following = model.plan_readings(s)
    files = s.text_bytes / (s.input_file_gb * model.GB)
    assert (s3.listed, s3.hashed, s3.bytes_hashed, s3.seconds) == (files, 0, 0, model.plan_cost(s).seconds(s))
    stats = files * (2 * s.fs_stat_s + s.plan_file_cpu_s)
    network = s.nic_gbit * 1e9 / 8 / s.concurrency  # a slot's share, below its 2 cores' sha256
    assert first.hashed == files and first.bytes_hashed == s.text_bytes
    assert first.seconds == following.seconds == pytest.approx(stats + s.task_overhead_s)
    assert first.rank_seconds == pytest.approx(s.text_bytes / s.ranks / network)
    assert following.hashed == pytest.approx(files * s.changed_share)
    assert following.rank_seconds == pytest.approx(s.changed_share * first.rank_seconds)
    assert "| file system, the first night | 50 k | 50 k | 50 TB | **56 s** | 5.2 min |" in report.render(s)


def test_docs_show_what_the_script_computes() -> None:
    text = (ROOT / "docs" / "scaling.md").read_text()
    generated = text.split(report.BEGIN, 1)[1].split(report.END, 1)[0]
    assert generated == "\n" + report.render(DEFAULT), (
        "regenerate: .venv/bin/python -m bench.scale_plan --out docs/scaling.md"
    )


def results_table(title: str) -> tuple[str, dict[str, dict[str, str]]]:
    """The bench/RESULTS.md table whose title starts with ``title``: its whole title, and its rows by their first
    two cells (stage, input)."""
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    assert f"\n{title}" in text, f"bench/RESULTS.md has no table '{title}...'"
    rest, table = text.split(f"\n{title}", 1)[1].split("\n\n", 2)[:2]
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    return title + rest, {f"{row[0]}, {row[1]}": dict(zip(header, row, strict=True)) for row in rows}


def test_measured_rates_and_memory_are_the_results_rows_they_name() -> None:
    """Each stage's rate and peak RSS are the figures of the bench/RESULTS.md row its source names, of the run the
    plan cites; tokenize's is one rank on 4 GB of generated web text, not a corpus repeated (which warms the
    encoder's caches)."""
    columns = {"_mb_s": "MB/s", "_rss_mb": "peak RSS (MB)"}
    checked = []
    for f in fields(model.Scenario):
        source = f.metadata["source"]
        if source.startswith((model.SCALE_TABLE, model.MEMORY_TABLE)):
            title_at, label = source.split("'", 2)[1], source.split(", row ", 1)[1]
            rows = results_table(title_at)[1]
            column = next(header for suffix, header in columns.items() if f.name.endswith(suffix))
            assert getattr(DEFAULT, f.name) == float(rows[label][column]), f.name
            checked.append(f.name)
    assert checked == [f"{stage}{figure}" for stage in ("tokenize", "merge", "context") for figure in columns]
    assert f"(one run each, {model.SCALE_RUN})" in results_table("Cost as the work grows")[0]
    assert model.TOKENIZE_ROW.endswith("row tokenize + doc shuffle, gpt2, 4.00 GB of text")
