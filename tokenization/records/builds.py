"""Records of a whole build: its plan, its claim on a run folder, its books (conservation, stage summaries,
footprint) and the build record that publishes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokenization.records.cache import CacheCleaning, CacheSize, CacheSummary, PlanReading
from tokenization.records.codec import Record, unless_none
from tokenization.records.contents import ContentsSum
from tokenization.records.inputs import InputFile
from tokenization.records.mixtures import SourceAccount, SourceShare
from tokenization.records.params import BuildParams
from tokenization.records.stages import ContextCounts, MergeCounts
from tokenization.records.tokenizer import BuildTokenizer, PlannedTokenizer, TokenizerFacts


@dataclass(frozen=True, kw_only=True)
class PlannedInputs(Record):
    files: list[InputFile]
    skipped: list[str]
    hidden: int
    sources: list[int] | None = field(default=None, metadata=unless_none())  # a mixture's: each file's source


@dataclass(frozen=True, kw_only=True)
class PlanRecord(Record):
    """What decides a build's bytes, fixed once (``tokenization.builds.plan``): its digest is in every rank manifest."""

    params: BuildParams
    seed: int
    tokenizer: PlannedTokenizer
    rendering_sha256: str | None
    inputs: PlannedInputs


@dataclass(frozen=True, kw_only=True)
class RunClaim(Record):
    """``{run}/_RUN.json``, written before anything else: which run owns the folder, since when, its plan, and
    what loading the tokenizer told the plan, so that no later step loads it but to encode (version 1 held no plan,
    so no build of it can be resumed, though it still owns its folder; version 2 no tokenizer facts)."""

    KIND: ClassVar[str] = "run"
    VERSION: ClassVar[int] = 3
    UNTAGGED: ClassVar[bool] = True  # version 1's claims were written without a tag
    LABEL: ClassVar[str] = "run claim"
    run_id: str
    claimed: float
    plan: PlanRecord | None = None
    tokenizer: TokenizerFacts | None = field(default=None, metadata=unless_none())
    reading: PlanReading | None = field(default=None, metadata=unless_none())  # what the plan read (a cache's)


@dataclass(frozen=True, kw_only=True)
class BuildSpec(Record):
    """What the step that starts a build hands the later ones (in Airflow, the XCom ``spec``): the run folder and
    its plan's digest. Each step reads the plan from the run's claim, and goes on only if it has this digest, so
    that a run folder replaced since is refused (version 1 also copied 12 of the plan's fields; they are ignored)."""

    KIND: ClassVar[str] = "build-spec"
    VERSION: ClassVar[int] = 2
    UNTAGGED: ClassVar[bool] = True
    LABEL: ClassVar[str] = "build spec"

    run_dir: str
    digest: str


@dataclass(frozen=True, kw_only=True)
class Conservation(Record):
    """Documents in = documents out + empty + quarantined, over the ranks, and whether the ranks read exactly the
    plan's files (``inputs_problem`` says how not)."""

    docs_in: int
    docs_out: int
    empty: int
    quarantined: int
    rejected_by_reason: dict[str, int]
    tokens: int
    tokens_dropped: int
    inputs_problem: str | None = None
    holds: bool
    # a mixture whose documents the plan chose: the tokens of those no source uses, which the ranks held and did
    # not move (``tokens`` is what they wrote); None: the ranks wrote every document
    tokens_not_chosen: int | None = field(default=None, metadata=unless_none())


@dataclass(frozen=True, kw_only=True)
class TokenizeSummary(Conservation):
    ranks: int
    input_files: int
    contents_in: ContentsSum | None = None  # the ranks' (None: a build made before contents were recorded)
    contents_out: ContentsSum | None = None


@dataclass(frozen=True, kw_only=True)
class StageSummary(Record):
    """The tokenize stage's books, and the summed counts of the merge's and the context shuffle's manifests."""

    tokenize: TokenizeSummary
    merge: MergeCounts | None = None
    context_shuffle: ContextCounts | None = None


@dataclass(frozen=True, kw_only=True)
class Arrived(Record):
    files: int
    first: list[str]


@dataclass(frozen=True, kw_only=True)
class BuildInputs(Record):
    """The build's account of its input: the files its plan holds, and what its listing left out."""

    spec: str | None
    files: int
    bytes: int
    skipped: int | None = None
    hidden: int | None = None
    arrived_after_plan: Arrived | None = None  # builds before plans were fixed kept no such list


@dataclass(frozen=True, kw_only=True)
class VerifySummary(Record):
    ok: bool
    files: int
    tokens: int
    notes: list[str]


@dataclass(frozen=True, kw_only=True)
class FolderBytes(Record):
    """One of a build's stage folders (``ranks``, ``merged``, ``context``) once the build is published: the bytes it
    holds, and those of the token files publish removed from it (its records stay)."""

    name: str
    held: int
    removed: int


@dataclass(frozen=True, kw_only=True)
class Footprint(Record):
    """What a published build takes on storage: each stage folder's bytes, in the order the stages write them, and
    its tokenization cache's size (None: no cache, or one that could not be measured)."""

    folders: list[FolderBytes]
    cache: CacheSize | None

    @property
    def held(self) -> int:
        return sum(folder.held for folder in self.folders)

    @property
    def removed(self) -> int:
        return sum(folder.removed for folder in self.folders)


@dataclass(frozen=True, kw_only=True)
class ReportFiles(Record):
    html: str
    json: str


@dataclass(frozen=True, kw_only=True)
class MdsOutput(Record):
    """A build's context windows as MDS shards (``stages.export_mds``): where, how many, and the sha256 of the
    ``index.json`` that names the shards (each with its sha1)."""

    folder: str
    shards: int
    windows: int
    tokens: int
    index_sha256: str


@dataclass(frozen=True, kw_only=True)
class BuildRecord(Record):
    """``{run}/_BUILD.json``, written last by publish: its presence means the build is complete, and every figure
    a person or a scheduler looks at comes from it."""

    KIND: ClassVar[str] = "build"
    # /5 had no removed or footprint; /4 no contents; /3 no packing counts; /2 no cache; /1 the same, unchecked
    VERSION: ClassVar[int] = 6
    LABEL: ClassVar[str] = "build record"
    run_id: str | None = None
    plan: str | None = None  # the plan's digest; builds before plans were fixed had none
    dataset: str
    input: str
    seed: int
    tokenizer: BuildTokenizer
    params: BuildParams
    inputs: BuildInputs | None = None
    started: str
    finished: str | None = None
    wall_seconds: float | None = None
    conservation: Conservation
    token_flow: dict[str, int] = field(default_factory=dict)
    tokens: int
    digest: str
    files: list[str]
    stages: StageSummary
    verify: VerifySummary
    report: ReportFiles | None = None  # where publish wrote the report (None: a build made before reports)
    cache: CacheSummary | None = None  # None: built without a tokenization cache
    removed: list[str] = field(default_factory=list)  # stage folders whose token files publish removes (records stay)
    footprint: Footprint | None = None  # None: a build made before footprints were measured
    mixture: list[SourceAccount] | None = field(default=None, metadata=unless_none())  # a mixture's, by source
    mds: MdsOutput | None = field(default=None, metadata=unless_none())  # where the build also wrote MDS

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The values of these params, as recorded (None for one that the version which made the build did not
        have)."""
        recorded = self.params.to_json()
        return {name: recorded.get(name) for name in names}


@dataclass(frozen=True, kw_only=True)
class BuildSummary(Record):
    """A published build in a few figures, from its build record: for XCom, the Asset event and the builds page
    (``latest``: the run folder ``{output}/LATEST`` names; ``deleted``: complete builds retention deleted;
    ``reused``: the share of the input whose tokens came from the cache; ``footprint``: what it takes on storage;
    ``mixture``: a mixture's shares reached, by source; ``started`` and ``wall_seconds``: the build's, plan to
    publish, which a cleared task does not reset as it does the Airflow run's). Untagged before version 1; version 1
    had no footprint, version 2 no times."""

    KIND: ClassVar[str] = "build-summary"
    VERSION: ClassVar[int] = 3
    UNTAGGED: ClassVar[bool] = True
    LABEL: ClassVar[str] = "build summary"
    dataset: str
    digest: str
    tokens: int
    docs: int
    rejects: int
    files: int
    verified: bool
    latest: str
    deleted: list[str]
    seed: int
    tokenizer: str
    input: str
    reused: float | None = None
    footprint: Footprint | None = None
    mixture: list[SourceShare] | None = field(default=None, metadata=unless_none())
    started: str | None = None
    wall_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class Retention(Record):
    """The complete builds a publish deleted, keeping the newest ``keep``, and the cache entries that only they
    used: the report lists them."""

    keep: int
    deleted: list[str]
    cache: CacheCleaning | None = None
