"""The scale test: one bucketed build of many ranks on the real topology, measured, beside the capacity plan.

    python -m bench.scale [--ranks 64] [--buckets 16] [--copies 2] [--out docs/scaling.md]

It starts the distributed test's deployment (``harness/cluster.py``: api-server, scheduler, dag-processor, triggerer
and two Celery workers on PostgreSQL and Redis; S3 served by SeaweedFS, or moto where ``weed`` is not installed,
behind a proxy that answers some requests with 503 SlowDown, none here unless ``--fault-every`` asks, caps each
connection's bandwidth and delays each request), with both workers on both queues, ``--slots`` task slots each and
a merge pool of as many slots as the two have, so that bucket merges spread over them. It measures what the store
answers, then runs ``tokenize_corpus`` once with ``merge_mode: bucketed`` on the shared corpora, dealt into one
gzipped input file a rank, with GPT-2 read from S3, and reports:

* wall time, of the run and of each stage (a stage lasts from its first task's start to its last one's end);
* per task: duration, the part of it the stage itself took (from its manifest), worker, peak RSS (manifest);
* S3 requests by stage and kind, against what ``bench.scale_plan`` predicts for this corpus and these settings;
* the scheduler's side: task instances, the sensor's duration, XCom bytes, database commits, its CPU time.

A benchmark (~8 minutes on 2 cores), not a test: nothing asserts a figure. The raw measurements are kept
(``--measurements``), so ``--report-only`` writes the report again; ``--out docs/scaling.md`` writes it into that
page between its markers, beside the plan it checks.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, astuple, dataclass
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import fsspec
import psutil

from bench.scale_plan import model as plan
from bench.scale_plan.report import table, write
from harness.cluster import Cluster, Request, services_missing
from tokenization.formats import DS
from tokenization.output.manifest import COMPLETIONS, MANIFESTS
from tokenization.output.runs import BUILD_MANIFEST, Layout
from tokenization.stages.context_shuffle import DEFAULT_WINDOW
from tokenization.storage.files import CONCURRENT_READS, map_concurrently, open_fs

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DAG = "tokenize_corpus"
RUN_ID = "scale"
BEGIN = "<!-- scale.py: measured from here -->"
END = "<!-- scale.py: measured up to here -->"
# Both workers take both queues: tokenize and context tasks on "default", merges on "large_disk".
WORKER_NAMES = ("worker-1", "worker-2")
PUT_CLASS = ("PUT", "PART", "CREATE", "COMPLETE")
INDEX_PARAM = {"tokenize": "rank", "merge": "bucket", "context_shuffle": "shard"}  # a mapped task's map index
SETTINGS = ("ranks", "buckets", "copies", "context_window", "fault_every", "s3_bandwidth", "s3_latency", "slots")
RECORDS = (f"/{MANIFESTS}/", f"/{COMPLETIONS}/")  # small objects: a GET of one is a request's own time
PROBE = "s3://corpus/probe.json"  # the small object the store's throughput is measured on
PROBE_GETS = 400  # GETs each probing process makes


@dataclass(frozen=True)
class Corpus:
    files: int
    docs: int
    text_bytes: int


def workers(slots: int) -> dict[str, tuple[str, int]]:
    """The deployment's workers: each on both queues with ``slots`` task slots."""
    return {name: ("default,large_disk", slots) for name in WORKER_NAMES}


def deal_corpus(corpora: Path, out: Path, files: int, copies: int) -> Corpus:
    """The shared corpora that have a ``text`` field, ``copies`` times (ids made unique by the copy), documents
    dealt round-robin into ``files`` gzipped JSONL files: one input file a rank."""
    out.mkdir(parents=True)
    docs = text_bytes = 0
    with contextlib.ExitStack() as stack:
        sinks = [
            stack.enter_context(gzip.open(out / f"part-{i:05d}.jsonl.gz", "wt", encoding="utf-8", compresslevel=1))
            for i in range(files)
        ]
        for copy in range(copies):
            for path in sorted(corpora.glob("*.jsonl.gz")):
                with gzip.open(path, "rt", encoding="utf-8") as lines:
                    for line in lines:
                        record = json.loads(line)
                        if "text" not in record:
                            continue  # instruction data: prompt and response
                        record = {"id": f"{copy}/{record['id']}", "text": record["text"]}
                        sinks[docs % files].write(json.dumps(record, ensure_ascii=False) + "\n")
                        docs += 1
                        text_bytes += len(record["text"].encode())
    return Corpus(files, docs, text_bytes)


def timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def stage_windows(tis: list[dict]) -> dict[str, tuple[float, float]]:
    """Each stage's first start and last end."""
    spans = defaultdict(list)
    for ti in tis:
        if ti["start_date"] and ti["end_date"]:
            spans[ti["task_id"]].append((timestamp(ti["start_date"]), timestamp(ti["end_date"])))
    return {stage: (min(a for a, _ in s), max(b for _, b in s)) for stage, s in spans.items()}


def stage_of(request: Request, windows: dict[str, tuple[float, float]]) -> str:
    """The stage running when S3 got the request. The sensor pokes while ranks run: a listing of the completion
    markers then is its; anything else is the ranks'. Otherwise the latest stage to start wins."""
    running = [s for s in plan.STAGES if s in windows and windows[s][0] <= request.at <= windows[s][1]]
    if {"tokenize", "wait_for_shards"} <= set(running):
        return "wait_for_shards" if request.kind == "LIST" and f"/{COMPLETIONS}" in request.path else "tokenize"
    return max(running, key=lambda s: windows[s][0]) if running else "between tasks"


def model_scenario(
    corpus: Corpus, tokens: int, token_bytes: int, args: SimpleNamespace, cores: int, measured: dict[str, float]
) -> plan.Scenario:
    """The capacity plan's scenario for this very build: its corpus, settings and deployment, the simulated S3's
    bandwidth a connection, and what this run measured of its environment (``measured``: a small GET's time, the
    requests a second the store answers and a request's CPU, the ranks' tokenizer loading, a task's cost to
    Airflow).
    The model's slot is 2 cores; here both workers share one machine of ``cores``, so a mapped task's compute runs
    at that share of the measured rates (the unmapped ones, publish's verify, run alone and keep them)."""
    slots = len(WORKER_NAMES) * args.slots
    share = cores / slots / 2
    default = plan.Scenario()
    return plan.Scenario(
        tokens=tokens,
        doc_tokens=tokens / corpus.docs,
        token_bytes=token_bytes,
        text_bytes_per_token=corpus.text_bytes / tokens,
        input_file_gb=corpus.text_bytes / corpus.files / plan.GB,
        context_window=args.context_window,
        ranks=args.ranks,
        buckets=args.buckets,
        context_shards=args.buckets,
        workers=len(WORKER_NAMES),
        table_workers=str(len(WORKER_NAMES)),
        concurrency=args.slots,
        merge_slots=slots,
        s3_mb_s=args.s3_bandwidth,
        request_s=measured["request_s"],
        rank_load_s=measured["rank_load_s"],
        task_overhead_s=measured["task_overhead_s"],
        store_requests_s=measured["requests_s"],
        request_cpu_s=measured["client_cpu_s"],
        slot_cores=cores / slots,
        tokenize_mb_s=default.tokenize_mb_s * share,
        merge_mb_s=default.merge_mb_s * share,
        context_mb_s=default.context_mb_s * share,
    )


@dataclass(frozen=True)
class StoreProbe:
    """What the store's probe measured: requests a second answered, and the CPU a request cost the probing
    processes (the client: signing, parsing)."""

    requests_s: float
    client_cpu_s: float


def probe_store(options: dict, processes: int) -> StoreProbe:
    """``processes`` task processes each keep ``CONCURRENT_READS`` GETs of a small object in flight through the
    library's own S3 client. On the simulated S3, the store, the proxy and every client share this machine's cores:
    that, more than one request's time, caps a stage of thousands of requests."""
    fs, path = open_fs(PROBE, options)
    fs.pipe_file(path, b"{}" * 200)
    start = time.time() + 5  # every process ready, its client built and its first request made
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        ends, cpus = zip(*pool.map(probe, [(options, start)] * processes), strict=True)
    requests = processes * PROBE_GETS
    return StoreProbe(requests / (max(ends) - start), sum(cpus) / requests)


def probe(args: tuple[dict, float]) -> tuple[float, float]:
    """One probing process: its GETs from ``start`` on; returns when the last one was answered, and the CPU time
    they cost it."""
    options, start = args
    fs, path = open_fs(PROBE, options)
    fs.cat_file(path)
    time.sleep(max(0.0, start - time.time()))
    cpu = time.process_time()
    map_concurrently(lambda _: fs.cat_file(path), range(PROBE_GETS), workers=CONCURRENT_READS)
    return time.time(), time.process_time() - cpu


def record_get_seconds(requests: list[Request]) -> float:
    """The median time of a GET of a small record (a marker, a manifest) that was not refused: what one request
    costs on this S3, latency and handling."""
    times = [r.seconds for r in requests if r.kind == "GET" and not r.injected and any(x in r.path for x in RECORDS)]
    return statistics.median(times)


def postgres(cluster: Cluster, sql: str, *args) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=cluster.db)
    with conn, conn.cursor() as cur:
        cur.execute(sql, args)
        rows = cur.fetchall()
    conn.close()
    return rows


def commits(cluster: Cluster) -> int:
    """Transactions committed in the deployment's database so far (PostgreSQL's statistics)."""
    return postgres(cluster, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children (the scheduler forks none in 3.x, the count is cheap anyway)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def run_build(args: argparse.Namespace, work: Path) -> dict:
    """Deal the corpus, start the deployment, run the build, and gather everything the report needs."""
    corpus = deal_corpus(args.corpora, work / "input", args.ranks, args.copies)
    print(f"corpus: {corpus.docs:,} documents, {corpus.text_bytes / 1e6:.1f} MB of text in {corpus.files} files")
    cluster = Cluster(
        work / "cluster",
        fail_ranks="",
        workers=workers(args.slots),
        merge_slots=len(WORKER_NAMES) * args.slots,
        fault_every=args.fault_every or None,
        s3_bandwidth=args.s3_bandwidth * 1e6,
        s3_latency=args.s3_latency / 1000,
    )
    with cluster:
        endpoint = json.loads(cluster.env()["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"]
        s3 = fsspec.filesystem(
            "s3",
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": endpoint},
            config_kwargs={"retries": {"max_attempts": 10}},
            skip_instance_cache=True,
        )
        s3.mkdir("corpus")
        s3.put(str(work / "input") + "/", "corpus/input/", recursive=True)
        s3.put_file(str(args.tokenizer), "corpus/tokenizers/gpt2/tokenizer.json")
        options = {"s3": {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}}
        store = probe_store(options, slots := len(WORKER_NAMES) * args.slots)
        print(f"the store answers {store.requests_s:.0f} requests a second to {slots} processes")
        cluster.api("PATCH", f"/dags/{DAG}?update_mask=is_paused", {"is_paused": False})  # the cluster has no schedule
        conf = {
            "input": "s3://corpus/input",
            "tokenizer": "s3://corpus/tokenizers/gpt2/tokenizer.json",
            "eos_token": "<|endoftext|>",
            "num_ranks": args.ranks,
            "seed": 7,
            "merge_mode": "bucketed",
            "num_buckets": args.buckets,
            "context_window": args.context_window,
            "num_context_shards": args.buckets,
            "sensor_timeout": 3600,
        }
        scheduler = cluster.processes["scheduler"].pid
        before = {"commits": commits(cluster), "cpu": cpu_seconds(scheduler), "requests": len(cluster.proxy.log)}
        cluster.api("POST", f"/dags/{DAG}/dagRuns", {"logical_date": None, "dag_run_id": RUN_ID, "conf": conf})
        cluster.wait_for(lambda: finished(cluster), args.timeout, "the build to finish")
        requests = [astuple(r) for r in cluster.proxy.log[before["requests"] :]]  # not the reads below
        time.sleep(5)  # PostgreSQL publishes its statistics about once a second
        dag_run = cluster.api("GET", f"/dags/{DAG}/dagRuns/{RUN_ID}")
        tis = cluster.task_instances(DAG, RUN_ID)
        if dag_run["state"] != "success":
            raise SystemExit(f"the build failed: {[(t['task_id'], t['map_index'], t['state']) for t in tis]}")
        run_dir = f"corpus/builds/{RUN_ID}"
        s3.invalidate_cache()
        manifests = [json.loads(s3.cat_file(p)) for p in s3.find(run_dir) if f"/{MANIFESTS}/" in p]
        build = json.loads(s3.cat_file(f"{run_dir}/{BUILD_MANIFEST}"))
        ds_bytes = sum(s3.size(f"{run_dir}/{Layout.CONTEXT}/{name}") for name in build["files"] if name.endswith(DS))
        return {
            "settings": {k: getattr(args, k) for k in SETTINGS},
            "measured": datetime.now().date().isoformat(),
            "cores": os.cpu_count(),
            "s3_server": cluster.store,
            "corpus": asdict(corpus),
            "store": asdict(store),
            "run": dag_run,
            "tis": tis,
            "manifests": manifests,
            "build": build,
            "token_bytes": round(ds_bytes / build["tokens"]),
            "requests": requests,
            "commits": commits(cluster) - before["commits"],
            "scheduler_cpu": cpu_seconds(scheduler) - before["cpu"],
            "xcom": dict(
                postgres(
                    cluster,
                    "SELECT task_id, sum(octet_length(value::text)) FROM xcom WHERE run_id = %s GROUP BY task_id",
                    RUN_ID,
                )
            ),
        }


def finished(cluster: Cluster) -> bool:
    return cluster.api("GET", f"/dags/{DAG}/dagRuns/{RUN_ID}")["state"] in ("success", "failed")


def airflow_overhead(by_stage: dict[str, list[dict]], record: dict[str, list[dict]]) -> list[float]:
    """Each mapped task's duration less its stage function's seconds (its manifest's): what Airflow costs."""
    found = []
    for stage, key in INDEX_PARAM.items():
        own = {r["params"][key]: r["seconds"] for r in record[stage]}
        found += [t["duration"] - own[t["map_index"]] for t in by_stage[stage] if t["map_index"] in own]
    return found


def handoffs(by_stage: dict[str, list[dict]], slots: int) -> list[float]:
    """For each mapped task, Airflow's wait before it started: from when its slot was free (its worker's earliest
    unclaimed end of a task of its stage, the first ``slots`` tasks of a worker had theirs free) and it was queued,
    to its start. Zero for a task that found its slot free; the model's task overhead counts it too."""
    found = []
    for stage in INDEX_PARAM:
        by_worker = defaultdict(list)
        for ti in by_stage[stage]:
            by_worker[ti["hostname"]].append(ti)
        for tis in by_worker.values():
            tis.sort(key=lambda ti: ti["start_date"])
            ends = sorted(timestamp(ti["end_date"]) for ti in tis)
            for i, ti in enumerate(tis):
                free = ends[i - slots] if i >= slots else 0.0
                ready = max(free, timestamp(ti["queued_when"]))
                found.append(max(0.0, timestamp(ti["start_date"]) - ready))
    return found


def figure(measured: float, model: float | None = None) -> str:
    """``measured (model)``, counts with separators."""
    text = f"{measured:,.0f}"
    return text if model is None else f"{text} ({model:,.0f})"


def report(m: dict) -> str:
    """The measurements as Markdown, each beside the model's figure for the same build where it has one."""
    settings = {"slots": 2} | m["settings"]  # (measurements before --slots ran two a worker)
    args, corpus, build, tis = SimpleNamespace(**settings), Corpus(**m["corpus"]), m["build"], m["tis"]
    cores = m.get("cores", 2)  # (measurements before it was recorded came from this 2-core machine)
    server = m.get("s3_server", "moto")  # (and before that, from moto)
    logged = [Request(*r) for r in m["requests"]]
    by_stage = defaultdict(list)
    for ti in tis:
        by_stage[ti["task_id"]].append(ti)
    record = defaultdict(list)
    for manifest in m["manifests"]:
        if "stage" in manifest:  # a merge also keeps a manifest of each file it wrote, to resume from
            record[manifest["stage"]].append(manifest)
    loads = [r["tokenizer"]["load_seconds"] or 0.0 for r in record["tokenize"]]
    overhead = airflow_overhead(by_stage, record)
    waited = statistics.mean(handoffs(by_stage, args.slots))
    measured = {
        "request_s": record_get_seconds(logged),
        "rank_load_s": statistics.mean(loads),
        "task_overhead_s": statistics.mean(overhead) + waited,
        # (measurements before the store was probed: no ceiling, and the plan's CPU a request)
        **m.get("store", {"requests_s": math.inf, "client_cpu_s": plan.REQUEST_CPU_S}),
    }
    scenario = model_scenario(corpus, build["tokens"], m["token_bytes"], args, cores, measured)
    model = plan.stages(scenario, True, scenario.workers)
    model_walls = plan.wall_seconds(scenario, True, scenario.workers)
    windows = stage_windows(tis)
    run_wall = timestamp(m["run"]["end_date"]) - timestamp(m["run"]["start_date"])
    requests = defaultdict(Counter)
    for request in logged:
        requests[stage_of(request, windows)][request.kind if not request.injected else "injected"] += 1

    tasks_rows = []
    for stage in plan.STAGES:
        group, cost = by_stage[stage], model[stage]
        durations = [t["duration"] for t in group]
        own = [r["seconds"] for r in record.get(stage, [])]
        rss = [r["peak_rss_mb"] for r in record.get(stage, [])]
        hosts = Counter(t["hostname"] for t in group)
        model_wall = model_walls[stage]
        tasks_rows.append(
            [
                stage,
                f"{len(group):,}",
                f"{windows[stage][1] - windows[stage][0]:.0f} s ({model_wall:.0f} s)",
                f"{statistics.mean(durations):.1f} / {max(durations):.1f} s",
                f"{statistics.mean(own):.2f} / {max(own):.2f} s" if own else "–",
                f"{statistics.mean(rss):.0f} / {max(rss):.0f} MB ({cost.ram / plan.MB:.0f} MB)" if rss else "–",
                ", ".join(f"{host} {n}" for host, n in sorted(hosts.items())),
            ]
        )
    s3_rows = []
    for stage in (*plan.STAGES, "between tasks"):
        got, cost = requests.get(stage, Counter()), model.get(stage)
        tasks = cost.tasks if cost else 0
        s3_rows.append(
            [
                stage,
                figure(got["GET"], cost and tasks * cost.gets),
                figure(got["HEAD"]),
                figure(got["LIST"], cost and tasks * cost.lists),
                figure(sum(got[k] for k in PUT_CLASS), cost and tasks * cost.puts),
                figure(got["DELETE"] + got["POST"]),
                figure(got["injected"]),
            ]
        )
    total = Counter()
    for got in requests.values():
        total.update(got)
    xcom_rows = [
        [stage, figure(m["xcom"].get(stage, 0)), figure(model[stage].tasks * model[stage].xcom)]
        for stage in plan.STAGES
    ]
    fault_flag = f" --fault-every {args.fault_every}" if args.fault_every else ""
    faults = f"answers every {args.fault_every}th request with 503 SlowDown" if args.fault_every else "injects no 503"
    lines = [
        f"### {args.ranks} ranks, {args.buckets} buckets, {len(by_stage['context_shuffle'])} context shards on "
        f"{len(WORKER_NAMES)} workers",
        "",
        f"Measured {m['measured']} on one {cores}-core machine (this project's VM): `python -m bench.scale "
        f"--ranks {args.ranks} --buckets {args.buckets} --copies {args.copies} --slots {args.slots}{fault_flag}`. "
        f"The corpus: the shared corpora that have a `text` field, {args.copies} times, {corpus.docs:,} documents and "
        f"{corpus.text_bytes / 1e6:.1f} MB of "
        f"text dealt into {corpus.files} files; GPT-2, read from S3; {build['tokens']:,} tokens. Two Celery workers, "
        f"each on both queues with concurrency {args.slots}; merge pool {scenario.merge_slots} slots; S3 is {server} "
        f"behind a proxy that {faults}, caps each connection at "
        f"{args.s3_bandwidth:g} MB/s and delays each request by {args.s3_latency:g} ms. Figures in brackets are "
        f"`bench.scale_plan`'s for this very build (its scenario: this corpus, these settings, 2 workers x "
        f"{args.slots} slots, the simulated S3's bandwidth a connection, and as measured in this run a small GET's "
        f"time ({measured['request_s'] * 1000:.0f} ms, the median), the requests a second the store answers to "
        f"{scenario.merge_slots} processes at once ({measured['requests_s']:.0f}, a stage's ceiling) and the CPU a "
        f"request costs its client "
        f"({measured['client_cpu_s'] * 1000:.1f} ms), a rank's tokenizer loading "
        f"({measured['rank_load_s']:.2f} s) and a task's cost to Airflow: its time outside its stage function and "
        f"its wait for a free slot ({statistics.mean(overhead):.1f} s and {waited:.1f} s, all means); its measured "
        f"rates at {scenario.slot_cores:.2g} core a slot instead of 2, as the {scenario.merge_slots} slots share "
        "this machine).",
        "",
        f"**Wall time: {run_wall:.0f} s** for the run (the model: {model_walls['total']:.0f} s); digest "
        f"`{build['digest'][:12]}…`, verify {'passed' if build['verify']['ok'] else 'FAILED'}, "
        f"{build['conservation']['docs_out']:,} documents out of {build['conservation']['docs_in']:,} read.",
        "",
        table(
            [
                "stage",
                "tasks",
                "stage wall (model)",
                "task: mean / max",
                "its work: mean / max",
                "peak RSS: mean / max (model)",
                "tasks by worker",
            ],
            tasks_rows,
        ),
        "",
        "*Its work* is the time the stage function took (its manifest's `seconds`); the rest of a task is Airflow's "
        f"({statistics.mean(overhead):.1f} s a task on average here), and so is the wait of a task queued for a "
        f"slot that is free ({waited:.1f} s a task; the model of the 15 T plan assumes "
        f"{plan.Scenario().task_overhead_s:.0f} s for both). Peak RSS is the task process's, which Airflow forks from "
        "the Celery worker, so it includes the worker's own pages.",
        "",
        "#### S3 requests by stage: measured (model)",
        "",
        table(["stage", "GET", "HEAD", "LIST", "PUT + parts", "DELETE and other", "503s injected"], s3_rows),
        "",
        f"{sum(total.values()):,} requests in all, {total['injected']:,} of them answered 503 (and retried). A "
        "request belongs to the stage running when it arrived; the model has no HEAD requests (s3fs's existence and "
        "size checks) and no DELETEs (staging and lease clean-up).",
        "",
        "#### Scheduler: measured (model)",
        "",
        table(["stage", "XCom bytes", "model"], xcom_rows),
        "",
        f"{len(tis):,} task instances ({scenario.ranks + scenario.buckets + len(by_stage['context_shuffle']) + 4:,} "
        f"in the model); the sensor took {by_stage['wait_for_shards'][0]['duration']:.1f} s (it starts once every rank "
        f"is done: it never waits); "
        f"{m['commits']:,} database "
        f"transactions ({m['commits'] / run_wall:.0f} a second); the scheduler used {m['scheduler_cpu']:.0f} s of "
        f"CPU ({m['scheduler_cpu'] / run_wall:.0%} of a core).",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=64, help="num_ranks, and input files (%(default)s)")
    parser.add_argument("--buckets", type=int, default=16, help="num_buckets and num_context_shards (%(default)s)")
    parser.add_argument("--copies", type=int, default=2, help="times the corpora are repeated (%(default)s)")
    parser.add_argument(
        "--slots", type=int, default=2, help="task slots a worker, of two (%(default)s); the merge pool has them all"
    )
    parser.add_argument("--context-window", type=int, default=DEFAULT_WINDOW, help="context_window (%(default)s)")
    parser.add_argument("--corpora", type=Path, default=SHARED / "corpora", help="folder of .jsonl.gz corpora")
    parser.add_argument("--tokenizer", type=Path, default=SHARED / "tokenizers" / "gpt2" / "tokenizer.json")
    parser.add_argument(
        "--fault-every",
        type=int,
        default=0,
        help="answer every Nth S3 request with 503 SlowDown (%(default)s: none. The deployment's adaptive retries "
        "slow the whole client after each SlowDown, as they should on S3, where one means a prefix past its rate: "
        "a 503 every 50th request made a bucket merge 25 s instead of 6. The distributed test injects every 7th, to "
        "prove the retries)",
    )
    parser.add_argument("--s3-bandwidth", type=float, default=50, help="MB/s a connection to S3 (%(default)s)")
    parser.add_argument("--s3-latency", type=float, default=30, help="ms added to each S3 request (%(default)s)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the build (%(default)s)")
    parser.add_argument(
        "--measurements",
        type=Path,
        default=Path(tempfile.gettempdir()) / "scale-measurements.json",
        help="where the raw measurements are kept (%(default)s)",
    )
    parser.add_argument("--report-only", action="store_true", help="report the kept measurements; run nothing")
    parser.add_argument("--out", type=Path, help="write the report here (between its markers, if it has them)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if reason := services_missing():
        raise SystemExit(f"the scale test needs the distributed deployment: {reason}")
    for needed in (args.corpora, args.tokenizer):
        if not needed.exists():
            raise SystemExit(f"{needed} does not exist (the shared data beside the repo, or pass the flag)")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # the bucket's region, and requests' signing region
    if args.report_only:
        measured = json.loads(args.measurements.read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="scale-") as work:
            measured = run_build(args, Path(work))
        args.measurements.write_text(json.dumps(measured))
        print(f"measurements: {args.measurements}")
    text = report(measured)
    if args.out:
        write(text, args.out, BEGIN, END)
    print(text, end="")


if __name__ == "__main__":
    main()
