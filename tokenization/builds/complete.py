"""Publishing a build: verify its dataset, check its books from the manifests on storage, write its report, then
``_BUILD.json``, which declares it complete, point ``{output}/LATEST`` at it, and remove the intermediate token files
(``tokenization.builds.footprint``); or take that declaration back.

Verifying reads no byte of the files whose stage checked them before upload (the context shuffle does): publish
checks their records, sizes and books, so its time does not grow with the dataset's bytes."""

from __future__ import annotations

import logging
import re
import shlex
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import cast

from tokenization.builds import accounting, footprint
from tokenization.builds.config import BuildConfig
from tokenization.builds.latest import LatestError, expire, latest_complete_build, point_latest, read_latest
from tokenization.builds.pages import size
from tokenization.builds.plan import Plan, Run, list_inputs
from tokenization.builds.report import REPORT_HTML, REPORT_JSON, write_report
from tokenization.errors import TokenizationError
from tokenization.formats import MEGATRON, names, token_file_names
from tokenization.formats.block_checks import Checks
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import may_hold_others
from tokenization.options import params
from tokenization.output import manifest
from tokenization.output.attempts import remove_staging
from tokenization.output.cache import Cache
from tokenization.output.runs import BUILD_MANIFEST, BuildError, Layout, read_build
from tokenization.records import (
    Arrived,
    BuildInputs,
    BuildParams,
    BuildRecord,
    BuildSummary,
    BuildTokenizer,
    CacheCleaning,
    CacheSummary,
    ContextCounts,
    MdsOutput,
    MergeCounts,
    Mixture,
    RankManifest,
    ReportFiles,
    Retention,
    SourceAccount,
    SourceShare,
    StageSummary,
    VerifySummary,
)
from tokenization.stages.export_mds import window_of, write_mds
from tokenization.stages.verify import tokenizer_checks, verify
from tokenization.storage.folder import Folder, StorageOptions, file_at
from tokenization.wording import counted

log = logging.getLogger(__name__)

PROBLEMS_LOGGED = 50
ARRIVED_LISTED = 100  # input files that arrived after the plan, named in the build record (then a count)
MEGATRON_DATA_PATH = "megatron_data_path.txt"  # a Megatron build's --data-path, beside its report
WEIGHT_SCALE = 10**12  # a mixture's weights in the data path, as integers (each file's part of 10^12)


@dataclass(frozen=True)
class Published:
    """A complete build: its ``_BUILD.json``, where ``{output}/LATEST`` points (``latest``: a run folder) and the
    complete builds that retention deleted."""

    record: BuildRecord
    latest: str
    deleted: list[str]

    def summary(self) -> BuildSummary:
        """A few figures for XCom, the Asset event and the builds page."""
        record = self.record
        return BuildSummary(
            dataset=record.dataset,
            digest=record.digest,
            tokens=record.tokens,
            docs=record.conservation.docs_out,
            rejects=record.conservation.quarantined,
            files=len(record.files),
            verified=record.verify.ok,
            latest=self.latest,
            deleted=self.deleted,
            seed=record.seed,
            tokenizer=record.tokenizer.name,
            input=record.input,
            reused=None if record.cache is None else record.cache.reused,
            footprint=record.footprint,
            mixture=None
            if record.mixture is None
            else [SourceShare(name=a.name, target=a.target, share=a.share) for a in record.mixture],
            started=record.started,
            wall_seconds=record.wall_seconds,
        )


def publish(config: BuildConfig, run: Run, keep: int | None = None) -> Published:
    """Verify the dataset, check that every document and every token is accounted for and that the ranks read
    exactly the plan's files (from the manifests on storage, never from what tasks said), write the report,
    then ``_BUILD.json``, which declares the build complete; then point ``{output}/LATEST`` at the newest
    complete build and, with ``keep``, delete the complete builds older than the newest ``keep`` (listed in the
    report); last, remove the intermediate token files the record names. A publish that fails leaves no
    ``_BUILD.json`` behind, not even an earlier one. A build published already is returned as it is, once the
    removal its record names is done and ``LATEST`` pointed (either cut short is finished then)."""
    folder = config.folder(run.run_dir)
    if (done := published(config, run)) is not None:
        log.info("%s is published already: nothing to publish again", folder.url)
        footprint.remove(Layout(folder), done.record.removed)
        # a publish cut short before it pointed LATEST (killed): pointed now, at the cost of two records
        return replace(done, latest=point_latest(config.folder(config.output), folder.name))
    try:
        ranks = accounting.rank_manifests(Layout(folder).ranks, config.num_ranks)  # read once: each is a file's row
        record = build_record(config, run, ranks)
    except Exception:
        unpublish(config, run)
        raise
    record = replace(record, report=ReportFiles(html=REPORT_HTML, json=REPORT_JSON))
    write_report(folder, record, ranks=ranks)  # before the record that declares the build complete
    if config.output_format == "megatron":
        _write_data_path(folder, config.folder(record.dataset), config.mixed)
    folder.put(BUILD_MANIFEST, record.dumps())
    output = config.folder(config.output)
    newest = point_latest(output, folder.name)
    deleted = expire(output, keep, {newest, folder.url}) if keep else []
    cleaned = _clean_cache(config) if keep else None
    if keep and (deleted or (cleaned and cleaned.entries)):  # (neither without keep)
        write_report(folder, record, Retention(keep=keep, deleted=deleted, cache=cleaned), ranks)
    footprint.remove(Layout(folder), record.removed)
    for stage in Layout(folder).stages.values():
        remove_staging(stage)
    log.info("published %s: %d tokens; report %s", record.dataset, record.tokens, REPORT_HTML)
    return Published(record, newest, deleted)


def _write_data_path(run: Folder, dataset: Folder, mixture: Mixture | None) -> None:
    """Megatron-LM's ``--data-path`` for a Megatron build, beside its report: every ``.bin/.idx`` prefix of the
    dataset (Megatron output is never merged: a rank's files), each weighted by its tokens, which Megatron
    normalizes into its blend; a mixture's by its source's weight too, so that each source is drawn at its share
    (each rank writes each source's documents apart). Each prefix is relative to the run folder (``./ranks/...``),
    so a build moved or copied elsewhere still holds a good data path; Megatron resolves a relative prefix from its
    working directory; ``absolute_data_path`` gives the command that prints them absolute."""
    entries = manifest.output_entries(dataset)
    inner = run.name_of(dataset)
    where = Folder(dataset.url if inner is None else f"./{inner}")
    weight = {name: described.entry.tokens for name, described in entries.items()}
    if mixture is not None:  # a source's files share its weight by their tokens (in integers: Megatron normalizes)
        source = {name: cast(str, names.source_in(name)) for name in entries}
        held: Counter[str] = Counter()
        for name, s in source.items():
            held[s] += weight[name]
        share = dict(zip(mixture.names, mixture.shares, strict=True))
        weight = {name: round(share[s] * WEIGHT_SCALE * weight[name] / held[s]) for name, s in source.items()}
    weighted = [f"{weight[name]} {where.url_of(name.removesuffix(MEGATRON))}" for name in sorted(entries)]
    run.put(MEGATRON_DATA_PATH, (" ".join(weighted) + "\n").encode())


def absolute_data_path(run_dir: str) -> str:
    """The shell command that prints a Megatron build's data path with absolute prefixes: ``megatron_data_path.txt``
    holds them relative to ``run_dir``, which Megatron would resolve from its own working directory."""
    into = re.sub(r"([\\&|])", r"\\\1", run_dir)  # what sed would read as its own in a replacement
    script = "s| \\./| " + into + "/|g"  # each prefix follows its weight and a space
    return f"sed {shlex.quote(script)} {shlex.quote(Folder(run_dir).url_of(MEGATRON_DATA_PATH))}"


def _clean_cache(config: BuildConfig) -> CacheCleaning | None:
    """Retention's part in the tokenization cache: the entries that no build still there used (``Cache.collect``).
    The build is published by then: a cache that cannot be cleaned now (unreachable, or a folder that is no cache)
    is logged, and cleaned by the next publish that can."""
    location = config.cache_folder
    if location is None:
        return None
    try:
        return Cache(location).collect()
    except (OSError, TokenizationError) as exc:
        log.warning("cache %s: not cleaned (%s); the next publish with retention cleans it", location.url, exc)
        return None


def published(config: BuildConfig, run: Run) -> Published | None:
    """This build as published, when it already is (its ``_BUILD.json`` records this very plan)."""
    record = read_build(config.folder(run.run_dir))
    if record is None or record.plan != run.plan.digest:
        return None
    try:
        latest = read_latest(config.folder(config.output)) or ""
    except LatestError:  # a LATEST that names no build here: the next publish rewrites it
        latest = ""
    return Published(record, latest, [])


def unpublish(config: BuildConfig, run: Run) -> None:
    """Take back ``_BUILD.json`` before files it describes may change, or when a publish fails: no build is
    ever declared complete over files that are not the ones it describes."""
    folder = config.folder(run.run_dir)
    if folder.exists(BUILD_MANIFEST):
        folder.remove(BUILD_MANIFEST)
        log.warning("%s removed: the build is incomplete until it is published again", folder.url_of(BUILD_MANIFEST))


def build_record(config: BuildConfig, run: Run, ranks: list[RankManifest]) -> BuildRecord:
    """The record of a build whose dataset verifies and whose books hold, by its ``ranks``' manifests
    (``accounting.rank_manifests``); a BuildError says what does not."""
    if problem := accounting.nothing_read(ranks, config.inputs):  # Megatron's: the rank files are the dataset
        raise BuildError(problem)
    layout = Layout(config.folder(run.run_dir))
    merged = accounting.stage_counts(layout.merged, MergeCounts)
    context = accounting.stage_counts(layout.context, ContextCounts)
    dataset = layout.context if context else layout.merged if config.output_format == "ds" else layout.ranks
    removed = [] if config.keep_intermediate else footprint.intermediate(layout, dataset)
    checked = verify(dataset, checks=dataset_checks(config, run), vouched=True)
    for line in checked.problems[:PROBLEMS_LOGGED]:
        log.warning("verify: %s", line)
    for line in checked.notes:
        log.info("verify: %s", line)
    if not checked.ok:
        found = f"{len(checked.problems)} problem{'s' * (len(checked.problems) != 1)}"
        raise BuildError(f"verify found {found} in {dataset.url}; the build is not published")
    recorded = Run.of(run.spec, config.storage_options).plan  # read again: a run folder replaced since is refused
    balance = accounting.conservation(ranks, recorded.shared)
    if balance.inputs_problem:
        raise BuildError(f"the ranks did not read exactly the plan's input files: {balance.inputs_problem}")
    if not balance.holds:
        raise BuildError(f"documents are not conserved: {balance}")
    mds = _write_mds(layout, checked.tokens) if config.mds else None
    finished = time.time()
    tokenized = accounting.tokenize_summary(ranks, balance, len(recorded.files))
    stages = StageSummary(tokenize=tokenized, merge=merged, context_shuffle=context)
    try:
        accounting.contents_flow(tokenized, stages, chunked=bool(config.shuffle_chunk_size))
    except BuildError as exc:
        raise BuildError(f"{exc}; the build is not published") from None
    return BuildRecord(
        run_id=run.claim.run_id,
        plan=recorded.digest,
        dataset=dataset.url,
        input=config.described_input,
        seed=recorded.seed,
        tokenizer=BuildTokenizer(
            name=config.tokenizer, sha256=recorded.record.tokenizer.sha256, eos=recorded.record.tokenizer.eos_token
        ),
        params=BuildParams.of(params(config)),
        inputs=BuildInputs(
            spec=config.described_input,
            files=len(recorded.files),
            bytes=sum(f.size for f in recorded.files),
            skipped=len(recorded.record.inputs.skipped),
            hidden=recorded.record.inputs.hidden,
            arrived_after_plan=_arrived_after(config, recorded),
        ),
        started=_iso(run.claim.claimed),
        finished=_iso(finished),
        wall_seconds=round(finished - run.claim.claimed, 3),
        conservation=balance,
        token_flow=accounting.token_flow(balance.tokens, stages, checked.tokens),
        tokens=checked.tokens,
        digest=accounting.dataset_digest(dataset, recorded.record.tokenizer.sha256),
        files=token_file_names(dataset.list()),
        stages=stages,
        verify=VerifySummary(ok=checked.ok, files=checked.files, tokens=checked.tokens, notes=checked.notes),
        cache=accounting.cache_summary(ranks, run.claim.reading),
        removed=removed,
        footprint=footprint.measure(layout, removed, config.cache_folder),
        mixture=accounting.mixture_accounts(ranks, merged, config.mixed),
        mds=mds,
    )


def _write_mds(layout: Layout, tokens: int) -> MdsOutput:
    """The verified dataset's windows as MDS in ``{run}/mds``, holding every token verify counted."""
    written = write_mds(layout.context, layout.mds, window_of(layout.context))
    if written.tokens != tokens:
        raise BuildError(f"{written.folder} holds {written.tokens:,} tokens, the dataset {tokens:,}")
    return written


def dataset_checks(config: BuildConfig, run: Run) -> Checks:
    """What the dataset's ids and document ends must be: from the tokenizer facts the run's claim records (a claim
    made before claims recorded them: from its tokenizer, loaded)."""
    facts = run.claim.tokenizer
    if facts is None:
        return tokenizer_checks(config.tokenizer, run.plan.record.tokenizer.eos_token, config.storage_options)
    return Checks(facts.vocab_size, facts.eos_id)


def _arrived_after(config: BuildConfig, recorded: Plan) -> Arrived:
    """The input files that arrived after the plan was made, which this build leaves out: for the report. Listed
    again only when the inputs may hold one (``may_hold_others``): a next night's publish looked at every input
    file's ``stat`` again to find none (~1 s for 20,000 files)."""
    known = {f.url for f in recorded.files}
    if not may_hold_others(config.inputs, known, config.storage_options):
        return Arrived(files=0, first=[])
    try:
        listing, _ = list_inputs(config.inputs, config.source_names, config.storage_options, quiet=True)
    except InputError:  # the input is gone, or empty now: nothing arrived
        return Arrived(files=0, first=[])
    arrived = [f.url for f in listing.files if f.url not in known]
    return Arrived(files=len(arrived), first=arrived[:ARRIVED_LISTED])


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


def latest_build(folder: str, storage_options: StorageOptions | None = None) -> BuildRecord:
    """The record of the newest complete build under a builds folder, the one ``LATEST`` names, checked as publish
    checks a candidate; anything else raises one line naming the file."""
    return latest_complete_build(Folder(folder, storage_options)).record


def cache_line(cache: CacheSummary, parts: bool = False) -> str:
    """``47 of 50 input files from the cache (96.1% of the bytes, 12,345,678 tokens), 3 tokenized in 4.2 s; the
    ranks took 9.8 s`` (``parts``: the ranks took input files and parts of them, not whole files)."""
    files = cache.files_hit + cache.files_missed
    what = counted(files, "input file or part", "input files and parts") if parts else counted(files, "input file")
    share = f"{cache.reused:.1%} of the bytes, " if cache.reused is not None else ""
    tokenized = f"{cache.files_missed:,} tokenized"
    if cache.files_grown:
        tokenized += (
            f" ({cache.files_grown:,} of them grown by lines appended: {counted(cache.lines_encoded or 0, 'line')} "
            f"of theirs encoded, the rest taken from the cache)"
        )
    line = (
        f"{cache.files_hit:,} of {what} from the cache ({share}{cache.tokens_reused:,} tokens), "
        f"{tokenized} in {cache.encode_seconds:.1f} s; the ranks took {cache.tokenize_seconds:.1f} s"
    )
    if cache.input_bytes_read is not None:
        line += f" and read {size(cache.input_bytes_read)} of input"
    if (plan := cache.plan) is not None:
        line += (
            f"; the plan listed {counted(plan.files_listed, 'file')}: {plan.files_recognised:,} recognised unchanged "
            f"without a byte read, {plan.files_hashed:,} new or changed, hashed by their ranks "
            f"({size(plan.bytes_hashed)})"
        )
    return line


def _corrected(rows: int) -> str:
    """``1 remembered identity was wrong and corrected``: rows of known input files that named another sha256 than
    their files' bytes (forged or damaged), which the ranks that read those files corrected."""
    identities = counted(rows, "remembered identity", "remembered identities")
    return f"{identities} {'was' if rows == 1 else 'were'} wrong and corrected"


def _kept(build: BuildRecord) -> list[str]:
    """The summary's line on the shuffles' proof (none for a build made before contents were recorded)."""
    read, merge = build.stages.tokenize.contents_in, build.stages.merge
    if read is None:
        return []
    not_chosen = build.stages.tokenize.tokens_not_chosen
    if merge is not None and merge.sources is not None and not_chosen is not None:  # the plan chose
        held = build.conservation.tokens + not_chosen
        return [
            f"shuffles: the ranks read each of the {read.pieces:,} documents once and moved the ones the mixture "
            f"chose, the merge wrote the {merge.units:,} uses it chose, the context shuffle kept each piece once",
            f"moved: the ranks moved {build.conservation.tokens:,} of the {held:,} tokens they held (the chosen "
            f"documents); {not_chosen:,} not chosen stayed where they were",
        ]
    if merge is not None and merge.sources is not None:  # a mixture's merge wrote what it chose
        return [
            f"shuffles: the ranks kept each of the {read.pieces:,} documents once, the merge wrote the "
            f"{merge.units:,} uses the mixture chose, the context shuffle kept each piece once"
        ]
    return [f"shuffles: every stage kept each of the {read.pieces:,} documents once (contents sum {read.sum})"]


def _unchosen(build: BuildRecord) -> str:
    """What a mixture's merge left out, beside the tokens dropped."""
    merge = build.stages.merge
    if merge is None or merge.sources is None:
        return ""
    return f", {merge.tokens_dropped + (build.stages.tokenize.tokens_not_chosen or 0):,} not chosen by the mixture"


def _mixed(accounts: list[SourceAccount] | None) -> list[str]:
    """The summary's line for each source of a mixture: the share of the tokens it reached, and what it gave."""
    return [
        f"mixture: {a.name} {a.share:.1%} of the tokens (target {a.target:.1%}): {a.docs_chosen:,} of its "
        f"{a.docs_read:,} documents chosen, {a.docs_repeated:,} repeated"
        + (f" ({a.uses:,} uses in all)" if a.docs_repeated else "")
        for a in accounts or []
    ]


def summary(build: BuildRecord) -> str:
    """A few lines for a person: where the dataset is, how much is in it, and whether it verified."""
    c = build.conservation
    lines = [
        f"dataset: {build.dataset}",
        f"digest:  {build.digest} (sha256 of the files' checksums: equal digests, equal bytes)",
        f"documents: {c.docs_in:,} read = {c.docs_out:,} written + {c.empty:,} empty + "
        f"{c.quarantined:,} quarantined ({'holds' if c.holds else 'DOES NOT HOLD'})",
        f"tokens: {build.tokens:,} in {counted(len(build.files), 'file')}, "
        f"{c.tokens_dropped:,} dropped{_unchosen(build)}",
        *_mixed(build.mixture),
        *_kept(build),
        f"verify: {'passed' if build.verify.ok else 'FAILED'} ({counted(build.verify.files, 'file')})",
    ]
    inputs, split_mb = build.inputs, build.params.split_input_mb
    if inputs and inputs.arrived_after_plan:  # builds since plans were fixed
        arrived = inputs.arrived_after_plan.files
        later = f"; {arrived:,} arrived after the plan, left for the next build" if arrived else ""
        read = f"those above {split_mb} MB in parts that ranks shared, each part" if split_mb else "each"
        lines.insert(3, f"inputs: the plan's {counted(inputs.files, 'file')}, {read} read once{later}")
    if build.cache:
        lines.append(f"cache: {cache_line(build.cache, parts=bool(split_mb))}")
        if build.cache.rows_corrected:  # a line of its own: a forged or damaged row is news
            lines.append(f"cache: {_corrected(build.cache.rows_corrected)}")
    if build.footprint:
        lines.append(f"storage: {footprint.described(build.footprint)}")
    folder, _ = file_at(build.dataset)  # the run folder: it holds the dataset's folder, the report and the data path
    run_dir = folder.url
    if build.params.output_format == "megatron":  # Megatron may run from another folder: absolute prefixes
        where = str(folder.local.resolve()) if folder.local is not None else run_dir
        lines.append(f"megatron: --data-path $({absolute_data_path(where)})  (each prefix, weighted by tokens)")
    if build.mds:
        m = build.mds
        lines.append(
            f"mds: {m.folder}: {counted(m.windows, 'window')} in {counted(m.shards, 'shard')} (StreamingDataset)"
        )
    if build.report:
        lines.append(f"report: {folder.url_of(build.report.html)}")
        if folder.local is not None:  # a run id's "%" is part of the folder's name: a browser needs it encoded again
            lines.append(f"open:   {(folder.local / build.report.html).resolve().as_uri()}")
    return "\n".join(lines)
