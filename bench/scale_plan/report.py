"""The capacity plan as a Markdown report, and its command line (``python -m bench.scale_plan``)."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

from bench import scale_plan
from bench.scale_plan.limits import Limit, limits
from bench.scale_plan.model import (
    FIXED_TASKS,
    GB,
    MB,
    TB,
    Scenario,
    list_pages,
    merge_cost,
    plan_readings,
    rank_folder_keys,
    request_rates,
    stages,
    wall_seconds,
)
from tokenization.storage.files import MIB, MIN_PART_SIZE, TRANSFER_STREAMS

BEGIN = "<!-- scale_plan.py: generated from here -->"
END = "<!-- scale_plan.py: generated up to here -->"


def human(x: float, unit: str = "") -> str:
    """A figure for people: seconds as s, min or h; bytes as kB ... TB; counts and rates as 1.2 k, 3.4 M ..."""
    if unit == "s":
        return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min" if x < 7200 else f"{x / 3600:.1f} h"
    suffix = {"bytes": "B", "/s": "/s"}.get(unit, "")
    for size, prefix in ((1e15, "P"), (TB, "T"), (GB, "G"), (MB, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g} {prefix}{suffix}"
    return f"{x:.3g} {suffix}".strip()


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, ["---"] * len(header), *rows])


def render(s: Scenario) -> str:
    """The report, in Markdown."""
    w = s.workers
    costs = stages(s, True, w)
    shards = costs["context_shuffle"].tasks
    interleave = merge_cost(s, False)
    keys = rank_folder_keys(s, True)
    sections = [
        f"### {human(s.tokens)} tokens: {human(s.docs)} documents, {human(s.dataset_bytes, 'bytes')} of token files",
        "",
        f"{s.ranks:,} ranks, {s.buckets:,} buckets, {shards:,} context shards; {w} workers x {s.concurrency} slots "
        f"(a slot is 2 cores), merge pool {s.merge_slots} slots; rank files "
        f"{'under a prefix a bucket' if s.bucket_prefixes else 'in one folder'}. Per task, on {w} workers:",
        "",
        table(
            ["stage", "tasks", "time a task", "compute", "S3 bytes", "S3 requests", "peak RAM", "local disk"],
            [
                [
                    c.stage,
                    f"{c.tasks:,}",
                    human(c.seconds(s), "s"),
                    human(c.compute_s, "s"),
                    human(c.transfer_s(s), "s"),
                    human(c.requests_s(s), "s"),
                    human(c.ram, "bytes"),
                    human(c.disk, "bytes"),
                ]
                for c in [*costs.values(), interleave]
            ],
        ),
        "",
        "#### S3 requests and bytes, whole stage",
        "",
        table(
            ["stage", "GET", "PUT + parts", "LIST pages", "read", "written"],
            [
                [
                    c.stage,
                    human(c.tasks * c.gets),
                    human(c.tasks * c.puts),
                    human(c.tasks * c.lists),
                    human(c.tasks * c.read, "bytes"),
                    human(c.tasks * c.upload, "bytes"),
                ]
                for c in [*costs.values(), interleave]
            ],
        ),
        "",
        f"The ranks folder holds {human(keys)} objects ({s.ranks:,} ranks x {s.buckets:,} buckets x {s.families} "
        f"files): one listing of it is {human(list_pages(keys))} LIST pages.",
        "",
        "#### Airflow",
        "",
        table(
            ["stage", "task instances", "XCom a task", "XCom, stage"],
            [
                [c.stage, f"{c.tasks:,}", human(c.xcom, "bytes"), human(c.tasks * c.xcom, "bytes")]
                for c in costs.values()
            ],
        ),
        "",
        f"{s.ranks + s.buckets + shards + len(FIXED_TASKS):,} task instances = {s.ranks:,} ranks + {s.buckets:,} "
        f"buckets + {shards:,} context shards + {len(FIXED_TASKS)} ({', '.join(FIXED_TASKS)}). The sensor starts "
        "once every rank is done or failed, so it pokes once, and again every "
        f"{s.poke_s:.0f} s only while a failed rank is retried. max_map_length needed: "
        f"{max(s.ranks, s.buckets, shards):,} (set: "
        f"{s.max_map_length:,}).",
        "",
        "#### The plan's reading of the inputs, on S3 and on a shared file system",
        "",
        plan_table(s),
        "",
        "#### Wall time",
        "",
        wall_table(s),
        "",
        "#### Limits, the closest first",
        "",
        limits_table(s),
        "",
        f"#### What each change buys, one on top of the other, on {w} workers",
        "",
        changes_table(s),
        "",
        "#### Inputs",
        "",
        inputs_table(s),
    ]
    return "\n".join(sections) + "\n"


def plan_table(s: Scenario) -> str:
    """What the plan reads before any rank starts, and its time (the wall time table's plan is S3's); and what each
    rank hashes before it looks its files up in the cache."""
    rows = [
        [
            r.inputs,
            human(r.listed),
            human(r.hashed),
            human(r.bytes_hashed, "bytes"),
            f"**{human(r.seconds, 's')}**",
            human(r.rank_seconds, "s"),
        ]
        for r in plan_readings(s)
    ]
    note = (
        "On S3 an object's ETag identifies its bytes: the plan lists them. On a file system the plan recognises an "
        "unchanged file from its stat, as an earlier night recorded it beside the file's sha256 (git's index), and "
        "reads no file's bytes: each rank hashes its new and changed files before it looks them up in the cache, on a "
        f"thread a core of its slot ({s.slot_cores:g}), within its share of its worker's network "
        f"({s.nic_gbit:g} Gbit/s over {s.concurrency} slots), and remembers them for the next night; it then reads "
        "them again to tokenize them (a miss), from the page cache when they fit. A build without a cache hashes none."
    )
    header = ["inputs", "files listed", "files hashed, by the ranks", "bytes hashed", "plan", "a rank's hashing"]
    return table(header, rows) + "\n\n" + note


def wall_table(s: Scenario) -> str:
    """Each stage's wall time for each worker count, the interleave build's total beside the bucketed one, and the
    busiest S3 prefix."""
    rows = []
    for w in s.worker_counts():
        walls, rates = wall_seconds(s, True, w), request_rates(s, w)
        rows.append(
            [
                f"{w:,}",
                f"{w * s.concurrency:,}",
                *(human(walls[name], "s") for name in stages(s, True, w)),
                f"**{human(walls['total'], 's')}**",
                human(wall_seconds(s, False, w)["total"], "s"),
                *(f"{rate:,.0f} ({stage})" for rate, stage in rates.values()),
            ]
        )
    labels = [c.stage for c in stages(s, True, s.workers).values()]
    header = ["workers", "slots", *labels, "total", "total, interleave", "PUT/s a prefix", "GET/s a prefix"]
    return table(header, rows)


def limits_table(s: Scenario) -> str:
    """The limits, the one the plan uses most of first; what the plan has already broken is in bold."""
    rows = sorted(((limit.value_at(s, s.workers), limit) for limit in limits(s)), key=lambda r: -r[1].used(r[0]))
    return table(
        ["limit", "this plan", "limit", "used", "breaks at", "what to do"],
        [
            [
                limit.name,
                human(value, limit.unit),
                human(limit.limit, limit.unit),
                f"**{limit.used(value):.0%}**" if limit.used(value) > 1 else f"{limit.used(value):.0%}",
                breaks_at(limit, s),
                limit.fix,
            ]
            for value, limit in rows
        ],
    )


def breaks_at(limit: Limit, s: Scenario) -> str:
    """Where the plan crosses the limit: the smallest power-of-two worker count that does, or, for what grows in
    proportion to its driver, the driver scaled by what the plan leaves."""
    if limit.grows_with == "workers":
        workers = limit.breaking_workers(s)
        return f"{workers:,} workers" if workers else "never"
    room = limit.room(s)
    if limit.grows_with == "tokens":
        return f"{human(s.tokens * room)} tokens"
    return f"{limit.grows_with} x {room:.2g}"


CHANGES = (  # from the code as the first plan measured it, one change on top of the other
    (
        "before: 8 MiB parts, one stream a file, publish reads every byte",
        {"min_part_mib": 8, "streams": 1, "distributed_verify": False, "bucket_prefixes": False},
    ),
    ("parts of 64 MiB at least (storage.MIN_PART_SIZE)", {"min_part_mib": MIN_PART_SIZE / MIB}),
    ("each context task verifies its own files", {"distributed_verify": True}),
    (f"{TRANSFER_STREAMS} streams a file (storage.TRANSFER_STREAMS)", {"streams": TRANSFER_STREAMS}),
    ("rank files under a prefix a bucket (names.bucket_folder)", {"bucket_prefixes": True}),
)


def changes_table(s: Scenario) -> str:
    """The build's wall time and the limits it still breaks (the interleave merge's aside) as each change is added
    to the ones before, from the code as it was."""
    rows, changed = [], s
    for name, change in CHANGES:
        changed = replace(changed, **change)
        walls = wall_seconds(changed, True, s.workers)
        broken = [
            limit.name
            for limit in limits(changed)
            if not limit.name.startswith("interleave") and limit.used(limit.value_at(changed, s.workers)) > 1
        ]
        put_rate, put_stage = request_rates(changed, s.workers)["PUT/s"]
        rows.append(
            [
                name,
                f"**{human(walls['total'], 's')}**",
                human(walls["publish"], "s"),
                f"{put_rate:,.0f} ({put_stage})",
                "; ".join(broken) or "none",
            ]
        )
    return table(["change", "build", "publish", "PUT/s a prefix", "limits still broken"], rows)


def inputs_table(s: Scenario) -> str:
    """The measured and assumed inputs with their sources, for the document that explains the plan."""
    return table(
        ["input", "value", "source"],
        [
            [f"`--{f.name.replace('_', '-')}`: {f.metadata['help']}", f"{getattr(s, f.name):g}", f.metadata["source"]]
            for f in fields(s)
            if f.metadata["source"]
        ],
    )


def write(report: str, path: Path, begin: str = BEGIN, end: str = END) -> None:
    """Write ``report`` to ``path``: between the markers ``begin`` and ``end`` when it has them, else the whole
    file."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        report = f"{head}{begin}\n{report}{end}{rest.split(end, 1)[1]}"
    path.write_text(report)


def parse_args(argv: list[str] | None = None) -> tuple[Scenario, Path | None]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_plan",
        description=scale_plan.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for f in fields(Scenario):
        flag = "--" + f.name.replace("_", "-")
        source = f" [{f.metadata['source']}]" if f.metadata["source"] else ""
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            parser.add_argument(flag, type=kind, default=f.default, help=f"{f.metadata['help']}{source} (%(default)s)")
    parser.add_argument("--out", type=Path, help="write the report here (between the markers, if the file has them)")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    return Scenario(**args), out


def main(argv: list[str] | None = None) -> None:
    scenario, out = parse_args(argv)
    report = render(scenario)
    if out:
        write(report, out)
    print(report, end="")
