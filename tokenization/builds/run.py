"""A whole corpus build as a library object: the same plan, stages and publish whether Airflow runs it (a task a
step, through the glue in ``plugins/``) or ``tokenization build`` runs it on one machine, so both give the same
bytes for the same params::

    start (check, claim the run folder, fix the seed) -> tokenize (a rank each) -> every shard complete
        -> merge -> context shuffle (a shard each) -> publish (verify, account, report, _BUILD.json, then the
        intermediate token files removed)

Once the build is published, a step run again (a task cleared in Airflow's Grid, ``tokenization build`` with the
same build id) does nothing and returns what its records say: the files it would read or write may be gone on
purpose (``tokenization.builds.footprint``), and the published build must not change under its ``_BUILD.json``.

The run folder's layout is in ``tokenization.output.runs``; the books that publish checks are in
``tokenization.builds.accounting``.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from tokenization.builds import accounting, complete
from tokenization.builds.complete import Published
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Run
from tokenization.builds.start import claimed_run
from tokenization.builds.workers import in_processes
from tokenization.formats import DS, list_token_files
from tokenization.formats.names import rank_stem
from tokenization.inputs.content import for_its_rank
from tokenization.mixing import CHOICE, RankChoice, read_choice
from tokenization.output import manifest
from tokenization.output.cache import OFF
from tokenization.output.leases import leased, new_holder
from tokenization.output.manifest import StageResult
from tokenization.output.runs import (
    BUILD_MANIFEST,
    BuildError,
    Layout,
    PlanConflict,
)
from tokenization.progress import ProgressMode
from tokenization.records import (
    BuildSpec,
    ContextCounts,
    ContextManifest,
    InputFile,
    MergeCounts,
    MergeManifest,
    RankManifest,
)
from tokenization.stages.context_shuffle import ContextOptions, ContextShuffleConfig, context_shuffle
from tokenization.stages.merge import merge
from tokenization.stages.merge.config import MergeConfig, MergeOptions
from tokenization.stages.merge.inputs import NoInputs
from tokenization.stages.tokenize import RankOptions, RankShare, TokenizeConfig, tokenize_rank
from tokenization.storage.folder import Folder
from tokenization.storage.locations import AllowedLocations
from tokenization.tokenizer.counts import Counts
from tokenization.tokenizer.documents import DocumentOptions
from tokenization.tokenizer.encoding import limit_hf_threads
from tokenization.tokenizer.loading import TokenizerFile

log = logging.getLogger(__name__)

BUILD_LEASE = "build"  # the lease a whole run of a build holds in its run folder (``.build.lock``, or on S3
# ``_leases/build.json``), beside those of its steps' outputs in the stage folders
DATASET_NAME = "corpus"  # the merged files are NNN_corpus.ds
M = TypeVar("M", RankManifest, MergeManifest, ContextManifest)


class Build:
    """One build run: its config and the run that claimed its folder with the plan made once for it. Each step is
    a method that Airflow's tasks and the command line call alike; every step opens storage with the config's
    storage options (its folders: ``config.folder``)."""

    def __init__(self, config: BuildConfig, run: Run):
        self.config, self.claimed, self.plan = config, run, run.plan
        self.layout = Layout(config.folder(run.run_dir))

    @classmethod
    def start(cls, config: BuildConfig, run_id: str, allowed: AllowedLocations | None = None) -> Build:
        """The build of ``config`` under ``run_id``, its plan made and its run folder claimed (``start.claimed_run``:
        what is checked first, within the ``allowed`` locations when given)."""
        return cls(config, claimed_run(config, run_id, allowed))

    @classmethod
    def of(cls, config: BuildConfig, spec: object, where: str) -> Build:
        """The build a later step is handed: its config, and the spec that ``start`` made (``run.spec``), read from
        its JSON (``where`` it was found, for messages) and held against the run's claim. Its mixture must be the
        planned one: a step reads the mixture's file again (Airflow's ``mixture_file``), which may have changed."""
        run = Run.of(BuildSpec.from_json(spec, where), config.storage_options)
        if config.mixture != (planned := run.plan.record.params.mixture):
            raise PlanConflict(
                f"{run.run_dir} was planned with another mixture (its file changed since?): {config.mixture!r} "
                f"(planned {planned!r}). A build id resumes only its own plan: run this mixture under a new build id"
            )
        return cls(config, run)

    @staticmethod
    def run_dir_of(spec: object, where: str) -> str:
        """The run folder a spec names (``where`` it was found, for messages), without reading the run's claim."""
        return BuildSpec.from_json(spec, where).run_dir

    @staticmethod
    def entered(threads: int | None) -> None:
        """Called by a process that runs build steps, at its start (an Airflow task, a build's worker): caps HF
        tokenizers' threads for the whole process (``limit_hf_threads``)."""
        limit_hf_threads(threads)

    @property
    def ranks(self) -> list[int]:
        return list(range(self.config.num_ranks))

    @property
    def merges(self) -> bool:
        """Whether the rank files are merged (and context-shuffled): the ds format's are; Megatron's are the dataset."""
        return self.config.output_format == "ds"

    @property
    def merge_buckets(self) -> list[int | None]:
        """What each merge task takes: a bucket each, or everything (None) in one task; nothing without a merge."""
        if not self.merges:
            return []
        return list(range(self.config.num_buckets)) if self.config.num_buckets else [None]

    def tokenize(
        self, rank: int, progress: ProgressMode = None, owner: str | None = None
    ) -> StageResult[Counts, RankManifest]:
        """Rank ``rank``'s share of the plan's files, never a new listing."""
        if self._published(f"rank {rank}"):
            record = self._recorded(self.layout.ranks, rank_stem(rank), RankManifest)
            return StageResult(Counts.of(record.counts), record)
        run = Run.of(self.claimed.spec, self.config.storage_options)  # read again: a replaced run folder is refused
        files = run.plan.share(rank, self.config.num_ranks)
        share = RankShare(
            files=files,
            plan=run.plan.digest,
            tokenizer_sha256=run.plan.record.tokenizer.sha256,
            rendering_sha256=run.plan.record.rendering_sha256,
            run_dir=self.layout.run_dir,
            tokenizer=run.claim.tokenizer,
            mixture=self.config.mixed,
            sources=run.plan.sources_of(files),
            choice=None if self.config.mixed is None else self._choice(rank_stem(rank)),
        )
        config = TokenizeConfig(
            inputs=self.config.inputs,
            output=self.layout.ranks.url,
            seed=self.plan.seed,
            rank=rank,
            world_size=self.config.num_ranks,
            local_working_dir=self.config.local_working_dir,
            cache=self.config.cache_location or OFF,
            **self.config.shared(DocumentOptions, RankOptions),
        )
        return tokenize_rank(config, progress, owner, share)

    def _choice(self, stem: str) -> RankChoice | None:
        """The rank's part of the choice the plan made of a mixture's documents (``builds.choice``), if it made one."""
        found = read_choice(self.layout.run.sub(CHOICE), [stem])
        return None if found is None else found[stem]

    def incomplete_ranks(self) -> dict[int, str]:
        """Every rank whose shard is not complete on storage yet, with the reason (none once the build is published:
        its rank files may be gone on purpose)."""
        if self._published("the shard check"):
            return {}
        return accounting.incomplete_ranks(self.layout.ranks, self.config.num_ranks, self.plan.digest)

    def merge(
        self, bucket: int | None = None, progress: ProgressMode = None, owner: str | None = None
    ) -> StageResult[MergeCounts, MergeManifest]:
        """The global merge of every rank file, or of one bucket of them."""
        config = MergeConfig(
            input=self.layout.ranks.url,
            output=self.layout.merged.url,
            save_filename=DATASET_NAME,
            seed=self.plan.seed,
            bucket=bucket,
            save_loss=self.config.save_loss,
            local_working_dir=self.config.merge_working_dir or self.config.local_working_dir,
            mixture=self.config.mixed,
            choice=None if self.config.mixed is None else self.layout.run.sub(CHOICE).url,
            **self.config.shared(MergeOptions),
        )
        if self._published(f"merge {config.stem}"):
            record = self._recorded(self.layout.merged, config.stem, MergeManifest)
            return StageResult(record.counts, record)
        dataset = not self.config.context_window  # no context shuffle follows: the merge's files are the dataset
        try:
            return merge(
                config, progress, owner, complete.dataset_checks(self.config, self.claimed) if dataset else None
            )
        except NoInputs:  # the ranks' manifests say why, when their input held no record
            ranks = accounting.rank_manifests(self.layout.ranks, self.config.num_ranks)
            if problem := accounting.nothing_read(ranks, self.config.inputs):
                raise BuildError(problem) from None
            raise

    def context_shards(self) -> list[int]:
        """The context-shuffle tasks to run: at most one a merged file, none when the window is 0. Once the build is
        published, those that ran, as its record says (the merged files may be gone)."""
        if not (self.merges and self.config.context_window):
            return []
        if published := self._published("the context shards"):
            shuffled = published.record.stages.context_shuffle
            merged_files = shuffled.files if shuffled else 0
        else:
            merged_files = len(list_token_files(self.layout.merged, (DS,)))
        return list(range(min(self.config.num_context_shards, merged_files)))

    def context_shuffle(
        self, shard: int, num_shards: int, progress: ProgressMode = None, owner: str | None = None
    ) -> StageResult[ContextCounts, ContextManifest]:
        pad_token, pad_id = self.pad() if self.config.context_mode == "packed" else (None, None)
        config = ContextShuffleConfig(
            input=self.layout.merged.url,
            output=self.layout.context.url,
            seed=self.plan.seed,
            shard=shard,
            num_shards=num_shards,
            local_working_dir=self.config.local_working_dir,
            pad_id=pad_id,
            pad_token=pad_token,
            **self.config.shared(ContextOptions),
        )
        if self._published(f"context shard {shard}"):
            record = self._recorded(self.layout.context, config.stem, ContextManifest)
            return StageResult(record.counts, record)
        return context_shuffle(config, progress, owner, complete.dataset_checks(self.config, self.claimed))

    def pad(self) -> tuple[str, int]:
        """The token packed windows are padded with: the tokenizer's own pad token, else the build's EOS."""
        tokenizer = TokenizerFile.load(self.config.tokenizer, self.claimed.claim.tokenizer, self.config.storage_options)
        own = tokenizer.pad()
        facts = self.claimed.claim.tokenizer
        if own is not None:
            pad = own
        elif facts is not None and facts.eos_token is not None and facts.eos_id is not None:  # (set together)
            pad = (facts.eos_token, facts.eos_id)
        else:
            raise BuildError(
                f"{self.config.tokenizer}: packed windows need a pad token; it has none, and the build "
                "writes no EOS to pad with"
            )
        log.info("packed windows are padded with %r (id %d), %s", *pad, "its pad token" if own else "its EOS")
        return pad

    def publish(self, keep: int | None = None) -> Published:
        """Verify, account, report and declare the build complete (``complete.publish``)."""
        return complete.publish(self.config, self.claimed, keep)

    def published(self) -> Published | None:
        """This build as published, when it already is (its ``_BUILD.json`` records this very plan)."""
        return complete.published(self.config, self.claimed)

    def unpublish(self) -> None:
        """Take back ``_BUILD.json`` before the files it describes may change."""
        complete.unpublish(self.config, self.claimed)

    def _published(self, step: str) -> Published | None:
        """This build as published, when it is, said in one line: ``step``, run again, then does nothing."""
        done = self.published()
        if done is not None:
            log.info(
                "%s: %s is published already, so this step changes nothing and returns what its records say",
                step,
                self.layout.run_dir,
            )
        return done

    def _recorded(self, stage: Folder, stem: str, kind: type[M]) -> M:
        """The manifest a step wrote in ``stage``: what that step, run again once the build is published, returns."""
        where = stage.url_of(manifest.manifest_name(stem))
        record = kind.read(stage, manifest.manifest_name(stem))
        if record is None:
            raise BuildError(
                f"{where}: missing, though the build is published: to build it again, clear the whole run in Airflow "
                f"(or remove its {BUILD_MANIFEST}) and run it again"
            )
        return record

    def run(self, parallel: int = 1, progress: ProgressMode = None, keep: int | None = None) -> Published:
        """The whole build on this machine: the ranks as up to ``parallel`` processes at once, the merge, the
        context shards (as processes too, but a lone one here), then publish (keeping ``keep`` complete builds, when
        given). A step that fails stops the build; running it again with the same build id keeps the complete ranks,
        resumes the merge after its last published file, and redoes the rest, with the same bytes; a build already
        published is returned as it is (``publish``). One run of a build at a time: a second one started meanwhile
        steps aside at once, naming the first (``BUILD_LEASE``), where the two would each undo the other's ranks."""
        with leased(self.layout.run, BUILD_LEASE, new_holder("tokenization build")):
            if self.published() is None:
                self._steps(parallel, progress)
            return self.publish(keep)

    def _steps(self, parallel: int, progress: ProgressMode) -> None:
        """Every step but publish: the ranks not complete yet, the merge, the context shards. A rank whose shard is
        damaged shows only once every rank has its marker (``incomplete_ranks`` reads the shards then), so the ranks
        found then are tokenized too; a rank is tokenized once at most."""
        tokenized: set[int] = set()
        missing = self.incomplete_ranks()
        while todo := {rank: why for rank, why in missing.items() if rank not in tokenized}:
            for rank, why in sorted(todo.items()):
                if why != accounting.UNMARKED:  # a shard done once, damaged since: said, then made again
                    log.warning("rank %d is tokenized again: %s", rank, why)
            shares = {rank: self.plan.share(rank, self.config.num_ranks) for rank in todo}
            text = sum(f.span_bytes for share in shares.values() for f in share)
            in_processes(self, "tokenize", [(rank,) for rank in _longest_first(shares)], parallel, progress, text)
            tokenized |= set(shares)
            missing = self.incomplete_ranks()  # what ends the loop is what is checked after it: read once
        if missing:
            raise BuildError(f"ranks not complete after tokenizing: {missing}")
        if self.config.num_buckets:
            in_processes(self, "merge", [(bucket,) for bucket in self.merge_buckets], parallel, progress)
        elif self.merges:
            self.merge(None, progress)
        shards = self.context_shards()
        if len(shards) == 1:  # one shard runs here, as one merge does: a worker to start cost more than it did
            self.context_shuffle(shards[0], 1, progress)
        else:
            in_processes(self, "context_shuffle", [(shard, len(shards)) for shard in shards], parallel, progress)


def _longest_first(shares: dict[int, list[InputFile]]) -> list[int]:
    """The ranks in the order their processes start: the most bytes to tokenize first (of files the plan did not
    recognise unchanged, which the cache is unlikely to hold), then the most bytes. With fewer processes than ranks,
    the rank that holds a night's changed files then starts at once, and the ranks whose files are all hits share the
    other processes meanwhile, rather than it starting last and running alone at the end."""

    def work(rank: int) -> tuple[int, int, int]:
        files = shares[rank]
        return -sum(f.span_bytes for f in files if for_its_rank(f)), -sum(f.span_bytes for f in files), rank

    return sorted(shares, key=work)
