"""The commands: each one's summary, its options (those of its stage's config, or its own) and what runs it."""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from tokenization.cli.reading import cmd_cache, cmd_inspect, cmd_report, cmd_verify
from tokenization.cli.running import cmd_build, cmd_context_shuffle, cmd_count, cmd_mds, cmd_merge, cmd_tokenize
from tokenization.options import add_arguments
from tokenization.storage.locations import malformed_url


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
        _options("tokenization.stages.merge.config", "MergeConfig"),
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
