"""The input files of a build: folders searched, globs expanded, each file once however many paths reach it, with
what tells it from another file at its path (``identity``); and how ranks share them (``split_files``, ``shard``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from tokenization.errors import reaching
from tokenization.inputs.formats import InputError, file_format
from tokenization.inputs.local import LocalFile
from tokenization.records import FilePart, InputFile
from tokenization.storage.folder import StorageOptions, file_at
from tokenization.storage.locations import resolve
from tokenization.storage.matching import Info, Matched, Unlistable, local_folder_files, matched
from tokenization.wording import counted

MB = 1_000_000  # of split_input_mb
V = TypeVar("V")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputListing:
    """The input files, sorted by URL, the files of unsupported types that folders held (named, not read), and how
    many files folders and globs held under names starting with ``.`` or ``_`` (counted, not read)."""

    files: list[InputFile]
    skipped: list[str]
    hidden: int


def list_input_files(
    inputs: Sequence[str], storage_options: StorageOptions | None = None, quiet: bool = False
) -> InputListing:
    """Every input file, sorted by URL: folders are searched recursively, globs expanded, files taken as named.

    Below the folder named (or a glob's fixed part), names starting with ``.`` or ``_`` (markers, temp files, a
    build's own ``_manifests/``), and everything inside folders so named, are ignored and counted in ``hidden``.
    Inside folders, files of other formats are skipped and listed in ``skipped``, and a file reached by several
    paths is listed once (``_once_each``), each logged unless ``quiet`` (a build says so once, when it plans); a
    named or globbed file of another format is an error, and so is a file name that is not UTF-8, or anything but a
    regular file (``LocalFile``). ``storage_options`` open the URLs.
    """
    found: dict[str, tuple[InputFile, Hashable]] = {}
    skipped: list[str] = []
    hidden: set[str] = set()
    for spec in inputs:
        with reaching(spec):
            try:
                found.update(_list(spec, skipped, hidden, storage_options))
            except RecursionError:  # fsspec's glob (and walk, on some stores) recurses a Python call a folder level
                raise InputError(
                    f"{spec}: its folders nest too deep for fsspec to search (a Python call a level, past the "
                    f"interpreter's limit): name a folder, which is listed without that limit, or flatten the tree"
                ) from None
    if skipped and not quiet:
        log.warning("skipped %s of unsupported types: %s", counted(len(skipped), "input file"), ", ".join(skipped))
    if hidden and not quiet:
        log.info("ignored %s under names starting with . or _", counted(len(hidden), "input file"))
    if not found:
        unsupported = f" (skipped as unsupported: {', '.join(skipped)})" if skipped else ""
        ignored = f" ({len(hidden)} ignored under names starting with . or _)" if hidden else ""
        raise InputError(f"no input files found in {', '.join(inputs)}{unsupported}{ignored}")
    kept = _once_each(found, quiet)
    return InputListing([kept[url] for url in sorted(kept)], skipped, len(hidden))


def _once_each(found: dict[str, tuple[InputFile, Hashable]], quiet: bool) -> dict[str, InputFile]:
    """Each file once: a file that the input reaches by several paths (a symlink, a hard link, a folder named
    twice, once through ``..``) is read by its real path (no link or ``..`` in it) if one is, else by the first in
    sorted order, and each other path is logged (unless ``quiet``)."""
    paths: dict[Hashable, list[str]] = {}
    for url in sorted(found):
        paths.setdefault(found[url][1], []).append(url)
    kept = {}
    for urls in paths.values():
        chosen = min(urls, key=lambda url: (len(urls) > 1 and resolve(url) != url, url))
        kept[chosen] = found[chosen][0]
        for other in urls:
            if other != chosen and not quiet:
                log.warning("%s and %s are one file: it is read once, as %s", chosen, other, chosen)
    return kept


def split_files(files: Sequence[InputFile], split_mb: int | None) -> list[InputFile]:
    """What ranks share, in order: each file whole, or, with ``split_mb``, each splittable file (uncompressed JSON
    lines, parquet) of more than that many MB as parts of about that size (``parts``: how they are read)."""
    if not split_mb:
        return list(files)
    shared = []
    for file in files:
        count = -(-file.size // (split_mb * MB))
        if count > 1 and _splittable(file.url):
            shared += [replace(file, part=FilePart(index, count)) for index in range(count)]
        else:
            shared.append(file)
    return shared


def _splittable(url: str) -> bool:
    """Whether a file can be read in parts: a compressed stream must be read from its start."""
    return file_format(url)[1] is None


def idle_ranks(ranks: int, shared: Sequence[InputFile], split_mb: int | None) -> None:
    """Warn, with the numbers, when ranks outnumber what they share (``split_files``): the others get nothing."""
    if ranks <= len(shared):
        return
    files = len({f.url for f in shared})
    if split_mb:
        what = f"{counted(files, 'input file')} in {counted(len(shared), 'part')}:"
        advice = "or a smaller --split-input-mb (only uncompressed JSON lines and parquet files are split)"
    else:
        what = f"{counted(files, 'input file')}: a rank takes whole files, so"
        part_mb = max(1, -(-sum(f.size for f in shared) // (ranks * MB)))
        advice = (
            f"or let ranks share big files: --split-input-mb {part_mb} splits those above {part_mb} MB"
            if any(_splittable(f.url) for f in shared)
            else "or split the input into more files (ranks cannot share a compressed file)"
        )
    idle = ranks - len(shared)
    log.warning(
        "%d ranks for %s %s will have nothing to tokenize; use at most %s, %s",
        ranks,
        what,
        counted(idle, "rank"),
        counted(len(shared), "rank"),
        advice,
    )


def may_hold_others(inputs: Sequence[str], known: set[str], storage_options: StorageOptions | None) -> bool:
    """Whether the inputs may hold a file that ``known`` (URLs) does not name. Local folders' files are looked at by
    their names alone (``local_folder_files``, no ``stat`` each: a tenth of ``list_input_files``' time), those the
    listing keeps (visible, of a supported format): all known, and no other input, say there is none. A glob, a file
    named, an object store or a name not known may be one (``list_input_files`` tells)."""
    for spec in inputs:
        if (found := local_folder_files(spec, storage_options)) is None:
            return True
        root, paths = found
        if any(p not in known and _is_supported(p) for p in _visible(dict.fromkeys(paths), root, set())):
            return True
    return False


def _list(
    spec: str, skipped: list[str], hidden: set[str], storage_options: StorageOptions | None
) -> dict[str, tuple[InputFile, Hashable]]:
    """One input spec's files with their sizes and identities, and what each is (``file_key``), by URL;
    unsupported files of folders go to ``skipped``, hidden ones to ``hidden``. A local file to be read must be a
    regular file (``LocalFile.of``)."""
    try:
        found = matched(spec, storage_options)
    except Unlistable as exc:
        raise InputError(
            f"{exc.folder}: cannot be listed ({exc.strerror}): make it readable, or move it out of the input"
        ) from None
    if found.kind == "missing":
        if found.link:
            LocalFile.of(found.root)  # a link loop or a dangling link: raises, saying which
        raise InputError(f"{spec}: no such file or folder")
    entries = found.files if found.kind == "file" else _visible(found.files, found.root, hidden)
    for p in entries:
        _check_name(p)
    if found.kind == "folder":  # each name looked at once: a folder of 100,000 files
        supported = {p: i for p, i in entries.items() if _is_supported(p)}
        skipped += sorted(found.url(p) for p in entries if p not in supported)
        entries = supported
    else:
        for p in entries:
            file_format(found.url(p))  # a named or globbed file of another format is an error
    return dict(_listed(found, p, info) for p, info in entries.items())


def _listed(found: Matched, path: str, info: Info) -> tuple[str, tuple[InputFile, Hashable]]:
    """A listed file by its URL, with what it is (``file_key``). A local one must be a regular file, or a link to
    one (``LocalFile``)."""
    url = found.url(path)
    if found.local:
        local = LocalFile.listed(path, info)
        file = InputFile(url, local.size, local.identity)
        return url, (file, file_key(file, local))
    file = InputFile(url, int(info.get("size") or 0), identity(path, info, local=False))
    return url, (file, file_key(file, None))


def file_key(file: InputFile, local: LocalFile | None) -> Hashable:
    """What a listed file is, however its path is spelled: locally (``local``: as the OS sees it) its device and
    inode (``LocalFile.key``); on an object store (None), which has no links, its key with ``.`` and ``..``
    resolved, and its ETag (``identity``)."""
    return local.key if local is not None else (resolve(file.url), file.identity)


def key_of(file: InputFile, storage_options: StorageOptions | None) -> Hashable:
    """``file_key`` of a file listed before, found again by its URL."""
    folder, name = file_at(file.url, storage_options)
    return file_key(file, LocalFile.of(folder.path_of(name)) if folder.on_disk else None)


def _visible(entries: dict[str, V], root: str, hidden: set[str]) -> dict[str, V]:
    """The entries with no name below ``root`` starting with ``.`` or ``_``; the others go to ``hidden``. Only
    names below ``root``: a folder the user named may itself be ``_private``."""
    shown = {}
    for p, info in entries.items():
        if any(name.startswith((".", "_")) for name in p[len(root) :].split("/")):
            hidden.add(p)
        else:
            shown[p] = info
    return shown


def _check_name(path: str) -> None:
    """Refuse a name that is not UTF-8 (a local listing gives its bytes as surrogate escapes), shown with
    backslash escapes: manifests and reports are UTF-8 JSON, and would fail to record it after all the work."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise InputError(f"{shown}: the file name is not valid UTF-8; rename it") from None


def _is_supported(url: str) -> bool:
    try:
        file_format(url)
    except InputError:
        return False
    return True


def identity(path: str, info: Info, local: bool) -> str:
    """What tells the file at ``path`` from another one there (see :class:`InputFile`), as a listing sees it
    (``info``; ``local``: a file of the local filesystem): a plan adds the sha256 of a local file's bytes when an
    earlier night remembered it (``with_content``)."""
    if local:
        return LocalFile.of(path).identity
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    if etag:
        return f"etag={str(etag).strip(chr(34))}"
    modified = info.get("LastModified") or info.get("mtime") or info.get("updated")
    return f"modified={modified}" if modified else ""


def shard(files: Sequence[InputFile], rank: int, world_size: int) -> list[InputFile]:
    """Rank ``r`` of ``w`` takes ``files[r::w]`` of the sorted list, as datatrove's ``get_shard`` does."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return list(files[rank::world_size])
