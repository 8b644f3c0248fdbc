"""Turn cleaned text into training token files (datatrove's .ds family, or Megatron's .bin/.idx), shuffled.

A build runs the stages in order, each also a command of its own:

  tokenize         one rank's share of the input files: encode, then shuffle its documents
  merge            every rank file into one globally ordered sequence of files (one task)
  context-shuffle  cut files into training windows and permute them (a shard of the files each)
  build            all of the above, then verify and publish: {output}/{build id}/_BUILD.json
  mds              a build's context windows as MDS shards, for mosaicml streaming and litdata

and count (tokens, no files), verify, inspect and report look at inputs and outputs; cache lists and prunes the
tokenization cache, where builds keep each input file's tokens for the next one.

The .ds family: X.ds holds the token ids (little-endian uint16, or uint32 past 65,536 ids), X.ds.index the
uint64 end offset of each document in tokens, X.ds.loss one byte a token (0 = no loss), and X.ds.metadata
"tokenizer|token size", the token count and a human count. datatrove's and nanotron's readers load it.

Each command imports its own stage when it runs, and builds only its own options: a merge or a context shuffle
loads no tokenizer library, template engine or build machinery, so its process starts in ~0.3 s.

Exit status: 0 on success, 1 on an error (one line; a bug shows its traceback), 2 on a usage error, 130 when
interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (SIGINT), as shells give it


def _stopped_starting(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the program loads its modules and reads its arguments: nothing begun, nothing to clean."""
    os.write(2, b"interrupted: tokenization stopped before its command began\n")
    os._exit(INTERRUPTED)


# As the program (not as a module others import), Ctrl-C is one line from here on, before any other import: where
# a shell left SIGINT ignored (a background job) it stays so; ``main`` hands it to KeyboardInterrupt as it runs.
if (__name__ == "__main__" or os.path.basename(sys.argv[0]) == "tokenization") and (
    signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, _stopped_starting)

import argparse
import contextlib
import difflib
import importlib
import logging
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn

from tokenization.errors import TokenizationError, UsageError, external_error
from tokenization.options import add_arguments, from_arguments
from tokenization.storage.folder import Folder
from tokenization.storage.locations import malformed_url
from tokenization.wording import counted

if TYPE_CHECKING:
    import numpy as np

    from tokenization.formats.ds import TokenFile
    from tokenization.formats.megatron import MegatronFile
    from tokenization.output.cache import Cache
    from tokenization.records import TokenizerInfo
    from tokenization.tokenizer.documents import Counts

EXAMPLE = """example: a whole build of a folder of JSON lines on one machine, 4 ranks, 2 at a time

  tokenization build data/ --output builds/ --tokenizer tokenizer.json --seed 1234 --num-ranks 4 --parallel 2 \\
      --save-loss --context-window 2049 --num-context-shards 2 --build-id nightly-2026-12-01

`tokenization COMMAND --help` lists a command's options."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command with its options or, with ``only``, that command's options alone
    (the others listed without theirs), so that a command imports its own stage and nothing else."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="tokenization", description=__doc__, epilog=EXAMPLE, formatter_class=formatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    for name, command in COMMANDS.items():
        described = sub.add_parser(name, help=command.summary, description=command.summary)
        described.set_defaults(parser=described)  # a usage error shows this command's usage
        if only in (None, name):
            command.arguments(described)
    return parser


def _options(module: str, config: str) -> Callable[[argparse.ArgumentParser], None]:
    """A command's options: those of its stage's config, ``module.config``, imported once they are asked for."""
    return lambda parser: add_arguments(parser, getattr(importlib.import_module(module), config))


def _build_arguments(bld: argparse.ArgumentParser) -> None:
    _options("tokenization.builds.config", "BuildConfig")(bld)
    bld.add_argument(
        "--build-id",
        help="names the build's folder under --output; running again with the same id finishes that build "
        "(default: cli- and the UTC time, as cli-20261201T174805Z)",
    )
    bld.add_argument(
        "--parallel",
        type=_positive,
        default=min(2, os.cpu_count() or 1),
        help="ranks and context shards run at once, each a process (default: %(default)s)",
    )
    bld.add_argument(
        "--keep-builds",
        type=_positive,
        metavar="N",
        help="once published, delete the complete builds under --output older than the newest N (never a running "
        "or incomplete one, nor the one LATEST names); default: keep every build",
    )


def _verify_arguments(ver: argparse.ArgumentParser) -> None:
    ver.add_argument(
        "path", type=_location, help="output folder or fsspec URL, or a build's run folder (then its dataset)"
    )
    ver.add_argument("--tokenizer", type=_location, help="also check every id against this tokenizer's vocabulary")
    ver.add_argument("--eos-token", help="also check that every document ends with this token (needs --tokenizer)")
    ver.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="instead of reading every file, trust the checks that stages made of their own files before upload "
        "(with the same tokenizer checks), and read N of those files, chosen at random (default: read every file)",
    )


def _report_arguments(rep: argparse.ArgumentParser) -> None:
    rep.add_argument(
        "run_dir", metavar="RUN_DIR", type=_location, help="the build's folder (holding ranks/ and _BUILD.json)"
    )


def _cache_arguments(cache: argparse.ArgumentParser) -> None:
    from tokenization.output.cache import DEFAULT_FOLDER

    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION", help="list or prune")
    where = "the cache's folder or fsspec URL, or a builds output, whose cache is {output}/" + DEFAULT_FOLDER
    for name, said in (
        ("list", "every entry: its size, when it was made and last used, by which build, and its input file"),
        ("prune", "remove entries by age, or the least recently used ones down to a size; never one in use"),
    ):
        action = actions.add_parser(name, help=said, description=said)
        action.set_defaults(parser=action)
        action.add_argument("location", metavar="CACHE", type=_location, help=where)
        if name == "prune":
            action.add_argument(
                "--older-than", type=_duration, metavar="AGE", help="remove entries last used before: 30d, 12h, 90m"
            )
            action.add_argument(
                "--max-size", type=_size, metavar="SIZE", help="then keep at most this much: 500GB, 1.5TB, 200MiB"
            )


def _mds_arguments(mds: argparse.ArgumentParser) -> None:
    mds.add_argument(
        "run_dir", metavar="RUN_DIR", type=_location, help="a published build's folder, built with context windows"
    )
    mds.add_argument("--out", type=_location, help="the MDS dataset's folder or fsspec URL (default: RUN_DIR/mds)")
    mds.add_argument(
        "--shard-size",
        type=_shard_size,
        default="64MiB",
        metavar="SIZE",
        help="the largest shard: 64MiB (the default, as MDSWriter's), 32MB, ... (1 byte to 4GiB - 1)",
    )


def _inspect_arguments(ins: argparse.ArgumentParser) -> None:
    ins.add_argument("path", type=_location, help="a .ds or .bin file, or a folder, local or fsspec URL")
    ins.add_argument("--decode", type=int, default=0, metavar="N", help="print the first N documents as text")
    ins.add_argument(
        "--tokenizer", type=_location, help="tokenizer for --decode (default: the one the .ds metadata names)"
    )


def _location(value: str) -> str:
    """A path or fsspec URL; one that reads like a URL missing a slash is refused, as options refuse it."""
    if wrong := malformed_url(value):
        raise argparse.ArgumentTypeError(wrong)
    return value


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20}
SIZE_UNITS |= {"GIB": 2**30, "TIB": 2**40}


def _duration(value: str) -> float:
    """``30d``, ``12h``, ``90m`` or ``3600s`` in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", value.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{value!r} is no age: give a number and s, m, h, d or w, such as 30d")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


def _size(value: str) -> int:
    """``500GB``, ``1.5TB``, ``200MiB`` or a plain number of bytes (``0`` empties the cache) in bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", value.lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is no size: give bytes, or a number and kB, MB, GB, TB (or KiB ... TiB)"
        )
    return int(float(match.group(1)) * SIZE_UNITS[(match.group(2) or "b").upper()])


def _shard_size(value: str) -> int:
    """An MDS shard's largest size: a shard's offsets are uint32, so below 4GiB; and more than nothing."""
    from tokenization.formats.mds import SHARD_LIMIT

    size = _size(value)
    if not 0 < size <= SHARD_LIMIT:
        raise argparse.ArgumentTypeError(
            f"{value if value.strip().isdigit() else f'{value} is {size:,}'} bytes; an MDS shard holds 1 to "
            f"{SHARD_LIMIT:,} (4GiB - 1: its offsets are 32-bit)"
        )
    return size


def cmd_cache(args: argparse.Namespace) -> int:
    from tokenization.builds import footprint, pages
    from tokenization.records import CacheSize

    cache = _cache_at(args.location)
    if args.action == "prune":
        if args.older_than is None and args.max_size is None:
            raise UsageError("prune needs --older-than, --max-size or both")
        cleaned = cache.prune(args.older_than, args.max_size)
        removed = counted(cleaned.entries, "entry", "entries")
        print(f"cache {cache.location}: removed {removed}, {pages.size(cleaned.bytes)}")
        return 0
    listed = cache.entries()
    total = CacheSize(
        location=cache.location,
        entries=len(listed),
        bytes=sum(item.bytes for item in listed),
        tokens=sum(item.tokens for item in listed),
    )
    print(f"cache {cache.location}: {counted(len(listed), 'entry', 'entries')}, {footprint.cache_weight(total)}")
    if listed:
        print(f"{'key':12}  {'size':>9}  {'tokens':>13}  {'made':20}  {'last used':20}  {'by':24}  input file")
    for item in listed:
        owner = Folder(item.last_owner).name if item.last_owner else pages.MISSING
        print(
            f"{item.key[:12]}  {pages.size(item.bytes):>9}  {item.tokens:>13,}  {_when(item.created):20}  "
            f"{_when(item.last_used):20}  {owner:24}  {item.source}"
        )
    return 0


def _cache_at(location: str) -> Cache:
    """The cache at ``location``, or the cache of the builds output ``location`` (``{output}/.cache``); a cache is
    known by its own file, or, made by an earlier version, by its entries."""
    from tokenization.output.cache import DEFAULT_FOLDER, ENTRIES, OWN_FILE, Cache

    def is_cache(folder: Folder) -> bool:
        return folder.exists(OWN_FILE) or folder.exists(ENTRIES)

    given = Folder(location)
    return Cache(given.sub(DEFAULT_FOLDER) if not is_cache(given) and is_cache(given.sub(DEFAULT_FOLDER)) else given)


def _when(moment: float | None) -> str:
    from tokenization.builds import pages

    return pages.date(None if moment is None else datetime.fromtimestamp(moment, timezone.utc))


def cmd_build(args: argparse.Namespace) -> int:
    if args.input and args.mixture:
        raise UsageError("give the input or --mixture, not both: a mixture's sources name their inputs")
    from tokenization.builds import workers

    workers.start()  # its imports on another core, while this process imports and plans
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
    from tokenization.stages.merge import MergeConfig, merge

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


def cmd_verify(args: argparse.Namespace) -> int:
    from tokenization.builds.verify import verify_path

    if args.sample is not None and args.sample < 0:
        raise UsageError(f"--sample must be 0 or more, got {args.sample}")
    if args.eos_token and not args.tokenizer:
        raise UsageError(
            f"--eos-token {args.eos_token!r} needs --tokenizer, which gives its id; give neither, and a build's "
            "folders are checked against the build's own tokenizer"
        )
    report, path = verify_path(Folder(args.path), args.tokenizer, args.eos_token, args.sample, say=print)
    for line in report.problems + report.notes:
        print(line)
    state = "OK" if report.ok else f"FAILED, {counted(len(report.problems), 'problem')}"
    print(f"verify {path.url}: {counted(report.files, 'file')}, {counted(report.tokens, 'token')}: {state}")
    return 0 if report.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from tokenization.builds.report import REPORT_HTML, write_report

    run = Folder(args.run_dir)
    build = write_report(run)
    c = build.conservation
    print(
        f"report {run.url_of(REPORT_HTML)}: {build.stages.tokenize.ranks} ranks, {c.docs_in:,} docs read = "
        f"{c.docs_out:,} written + {c.empty:,} empty + {c.quarantined:,} quarantined, {build.tokens:,} tokens in "
        f"{counted(len(build.files), 'file')}, {c.tokens_dropped:,} dropped by tokenizing"
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


def cmd_inspect(args: argparse.Namespace) -> int:
    from tokenization.formats import MEGATRON, list_token_files
    from tokenization.formats.ds import TokenFile, TokenFileError
    from tokenization.formats.megatron import MegatronFile

    given = Folder(args.path)
    urls = list_token_files(given) if given.is_folder() else [args.path]
    if not urls:
        raise TokenFileError(f"{args.path}: no .ds or .bin files")
    files = [MegatronFile(u) if u.endswith((MEGATRON, ".idx")) else TokenFile(u) for u in urls]
    for url, f in zip(urls, files, strict=True):
        print(f"{url}: {_description(f)}")
    tokens, entries = sum(f.num_tokens for f in files), sum(len(_ends(f)) for f in files)
    entries_text = counted(entries, "index entry", "index entries")
    print(f"total: {counted(len(files), 'file')}, {entries_text}, {counted(tokens, 'token')}")
    if args.decode:
        _decode(urls, files, args.decode, args.tokenizer)
    return 0


def _description(f: TokenFile | MegatronFile) -> str:
    from tokenization.formats.megatron import MegatronFile

    if isinstance(f, MegatronFile):
        return f"{f.num_tokens:,} tokens, {len(f.lengths):,} sequences, Megatron {f.dtype.name}"
    loss = "loss" if f.loss is not None else "no loss"
    tokenizer = f.metadata.tokenizer if f.metadata else "?"
    return f"{f.num_tokens:,} tokens, {len(f.ends):,} index entries, uint{8 * f.token_size}, {loss}, {tokenizer}"


def _ends(f: TokenFile | MegatronFile) -> np.ndarray:
    """Where each document (a Megatron sequence) ends, in tokens."""
    import numpy as np

    from tokenization.formats.megatron import MegatronFile

    if isinstance(f, MegatronFile):
        return np.cumsum(f.lengths, dtype=np.int64)
    return np.asarray(f.ends, dtype=np.int64)


def _decode(urls: list[str], files: list[TokenFile | MegatronFile], count: int, tokenizer: str | None) -> None:
    import numpy as np

    from tokenization.formats.ds import TokenFile, TokenFileError
    from tokenization.tokenizer.encoding import Encoder

    named = next((f.metadata.tokenizer for f in files if isinstance(f, TokenFile) and f.metadata), None)
    name = tokenizer or named
    if not name:
        raise TokenFileError("--decode needs --tokenizer: no metadata names one")
    try:
        decoder = Encoder(name, no_eos=True).tokenizer
    except TokenizationError as exc:
        if tokenizer:
            raise
        raise TokenFileError(f"{exc} (the metadata names it as the build was given it): give --tokenizer") from None
    shown = 0
    for url, f in zip(urls, files, strict=True):
        ends = _ends(f)
        tokens = f.tokens
        for i in range(min(len(ends), count - shown)):
            ids = np.asarray(tokens[int(ends[i - 1]) if i else 0 : int(ends[i])]).tolist()
            print(f"--- {url} document {i} ({len(ids):,} tokens)")
            print(decoder.decode(ids, skip_special_tokens=False))
            shown += 1
        if shown >= count:
            return


@dataclass(frozen=True)
class Command:
    """A command: its summary, its options and what runs it, each importing what it uses when it is called."""

    summary: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS = {
    "build": Command(
        "a whole build on this machine: tokenize, merge, context shuffle, verify, publish", _build_arguments, cmd_build
    ),
    "tokenize": Command(
        "tokenize one rank's share of the input into shuffled token files",
        _options("tokenization.stages.tokenize", "TokenizeConfig"),
        cmd_tokenize,
    ),
    "merge": Command(
        "merge every rank file of a folder into globally reordered files (one task)",
        _options("tokenization.stages.merge", "MergeConfig"),
        cmd_merge,
    ),
    "context-shuffle": Command(
        "permute fixed-size context windows of token files",
        _options("tokenization.stages.context_shuffle", "ContextShuffleConfig"),
        cmd_context_shuffle,
    ),
    "count": Command(
        "count tokens exactly as tokenize would, writing no token files",
        _options("tokenization.stages.count", "CountConfig"),
        cmd_count,
    ),
    "verify": Command(
        "check an output folder (.ds families or Megatron .bin/.idx); exit 1 on any problem",
        _verify_arguments,
        cmd_verify,
    ),
    "report": Command(
        "write a build's report.html and report.json again, from its manifests", _report_arguments, cmd_report
    ),
    "mds": Command(
        "write a build's context windows as MDS shards (mosaicml streaming, litdata)", _mds_arguments, cmd_mds
    ),
    "cache": Command("list or prune a tokenization cache", _cache_arguments, cmd_cache),
    "inspect": Command(
        "describe a token file (.ds or Megatron .bin) or a folder of them", _inspect_arguments, cmd_inspect
    ),
}


class CommandParser(argparse.ArgumentParser):
    """A command's parser. argparse refuses a missing required option before it looks at unknown arguments, so a
    misspelled required flag (``--tokeniser``) would be reported only as missing: the refusal names it too, with the
    flag meant, as ``main`` does for a misspelled optional one."""

    _given: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]  # argparse's overloads, which this passes through
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        unknown = [arg for arg in self._given if arg.startswith("--") and not self._knows(arg.split("=")[0])]
        if message.startswith("the following arguments are required") and unknown:
            message += f"; unrecognized arguments: {' '.join(_meant(arg, self) for arg in unknown)}"
        super().error(message)

    def _knows(self, flag: str) -> bool:
        """Whether ``flag`` is one of this command's, or an abbreviation argparse takes for one."""
        return any(known.startswith(flag) for known in self._option_string_actions)


def _meant(arg: str, parser: argparse.ArgumentParser) -> str:
    """``arg``, with the command's closest flag when it looks like a misspelled one."""
    flags = [flag for action in parser._actions for flag in action.option_strings]
    close = difflib.get_close_matches(arg.split("=")[0], flags, 1) if arg.startswith("--") else []
    return f"{arg} (did you mean {close[0]}?)" if close else arg


def as_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """A config's message in the command line's words: each option's field name (``save_loss``, as the DAG's params
    say it) as its flag (``--save-loss``). Names of one word read the same either way and are left alone."""
    flags = {
        a.dest: a.option_strings[0]
        for a in parser._actions
        if a.option_strings and "_" in a.dest and not isinstance(a, argparse._StoreFalseAction)  # --no-shuffle
    }
    if not flags:
        return message
    return re.sub(rf"\b({'|'.join(map(re.escape, flags))})\b", lambda m: flags[m.group(1)], message)


def interrupted(args: argparse.Namespace) -> str:
    """The one line a Ctrl-C leaves: what stopped and, for a build, how to resume it."""
    resume = f"; resume it with --build-id {shlex.quote(args.build_id)}" if getattr(args, "build_id", None) else ""
    return (
        f"interrupted: tokenization {args.command} stopped; an unfinished attempt's files stay for the next run "
        f"to resume or clear{resume}"
    )


def _above_bars() -> contextlib.AbstractContextManager[Any]:
    """Log lines above a progress bar, not through it. Bars are drawn only on a terminal (``progress``), so
    elsewhere (a task log, a pipe) nothing is redirected and tqdm is not imported: a stage starts sooner."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's usage, not the program's, and the flag meant
        args.parser.error(f"unrecognized arguments: {' '.join(_meant(arg, args.parser) for arg in unknown)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if signal.getsignal(signal.SIGINT) is _stopped_starting:  # from here, what stopped is said (``interrupted``)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        with _above_bars():
            return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:  # Ctrl-C: what stopped, not where
        print(interrupted(args), file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # its output piped into a reader that stopped early (``| head``): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes it
        return 1
    except UsageError as exc:
        command_parser: argparse.ArgumentParser = args.parser
        command_parser.error(as_flags(str(exc), command_parser))  # exits 2, as argparse does for its own usage errors
    except TokenizationError as exc:  # any other exception is a bug: its traceback shows where
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # storage and network libraries: their last line is all a user can act on
        message = external_error(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
