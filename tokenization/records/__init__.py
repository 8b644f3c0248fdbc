"""The records stages leave on storage, as code: the contract between the stages, and between a build and its
readers (accounting, the report, publishing, the sensor, XCom, the builds page, verify).

The bottom layer beside ``errors``: every other layer may import it, and it imports none of them. The codec is
``codec``; each other module is one topic (``contents``, ``inputs``, ``tokenizer``, ``stages``, ``cache``,
``mixtures``, ``params``, ``builds``), and every kind is importable from here.

Each topic's module is imported when one of its kinds is first asked for (``__getattr__``), so that a stage loads
only the topics it uses: the tokenize stage never loads ``builds`` (~10 ms of dataclasses at its start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenization.records.builds import (
        Arrived,
        BuildInputs,
        BuildRecord,
        BuildSpec,
        BuildSummary,
        Conservation,
        FolderBytes,
        Footprint,
        MdsOutput,
        PlannedInputs,
        PlanRecord,
        ReportFiles,
        Retention,
        RunClaim,
        StageSummary,
        TokenizeSummary,
        VerifySummary,
    )
    from tokenization.records.cache import (
        CacheCleaning,
        CachedInput,
        CacheEntry,
        CacheFolder,
        CacheSize,
        CacheSummary,
        CacheUse,
        KnownInputs,
        PlanReading,
        RankCache,
    )
    from tokenization.records.codec import (
        JSON_TYPES,
        PROJECT,
        OpenRecord,
        Record,
        RecordError,
        json_name,
        shown,
        unless_none,
    )
    from tokenization.records.contents import MASK, Contents, ContentsSum
    from tokenization.records.inputs import FilePart, FileSum, HistogramRow, InputFile, RankCounts, Rejected, SizedInput
    from tokenization.records.mixtures import (
        Mixture,
        MixtureSource,
        SourceAccount,
        SourceCounts,
        SourceMix,
        SourceShare,
    )
    from tokenization.records.params import BuildParams, ContextParams, MergeParams, RankParams, StageParams
    from tokenization.records.stages import (
        STAGE_MANIFESTS,
        CompletionMarker,
        ContextCounts,
        ContextManifest,
        ContextOutput,
        CountedFile,
        CountStats,
        MergeCounts,
        MergeManifest,
        MergeOutput,
        OutputEntry,
        PseudoEnds,
        RankManifest,
        SelfCheck,
        StageManifest,
        StageRecord,
        Throughput,
        stage_manifest,
    )
    from tokenization.records.tokenizer import (
        BuildTokenizer,
        MergeTokenizer,
        PadToken,
        PlannedTokenizer,
        TokenizerFacts,
        TokenizerInfo,
    )

# The topics, those the others import first: a kind is looked for in them in this order, and found in the first
# that holds it (a later topic holds the kinds it imports from an earlier one, as the same objects).
TOPICS = ("codec", "contents", "inputs", "params", "tokenizer", "mixtures", "cache", "stages", "builds")


def __getattr__(name: str) -> Any:
    """A kind of a topic not imported yet: its topic imported, and the kind kept here for the next look."""
    if name in __all__:
        for topic in TOPICS:
            module = importlib.import_module(f"{__name__}.{topic}")
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "JSON_TYPES",
    "MASK",
    "PROJECT",
    "STAGE_MANIFESTS",
    "Arrived",
    "BuildInputs",
    "BuildParams",
    "BuildRecord",
    "BuildSpec",
    "BuildSummary",
    "BuildTokenizer",
    "CacheCleaning",
    "CacheEntry",
    "CacheFolder",
    "CacheSize",
    "CacheSummary",
    "CacheUse",
    "CachedInput",
    "CompletionMarker",
    "Conservation",
    "Contents",
    "ContentsSum",
    "ContextCounts",
    "ContextManifest",
    "ContextOutput",
    "ContextParams",
    "CountStats",
    "CountedFile",
    "FilePart",
    "FileSum",
    "FolderBytes",
    "Footprint",
    "HistogramRow",
    "InputFile",
    "KnownInputs",
    "MdsOutput",
    "MergeCounts",
    "MergeManifest",
    "MergeOutput",
    "MergeParams",
    "MergeTokenizer",
    "Mixture",
    "MixtureSource",
    "OpenRecord",
    "OutputEntry",
    "PadToken",
    "PlanReading",
    "PlanRecord",
    "PlannedInputs",
    "PlannedTokenizer",
    "PseudoEnds",
    "RankCache",
    "RankCounts",
    "RankManifest",
    "RankParams",
    "Record",
    "RecordError",
    "Rejected",
    "ReportFiles",
    "Retention",
    "RunClaim",
    "SelfCheck",
    "SizedInput",
    "SourceAccount",
    "SourceCounts",
    "SourceMix",
    "SourceShare",
    "StageManifest",
    "StageParams",
    "StageRecord",
    "StageSummary",
    "Throughput",
    "TokenizeSummary",
    "TokenizerFacts",
    "TokenizerInfo",
    "VerifySummary",
    "json_name",
    "shown",
    "stage_manifest",
    "unless_none",
]
