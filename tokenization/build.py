"""A whole corpus build as a library object: the same plan, stages and publish whether Airflow runs it (a task a
step, through the glue in ``plugins/``) or ``tokenization build`` runs it on one machine, so both give the same
bytes for the same params::

    start (check, claim the run folder, fix the seed) -> tokenize (a rank each) -> every shard complete
        -> merge -> context shuffle (a shard each) -> publish (verify, account, report, _BUILD.json)

The run folder's layout is in ``tokenization.runs``; the books that publish checks are in
``tokenization.accounting``.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from multiprocessing import get_context
from typing import Literal

from tokenization import accounting, manifest
from tokenization.context import DEFAULT_WINDOW, ContextCounts, ContextShuffleConfig, context_shuffle
from tokenization.documents import Counts, DocumentOptions
from tokenization.encoding import limit_hf_threads
from tokenization.errors import UsageError
from tokenization.formats import DS, list_token_files, token_file_names
from tokenization.latest import LatestError, expire, latest_complete_build, point_latest, read_latest
from tokenization.locations import AllowedLocations, check_disjoint
from tokenization.manifest import StageResult
from tokenization.merge import DEFAULT_MAX_TOKENS_PER_FILE, MergeConfig, MergeCounts, merge
from tokenization.options import option, params
from tokenization.plan import Plan
from tokenization.progress import ProgressMode
from tokenization.report import REPORT_HTML, REPORT_JSON, write_report
from tokenization.runs import (
    BUILD_FORMAT,
    BUILD_MANIFEST,
    RUN_CLAIM,
    BuildError,
    Layout,
    claim,
    folder_for,
    read_claim,
    resolve_seed,
)
from tokenization.sources import InputError, list_input_files
from tokenization.storage import join, list_names, open_fs, remove_if_exists, using, write_bytes_atomic
from tokenization.tokenize import RankOptions, RankShare, TokenizeConfig, tokenize_rank
from tokenization.verify import verify

log = logging.getLogger(__name__)

DATASET_NAME = "corpus"  # the merged files are NNN_corpus.ds
PROBLEMS_LOGGED = 50
ARRIVED_LISTED = 100  # input files that arrived after the plan, named in the build record (then a count)


@dataclass(frozen=True, kw_only=True)
class BuildConfig(DocumentOptions, RankOptions):
    """A build's params: the DAG's Params and the options of ``tokenization build`` are made from these fields."""

    input: str = option(flag="", title="Input", help="folder, glob or fsspec URL of .jsonl[.gz|.zst] or .parquet files")
    output: str = option(title="Output", help="folder or fsspec URL; a build writes under {output}/{build id}")
    seed: int | None = option(
        None,
        minimum=0,
        title="Seed",
        help="shuffle seed for every stage (default: one derived from the build id, the same for every retry)",
    )
    num_ranks: int = option(
        4,
        minimum=1,
        maximum=4096,
        title="Ranks",
        help="tokenize tasks; rank r takes input files r, r + ranks, ... of the sorted list",
    )
    merge_mode: Literal["interleave", "shuffle", "bucketed"] = option(
        "interleave",
        title="Merge order",
        help="interleave: datatrove's random interleave of the rank files (datatrove's bytes); shuffle: a uniform "
        "permutation of every document, in one task; bucketed: the same, in a task a bucket (needs num_buckets)",
    )
    merge_max_tokens_per_file: int = option(
        DEFAULT_MAX_TOKENS_PER_FILE,
        minimum=1,
        title="Most tokens a merged file",
        help="the merge closes a file once it holds this many tokens (cut at a document boundary)",
    )
    context_window: int = option(
        DEFAULT_WINDOW,
        minimum=0,
        title="Context window + 1",
        help="tokens a training window holds, plus one; the merged files are cut into such windows and shuffled "
        "(0 skips the context shuffle)",
    )
    num_context_shards: int = option(
        4,
        minimum=1,
        maximum=1024,
        title="Context-shuffle tasks",
        help="context-shuffle tasks, each taking some of the merged files (never more tasks than files)",
    )
    local_working_dir: str | None = option(
        None, param=False, help="local folder where ranks and context shards stage their files"
    )
    merge_working_dir: str | None = option(
        None,
        param=False,
        help="local folder with room for the whole dataset, where the merge stages its files (default: "
        "--local-working-dir)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.merge_mode == "bucketed") != bool(self.num_buckets):
            raise UsageError("merge_mode bucketed and num_buckets go together: give both or neither")

    def shared(self, *groups: type) -> dict:
        """This config's values of the option groups a stage config shares with it."""
        return {f.name: getattr(self, f.name) for group in groups for f in fields(group)}


@dataclass(frozen=True)
class BuildPlan:
    """What ``start`` decided once for the whole run; every later step reads it (in Airflow, the XCom ``spec``)."""

    run_id: str
    run_dir: str
    seed: int
    num_ranks: int
    input_files: int
    input_bytes: int
    skipped_inputs: int
    tokenizer_sha256: str
    eos_token: str | None
    merges: bool  # the ds format is merged and context-shuffled; Megatron's rank files are the dataset
    num_buckets: int | None  # a merge task a bucket, or one merge of everything
    started: float  # when the run claimed its folder
    digest: str  # of the plan its claim records (``tokenization.plan``): every rank manifest names it

    @property
    def ranks(self) -> list[int]:
        return list(range(self.num_ranks))

    @property
    def merge_buckets(self) -> list[int | None]:
        """What each merge task takes: a bucket each, or everything (None) in one task; nothing without a merge."""
        if not self.merges:
            return []
        return list(range(self.num_buckets)) if self.num_buckets else [None]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BuildPlan:
        return cls(**data)


@dataclass(frozen=True)
class Published:
    """A complete build: the figures a scheduler or a person looks at first, and the whole ``_BUILD.json``."""

    dataset: str
    digest: str
    tokens: int
    docs: int
    rejects: int
    files: int
    verified: bool
    latest: str  # the run folder {output}/LATEST names
    deleted: list[str]  # complete builds that retention deleted
    record: dict

    @classmethod
    def of(cls, record: dict, latest: str, deleted: list[str]) -> Published:
        balance = record["conservation"]
        return cls(
            dataset=record["dataset"],
            digest=record["digest"],
            tokens=record["tokens"],
            docs=balance["docs_out"],
            rejects=balance["quarantined"],
            files=len(record["files"]),
            verified=record["verify"]["ok"],
            latest=latest,
            deleted=deleted,
            record=record,
        )

    def summary(self) -> dict:
        """A few figures for XCom, the Asset event and the builds page."""
        record = self.record
        figures = {k: v for k, v in asdict(self).items() if k != "record"}
        return figures | {"seed": record["seed"], "tokenizer": record["tokenizer"]["name"], "input": record["input"]}


class Build:
    """One build run: its config and the plan made once for it. Each step is a method that Airflow's tasks and the
    command line call alike; every step opens storage with the config's storage options."""

    def __init__(self, config: BuildConfig, plan: BuildPlan):
        self.config, self.plan = config, plan
        self.layout = Layout(plan.run_dir)

    @classmethod
    def start(cls, config: BuildConfig, run_id: str, allowed: AllowedLocations | None = None) -> Build:
        """Check what can be checked before any work (an output apart from the input, the input files, within the
        ``allowed`` locations when given, the tokenizer and its EOS, a chat template), then make the plan and
        claim the run's folder with it. A retry or a resume of the same run finds its own claim, and goes on only
        if it would plan the very same build (``Plan.refuse_another``)."""
        with using(config.storage_options):
            check_disjoint([config.input], config.output)
            listing = list_input_files([config.input])
            if allowed is not None:
                allowed.check_files("input", [f.url for f in listing.files])
            encoder = config.encoder()
            renderer = config.renderer(encoder)
            run_dir = folder_for(config.output, run_id)
            seed = resolve_seed(config.seed, run_id)
            rendering = renderer and renderer.describe()["sha256"]
            proposed = Plan.make(config, seed, encoder.sha256, encoder.eos_token, rendering, listing)
            claimed = claim(run_dir, run_id, proposed.record)
            recorded = Plan(claimed["plan"])
            if recorded.digest != proposed.digest:
                recorded.refuse_another(proposed, listing, run_dir)
        files = recorded.files
        plan = BuildPlan(
            run_id=run_id,
            run_dir=run_dir,
            seed=seed,
            num_ranks=config.num_ranks,
            input_files=len(files),
            input_bytes=sum(f.size for f in files),
            skipped_inputs=len(recorded.record["inputs"]["skipped"]),
            tokenizer_sha256=encoder.sha256,
            eos_token=encoder.eos_token,
            merges=config.output_format == "ds",
            num_buckets=config.num_buckets,
            started=float(claimed["claimed"]),
            digest=recorded.digest,
        )
        log.info("plan: %s", plan)
        return cls(config, plan)

    def recorded_plan(self) -> Plan:
        """The plan the run's claim records: the one this build was started with, or an error saying otherwise."""
        claimed = read_claim(self.layout.run_dir)
        found = claimed and Plan(claimed["plan"])
        if found is None or found.digest != self.plan.digest:
            raise BuildError(
                f"{join(self.layout.run_dir, RUN_CLAIM)}: "
                f"{'missing' if found is None else f'records plan {found.digest}'}, not this run's plan "
                f"{self.plan.digest}: the run folder was replaced after the run started"
            )
        return found

    def tokenize(self, rank: int, progress: ProgressMode = None, owner: str | None = None) -> StageResult[Counts]:
        """Rank ``rank``'s share of the plan's files, never a new listing."""
        with using(self.config.storage_options):
            plan = self.recorded_plan()
        share = RankShare(
            files=plan.share(rank, self.plan.num_ranks),
            plan=plan.digest,
            tokenizer_sha256=plan.record["tokenizer"]["sha256"],
            rendering_sha256=plan.record["rendering_sha256"],
        )
        config = TokenizeConfig(
            inputs=[self.config.input],
            output=self.layout.ranks,
            seed=self.plan.seed,
            rank=rank,
            world_size=self.plan.num_ranks,
            local_working_dir=self.config.local_working_dir,
            **self.config.shared(DocumentOptions, RankOptions),
        )
        return tokenize_rank(config, progress, owner, share)

    def incomplete_ranks(self) -> dict[int, str]:
        """Every rank whose shard is not complete on storage yet, with the reason."""
        with using(self.config.storage_options):
            return accounting.incomplete_ranks(self.layout.ranks, self.plan.num_ranks, self.plan.digest)

    def merge(
        self, bucket: int | None = None, progress: ProgressMode = None, owner: str | None = None
    ) -> StageResult[MergeCounts]:
        """The global merge of every rank file, or of one bucket of them."""
        config = MergeConfig(
            input=self.layout.ranks,
            output=self.layout.merged,
            save_filename=DATASET_NAME,
            seed=self.plan.seed,
            mode=self.config.merge_mode,
            bucket=bucket,
            max_tokens_per_file=self.config.merge_max_tokens_per_file,
            save_loss=self.config.save_loss,
            local_working_dir=self.config.merge_working_dir or self.config.local_working_dir,
            storage_options=self.config.storage_options,
        )
        return merge(config, progress, owner)

    def context_shards(self) -> list[int]:
        """The context-shuffle tasks to run: at most one a merged file, none when the window is 0."""
        if not (self.plan.merges and self.config.context_window):
            return []
        with using(self.config.storage_options):
            merged_files = len(list_token_files(self.layout.merged, (DS,)))
        return list(range(min(self.config.num_context_shards, merged_files)))

    def context_shuffle(
        self, shard: int, num_shards: int, progress: ProgressMode = None, owner: str | None = None
    ) -> StageResult[ContextCounts]:
        config = ContextShuffleConfig(
            input=self.layout.merged,
            output=self.layout.context,
            window_size=self.config.context_window,
            seed=self.plan.seed,
            shard=shard,
            num_shards=num_shards,
            local_working_dir=self.config.local_working_dir,
            storage_options=self.config.storage_options,
        )
        return context_shuffle(config, progress, owner)

    def publish(self, keep: int | None = None) -> Published:
        """Verify the dataset, check that every document and every token is accounted for and that the ranks read
        exactly the plan's files (from the manifests on storage, never from what tasks said), write the report,
        then ``_BUILD.json``, which declares the build complete; then point ``{output}/LATEST`` at the newest
        complete build and, with ``keep``, delete the complete builds older than the newest ``keep`` (listed in the
        report). A publish that fails leaves no ``_BUILD.json`` behind, not even an earlier one."""
        run_dir = self.layout.run_dir
        with using(self.config.storage_options):
            try:
                record = {"format": BUILD_FORMAT, **self._record()}
            except Exception:
                self.unpublish()
                raise
            write_report(run_dir, record)  # before the marker of completion
            record |= {"report": {"html": REPORT_HTML, "json": REPORT_JSON}}
            fs, path = open_fs(self.layout.manifest)
            write_bytes_atomic(fs, path, manifest.dumps(record))
            newest = point_latest(self.config.output)
            deleted = expire(self.config.output, keep, {newest, run_dir}) if keep else []
            if deleted:
                write_report(run_dir, record | {"retention": {"keep": keep, "deleted": deleted}})
        log.info("published %s: %d tokens; report %s", record["dataset"], record["tokens"], REPORT_HTML)
        return Published.of(record, newest, deleted)

    def published(self) -> Published | None:
        """This build as published, when it already is (its ``_BUILD.json`` records this very plan)."""
        with using(self.config.storage_options):
            fs, path = open_fs(self.layout.manifest)
            record = manifest.read_json(fs, path)
            if record is None or record.get("plan") != self.plan.digest:
                return None
            try:
                latest = read_latest(self.config.output) or ""
            except LatestError:  # a LATEST that names no build here: the next publish rewrites it
                latest = ""
            return Published.of(record, latest, [])

    def unpublish(self) -> None:
        """Take back ``_BUILD.json`` before files it describes may change, or when a publish fails: no build is
        ever declared complete over files that are not the ones it describes."""
        with using(self.config.storage_options):
            fs, path = open_fs(self.layout.manifest)
            if fs.exists(path):
                remove_if_exists(fs, path)
                log.warning("%s removed: the build is incomplete until it is published again", self.layout.manifest)

    def _record(self) -> dict:
        layout, plan = self.layout, self.plan
        stages = {
            "merge": accounting.stage_counts(layout.merged),
            "context_shuffle": accounting.stage_counts(layout.context),
        }
        dataset = layout.context if stages["context_shuffle"] else layout.merged if plan.merges else layout.ranks
        checked = verify(dataset, self.config.tokenizer, plan.eos_token)
        for line in checked.problems[:PROBLEMS_LOGGED] + checked.notes:
            log.warning("verify: %s", line)
        if not checked.ok:
            raise BuildError(f"verify found {len(checked.problems)} problems in {dataset}; the build is not published")
        recorded = self.recorded_plan()
        balance = accounting.conservation(accounting.rank_manifests(layout.ranks, plan.num_ranks), recorded.files)
        if balance["inputs_problem"]:
            raise BuildError(f"the ranks did not read exactly the plan's input files: {balance['inputs_problem']}")
        if not balance["holds"]:
            raise BuildError(f"documents are not conserved: {balance}")
        finished = time.time()
        return {
            "run_id": plan.run_id,
            "plan": plan.digest,
            "dataset": dataset,
            "input": self.config.input,
            "seed": plan.seed,
            "tokenizer": {"name": self.config.tokenizer, "sha256": plan.tokenizer_sha256, "eos": plan.eos_token},
            "params": params(self.config),
            "inputs": {
                "spec": self.config.input,
                "files": plan.input_files,
                "bytes": plan.input_bytes,
                "skipped": plan.skipped_inputs,
                "hidden": recorded.record["inputs"]["hidden"],
                "arrived_after_plan": self._arrived_after(recorded),
            },
            "started": _iso(plan.started),
            "finished": _iso(finished),
            "wall_seconds": round(finished - plan.started, 3),
            "conservation": balance,
            "token_flow": accounting.token_flow(balance["tokens"], stages, checked.tokens),
            "tokens": checked.tokens,
            "digest": accounting.dataset_digest(dataset),
            "files": token_file_names(list_names(*open_fs(dataset))),
            "stages": {"tokenize": {"ranks": plan.num_ranks, "input_files": plan.input_files, **balance}, **stages},
            "verify": {"ok": checked.ok, "files": checked.files, "tokens": checked.tokens, "notes": checked.notes},
        }

    def _arrived_after(self, recorded: Plan) -> dict:
        """The input files that arrived after the plan was made, which this build leaves out: for the report."""
        try:
            listing = list_input_files([self.config.input])
        except InputError:  # the input is gone, or empty now: nothing arrived
            return {"files": 0, "first": []}
        known = {f.url for f in recorded.files}
        arrived = [f.url for f in listing.files if f.url not in known]
        return {"files": len(arrived), "first": arrived[:ARRIVED_LISTED]}

    def run(self, parallel: int = 1, progress: ProgressMode = None, keep: int | None = None) -> Published:
        """The whole build on this machine: the ranks as up to ``parallel`` processes at once, the merge, the
        context shards (as processes too), then publish (keeping ``keep`` complete builds, when given). A step
        that fails stops the build; running it again with the same build id keeps the complete ranks, resumes the
        merge after its last published file, and redoes the rest, with the same bytes; a build already published
        is returned as it is."""
        if (done := self.published()) is not None:
            log.info("%s is already published: nothing to do", self.layout.run_dir)
            return done
        self._in_processes("tokenize", [(rank,) for rank in sorted(self.incomplete_ranks())], parallel)
        if missing := self.incomplete_ranks():
            raise BuildError(f"ranks not complete after tokenizing: {missing}")
        if self.plan.num_buckets:
            self._in_processes("merge", [(bucket,) for bucket in self.plan.merge_buckets], parallel)
        elif self.plan.merges:
            self.merge(None, progress)
        shards = self.context_shards()
        self._in_processes("context_shuffle", [(shard, len(shards)) for shard in shards], parallel)
        return self.publish(keep)

    def _in_processes(
        self, step: Literal["tokenize", "merge", "context_shuffle"], calls: list[tuple], parallel: int
    ) -> None:
        """Run ``step`` once per argument tuple in up to ``parallel`` fresh processes (spawned: no thread pool
        is inherited), logging each as it completes; the first failure cancels what has not started."""
        if not calls:
            return
        with ProcessPoolExecutor(min(parallel, len(calls)), mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(_run_step, self, step, args): args for args in calls}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in list(done) + list(pending):
                if not future.cancelled():
                    result = future.result()  # raises the step's error
                    log.info(
                        "%s %s: %s tokens in %d files, %.1fs",
                        step,
                        futures[future][0],
                        f"{result.tokens:,}",
                        len(result.outputs),
                        result.seconds,
                    )


def _run_step(build: Build, step: str, args: tuple) -> StageResult:
    """One step in a worker process, without progress bars (several would share one terminal)."""
    limit_hf_threads(build.config.threads)
    return getattr(build, step)(*args, progress=False)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


def latest_build(folder: str) -> dict:
    """The record of the newest complete build under a builds folder, the one ``LATEST`` names, checked as publish
    checks a candidate and in this version's format; anything else raises one line naming the file."""
    build = latest_complete_build(folder)
    if build.record.get("format") != BUILD_FORMAT:
        raise LatestError(
            f"{join(build.run_dir, BUILD_MANIFEST)}: format {build.record.get('format')!r}, not {BUILD_FORMAT!r}: "
            f"read it with the version that wrote it"
        )
    return build.record


def summary(build: dict) -> str:
    """A few lines for a person: where the dataset is, how much is in it, and whether it verified."""
    c = build["conservation"]
    lines = [
        f"dataset: {build['dataset']}",
        f"digest:  {build['digest']} (sha256 of the files' checksums: equal digests, equal bytes)",
        f"documents: {c['docs_in']:,} read = {c['docs_out']:,} written + {c['empty']:,} empty + "
        f"{c['quarantined']:,} quarantined ({'holds' if c['holds'] else 'DOES NOT HOLD'})",
        f"tokens: {build['tokens']:,} in {len(build['files'])} files, {c['tokens_dropped']:,} dropped",
        f"verify: {'passed' if build['verify']['ok'] else 'FAILED'} ({build['verify']['files']} files)",
    ]
    inputs = build.get("inputs") or {}
    if "arrived_after_plan" in inputs:  # builds since plans were fixed
        arrived = inputs["arrived_after_plan"]["files"]
        later = f"; {arrived:,} arrived after the plan, left for the next build" if arrived else ""
        lines.insert(3, f"inputs: the plan's {inputs['files']:,} files, each read once{later}")
    if "report" in build:  # the run folder holds the dataset's folder and the report
        lines.append(f"report: {join(build['dataset'].rsplit('/', 1)[0], build['report']['html'])}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tokenization.build BUILDS_FOLDER: the summary of the newest build
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m tokenization.build BUILDS_FOLDER")
    try:
        print(summary(latest_build(sys.argv[1])))
    except (OSError, ValueError) as exc:  # no LATEST, or one (or a record) that cannot be used: its one line
        sys.exit(f"error: {exc}")
    except (KeyError, TypeError) as exc:  # this version's format, but a field missing or of another type
        where = join(read_latest(sys.argv[1]), BUILD_MANIFEST)
        sys.exit(f"error: {where}: not a build record this version can summarize ({type(exc).__name__}: {exc})")
