"""A build's params: with the run's spec (``plan.Run``), what every step of a build is given (in Airflow, the DAG's
Params and the ``plan`` task's XCom ``spec``); and what a deployment asks of them: the Params it offers
(``offered_params``), the locations it allows (``check_locations``, ``allowed_locations``), a tokenizer's folder."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, cast

from tokenization.errors import UsageError
from tokenization.mixing.spec import MIXTURE_SCHEMA, load_mixture_file, read_mixture
from tokenization.options import fields_of, json_schema, option, section
from tokenization.output.cache import DEFAULT_FOLDER, OFF, chosen_location
from tokenization.records import Mixture
from tokenization.stages.context_shuffle import ContextOptions
from tokenization.stages.merge.config import MergeOptions
from tokenization.stages.tokenize import RankOptions
from tokenization.storage import locations
from tokenization.storage.folder import Folder, file_at
from tokenization.storage.locations import AllowedLocations, tokenizer_files
from tokenization.tokenizer.documents import DocumentOptions
from tokenization.tokenizer.loading import FILE_SUFFIXES

ALLOWED_LOCATIONS_SETTING = locations.SETTING  # the variable a deployment lists the locations it allows in


@dataclass(frozen=True)
class Param:
    """A field of ``BuildConfig`` as the DAG offers it: its default (``dataclasses.MISSING`` when it has none), title,
    help, JSON schema, and the section of the trigger form it belongs to (None: the config's own fields)."""

    name: str
    default: Any
    title: str | None
    help: str
    schema: dict[str, Any]
    section: str | None


@dataclass(frozen=True, kw_only=True)
class BuildConfig(DocumentOptions, RankOptions, MergeOptions, ContextOptions):
    """A build's params: the DAG's Params and the options of ``tokenization build`` are made from these fields."""

    input: str | None = option(
        None,
        flag="",
        title="Input",
        help="folder, glob or fsspec URL of .jsonl[.gz|.zst] or .parquet files (a mixture's sources name their own)",
    )
    mixture: dict[str, Any] | None = option(
        None,
        title="Mixture",
        help="several sources at chosen token shares, in place of the input: {tokens, sources: [{name, input, weight, "
        "max_repetition, text_key, template}]}; on the command line, a YAML or JSON file (docs/mixtures.md)",
        read=load_mixture_file,
        schema=MIXTURE_SCHEMA,
    )
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
        help="tokenize tasks; rank r takes input files r, r + ranks, ... of the sorted list (or of files and parts, "
        "with split_input_mb)",
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
    cache: str | None = option(
        None,
        title="Tokenization cache",
        help="where each input file's tokens are kept for the next build, which then tokenizes only the files that "
        f"changed (a folder or fsspec URL), or {OFF} (default: {{output}}/{DEFAULT_FOLDER})",
    )
    keep_intermediate: bool = option(
        False,
        title="Keep intermediate token files",
        help="keep the token files of ranks/ and merged/ once the build is published (default: removed then, their "
        "records kept, so the dataset is the one copy on storage; a folder that is the dataset always stays)",
    )

    mds: bool = option(
        False,
        title="Also write MDS",
        help="publish also writes the context windows as MDS shards in {run}/mds/, which mosaicml streaming's "
        "StreamingDataset and litdata read: a second copy of the dataset (docs/output.md)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mds and (not self.context_window or self.output_format != "ds"):
            raise UsageError(
                "mds writes the context windows as MDS samples: it needs a context_window and the ds output format"
            )
        if self.mixture is None and not self.input:
            raise UsageError("give the input (a folder, glob or URL), or a mixture of sources")
        if self.mixed is not None:
            self._check_mixture()
            object.__setattr__(self, "input", None)  # not read: the plan and the record name the sources' inputs
        if (self.merge_mode == "bucketed") != bool(self.num_buckets):
            raise UsageError("merge_mode bucketed and num_buckets go together: give both or neither")
        if self.context_mode == "packed":
            if not self.context_window:
                raise UsageError("context_mode packed packs documents into windows: give a context_window")
            if not self.save_loss:
                raise UsageError(
                    "context_mode packed pads windows at loss 0: it needs save_loss, so that every "
                    "real token keeps its own"
                )
            if self.shuffle_chunk_size:
                raise UsageError("context_mode packed packs whole documents: no shuffle_chunk_size")

    @cached_property
    def mixed(self) -> Mixture | None:
        """The mixture, read and checked (None without one)."""
        return None if self.mixture is None else read_mixture(self.mixture, "mixture")

    @property
    def inputs(self) -> list[str]:
        """What the build reads: its input, or each of its mixture's sources' (in their order)."""
        return [source.input for source in self.mixed.sources] if self.mixed else [cast(str, self.input)]

    @property
    def source_names(self) -> list[str] | None:
        """A mixture's source names, in its order (None without a mixture)."""
        return self.mixed.names if self.mixed else None

    @property
    def described_input(self) -> str:
        """The input as records and reports name it: a mixture's as ``name=input`` for each source."""
        if self.mixed is None:
            return cast(str, self.input)
        return ", ".join(f"{source.name}={source.input}" for source in self.mixed.sources)

    def _check_mixture(self) -> None:
        """What a mixture refuses: the options that would cut a document, or write what the mixture cannot carry."""
        if self.shuffle_chunk_size:
            raise UsageError("a mixture mixes whole documents: no shuffle_chunk_size")
        mixed = cast(Mixture, self.mixed)
        repeated = [source.name for source in mixed.sources if source.max_repetition != 1]
        if self.output_format == "megatron" and (mixed.tokens is not None or repeated):
            raise UsageError(
                "Megatron output is not merged: its megatron_data_path.txt gives each source's files the mixture's "
                "weight, and Megatron-LM decides how many tokens it takes of each: no tokens, no max_repetition"
            )
        if self.context_mode == "packed":
            raise UsageError("a mixture records the source of every window's piece; packed windows do not, yet")

    @property
    def cache_location(self) -> str | None:
        """Where the build's tokenization cache is: None when it is off."""
        return chosen_location(self.cache, Folder(self.output).url_of(DEFAULT_FOLDER))

    @property
    def cache_folder(self) -> Folder | None:
        """The cache's folder, opened with the build's storage options: None when it is off."""
        location = self.cache_location
        return None if location is None else self.folder(location)

    def check_locations(self, allowed: AllowedLocations) -> None:
        """Input, output, the cache, tokenizer and chat template only where the deployment allows (never http://,
        never /etc), each after its symlinks are resolved: a tokenizer folder's files one by one too. (The input
        folder's files are checked once listed, by ``Build.start``.)"""
        for location in self.inputs:
            allowed.check("input", location)
        allowed.check("output", self.output)
        for name, place in (("cache", self.cache_location), ("chat_template", self.chat_template)):
            if place:
                allowed.check(name, place)
        tokenizer = self.tokenizer
        if "://" in tokenizer or tokenizer.startswith(("/", ".", "~")) or os.path.exists(tokenizer):
            allowed.check("tokenizer", tokenizer)  # anything else is a hub name: the hub is a fixed host
            allowed.check_files("tokenizer", tokenizer_files(tokenizer))

    def shared(self, *groups: type) -> dict[str, Any]:
        """This config's values of the option groups a stage config shares with it."""
        return {f.name: getattr(self, f.name) for group in groups for f in fields(group)}


def allowed_locations(defaults: list[str]) -> AllowedLocations:
    """The locations a deployment allows, from its environment (``ALLOWED_LOCATIONS_SETTING``), else ``defaults``."""
    return AllowedLocations.from_env(defaults)


def tokenizer_folder(tokenizer: str) -> str:
    """Where a build reads the tokenizer: a tokenizer file's folder, whatever its format (the tokenizer_config.json
    beside it names its EOS; a bare file name's is the working folder), or the tokenizer itself, a folder."""
    is_file = tokenizer.endswith(FILE_SUFFIXES) or os.path.isfile(tokenizer)
    return file_at(tokenizer)[0].location if is_file else tokenizer


def offered_params() -> list[Param]:
    """Every field of ``BuildConfig`` offered as a DAG Param, in the order the trigger form shows them."""
    return [
        Param(f.name, f.default, spec.title, spec.help, json_schema(f, spec, kind), section(BuildConfig, f.name))
        for f, spec, kind in fields_of(BuildConfig)
        if spec.param
    ]
