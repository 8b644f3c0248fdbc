"""The commands that look at what was built (``verify``, ``report``, ``cache``, ``inspect``): the layers below
check, list and read; these print."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tokenization.errors import TokenizationError, UsageError
from tokenization.storage.folder import Folder
from tokenization.wording import counted

if TYPE_CHECKING:
    import numpy as np

    from tokenization.formats.ds import TokenFile
    from tokenization.formats.megatron import MegatronFile
    from tokenization.output.cache import Cache


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
