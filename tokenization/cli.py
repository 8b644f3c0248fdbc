"""``tokenization``: the command line. Exit 0 on success, 1 on an error (one line), 2 on a usage error."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from tokenization.attempts import AttemptConflict, LeaseLost
from tokenization.context import DEFAULT_WINDOW, ContextShuffleConfig, context_shuffle
from tokenization.count import CountConfig, count_tokens
from tokenization.documents import DEFAULT_MAX_REJECT_FRACTION, DEFAULT_MAX_REJECTS, TooManyRejects
from tokenization.encoding import ENGINES, SPECIAL_TEXT_POLICIES, Encoder, TokenizerError
from tokenization.errors import UsageError, external_error
from tokenization.formats.ds import TokenFile, TokenFileError
from tokenization.merge import DEFAULT_MAX_TOKENS_PER_FILE, MergeConfig, merge
from tokenization.permute import MAX_OPEN_FILES
from tokenization.report import REPORT_HTML, write_report
from tokenization.sources import InputError
from tokenization.storage import is_local, join, open_fs
from tokenization.tokenize import TokenizeConfig, tokenize_rank
from tokenization.verify import verify

ERRORS = (InputError, TokenizerError, TokenFileError, TooManyRejects, AttemptConflict, LeaseLost, ValueError, OSError)


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="auto: the fast exact engine where it can represent the tokenizer, self-checked against HF; "
        "hf: HF tokenizers only (default: auto)",
    )
    parser.add_argument(
        "--threads", type=_positive, help="threads for encoding (default: every core this process may use)"
    )


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return number


def _fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return number


def _document_arguments(parser: argparse.ArgumentParser) -> None:
    """Reading and encoding options that tokenize and count share."""
    parser.add_argument("--text-key", default="text", help="field holding the text; dotted for nested (default: text)")
    parser.add_argument("--id-key", default="id", help="field holding the document id (default: id)")
    eos = parser.add_mutually_exclusive_group()
    eos.add_argument(
        "--eos-token",
        help="token appended to every document (default: the tokenizer's own end-of-text token, from its "
        "tokenizer_config.json, its post-processor or its vocabulary)",
    )
    eos.add_argument("--no-eos", action="store_true", help="append no end-of-text token")
    parser.add_argument(
        "--special-tokens-in-text",
        dest="special_text",
        choices=SPECIAL_TEXT_POLICIES,
        default="text",
        help="literal special-token text in documents: encode as plain text (default) or as the special "
        "token, as datatrove does; occurrences are counted either way",
    )
    parser.add_argument(
        "--max-rejects",
        type=_count,
        default=DEFAULT_MAX_REJECTS,
        help=f"fail as soon as more records than this are rejected (default: {DEFAULT_MAX_REJECTS})",
    )
    parser.add_argument(
        "--max-reject-fraction",
        type=_fraction,
        default=DEFAULT_MAX_REJECT_FRACTION,
        help=f"fail when more than this share of the records read is rejected (default: {DEFAULT_MAX_REJECT_FRACTION})",
    )
    _engine_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenization", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    tok = sub.add_parser("tokenize", help="tokenize one rank's share of the input into shuffled .ds files")
    # dests are TokenizeConfig's field names, so the parsed arguments build the config directly
    tok.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs; local or fsspec URLs")
    tok.add_argument("--output", required=True, help="output folder or URL")
    tok.add_argument("--tokenizer", required=True, help="tokenizer.json path, folder, URL or hub name")
    _document_arguments(tok)
    tok.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    tok.add_argument("--rank", type=int, default=0)
    tok.add_argument("--world-size", type=_positive, default=1)
    tok.add_argument("--save-filename", help="prefix of the output names")
    tok.add_argument(
        "--no-shuffle", dest="shuffle_documents", action="store_false", help="keep documents in input order"
    )
    tok.add_argument("--shuffle-chunk-size", type=_positive, help="also shuffle fixed-size chunks of N tokens")
    tok.add_argument("--drop-last-chunk", action="store_true", help="drop the partial last chunk (datatrove)")
    tok.add_argument("--max-tokens-per-file", type=_positive, help="split outputs at document boundaries")
    tok.add_argument("--save-loss", action="store_true", help="write .ds.loss from no_loss_ranges")
    tok.add_argument("--local-working-dir", help="local folder for the unshuffled pass")
    tok.add_argument(
        "--format", dest="output_format", choices=("ds", "megatron"), default="ds", help="output format (default: ds)"
    )
    tok.add_argument("--batch-size", type=_positive, default=10000, help="documents per encode batch")

    mrg = sub.add_parser("merge", help="merge every rank file of a folder into globally reordered files (one task)")
    mrg.add_argument("input", help="folder or URL holding the rank .ds files")
    mrg.add_argument("--output", required=True, help="output folder or URL")
    mrg.add_argument("--save-filename", required=True, help="name of the merged dataset")
    mrg.add_argument("--seed", type=int, default=0, help="ordering seed (default: 0)")
    mrg.add_argument(
        "--mode",
        choices=("interleave", "shuffle"),
        default="interleave",
        help="interleave: datatrove's random file interleave (default); shuffle: a uniform permutation of all units",
    )
    mrg.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="concatenate in file order")
    mrg.add_argument("--max-tokens-per-file", type=_positive, default=DEFAULT_MAX_TOKENS_PER_FILE)
    mrg.add_argument("--shuffle-chunk-size", type=_positive, help="move fixed chunks of N tokens, not documents")
    mrg.add_argument("--drop-last-chunk", action="store_true", help="drop each file's partial chunk (datatrove)")
    mrg.add_argument("--save-loss", action="store_true", help="merge the .ds.loss files too")
    mrg.add_argument("--local-working-dir", help="local folder for staging (and for copies of remote inputs)")
    mrg.add_argument("--max-open-files", type=_positive, default=MAX_OPEN_FILES, help="input files open at once")

    ctx = sub.add_parser("context-shuffle", help="permute fixed-size context windows of token files")
    ctx.add_argument("input", help="a .ds file or a folder of them")
    ctx.add_argument("--output", required=True, help="output folder or URL (file names are kept)")
    ctx.add_argument("--window-size", type=_positive, default=DEFAULT_WINDOW, help="tokens a window (default: 2049)")
    ctx.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    ctx.add_argument("--shard", type=int, default=0, help="this task's shard of the sorted files")
    ctx.add_argument("--num-shards", type=_positive, default=1)
    ctx.add_argument("--drop-tail", action="store_true", help="drop the tail shorter than a window (datatrove)")
    ctx.add_argument("--local-working-dir", help="local folder for staging")

    cnt = sub.add_parser("count", help="count tokens as tokenize would, writing no token files")
    cnt.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs; local or fsspec URLs")
    cnt.add_argument("--tokenizer", required=True, help="tokenizer.json path, folder, URL or hub name")
    _document_arguments(cnt)
    cnt.add_argument("--stats-out", help="write the stats JSON here")
    cnt.add_argument("--annotate", help="write the records back as JSON lines with a token_count field")

    ver = sub.add_parser("verify", help="check an output folder (.ds family or Megatron); exit 1 on any problem")
    ver.add_argument("path", help="output folder or URL")
    ver.add_argument("--tokenizer", help="also check ids against its vocabulary")
    ver.add_argument("--eos-token", help="also check that every document ends with this token")

    rep = sub.add_parser("report", help="write a build's report.html and report.json again, from its manifests")
    rep.add_argument("run_dir", metavar="DIR_OR_URL", help="the run folder (holding ranks/ and _BUILD.json)")

    ins = sub.add_parser("inspect", help="describe a .ds file or a folder of them")
    ins.add_argument("path", help="a .ds file or a folder")
    ins.add_argument("--decode", type=int, default=0, metavar="N", help="print the first N documents")
    ins.add_argument("--tokenizer", help="tokenizer for --decode (default: the one named in the metadata)")
    return parser


def _config(cls: type, args: argparse.Namespace):
    """A stage config from parsed arguments: the parsers' dests are the configs' field names."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def cmd_tokenize(args: argparse.Namespace) -> int:
    config = _config(TokenizeConfig, args)
    result = tokenize_rank(config)
    counts = result["counts"]
    print(
        f"rank {config.rank}/{config.world_size}: {counts['docs_read']} docs read, {counts['docs_written']} written, "
        f"{counts['empty']} empty, {counts['rejected_total']} rejected, {counts['tokens_written']} tokens in "
        f"{len(result['outputs'])} files, {counts['tokens_dropped']} dropped, "
        f"{counts['special_token_literals_total']} special-token literals; {result['seconds']:.1f}s "
        f"({result['tokenizer']['load_seconds']:.1f}s loading the tokenizer, then "
        f"{result['throughput']['text_mb_per_s']} MB/s of text) -> {config.output}"
    )
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    result = merge(_config(MergeConfig, args))
    counts = result["counts"]
    resumed = f", {counts['resumed_files']} resumed" if counts["resumed_files"] else ""
    print(
        f"merge {args.save_filename}: {counts['input_files']} inputs, {counts['units']} units, {counts['tokens']} "
        f"tokens in {len(result['outputs'])} files{resumed}, {counts['tokens_dropped']} dropped; "
        f"{result['seconds']:.1f}s -> {args.output}"
    )
    return 0


def cmd_context_shuffle(args: argparse.Namespace) -> int:
    result = context_shuffle(_config(ContextShuffleConfig, args))
    counts = result["counts"]
    print(
        f"context shuffle shard {args.shard}/{args.num_shards}: {counts['files']} files, {counts['windows']} windows "
        f"of {args.window_size}, {counts['tokens']} tokens, {counts['tail_tokens_kept']} tail tokens kept, "
        f"{counts['tokens_dropped']} dropped; {result['seconds']:.1f}s -> {args.output}"
    )
    return 0


def cmd_count(args: argparse.Namespace) -> int:
    stats = count_tokens(_config(CountConfig, args))
    rejected = sum(stats["rejected"].values())
    print(
        f"count: {stats['docs']} docs, {stats['tokens']} tokens ({stats['mean_tokens_per_doc']} a doc, longest "
        f"{stats['max_tokens_per_doc']}), {stats['empty']} empty, {rejected} rejected in {len(stats['files'])} files"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = verify(args.path, args.tokenizer, args.eos_token)
    for line in report.problems + report.notes:
        print(line)
    state = "OK" if report.ok else f"FAILED, {len(report.problems)} problems"
    print(f"verify {args.path}: {report.files} files, {report.tokens} tokens: {state}")
    return 0 if report.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    data = write_report(args.run_dir)
    c = data["conservation"]
    print(
        f"report {join(args.run_dir, REPORT_HTML)}: {len(data['ranks'])} ranks, {c['docs_in']} docs read = "
        f"{c['docs_out']} written + {c['empty']} empty + {c['quarantined']} quarantined, {data['tokens']} tokens "
        f"in {len(data['files'])} files, {data['tokens_dropped']['total']} dropped"
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    fs, path = open_fs(args.path)
    if fs.isdir(path):
        urls = sorted(p if is_local(fs) else fs.unstrip_protocol(p) for p in fs.glob(path.rstrip("/") + "/*.ds"))
        if not urls:
            raise TokenFileError(f"{args.path}: no .ds files")
    else:
        urls = [args.path]
    total_tokens = total_docs = 0
    files = [TokenFile(u) for u in urls]
    for f in files:
        docs = len(f.ends)
        total_tokens += f.num_tokens
        total_docs += docs
        tokenizer = f.metadata.tokenizer if f.metadata else "?"
        loss = "loss" if f.loss is not None else "no loss"
        print(f"{f.url}: {f.num_tokens} tokens, {docs} index entries, uint{8 * f.token_size}, {loss}, {tokenizer}")
    print(f"total: {len(files)} files, {total_docs} index entries, {total_tokens} tokens")
    if args.decode:
        name = args.tokenizer or (files[0].metadata.tokenizer if files[0].metadata else None)
        if not name:
            raise TokenFileError("--decode needs --tokenizer: the metadata names none")
        tokenizer = Encoder(name, no_eos=True).tokenizer
        shown = 0
        for f in files:
            ends = np.asarray(f.ends, dtype=np.int64)
            for i in range(min(len(ends), args.decode - shown)):
                ids = f.document(i).tolist()
                print(f"--- {f.url} document {i} ({len(ids)} tokens)")
                print(tokenizer.decode(ids, skip_special_tokens=False))
                shown += 1
            if shown >= args.decode:
                break
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        commands = {
            "tokenize": cmd_tokenize,
            "merge": cmd_merge,
            "context-shuffle": cmd_context_shuffle,
            "count": cmd_count,
            "verify": cmd_verify,
            "inspect": cmd_inspect,
            "report": cmd_report,
        }
        return commands[args.command](args)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2, as argparse does for its own usage errors
    except ERRORS as exc:
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
