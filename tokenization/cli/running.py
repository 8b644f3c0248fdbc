"""The commands that run a stage or a whole build (``build``, ``tokenize``, ``merge``, ``context-shuffle``, ``count``,
``mds``): each imports its stage when it runs, and prints what it did in a line or two."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tokenization.errors import UsageError
from tokenization.options import from_arguments
from tokenization.storage.folder import Folder
from tokenization.wording import counted

if TYPE_CHECKING:
    from tokenization.records import TokenizerInfo
    from tokenization.tokenizer.counts import Counts


def cmd_build(args: argparse.Namespace) -> int:
    if args.input and args.mixture:
        raise UsageError("give the input or --mixture, not both: a mixture's sources name their inputs")
    from tokenization.builds import forkserver

    forkserver.start()  # its imports on another core, while this process imports and plans
    from tokenization.builds.complete import summary
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build
    from tokenization.tokenizer.encoding import limit_hf_threads

    limit_hf_threads(args.threads)
    args.build_id = args.build_id or f"cli-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"  # a safe folder name as it is
    published = Build.start(from_arguments(BuildConfig, args), args.build_id).run(args.parallel, keep=args.keep_builds)
    print(summary(published.record))
    print(f"latest: {published.latest}")
    for run_dir in published.deleted:
        print(f"deleted (--keep-builds {args.keep_builds}): {run_dir}")
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
    from tokenization.tokenizer.encoding import limit_hf_threads

    limit_hf_threads(args.threads)
    config = from_arguments(TokenizeConfig, args)
    result = tokenize_rank(config)
    c = result.counts
    throughput = result.record.throughput  # (None only in a record made before ranks measured it)
    rate = None if throughput is None else throughput.text_mb_per_s
    print(
        f"rank {config.rank}/{config.world_size}: {c.docs_read:,} docs read, {c.docs_written:,} written, "
        f"{c.empty:,} empty, {sum(c.rejected.values()):,} rejected, {c.tokens_written:,} tokens in "
        f"{counted(len(result.outputs), 'file')}, {c.tokens_dropped:,} dropped, "
        f"{sum(c.special_token_literals.values()):,} "
        f"special-token literals{_loss_share(c) if config.save_loss else ''}; {result.seconds:.1f}s "
        f"({_loading(result.record.tokenizer, rate)}) -> "
        f"{config.output}"
    )
    return 0


def _loading(tokenizer: TokenizerInfo, rate: float | None) -> str:
    """What a rank spent on its tokenizer, then its rate; a rank that encoded nothing loaded no engine."""
    from tokenization.tokenizer.encoding import NO_ENGINE

    if tokenizer.engine == NO_ENGINE:
        return "no text encoded, so no tokenizer engine loaded: every file came from the cache, or there was none"
    return f"{tokenizer.load_seconds or 0:.1f}s loading the tokenizer, then {rate} MB/s of text"


def _loss_share(c: Counts) -> str:
    return f", {c.loss_tokens:,} tokens with loss ({c.loss_tokens / c.tokens:.1%})" if c.tokens else ""


def cmd_merge(args: argparse.Namespace) -> int:
    from tokenization.stages.merge import merge
    from tokenization.stages.merge.config import MergeConfig

    config = from_arguments(MergeConfig, args)
    result = merge(config)
    c = result.counts
    resumed = f", {c.resumed_files} resumed" if c.resumed_files else ""
    print(
        f"merge {config.save_filename}: {c.input_files} inputs, {c.units:,} units, {c.tokens:,} tokens in "
        f"{counted(len(result.outputs), 'file')}{resumed}, {c.tokens_dropped:,} dropped; "
        f"{result.seconds:.1f}s -> {config.output}"
    )
    return 0


def cmd_context_shuffle(args: argparse.Namespace) -> int:
    from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle

    config = from_arguments(ContextShuffleConfig, args)
    result = context_shuffle(config)
    c = result.counts
    kept = (
        f"{c.documents_whole:,} documents whole, {c.documents_split:,} split into {c.split_pieces:,} pieces, "
        f"{c.padding_tokens:,} padding tokens ({c.padding_tokens / max(1, c.tokens):.2%})"
        if config.context_mode == "packed"
        else f"{c.tail_tokens_kept:,} tail tokens kept, {c.tokens_dropped:,} dropped"
    )
    print(
        f"context shuffle shard {config.shard}/{config.num_shards}: {counted(c.files, 'file')}, "
        f"{counted(c.windows, 'window')} of "
        f"{config.context_window:,}, {c.tokens:,} tokens, {kept}; {result.seconds:.1f}s -> {config.output}"
    )
    return 0


def cmd_count(args: argparse.Namespace) -> int:
    from tokenization.stages.count import CountConfig, count_tokens
    from tokenization.tokenizer.encoding import limit_hf_threads

    limit_hf_threads(args.threads)
    result = count_tokens(from_arguments(CountConfig, args))
    c = result.counts
    mean = c.tokens / c.docs_written if c.docs_written else 0
    print(
        f"count: {c.docs_written:,} docs, {c.tokens:,} tokens ({mean:,.1f} tokens a document on average, the longest "
        f"{c.longest:,}), {c.empty:,} empty, {sum(c.rejected.values()):,} rejected, in "
        f"{counted(len(result.record.files), 'file')}{_loss_share(c) if result.record.loss_tokens is not None else ''}"
    )
    return 0


def cmd_mds(args: argparse.Namespace) -> int:
    from tokenization.stages.export_mds import export_mds

    done = export_mds(Folder(args.run_dir), Folder(args.out) if args.out else None, args.shard_size)
    print(
        f"mds {done.folder}: {counted(done.windows, 'window')}, {counted(done.tokens, 'token')}, in "
        f"{counted(done.shards, 'shard')} and index.json (streaming.StreamingDataset(local={done.folder!r}))"
    )
    return 0
