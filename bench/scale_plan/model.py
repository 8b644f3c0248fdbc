"""The capacity plan's model: a build's stages as tasks, each with the time, bytes, requests, RAM and disk it
costs, from measured per-task rates and a few stated assumptions about S3 and Airflow. Arithmetic only: it runs no
pipeline code and loops over no documents."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

from tokenization.builds.run import DATASET_NAME
from tokenization.formats.checks import BLOCK_BYTES
from tokenization.formats.ds import INDEX_DTYPE
from tokenization.output.leases import CONFIRM_AFTER, HEARTBEAT_SECONDS, LEASE_TTL_SECONDS
from tokenization.stages.context_shuffle import DEFAULT_WINDOW
from tokenization.stages.merge.config import DEFAULT_MAX_TOKENS_PER_FILE, MergeConfig
from tokenization.stages.tokenize import TokenizeConfig
from tokenization.storage.files import (  # what the transfers really use
    CONCURRENT_READS,
    MIB,
    MIN_PART_SIZE,
    TRANSFER_BUFFER,
    TRANSFER_STREAMS,
    part_size,
)

MB, GB, TB = 1e6, 1e9, 1e12

# S3 and Airflow facts the model uses.
LIST_PAGE_KEYS = 1_000  # ListObjectsV2 returns at most this many keys a request
S3_BLOCK = 50 << 20  # s3fs reads a stream in ranged GETs of its default block size
# The DAG's tasks in order (its task ids), and those of them that are not mapped.
STAGES = ("plan", "tokenize", "wait_for_shards", "merge", "plan_context", "context_shuffle", "publish")
FIXED_TASKS = ("plan", "wait_for_shards", "plan_context", "publish")

# Bytes of memory a document, from the code (not measured; the fixed part of each task is measured RSS):
TOKENIZE_BYTES_PER_DOC = 32  # bucketed pass 2: index ends, bucket drawn, argsort order, sorted copy (int64 each)
RANK_BYTES_PER_DOC = 16  # a doc-shuffled rank: index ends and the permutation
INTERLEAVE_BYTES_PER_DOC = 16  # the index, and its concatenated copy while the merge plans (8 + 8)
BUCKET_BYTES_PER_DOC = 18  # the index (8), the bucket's permutation (8), the file id of each entry (2)
CONTEXT_BYTES_PER_DOC = 8  # a merged file's index, mapped and read in place (its windows' index entries stream out)
# the window permutation's units (17: source, start, end), the window ends (8), the move's block offsets (16), and
# the proof's plan while the windows move: the two pieces a window's edges cut, by their numbers as written and in
# the file (32); the pieces themselves wait on disk (formats.kept). Measured: one file of 4 M documents (~780 k
# windows) peaked at 196 MB, of 2 M at 150 MB: 46 MB for 2 M documents and 390 k windows, 8 a document and ~80 a window
CONTEXT_BYTES_PER_WINDOW = 80
INDEX_BYTES_PER_DOC = INDEX_DTYPE.itemsize  # .ds.index: one end offset a document
METADATA_FILE_BYTES = 100  # a .ds.metadata file
CACHE_RECORDS = 3  # a cached input's requests besides its token files: its entry, and the rank's use before and after
LISTED_FILE_DIGEST_BYTES = 8  # the sensor keeps each listed file as an 8-byte digest of name and size

# File names, for XCom sizes, as the stages name them (a build's rank stem is the rank; merged files are
# NNN_corpus.ds, three digits below 1,000 files).
_RANK = TokenizeConfig(inputs=["input"], output="ranks", tokenizer="tokenizer.json")  # names need no real paths
_MERGE = {"input": "ranks", "output": "merged", "save_filename": DATASET_NAME}
RANK_FILE = _RANK.output_name(0)
RANK_BUCKET_FILE = _RANK.bucket_name(0, 0)
MERGED_FILE = MergeConfig(**_MERGE).file_name(0, 3)
MERGED_BUCKET_FILE = MergeConfig(**_MERGE, merge_mode="bucketed", bucket=0).file_name(0, 3)
SPEC_BYTES = 212  # the run's XCom spec (a BuildSpec as JSON: an S3 run folder and the plan's digest)
SUMMARY_BYTES = 500  # publish's return value

ASSUMED = "assumption"
# The tables of bench/RESULTS.md the measured rates and peak RSS come from, by their title and the date of their run:
# one rank on generated web text (whose vocabulary grows as web text's; the corpus repeated warms the encoder's
# caches), the context shuffle of its 4 GB result's merged file, and the merge of 8 ranks of ~400-token documents
# at 2.4 GB (a bucket merge interleaves many ranks' documents; the scale table's merge reads one rank's file).
SCALE_RUN = "2026-12-06"
SCALE_TABLE = f"bench/RESULTS.md of {SCALE_RUN}, table 'Cost as the work grows'"
MEMORY_TABLE = f"bench/RESULTS.md of {SCALE_RUN}, table 'Peak RSS as the input grows'"
TOKENIZE_ROW = f"{SCALE_TABLE}, row tokenize + doc shuffle, gpt2, 4.00 GB of text"
CONTEXT_ROW = f"{SCALE_TABLE}, row context shuffle, 3.27 GB of tokens (the 4.00 GB of text)"
MERGE_ROW = f"{MEMORY_TABLE}, row merge, 2397.1"
VERIFY_ROW = "bench/RESULTS.md of 2026-12-06 (make bench), row verify"
SAMPLE_RANK = "measured: a sample rank, 16 vs 64 buckets"
GPT2_LOAD = "bench/RESULTS.md, tokenizer load, gpt2"
S3_GUIDELINES = "AWS, S3 performance guidelines: a request a 85-90 MB/s"
S3_PREFIXES = "AWS, S3 performance guidelines: request rates scale with the number of prefixes"
PROBE = "bench.scale's probe of the store: its processes' CPU time a GET"
# Measured by bench.scale's probe (1 to 4 processes, 32 GETs in flight each, against the simulated S3): 2.4-3.2 ms
# of CPU a GET. Over plain HTTP: real S3's TLS adds to it.
REQUEST_CPU_S = 0.003
# Measured in bench/RESULTS.md (row s3): a merge over 8 connections of a simulated S3 capped at 10 MB/s a
# connection took 1/2.50 of its time over one (142.0 s, 56.7 s): 2.50 / 8. A lower bound: the task's compute does
# not speed up, its uploads go 4 parts at once, and moto's one process serves ~45-80 MB/s on this 2-core machine.
STREAMS_EFFICIENCY = 0.31


# A plan of 20,000 local one-line files (``list_input_files``, then ``with_content`` with the rows of the one before):
# 17 us of CPU a file to list, 13.5 us to recognise from its stat.
PLAN_FILES = "measured: a plan of 20,000 local files, listed and recognised"
SHA256_RATE = "issue 52: the sha256 of local files, reading included"
STATS_A_FILE = 2  # a local file's stat when it is listed, and again when the plan recognises it


def arg(default, help: str, source: str = ""):
    """A scenario field: its default, what it means, and where the default comes from (shown in the report)."""
    return field(default=default, metadata={"help": help, "source": source})


@dataclass(frozen=True)
class Scenario:
    """Everything the projection depends on; each field is also a command-line flag."""

    # The corpus
    tokens: float = arg(15e12, "tokens in the corpus")
    doc_tokens: float = arg(400, "mean tokens a document")
    token_bytes: int = arg(2, "bytes a token id (uint16 up to 65,536 ids)")
    save_loss: bool = arg(False, "also write .ds.loss, 1 byte a token")
    text_bytes_per_token: float = arg(
        3.33, "bytes of input text a token", "docs/deployment.md, Sizing: ~0.3 tokens a byte"
    )
    input_file_gb: float = arg(1.0, "size of an input file, GB", ASSUMED)
    cache: bool = arg(True, "the tokenization cache is on (a build's default): a rank also stores each file's tokens")
    context_window: int = arg(
        DEFAULT_WINDOW, f"context_window ({DEFAULT_WINDOW}: a {DEFAULT_WINDOW - 1}-token context plus one)"
    )
    # The build
    ranks: int = arg(1024, "tokenize tasks (num_ranks, at most 4096)")
    buckets: int = arg(512, "buckets of the global shuffle: bucket merge tasks")
    bucket_prefixes: bool = arg(True, "rank files under a prefix a bucket (off: in one folder, as before)")
    distributed_verify: bool = arg(
        True, "each context task checks its own files before upload, and publish reads none (off: it reads all)"
    )
    context_shards: int = arg(512, "context-shuffle tasks (num_context_shards, at most 1024)")
    max_tokens_per_file: float = arg(
        float(DEFAULT_MAX_TOKENS_PER_FILE), "merge_max_tokens_per_file (datatrove's default, 100 GT)"
    )
    min_part_mib: float = arg(MIN_PART_SIZE / MIB, "smallest multipart part, MiB (storage.MIN_PART_SIZE)")
    streams: int = arg(TRANSFER_STREAMS, "S3 connections a file moves over at once (storage.TRANSFER_STREAMS)")
    transfer_buffer_mib: float = arg(TRANSFER_BUFFER / MIB, "bytes of a file in flight, MiB (storage.TRANSFER_BUFFER)")
    concurrent_reads: int = arg(CONCURRENT_READS, "small records read at once (storage.CONCURRENT_READS)")
    # The deployment
    workers: int = arg(128, "Celery workers of the headline figures")
    table_workers: str = arg("8,32,128,512", "worker counts of the wall-time table, comma-separated")
    concurrency: int = arg(8, "task slots a worker (Celery concurrency); a slot is 2 cores, as measured")
    slot_cores: float = arg(2, "cores a slot has to itself (the measured rates are a slot's)")
    merge_slots: int = arg(512, "slots of the tokenization_merge pool: bucket merges at once")
    worker_ram_gb: float = arg(64, "RAM of a worker, GB", ASSUMED)
    worker_disk_gb: float = arg(1900, "local disk of a worker, GB", ASSUMED)
    nic_gbit: float = arg(10, "network of a worker, Gbit/s, shared by its slots", ASSUMED)
    large_ram_gb: float = arg(1024, "RAM of the large-disk worker a single merge runs on, GB", ASSUMED)
    large_disk_tb: float = arg(30, "local disk of that worker, TB", ASSUMED)
    deadline_h: float = arg(24, "hours a build may take: the DAG runs nightly with max_active_runs=1")
    max_map_length: int = arg(4096, "Airflow's [core] max_map_length (compose and make airflow set 4096)")
    poke_s: float = arg(10, "wait_for_shards poke interval, s (dags/tokenize_corpus.py)")
    # Measured on the 2-core benchmark VM
    tokenize_mb_s: float = arg(47.9, "tokenize: MB of text a second", TOKENIZE_ROW)
    tokenize_rss_mb: float = arg(855, "tokenize: peak RSS, MB (within its memory budget, 1,024 MB)", TOKENIZE_ROW)
    rank_load_s: float = arg(0.17, "tokenize: loading the tokenizer (HF and gigatoken), s", GPT2_LOAD)
    merge_mb_s: float = arg(516.8, "merge: MB of tokens a second", MERGE_ROW)
    merge_rss_mb: float = arg(221, "merge: peak RSS besides its arrays, MB", MERGE_ROW)
    context_mb_s: float = arg(678.7, "context shuffle: MB of tokens a second", CONTEXT_ROW)
    context_rss_mb: float = arg(188, "context shuffle: peak RSS, MB", CONTEXT_ROW)
    verify_mb_s: float = arg(766.9, "verify (in publish): MB of tokens a second", VERIFY_ROW)
    verify_rss_mb: float = arg(165, "verify: peak RSS, MB", VERIFY_ROW)
    marker_bytes: float = arg(391, "a rank's completion marker, bytes a bucket", SAMPLE_RANK)
    manifest_bytes: float = arg(682, "a rank's manifest, bytes a bucket", SAMPLE_RANK)
    marker_ram_bytes: float = arg(1333, "markers, parsed, bytes of RAM a bucket", "measured: tracemalloc")
    listed_key_ram_bytes: float = arg(
        718, "a listed key, RAM while the listing is held (s3fs's entry, then name and size)", "measured: tracemalloc"
    )
    entries_ram_bytes: float = arg(1879, "manifest entries, parsed (a merge), RAM a bucket", "measured: tracemalloc")
    manifest_ram_bytes: float = arg(1826, "a manifest, parsed (publish), RAM a bucket", "measured: tracemalloc")
    # Assumed: S3 and Airflow
    s3_mb_s: float = arg(85, "one S3 connection's transfer, MB/s", S3_GUIDELINES)
    streams_efficiency: float = arg(
        STREAMS_EFFICIENCY,
        "of streams x one connection's rate, what a task's streams move at once",
        "bench/RESULTS.md, row s3: merge, 8 streams against 1",
    )
    request_s: float = arg(0.05, "a small S3 GET, one after another, s", ASSUMED)
    request_cpu_s: float = arg(
        REQUEST_CPU_S, "CPU a request costs the task's own process (signing, parsing; one core), s", PROBE
    )
    store_requests_s: float = arg(
        math.inf,
        "requests a second the store answers in all (inf: S3 scales by prefix; its per-prefix rates are held apart)",
        S3_PREFIXES,
    )
    list_page_s: float = arg(0.1, "a LIST page of 1,000 keys, s", ASSUMED)
    task_overhead_s: float = arg(5, "Airflow's cost of a task instance (queue, start, imports), s", ASSUMED)
    scheduler_tis_s: float = arg(10, "task instances one scheduler starts a second", ASSUMED)
    # Local inputs: a file system the workers share (``inputs.content.with_content``, ``rank_hashes``)
    plan_file_cpu_s: float = arg(
        3.1e-5, "plan, local inputs: CPU to list a file and recognise it from its stat, s", PLAN_FILES
    )
    fs_stat_s: float = arg(0.0005, "a stat on the shared file system (a metadata round trip), s", ASSUMED)
    sha256_mb_s: float = arg(750, "ranks, local inputs: sha256 of a file read, MB/s a core", SHA256_RATE)
    changed_share: float = arg(0.02, "a next night's input files new or changed, of all", ASSUMED)

    @property
    def docs(self) -> float:
        return self.tokens / self.doc_tokens

    @property
    def families(self) -> int:
        """Files a token file comes as: .ds, .ds.index, .ds.metadata (and .ds.loss)."""
        return 3 + self.save_loss

    @property
    def dataset_bytes(self) -> float:
        """The corpus as token files, ids (and loss bytes) plus index: what every stage reads and writes."""
        return self.tokens * (self.token_bytes + self.save_loss) + self.docs * INDEX_BYTES_PER_DOC

    @property
    def text_bytes(self) -> float:
        return self.tokens * self.text_bytes_per_token

    def network_share(self, concurrency: int) -> float:
        """A task's share of its worker's network, bytes a second."""
        return self.nic_gbit * 1e9 / 8 / concurrency

    def upload_bytes_s(self, concurrency: int) -> float:
        """What one task uploads a second: its parts go as many at once as the transfer buffer holds (at most
        ``streams``), each at one connection's rate, within its share of the network."""
        part = max(self.min_part_mib, 1) * MIB
        streams = max(1, min(self.streams, int(self.transfer_buffer_mib * MIB // part)))
        return min(self.streams_bytes_s(streams), self.network_share(concurrency))

    def download_bytes_s(self, concurrency: int) -> float:
        """What one task downloads a second: ``streams`` ranged GETs at once, within its share of the network."""
        return min(self.streams_bytes_s(self.streams), self.network_share(concurrency))

    def streams_bytes_s(self, streams: int) -> float:
        """What ``streams`` connections at once move a second: one connection's rate, or that many times it at the
        measured efficiency."""
        return self.s3_mb_s * MB * (1 if streams == 1 else streams * self.streams_efficiency)

    def files_at_once(self, largest: float) -> int:
        """Files of at most ``largest`` bytes moved at once (``storage.files_at_once``: a merge's inputs copied,
        a task's files placed)."""
        return min(self.concurrent_reads, max(1, int(self.transfer_buffer_mib * MIB // max(largest, 1))))

    @property
    def inputs_per_rank(self) -> float:
        return self.text_bytes / (self.input_file_gb * GB) / self.ranks

    def worker_counts(self) -> list[int]:
        return [int(w) for w in self.table_workers.split(",")]


@dataclass(frozen=True)
class TaskCost:
    """One task of a stage (a stage's tasks are alike): what it computes, moves and asks S3, and its footprint.
    Counts and bytes are a task's; ``tasks`` times them is the stage's. Its time is computed from them, so that
    every stage follows one rule: compute at the measured rate, bytes at the task's share of the network, and each
    request it waits for (a GET, a batch of GETs in flight at once, a LIST page, a batch of files uploaded at once)
    one after another. Its requests are counted apart from its waits: they are what the store must answer."""

    stage: str  # its label in the report
    tasks: int
    pool: str  # the slots that run it: "workers", "merge" (the merge pool, on the workers) or "one"
    concurrency: int  # tasks sharing its worker's network
    compute_s: float = 0.0  # at the measured rate
    download: float = 0.0  # bytes read before the work can go on
    upload: float = 0.0  # bytes written (multipart, parts in parallel)
    waits: float = 0.0  # requests (or batches of requests in flight at once) it waits for, one after another
    lists: float = 0.0  # LIST pages it waits for
    gets: float = 0.0  # GET requests it makes, waited for or not
    puts: float = 0.0  # PUT requests and multipart calls (create, each part, complete)
    lease_puts: float = 0.0  # of them, those on the stage's _leases/ prefix
    read: float = 0.0
    ram: float = 0.0
    disk: float = 0.0
    xcom: float = 0.0  # bytes of the task instance's return value

    @property
    def requests(self) -> float:
        """Every request it makes: GETs, LIST pages, PUT-class."""
        return self.gets + self.lists + self.puts

    def transfer_s(self, s: Scenario) -> float:
        return self.download / s.download_bytes_s(self.concurrency) + self.upload / s.upload_bytes_s(self.concurrency)

    def requests_s(self, s: Scenario) -> float:
        """Its waits for requests, one after another, and the CPU all its requests cost its process (s3fs and
        botocore run on one core at a time; a slot with less than a core has that share of one)."""
        cpu = self.requests * s.request_cpu_s / min(1.0, s.slot_cores)
        return self.lists * s.list_page_s + self.waits * s.request_s + cpu

    def seconds(self, s: Scenario) -> float:
        return self.compute_s + self.transfer_s(s) + self.requests_s(s) + s.task_overhead_s


def upload_requests(s: Scenario, size: float) -> float:
    """Requests to upload one file as storage.py does: one PUT below two parts (s3fs's rule), else a multipart
    upload of ``part_size`` parts, at least ``min_part_mib`` (create, the parts, complete)."""
    part = part_size(math.ceil(size), int(s.min_part_mib * MIB))
    return 1 if size < 2 * part else math.ceil(size / part) + 2


def family_uploads(s: Scenario, tokens: float, docs: float) -> float:
    """Requests to upload one token-file family of ``tokens`` tokens and ``docs`` index entries."""
    sizes = [tokens * s.token_bytes, docs * INDEX_BYTES_PER_DOC, METADATA_FILE_BYTES] + [tokens] * s.save_loss
    return sum(upload_requests(s, size) for size in sizes)


def list_pages(keys: float) -> int:
    return max(1, math.ceil(keys / LIST_PAGE_KEYS))


def lease_puts(seconds: float) -> float:
    """The requests on a stage's ``_leases/``: its lease created, renewed every ``HEARTBEAT_SECONDS``, and renewed by
    a confirmation before a change at most once every ``CONFIRM_AFTER`` of a TTL."""
    return 1 + math.ceil(seconds / HEARTBEAT_SECONDS) + math.ceil(seconds / (CONFIRM_AFTER * LEASE_TTL_SECONDS))


def with_puts(s: Scenario, cost: TaskCost, data_puts: float) -> TaskCost:
    """``cost`` with its PUT-class requests: ``data_puts`` for its files, 2 for its manifest and marker, and its
    lease's."""
    leases = lease_puts(cost.seconds(s))
    return replace(cost, puts=data_puts + 2 + leases, lease_puts=leases)


def placing_waits(s: Scenario, files: float, largest: float) -> float:
    """Batches of ``files`` placed at once (``Attempt.place_families``), the largest ``largest`` bytes."""
    return math.ceil(files / s.files_at_once(largest))


def json_list_bytes(n: float, name: str) -> float:
    """Bytes of a JSON list of ``n`` strings as long as ``name``: ``["a", "b"]``."""
    return 2 + n * (len(name) + 4)


def rank_files(s: Scenario, bucketed: bool) -> float:
    """Token files a rank writes: one a bucket, or one."""
    return s.buckets if bucketed else 1


def rank_folder_keys(s: Scenario, bucketed: bool) -> float:
    """Keys directly in the ranks folder: every rank's token files."""
    return s.ranks * rank_files(s, bucketed) * s.families


def input_pages(s: Scenario) -> int:
    """LIST pages of the input folder: ``plan`` and every rank list it."""
    return list_pages(input_files(s))


def tokenize_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """A rank: encode its share (read on a thread beside the encoder) to local disk in input order, storing each
    file's tokens in the cache one after another as it is done; write the documents again, into a file a bucket
    (or shuffled); place them several at once. It lists nothing: the plan names its files."""
    text, tokens, docs, out = (x / s.ranks for x in (s.text_bytes, s.tokens, s.docs, s.dataset_bytes))
    files = rank_files(s, bucketed)
    inputs = s.inputs_per_rank
    cache_puts = inputs * (family_uploads(s, tokens / inputs, docs / inputs) + CACHE_RECORDS) if s.cache else 0
    cost = TaskCost(
        stage="tokenize",
        tasks=s.ranks,
        pool="workers",
        concurrency=s.concurrency,
        compute_s=s.rank_load_s + text / (s.tokenize_mb_s * MB),
        upload=out * (2 if s.cache else 1),
        # its files a batch at a time, its manifest and marker; each cached file's lookup and stores
        waits=placing_waits(s, files * s.families, out / files)
        + 2
        + s.cache * inputs * (1 + s.families + CACHE_RECORDS),
        gets=math.ceil(text / S3_BLOCK) + (inputs if s.cache else 0),
        read=text,
        ram=s.tokenize_rss_mb * MB + (TOKENIZE_BYTES_PER_DOC if bucketed else RANK_BYTES_PER_DOC) * docs,
        disk=2 * out,  # pass 1's file, then pass 2's files
        xcom=json_list_bytes(files, RANK_BUCKET_FILE if bucketed else RANK_FILE),
    )
    return with_puts(s, cost, files * family_uploads(s, tokens / files, docs / files) + cache_puts)


def sensor_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """wait_for_shards starts once every rank is done or failed (trigger rule ``all_done``), so in a build
    without failures its first poke finds every marker: one listing of ``_completions/``, one of the ranks folder
    and of each bucket's (``concurrent_reads`` at a time, each folded into 8 bytes a file as it is read), and every
    rank's marker and manifest, a batch of ``concurrent_reads`` ranks at a time (their markers at once, then their
    manifests). It pokes again, a listing each ``poke_s``, only while a failed rank is retried."""
    metadata = s.ranks * rank_files(s, bucketed) * (s.marker_bytes + s.manifest_bytes)
    batch = min(s.ranks, s.concurrent_reads)
    prefixes = s.buckets if bucketed and s.bucket_prefixes else 1
    listed_at_once = rank_folder_keys(s, bucketed) / prefixes * min(prefixes, s.concurrent_reads)
    return TaskCost(
        stage="wait_for_shards",
        tasks=1,
        pool="one",
        concurrency=1,
        download=metadata,
        waits=2 * math.ceil(s.ranks / batch),
        gets=2 * s.ranks,
        # waited for: the top folder, then the bucket folders a batch at a time (a batch waits for one folder)
        lists=math.ceil(prefixes / s.concurrent_reads) * list_pages(rank_folder_keys(s, bucketed) / prefixes)
        + list_pages(s.ranks),
        read=metadata,
        ram=listed_at_once * s.listed_key_ram_bytes
        + rank_folder_keys(s, bucketed) * LISTED_FILE_DIGEST_BYTES
        + batch * rank_files(s, bucketed) * s.marker_ram_bytes,
        xcom=len(json.dumps(list(range(s.buckets)) if bucketed else [None])),
    )


def merge_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """A merge task, of one bucket or of everything: list the rank files; read the ranks' markers and manifests,
    then each input's .metadata and .index, ``concurrent_reads`` at a time; copy its inputs' tokens to local disk,
    as many at once as the transfer buffer holds of one (``SourcePool.fetch``; each over ``streams`` connections);
    write them in the new order (one output file in flight on local disk); upload."""
    n = s.buckets if bucketed else 1
    tokens, docs, data = s.tokens / n, s.docs / n, s.dataset_bytes / n
    files = math.ceil(tokens / s.max_tokens_per_file)
    metadata = s.ranks * rank_files(s, bucketed) * (s.marker_bytes + s.manifest_bytes)
    listed = rank_folder_keys(s, bucketed) / (n if s.bucket_prefixes else 1)
    copied = 1 + s.save_loss  # an input's files copied: .ds (and .ds.loss)
    cost = TaskCost(
        stage="merge (bucketed)" if bucketed else "merge (interleave, one task)",
        tasks=n,
        pool="merge" if bucketed else "one",
        concurrency=s.concurrency if bucketed else 1,  # a single merge has its large-disk worker to itself
        compute_s=tokens * s.token_bytes / (s.merge_mb_s * MB),
        download=data + metadata,
        upload=data,
        # the ranks' markers and manifests at once, then each input's .metadata and .index (a thread reads one
        # input's two), then its copies a batch of inputs at a time; the files, each family's at once, with a
        # manifest a file; the merge's manifest and marker
        waits=math.ceil(2 * s.ranks / s.concurrent_reads)
        + 2 * math.ceil(s.ranks / s.concurrent_reads)
        + math.ceil(s.ranks / s.files_at_once(data / s.ranks)) * copied  # SourcePool.fetch
        + files * (placing_waits(s, s.families, data / files) + 1)
        + 2,
        gets=s.ranks * (2 + 2 + copied),  # (its marker, manifest; an input's .metadata, .index, copies)
        lists=list_pages(listed) + 2 * list_pages(s.ranks),  # the rank files, _completions/, _manifests/
        read=data + metadata,
        ram=s.merge_rss_mb * MB
        + (BUCKET_BYTES_PER_DOC if bucketed else INTERLEAVE_BYTES_PER_DOC) * docs
        + s.ranks * rank_files(s, bucketed) / (n if s.bucket_prefixes else 1) * s.entries_ram_bytes
        + min(s.ranks, s.concurrent_reads) * rank_files(s, bucketed) * s.manifest_ram_bytes,  # a batch, parsed
        disk=data + data / files,
        xcom=json_list_bytes(files, MERGED_BUCKET_FILE if bucketed else MERGED_FILE),
    )
    return with_puts(s, cost, files * (family_uploads(s, tokens / files, docs / files) + 1))


def merged_files(s: Scenario, bucketed: bool) -> int:
    n = s.buckets if bucketed else 1
    return n * math.ceil(s.tokens / n / s.max_tokens_per_file)


def plan_context_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """plan_context: one listing of the merged folder, to count its files."""
    shards = min(s.context_shards, merged_files(s, bucketed))
    return TaskCost(
        stage="plan_context",
        tasks=1,
        pool="one",
        concurrency=1,
        lists=list_pages(merged_files(s, bucketed) * s.families),
        xcom=len(json.dumps(list(range(shards)))),
    )


def context_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """A context shard: list the merged folder; read every merge manifest and marker; then for each of its files,
    copy it to local disk, write its windows in a random order, upload."""
    m = merged_files(s, bucketed)
    shards = min(s.context_shards, m)
    k = math.ceil(m / shards)  # files the busiest shard takes
    tokens, docs, data = s.tokens / m, s.docs / m, s.dataset_bytes / m
    windows = tokens / s.context_window
    merges = s.buckets if bucketed else 1
    cost = TaskCost(
        stage="context_shuffle",
        tasks=shards,
        pool="workers",
        concurrency=s.concurrency,
        compute_s=k * tokens * s.token_bytes / (s.context_mb_s * MB),  # its own check, made as it writes, included
        download=k * data,
        upload=k * data,
        # at once: a manifest a merged file, each merge's manifest and marker; then its files one after another,
        # each read (.metadata, .index, then its copies) and placed (a family at once)
        waits=math.ceil((m + 2 * merges) / s.concurrent_reads)
        + k * (2 + 1 + s.save_loss + placing_waits(s, s.families, data))
        + 2,
        gets=m + 2 * merges + k * (2 + 1 + s.save_loss),
        lists=list_pages(m * s.families) + 2 * list_pages(m + merges),
        read=k * data,
        ram=s.context_rss_mb * MB + CONTEXT_BYTES_PER_DOC * docs + CONTEXT_BYTES_PER_WINDOW * windows,
        disk=2 * data,
        xcom=json_list_bytes(k, MERGED_BUCKET_FILE if bucketed else MERGED_FILE),
    )
    return with_puts(s, cost, k * family_uploads(s, tokens, docs + windows))


def publish_cost(s: Scenario, bucketed: bool) -> TaskCost:
    """publish: with the context tasks' own checks, verify reads the records and one listing, no token byte;
    without them it streams every byte of the dataset in 64 MiB blocks, in this one task. Then the books read
    every rank's manifest, a batch of ``concurrent_reads`` at a time, each kept without its output entries; three
    small files."""
    m = merged_files(s, bucketed)
    manifests = s.ranks * rank_files(s, bucketed) * s.manifest_bytes
    verified = 0 if s.distributed_verify else s.dataset_bytes
    records = 2 * min(s.context_shards, m) + s.ranks  # the context tasks' manifests and markers, the ranks' manifests
    return TaskCost(
        stage="publish",
        tasks=1,
        pool="one",
        concurrency=1,
        compute_s=0 if s.distributed_verify else s.tokens * s.token_bytes / (s.verify_mb_s * MB),
        download=verified + manifests,
        waits=math.ceil(verified / BLOCK_BYTES) + math.ceil(records / s.concurrent_reads) + 3,
        gets=math.ceil(verified / BLOCK_BYTES) + records,
        puts=3,  # report.html, report.json, _BUILD.json
        lists=list_pages(m * s.families),
        read=verified + manifests,
        ram=s.verify_rss_mb * MB
        + (0 if s.distributed_verify else INDEX_BYTES_PER_DOC * s.docs / m)
        + min(s.ranks, s.concurrent_reads) * rank_files(s, bucketed) * s.manifest_ram_bytes,
        xcom=SUMMARY_BYTES,
    )


def plan_cost(s: Scenario) -> TaskCost:
    """plan: lists the input once and claims the run folder; its XCom is the spec and the ranks to map over."""
    return TaskCost(
        stage="plan",
        tasks=1,
        pool="one",
        concurrency=1,
        lists=input_pages(s),
        waits=1,
        puts=1,  # _RUN.json
        xcom=SPEC_BYTES + len(json.dumps(list(range(s.ranks)))),
    )


@dataclass(frozen=True)
class PlanReading:
    """What a plan reads of its inputs before any rank starts, and its time (``plan_cost`` is the rest of it); and
    the hashing that each rank does of its new or changed files before it looks them up in the cache."""

    inputs: str  # where they are, and which night
    listed: float  # files
    hashed: float  # files, by their ranks
    bytes_hashed: float
    seconds: float  # the plan's
    rank_seconds: float  # a rank's hashing of its share


def input_files(s: Scenario) -> float:
    return s.text_bytes / (s.input_file_gb * GB)


def plan_readings(s: Scenario) -> list[PlanReading]:
    """The plan's reading of the inputs, on S3 (a listing: each object's ETag identifies its bytes) and on a file
    system the workers share, the first night (every file new) and a next night (``changed_share`` of them): each
    file's stat, one after another, twice (listed, recognised); the plan reads no file's bytes. Each rank hashes its
    share of the new or changed ones (``inputs.content.rank_hashes``) on a thread a core of its slot, within its
    share of its worker's network."""
    files, plan = input_files(s), plan_cost(s)
    rank_rate = min(s.slot_cores * s.sha256_mb_s * MB, s.network_share(s.concurrency))

    def local(label: str, share: float) -> PlanReading:
        stats = files * (STATS_A_FILE * s.fs_stat_s + s.plan_file_cpu_s)
        read = s.text_bytes * share
        return PlanReading(label, files, files * share, read, stats + s.task_overhead_s, read / s.ranks / rank_rate)

    return [
        PlanReading("S3, any night", files, 0, 0, plan.seconds(s), 0),
        local("file system, the first night", 1.0),
        local(f"file system, a next night ({s.changed_share:.0%} changed)", s.changed_share),
    ]


def slots(s: Scenario, pool: str, workers: int) -> int:
    """Tasks of a pool that run at once on ``workers`` workers."""
    fleet = workers * s.concurrency
    return {"workers": fleet, "merge": min(s.merge_slots, fleet), "one": 1}[pool]


def stage_seconds(s: Scenario, cost: TaskCost, workers: int) -> float:
    """A stage's wall time: its alike tasks run in waves of as many as there are slots, and no faster than the
    store answers all their requests."""
    waves = math.ceil(cost.tasks / slots(s, cost.pool, workers)) * cost.seconds(s)
    return max(waves, cost.tasks * cost.requests / s.store_requests_s)


def stages(s: Scenario, bucketed: bool, workers: int) -> dict[str, TaskCost]:
    """The DAG's stages in order, by task id, as run on ``workers`` workers."""
    costs = (
        plan_cost(s),
        tokenize_cost(s, bucketed),
        sensor_cost(s, bucketed),
        merge_cost(s, bucketed),
        plan_context_cost(s, bucketed),
        context_cost(s, bucketed),
        publish_cost(s, bucketed),
    )
    return dict(zip(STAGES, costs, strict=True))


def wall_seconds(s: Scenario, bucketed: bool, workers: int) -> dict[str, float]:
    """Each stage's wall time on ``workers`` workers, by task id, and the build's: the stages run one after
    another."""
    walls = {name: stage_seconds(s, c, workers) for name, c in stages(s, bucketed, workers).items()}
    return walls | {"total": sum(walls.values())}


def request_rates(s: Scenario, workers: int) -> dict[str, tuple[float, str]]:
    """The highest mean S3 request rates a prefix, with the stage that makes them: PUT-class (PUTs and parts) and
    GET-class (GETs and LIST pages), over the stage's wall time. Each stage writes one folder; only rank files
    under a prefix a bucket spread over several (tokenize's writes, the merges' reads)."""
    spread = s.buckets if s.bucket_prefixes else 1
    puts, gets = {}, {}
    for name, c in stages(s, True, workers).items():
        wall = stage_seconds(s, c, workers)
        files = (c.puts - c.lease_puts) / (spread if name == "tokenize" else 1)
        puts[c.stage] = c.tasks * max(files, c.lease_puts) / wall  # the busier of its files' prefix and _leases/
        requests = c.gets + c.lists
        gets[c.stage] = c.tasks * requests / wall / (spread if name == "merge" else 1)
    busiest_put, busiest_get = max(puts, key=puts.get), max(gets, key=gets.get)
    return {"PUT/s": (puts[busiest_put], busiest_put), "GET/s": (gets[busiest_get], busiest_get)}


def ti_starts_per_s(s: Scenario, workers: int) -> float:
    """Task instances the scheduler starts a second in the busiest stage."""
    mapped = [c for c in stages(s, True, workers).values() if c.tasks > 1]
    return max(min(c.tasks, slots(s, c.pool, workers)) / c.seconds(s) for c in mapped)
