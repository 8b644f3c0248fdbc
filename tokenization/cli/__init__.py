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


_AS_PROGRAM = os.path.basename(sys.argv[0]) in ("tokenization", "-m")
# As the program (not as a module others import), Ctrl-C is one line from here on, before any other import: where
# a shell left SIGINT ignored (a background job) it stays so; ``main`` hands it to KeyboardInterrupt as it runs.
# ``python -m tokenization.cli`` imports this package while its ``sys.argv[0]`` is ``-m``, before ``__main__`` runs.
if _AS_PROGRAM and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stopped_starting)
# Nothing the program runs multiplies matrices: OpenBLAS's threads, which numpy's import starts in every process and
# worker and which spin 20-60 ms of CPU there, are held to the calling thread (a setting of the caller's own stands).
if _AS_PROGRAM:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import difflib
import logging
import re
import shlex
from collections.abc import Sequence
from typing import Any, NoReturn

from tokenization.cli.commands import COMMANDS
from tokenization.errors import TokenizationError, UsageError, external_error

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


def _forget_unhandled_interrupt() -> None:
    """CPython marks a KeyboardInterrupt as unhandled when it leaves code run from a string (``exec``, ``eval``: each
    dataclass and namedtuple a module makes as it imports) even when a caller catches it, and ``python -m`` then
    ends by killing itself with SIGINT: exit status -2, not 130 (a Ctrl-C landing in a lazy import did, one build in
    ten on a loaded machine). Any string run to its end clears the mark."""
    eval("None")


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
        # Stopped: a later Ctrl-C (pressed again, or one held back meanwhile) is ignored, so that the exit ends as
        # 130; the interpreter's exit puts SIGINT's default action back, and one then ended a CI run's build on it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _forget_unhandled_interrupt()
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
