"""The limits the capacity plan is held against (S3's request rates, Airflow's, a worker's RAM and disk, the
nightly deadline), each with what drives it and what to do about it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.scale_plan.model import (
    GB,
    TB,
    Scenario,
    merge_cost,
    merged_files,
    publish_cost,
    request_rates,
    stages,
    ti_starts_per_s,
    tokenize_cost,
    wall_seconds,
)
from tokenization.storage.files import MIB

S3_PUTS_PER_S = 3_500  # PUT/COPY/POST/DELETE a second per partitioned prefix (S3 performance guidelines)
S3_GETS_PER_S = 5_500  # GET/HEAD a second per partitioned prefix
XCOM_GUIDELINE = 64_000  # bytes a task instance's XCom should stay under (Airflow: "keep them to KBs")
SMALL_OBJECT = 8 * MIB  # a rank bucket file below this costs a request for too few bytes to reach a stream's rate
WORKER_COUNTS = [2**k for k in range(17)]  # where a limit that grows with the fleet is looked for


@dataclass(frozen=True)
class Limit:
    """A limit the plan is held against: its value on a number of workers, the limit, what drives it and what to
    do about it. A ``floor`` must stay above its limit; everything else below."""

    name: str
    unit: str  # "bytes", "s", "/s" or "" (a plain number)
    limit: float
    grows_with: str  # "workers", "tokens", or the setting that drives it
    fix: str
    value_at: Callable[[Scenario, int], float]
    floor: bool = False

    def used(self, value: float) -> float:
        """How much of the limit the plan uses: above 1, it is broken."""
        return self.limit / value if self.floor else value / self.limit

    def breaking_workers(self, s: Scenario) -> int | None:
        """For a limit that grows with the fleet: the smallest power-of-two worker count that crosses it."""
        return next((w for w in WORKER_COUNTS if self.used(self.value_at(s, w)) > 1), None)

    def room(self, s: Scenario) -> float:
        """For a limit that grows in proportion to its driver: by how much the driver may grow before it breaks."""
        return 1 / self.used(self.value_at(s, s.workers))


def busiest(attr: str) -> Callable[[Scenario, int], float]:
    """A worker's need when every slot runs the stage that needs the most ``attr`` (RAM or disk) a task."""
    return lambda s, w: s.concurrency * max(getattr(c, attr) for c in stages(s, True, w).values() if c.pool != "one")


def merge_metadata_share(s: Scenario, w: int) -> float:
    """A bucket merge's time spent listing and reading markers and manifests, over its time moving bytes."""
    merge = merge_cost(s, True)
    return merge.requests_s(s) / (merge.compute_s + merge.transfer_s(s))


def limits(s: Scenario) -> list[Limit]:
    """Everything the plan meets as the corpus or the fleet grows."""
    deadline = s.deadline_h * 3600
    return [
        Limit(
            "interleave merge: RAM of its one task",
            "bytes",
            s.large_ram_gb * GB,
            "tokens",
            "merge_mode bucketed",
            lambda s, w: merge_cost(s, False).ram,
        ),
        Limit(
            "interleave merge: local disk of its one task",
            "bytes",
            s.large_disk_tb * TB,
            "tokens",
            "merge_mode bucketed",
            lambda s, w: merge_cost(s, False).disk,
        ),
        Limit(
            "interleave build: wall time",
            "s",
            deadline,
            "tokens",
            "merge_mode bucketed",
            lambda s, w: wall_seconds(s, False, w)["total"],
        ),
        Limit(
            "bucketed build: wall time",
            "s",
            deadline,
            "tokens",
            "more workers, until publish (one task) is most of it",
            lambda s, w: wall_seconds(s, True, w)["total"],
        ),
        Limit(
            "publish: one task (records and books; without the context tasks' checks, every byte)",
            "s",
            deadline,
            "tokens",
            "keep the context tasks' own checks (distributed_verify)",
            lambda s, w: publish_cost(s, True).seconds(s),
        ),
        Limit(
            "worker RAM: busiest stage x concurrency",
            "bytes",
            s.worker_ram_gb * GB,
            "ranks x buckets",
            "fewer ranks x buckets: a bucket merge reads every rank's manifest, a batch at a time",
            busiest("ram"),
        ),
        Limit(
            "publish: RAM (a batch of rank manifests, parsed)",
            "bytes",
            s.worker_ram_gb * GB / s.concurrency,
            "ranks x buckets",
            "fewer ranks x buckets: a batch of manifests holds every bucket's entries",
            lambda s, w: publish_cost(s, True).ram,
        ),
        Limit(
            "worker disk: busiest stage x concurrency",
            "bytes",
            s.worker_disk_gb * GB,
            "tokens",
            "more ranks and buckets, or fewer slots a worker",
            busiest("disk"),
        ),
        Limit(
            "S3 PUT/s a prefix, busiest stage",
            "/s",
            S3_PUTS_PER_S,
            "workers",
            "larger parts (min_part_mib); fewer merge pool slots",
            lambda s, w: request_rates(s, w)["PUT/s"][0],
        ),
        Limit(
            "S3 GET/s a prefix, busiest stage",
            "/s",
            S3_GETS_PER_S,
            "workers",
            "fewer merge pool slots",
            lambda s, w: request_rates(s, w)["GET/s"][0],
        ),
        Limit(
            "bucket merge: metadata time / data time",
            "",
            1.0,
            "ranks x buckets",
            "fewer ranks x buckets: each bucket task reads every rank's marker and manifest",
            merge_metadata_share,
        ),
        Limit(
            "XCom of a tokenize task (its file names)",
            "bytes",
            XCOM_GUIDELINE,
            "buckets",
            "return a count: the marker lists the files",
            lambda s, w: tokenize_cost(s, True).xcom,
        ),
        Limit(
            "max_map_length: largest mapped task",
            "",
            s.max_map_length,
            "ranks or buckets",
            "raise AIRFLOW__CORE__MAX_MAP_LENGTH on every component",
            lambda s, w: max(s.ranks, s.buckets, min(s.context_shards, merged_files(s, True))),
        ),
        Limit(
            "scheduler: task instances started a second",
            "/s",
            s.scheduler_tis_s,
            "workers",
            "longer tasks (fewer ranks or buckets); more schedulers",
            ti_starts_per_s,
        ),
        Limit(
            f"rank bucket file (.ds), above {SMALL_OBJECT // MIB} MiB",
            "bytes",
            SMALL_OBJECT,
            "ranks x buckets",
            "fewer ranks x buckets",
            lambda s, w: s.tokens * s.token_bytes / (s.ranks * s.buckets),
            floor=True,
        ),
    ]
