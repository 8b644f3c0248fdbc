"""A build's plan: made once, when its run claims its folder, and the only thing a later step or a resume takes.

A plan is what decides the dataset's bytes: the params (less the few that cannot change a byte), the seed, the
tokenizer's and the chat template's sha256, and the exact input files, each with the identity a listing gave it
(``records.InputFile``) and, for a local file an earlier night's ranks hashed, the sha256 of its bytes
(``inputs.content.with_content``: no plan reads a file; a new one is planned by its ``stat``). It is recorded
in the run's claim (``runs.claim``), so it exists before any work and cannot be replaced. Ranks take their share
of its file list, never a new listing; a re-run of the same run id resumes only when it would make the very same
plan (files that arrived since are left out, and named; a file whose bytes did not change is the same file); the
books check that the ranks read exactly the plan's files, each once.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from functools import cached_property

import orjson

from tokenization.inputs.content import Remembered, difference
from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import InputListing, key_of, list_input_files, split_files
from tokenization.mixing.spec import MixtureError
from tokenization.options import Options, params
from tokenization.output.runs import RUN_CLAIM, BuildError, PlanConflict, read_claim
from tokenization.records import (
    BuildParams,
    BuildSpec,
    InputFile,
    PlannedInputs,
    PlannedTokenizer,
    PlanRecord,
    RunClaim,
)
from tokenization.storage.folder import Folder, StorageOptions
from tokenization.wording import counted

log = logging.getLogger(__name__)

# Params that choose how the work is done, never what it writes: exact engines give identical ids (the tests prove
# it), and threads, the memory budget, batches, working folders and the tokenization cache only change how fast the
# same bytes come; keeping the intermediate token files only changes what stays once the build is published.
# (The seed is planned as resolved, on its own: the param may be None.)
NOT_PLANNED = (
    "engine",
    "threads",
    "memory_budget_mb",
    "batch_size",
    "batch_bytes",
    "local_working_dir",
    "merge_working_dir",
    "cache",
    "keep_intermediate",
    "seed",
)
SHOWN = 5  # files named in a message, then a count


@dataclass(frozen=True)
class Plan:
    """The record itself (``record``, as ``_RUN.json`` holds it) and its digest, which every manifest carries."""

    record: PlanRecord

    @classmethod
    def make(
        cls,
        config: Options,
        seed: int,
        tokenizer_sha256: str,
        eos_token: str | None,
        rendering_sha256: str | None,
        listing: InputListing,
        sources: list[int] | None = None,
    ) -> Plan:
        """The plan of these settings and files (``sources``: a mixture's source of each file)."""
        planned = {k: v for k, v in params(config).items() if k not in NOT_PLANNED}
        inputs = PlannedInputs(files=listing.files, skipped=listing.skipped, hidden=listing.hidden, sources=sources)
        return cls(
            PlanRecord(
                params=BuildParams.of(planned),
                seed=seed,
                tokenizer=PlannedTokenizer(sha256=tokenizer_sha256, eos_token=eos_token),
                rendering_sha256=rendering_sha256,
                inputs=inputs,
            )
        )

    @cached_property
    def digest(self) -> str:
        """The sha256 of the plan's JSON, worked out once a plan (a plan of 100,000 files takes 0.1 s)."""
        return hashlib.sha256(orjson.dumps(self.record.to_json(), option=orjson.OPT_SORT_KEYS)).hexdigest()

    @property
    def seed(self) -> int:
        return self.record.seed

    @property
    def files(self) -> list[InputFile]:
        return self.record.inputs.files

    @property
    def shared(self) -> list[InputFile]:
        """What ranks share: the files, and with ``split_input_mb`` big ones as parts (``listing.split_files``)."""
        return split_files(self.files, self.record.params.split_input_mb)

    def share(self, rank: int, num_ranks: int) -> list[InputFile]:
        """Rank ``r`` of ``w`` takes files (or parts) ``r, r + w, ...`` of the sorted list, as datatrove's
        ``get_shard``."""
        return self.shared[rank::num_ranks]

    def sources_of(self, files: Iterable[InputFile]) -> list[int] | None:
        """A mixture's source of each of these files (or parts); None without a mixture."""
        sources = self.record.inputs.sources
        if sources is None:
            return None
        source = {f.url: s for f, s in zip(self.files, sources, strict=True)}
        return [source[f.url] for f in files]

    def refuse_another(
        self, proposed: Plan, listing: InputListing, where: str, remembered: Remembered | None = None
    ) -> list[InputFile]:
        """Resume this plan only if ``proposed`` (what the re-run would plan) is the same plan: same settings, and
        each planned file still there and unchanged (``difference``, with the rows ranks ``remembered``). Returns
        the files that arrived since, which the build leaves out; raises :class:`PlanConflict` naming every
        difference otherwise."""
        differences = _setting_differences(self.record, proposed.record)
        now = {f.url: f for f in listing.files}
        planned = self.files
        gone = [f.url for f in planned if f.url not in now]
        changed = [
            f"{f.url}: {how}" for f in planned if f.url in now and (how := difference(f, now[f.url], remembered))
        ]
        if gone:
            are = "is" if len(gone) == 1 else "are"
            differences.append(f"{counted(len(gone), 'planned input file')} {are} gone ({_named(gone)})")
        if changed:
            differences.append(f"{counted(len(changed), 'planned input file')} changed since ({_named(changed)})")
        if differences:
            raise PlanConflict(
                f"{where} was planned otherwise: {'; '.join(differences)}. A build id resumes only its own plan: "
                f"run these settings or inputs under a new build id"
            )
        known = {f.url for f in planned}
        arrived = [f for f in listing.files if f.url not in known]
        if arrived:
            log.warning(
                "%s arrived after %s was planned and are not in this build: %s",
                counted(len(arrived), "input file"),
                where,
                _named([f.url for f in arrived]),
            )
        return arrived


@dataclass(frozen=True)
class Run:
    """A run that claimed its folder: the folder and its claim, which records the plan, when the run started, and
    what loading the tokenizer told it. ``Build.start`` makes it; every later step is handed its ``spec`` (the folder
    and the plan's digest) and reads the rest from the claim (``of``)."""

    run_dir: str
    claim: RunClaim

    @cached_property
    def plan(self) -> Plan:
        if self.claim.plan is None:  # read_claim refuses such a claim (an older version's) before it gets here
            raise BuildError(f"{Folder(self.run_dir).url_of(RUN_CLAIM)}: records no plan")
        return Plan(self.claim.plan)

    @property
    def spec(self) -> BuildSpec:
        return BuildSpec(run_dir=self.run_dir, digest=self.plan.digest)

    @classmethod
    def of(cls, spec: BuildSpec, storage_options: StorageOptions | None = None) -> Run:
        """The run ``spec`` names, read from its claim (opened with ``storage_options``), when the claim records the
        plan with the spec's digest (the plan the run was started with); else an error saying the run folder was
        replaced since."""
        global _last_run
        run_dir = Folder(spec.run_dir, storage_options)
        claimed = read_claim(run_dir)
        if _last_run is not None and _last_run.claim is claimed and _last_run.run_dir == spec.run_dir:
            run: Run | None = _last_run  # the same bytes, decoded once (``Record.loads``): its plan's digest is known
        else:
            run = None if claimed is None else cls(spec.run_dir, claimed)
        if run is None or run.plan.digest != spec.digest:
            raise BuildError(
                f"{run_dir.url_of(RUN_CLAIM)}: {'missing' if run is None else f'records plan {run.plan.digest}'}, "
                f"not this run's plan {spec.digest}: the run folder was replaced after the run started"
            )
        _last_run = run
        return run


_last_run: Run | None = None  # the run ``Run.of`` read last: the steps of a build's process read it again and again


def _setting_differences(recorded: PlanRecord, proposed: PlanRecord) -> list[str]:
    """Every setting that differs, as ``name now (planned before)``."""
    found = []
    was, now = recorded.params.to_json(), proposed.params.to_json()
    for name in sorted(set(was) | set(now)):
        if was.get(name) != now.get(name):
            found.append(f"{name} {now.get(name)!r} (planned {was.get(name)!r})")
    for label, before, after in (
        ("seed", recorded.seed, proposed.seed),
        ("tokenizer sha256", recorded.tokenizer.sha256, proposed.tokenizer.sha256),
        ("EOS token", recorded.tokenizer.eos_token, proposed.tokenizer.eos_token),
        ("chat template sha256", recorded.rendering_sha256, proposed.rendering_sha256),
    ):
        if before != after:
            found.append(f"{label} {after!r} (planned {before!r})")
    return found


def _named(urls: list[str]) -> str:
    return ", ".join(urls[:SHOWN]) + (f" and {len(urls) - SHOWN} more" if len(urls) > SHOWN else "")


def unread_or_reread(planned: Iterable[InputFile], read: Iterable[InputFile]) -> str | None:
    """What is wrong with the files (or parts) the ranks read (their manifests' ``inputs``) against what the plan
    shares out (``Plan.shared``), or None when they read exactly that, each once."""
    want = Counter(planned)
    got = Counter(read)
    problems = []
    if twice := sorted(f.name for f, n in got.items() if n > 1):
        problems.append(f"read more than once: {_named(twice)}")
    if never := sorted(f.name for f in want.keys() - got.keys()):
        problems.append(f"planned but never read: {_named(never)}")
    if strangers := sorted(f.name for f in got.keys() - want.keys()):
        problems.append(f"read but not planned: {_named(strangers)}")
    return "; ".join(problems) or None


def list_inputs(
    inputs: list[str], names: list[str] | None, storage_options: StorageOptions | None, quiet: bool = False
) -> tuple[InputListing, list[int] | None]:
    """A build's input files: its input's listing; or, for a mixture (each source's ``inputs``, its ``names``), each
    source's listing in turn, with each file's source. A file that two sources reach, by one path or two (a
    symlink, a hard link, ``..``: ``inputs.listing.file_key``), is refused: a document belongs to one."""
    if names is None:
        return list_input_files(inputs, storage_options, quiet), None
    listings = [_source_listing(spec, name, storage_options, quiet) for spec, name in zip(inputs, names, strict=True)]
    owner: dict[Hashable, tuple[int, str]] = {}
    for source, listing in enumerate(listings):
        for file in listing.files:
            first, url = owner.setdefault(key_of(file, storage_options), (source, file.url))
            if first != source:
                where = (
                    f"{url} is in mixture sources {names[first]!r} and {names[source]!r}"
                    if url == file.url
                    else f"{url} of mixture source {names[first]!r} and {file.url} of {names[source]!r} are one file"
                )
                raise MixtureError(f"{where}: a file belongs to one source; narrow their inputs")
    files = [file for listing in listings for file in listing.files]
    skipped = [name for listing in listings for name in listing.skipped]
    merged = InputListing(files, skipped, sum(listing.hidden for listing in listings))
    return merged, [source for source, listing in enumerate(listings) for _ in listing.files]


def _source_listing(spec: str, name: str, storage_options: StorageOptions | None, quiet: bool) -> InputListing:
    """A mixture source's input files; a listing error names the source, and so does a source whose files are all
    empty (0 bytes): it could only be found after every rank tokenized, as an empty mixture."""
    try:
        listing = list_input_files([spec], storage_options, quiet)
    except InputError as exc:
        raise InputError(f"mixture source {name!r}: {exc}") from None
    if not any(file.size for file in listing.files):
        files = counted(len(listing.files), "input file")
        raise InputError(f"mixture source {name!r}: {spec} holds only empty files ({files} of 0 bytes): no documents")
    return listing
