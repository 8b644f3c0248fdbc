"""Input documents: file discovery, datatrove-style sharding, record parsing and quarantine reasons.

Every line or row read ends up as exactly one of: a :class:`Record` (which may have empty text), a
:class:`Rejected` with a reason, or a counted blank line. Nothing is skipped silently.
"""

from __future__ import annotations

import bisect
import errno
import functools
import io
import itertools
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from gzip import BadGzipFile
from typing import IO, TYPE_CHECKING, Any

import fsspec
import orjson
import zstandard
from isal import igzip, isal_zlib

from tokenization.errors import StorageError, TokenizationError, reaching
from tokenization.inputs.parts import Window, line_span, row_groups
from tokenization.records import FilePart, InputFile, PlanReading, Rejected
from tokenization.rendering.renderer import MISSING, Renderer, get_field, no_loss_ranges, text_field
from tokenization.storage.files import StorageOptions, file_sha256, is_local, map_concurrently, open_fs
from tokenization.storage.locations import GLOB_CHARS, glob_folder, resolve
from tokenization.wording import counted

if TYPE_CHECKING:
    import pyarrow.parquet

JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_EXTENSION = ".parquet"
PARQUET_BATCH_ROWS = 1024
READ_BUFFER = 1 << 20
SAMPLE_READ = 64 << 10  # read at each place ``DocumentReader.at`` reads a plain file
ZSTD_SLICE = 1 << 10  # compressed bytes inflated at once: <= 32 MiB out (RLE: 4 bytes, 128 KiB); 8% slower than 1 MiB
DEFAULT_MAX_RECORD_BYTES = 64 << 20  # a line or row: a 50 MB document (1 GB to encode) passes; a few fit any worker
RAW_HEAD_BYTES = 1 << 10  # of a record too large to keep, the bytes its quarantine entry shows
MB = 1_000_000  # of split_input_mb
MTIME = "mtime_ns"  # a local file's identity starts with it
UTF8_BOM = b"\xef\xbb\xbf"

log = logging.getLogger(__name__)


class InputError(TokenizationError, ValueError):
    """Input cannot be read: no files, an unknown format, or corrupt compressed data (the message names it)."""


@dataclass(frozen=True)
class InputListing:
    """The input files, sorted by URL, the files of unsupported types that folders held (named, not read), and how
    many files folders and globs held under names starting with ``.`` or ``_`` (counted, not read)."""

    files: list[InputFile]
    skipped: list[str]
    hidden: int


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A local file as ``stat`` sees it through its links: what it is (``device`` and ``inode``: every path to one
    file, a symlink, a hard link or a ``..``, gives the same pair), and what tells a change (``size``, ``mtime_ns``,
    ``ctime_ns``). Only a regular file is one (``of``)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str) -> LocalFile:
        """The regular file at ``path`` (links followed), or :class:`InputError` saying what else is there: a device
        or a FIFO would be read forever, a link loop or a dangling link not at all."""
        try:
            st = os.stat(path)
        except OSError as exc:
            raise InputError(f"{_shown(path)} {_unreachable(path, exc)}; {ONLY_REGULAR}") from None
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{_shown(path)} is {_kind(st.st_mode)}; {ONLY_REGULAR}")
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @property
    def key(self) -> tuple[int, int]:
        """What the file is, however its path is spelled."""
        return self.device, self.inode

    @property
    def identity(self) -> str:
        """The identity a listing records (``InputFile.identity``)."""
        return f"{MTIME}={self.mtime_ns},ctime_ns={self.ctime_ns},ino={self.inode}"


ONLY_REGULAR = "only regular files (or links to them) are read as input: remove it, or name the files to read"
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), f"not a regular file (mode {mode:o})")


def _unreachable(path: str, exc: OSError) -> str:
    """Why ``stat`` found no file at ``path``, which a listing showed: a link loop, a dangling link, or another
    error (as the system words it)."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop"
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return "is a dangling symbolic link"
    return f"cannot be read ({exc.strerror or exc})"


def _shown(path: str) -> str:
    """A path, and where it links to when it is a symbolic link."""
    try:
        return f"{path} (a symbolic link to {os.readlink(path)})"
    except OSError:
        return path


@dataclass(frozen=True, slots=True)
class Record:
    text: str
    id: str
    no_loss_ranges: list[tuple[int, int]] | None
    file: str
    line: int
    data: dict[str, Any] | None = None  # the whole record, kept only when the reader is asked to (count --annotate)
    special_spans: list[tuple[int, int]] | None = None  # special tokens its chat template wrote (rendering.Rendered)
    offset: int = -1  # where its line starts in the file's (decompressed) bytes, or its row in a parquet file


def file_format(url: str) -> tuple[str, str | None]:
    """``("jsonl"|"parquet", compression)`` from the name, or raise :class:`InputError`."""
    name = url.rsplit("/", 1)[-1].lower()
    compression = next((c for ext, c in COMPRESSIONS.items() if name.endswith(ext)), None)
    if compression:
        name = name.rsplit(".", 1)[0]
    if name.endswith(PARQUET_EXTENSION) and compression is None:
        return "parquet", None
    if name.endswith(JSONL_EXTENSIONS):
        return "jsonl", compression
    raise InputError(f"{url}: unsupported input format (expected .jsonl[.gz|.zst] or .parquet)")


# Bytes of text a byte of a compressed input holds, at least, about: JSON lines of text compress 3-4 times (the
# shared corpora: 13.3 MB of gzip hold 43 MB of text), and so do parquet's pages.
COMPRESSED_TEXT_RATIO = 3


def text_bytes_about(file: InputFile) -> int:
    """About how many bytes of text reading ``file`` gives, without reading it: what a rank weighs encoding it on HF
    against building the fast engine by (a gzip file counted by its own bytes passed for a third of its text)."""
    form, compression = file_format(file.url)
    return file.span_bytes * (COMPRESSED_TEXT_RATIO if compression or form == "parquet" else 1)


def _is_supported(url: str) -> bool:
    try:
        file_format(url)
    except InputError:
        return False
    return True


class _ZstdFrames(io.RawIOBase):
    """Decompresses concatenated zstd frames, raising on a truncated last frame (zstandard's stream reader
    silently ends there, which would lose the tail of the file without a word). Compressed data goes in by
    ``ZSTD_SLICE`` bytes, as zstd returns all it inflates from its input at once: a small file that inflates to
    gigabytes is never held whole."""

    def __init__(self, raw: io.IOBase):
        self.raw = raw
        self.frame = zstandard.ZstdDecompressor().decompressobj()
        self.in_frame = False
        self.compressed = b""  # read from ``raw``; fed up to ``offset``
        self.offset = 0
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            if self.frame.eof:  # the next frame starts in what the last slice left over
                self.offset -= len(self.frame.unused_data)
                self.frame, self.in_frame = zstandard.ZstdDecompressor().decompressobj(), False
            if self.offset == len(self.compressed):
                self.compressed, self.offset = self.raw.read(READ_BUFFER), 0
            piece = memoryview(self.compressed)[self.offset : self.offset + ZSTD_SLICE]
            if not piece:
                if self.in_frame:
                    raise EOFError("zstd stream ended in the middle of a frame")
                return 0
            self.offset += len(piece)
            self.in_frame = True
            self.pending = memoryview(self.frame.decompress(piece))
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


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


def _list(
    spec: str, skipped: list[str], hidden: set[str], storage_options: StorageOptions | None
) -> dict[str, tuple[InputFile, Hashable]]:
    """One input spec's files with their sizes and identities, and what each is (``file_key``), by URL;
    unsupported files of folders go to ``skipped``, hidden ones to ``hidden``. A local file to be read must be a
    regular file (``LocalFile.of``)."""
    fs, path = open_fs(spec, storage_options)
    globbed = any(ch in path for ch in GLOB_CHARS) and not fs.exists(path)  # `data [v2]/` may be a real folder
    folder = not globbed and fs.isdir(path)
    if globbed:
        matched = {p: i for p, i in fs.glob(path, detail=True).items() if i["type"] != "directory"}
        entries = _visible(matched, glob_folder(path), hidden)
    elif folder:
        entries = _visible(_files_under(fs, path), path, hidden)
    elif fs.exists(path):
        entries = {path: fs.info(path)}
    else:
        if is_local(fs) and os.path.islink(path):
            LocalFile.of(path)  # a link loop or a dangling link: raises, saying which
        raise InputError(f"{spec}: no such file or folder")
    for p in entries:
        _check_name(p)
    if folder:
        skipped += sorted(_url(fs, p) for p in entries if not _is_supported(p))
        entries = {p: i for p, i in entries.items() if _is_supported(p)}
    for p in entries:
        file_format(_url(fs, p))  # a named or globbed file of another format is an error
    return dict(_listed(fs, p, info) for p, info in entries.items())


def _listed(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any]) -> tuple[str, tuple[InputFile, Hashable]]:
    """A listed file by its URL, with what it is (``file_key``). A local one must be a regular file, or a link to
    one (``LocalFile``)."""
    url = _url(fs, path)
    if is_local(fs):
        local = LocalFile.of(path)
        file = InputFile(url, local.size, local.identity)
        return url, (file, file_key(fs, path, file, local))
    file = InputFile(url, int(info.get("size") or 0), identity(fs, path, info))
    return url, (file, file_key(fs, path, file))


def file_key(fs: fsspec.AbstractFileSystem, path: str, file: InputFile, local: LocalFile | None = None) -> Hashable:
    """What a listed file is, however its path is spelled: locally its device and inode (``LocalFile.key``; of
    ``local``, when the listing has it already); on an object store, which has no links, its key with ``.`` and
    ``..`` resolved, and its ETag (``identity``)."""
    if is_local(fs):
        return (local or LocalFile.of(path)).key
    return resolve(file.url), file.identity


def _files_under(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, dict[str, Any]]:
    """Every file under the folder ``path``, as ``fs.find(path, detail=True)`` gives them. A local folder is listed
    a folder at a time from a stack, not by fsspec's ``walk``: that recurses a Python call a level (a tree 1,100
    deep raised RecursionError), and leaves out, without a word, a folder it cannot list. An object store lists
    the whole prefix at once, in pages."""
    if not is_local(fs):
        return fs.find(path, detail=True)
    found: dict[str, dict[str, Any]] = {}
    folders = [path]
    while folders:
        folder = folders.pop()
        try:
            listing = fs.ls(folder, detail=True)
        except OSError as exc:
            raise InputError(
                f"{folder}: cannot be listed ({exc.strerror or exc}): make it readable, or move it out of the input"
            ) from None
        for info in listing:
            if info["type"] == "directory":
                folders.append(info["name"])
            else:
                found[info["name"]] = info
    return found


def _visible(entries: dict[str, dict[str, Any]], root: str, hidden: set[str]) -> dict[str, dict[str, Any]]:
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


def identity(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any]) -> str:
    """What tells this file from another one at the same path (see :class:`InputFile`), as a listing sees it: a
    plan adds the sha256 of a local file's bytes when an earlier night remembered it (``with_content``)."""
    if is_local(fs):
        return LocalFile.of(path).identity
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    if etag:
        return f"etag={str(etag).strip(chr(34))}"
    modified = info.get("LastModified") or info.get("mtime") or info.get("updated")
    return f"modified={modified}" if modified else ""


@dataclass(frozen=True)
class Hashed:
    """A plan's listing with the sha256 of each local file it recognised unchanged (``with_content``), what the
    next plan is to remember of them (``known``: a row a local file, by URL), and what the night costs: files
    recognised unchanged without a byte read, files new or changed that their ranks hash (``rank_hashes``), and
    their bytes. The plan reads none."""

    listing: InputListing
    known: dict[str, str]
    recognised: int
    hashed: int
    bytes_to_hash: int

    def reading(self, listed: int) -> PlanReading:
        """As a build records it, of the ``listed`` files."""
        return PlanReading(
            files_listed=listed,
            files_recognised=self.recognised,
            files_hashed=self.hashed,
            bytes_hashed=self.bytes_to_hash,
        )


def with_content(listing: InputListing, known: Mapping[str, str] | None = None) -> Hashed:
    """The listing with the identity of each local file that ``known`` (an earlier night's rows, by URL)
    recognises ending in the sha256 of its bytes, read from there: its size, mtime, change time, inode and device
    are what they were, and its mtime is older than the moment it was hashed by ``RACY_NS`` at least, as git's index
    does. The plan reads no file's bytes: a plan of 10,000 new files on a shared file system would be one task's
    read of them all. A new file, a changed one, one modified within that margin of its hashing (git's "racy" case:
    a coarse clock could not tell a write during the hash) and one whose change time alone differs (a ``chmod``)
    keep their listed identity (their ``stat``): their ranks hash them before they look them up in the cache
    (``rank_hashes``), and remember them for the next night. An object store's ETag is a digest of the bytes
    already."""
    local = [f for f in listing.files if f.identity.startswith(MTIME)]
    known = known or {}
    digests = {f.url: sha for f in local if (sha := _recognised(f, _stat(f.url), known.get(f.url)))}
    rows = {url: known[url] for url in digests}  # the recognised: as they were remembered
    unknown = [f for f in local if f.url not in digests]
    if unknown:
        log.info(
            "plan: %s recognised unchanged, not read; %s (%d bytes) new or changed, for their ranks to hash",
            counted(len(rows), "local input file"),
            counted(len(unknown), "file"),
            sum(f.size for f in unknown),
        )
    files = [with_sha256(f, digests[f.url]) if f.url in digests else f for f in listing.files]
    return Hashed(replace(listing, files=files), rows, len(rows), len(unknown), sum(f.size for f in unknown))


def with_sha256(file: InputFile, sha256: str) -> InputFile:
    """A local file's identity, as listed, ending in the sha256 of its bytes (``content_identity`` takes it)."""
    return replace(file, identity=f"{file.identity},sha256={sha256}")


def for_its_rank(file: InputFile) -> bool:
    """Whether ``file`` is a local file whose plan records no sha256 of it: its rank hashes it (``rank_hashes``)."""
    return file.identity.startswith(MTIME) and "sha256" not in _fields(file.identity)


def rank_hashes(files: Sequence[InputFile]) -> tuple[list[InputFile], dict[str, str]]:
    """A rank's ``files``, each local one whose plan records no sha256 (new or changed: ``with_content``) given
    the sha256 of its bytes, which this rank reads here, on a thread a core (hashlib works without the GIL; a file
    of several parts is read once); and the rows the next night is to remember of them, by URL. A file whose
    ``stat`` is no longer its planned one gets no row: the rank refuses it (``check_unchanged``)."""
    todo = {f.url: f for f in files if for_its_rank(f)}
    stats = {url: _stat(url) for url in todo}
    # ``hashed_ns``: before any byte is read, so that a write during the hash is git's racy case
    started, hashed_ns = time.perf_counter(), time.time_ns()
    found = map_concurrently(lambda f: _sha256(f.url, f.identity), list(todo.values()), workers=os.cpu_count() or 1)
    digests = dict(zip(todo, found, strict=True))
    if todo:
        log.info(
            "hashed %s new or changed since the last night, %d bytes, in %.1f s",
            counted(len(todo), "local input file"),
            sum(f.size for f in todo.values()),
            time.perf_counter() - started,
        )
    rows = {
        url: _row(st, hashed_ns, digests[url])
        for url, st in stats.items()
        if st is not None and _as_listed(todo[url], st)
    }
    return [with_sha256(f, digests[f.url]) if f.url in digests else f for f in files], rows


RACY_NS = 2 * 10**9  # a file modified this close to its hashing is hashed again: coarse filesystems keep 1-2 s mtimes
SHA256 = re.compile(r"[0-9a-f]{64}")
KNOWN_FIELDS = 7  # a row: size, mtime_ns, ctime_ns, inode, device, when it was hashed (ns), sha256


def _stat(path: str) -> os.stat_result | None:
    """A local file's ``stat``, or None when it is gone (the build then fails as it reads it, with its name)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def _row(st: os.stat_result, hashed_ns: int, sha256: str) -> str:
    """What the next plan remembers of a local file (``with_content``)."""
    return f"{st.st_size},{st.st_mtime_ns},{st.st_ctime_ns},{st.st_ino},{st.st_dev},{hashed_ns},{sha256}"


def _as_listed(file: InputFile, st: os.stat_result) -> bool:
    """Whether a local file's ``stat`` now (``st``) is what its listing (or its plan) recorded of it."""
    listed = _fields(file.identity)
    return (file.size, listed[MTIME], listed["ctime_ns"], listed["ino"]) == (
        st.st_size,
        str(st.st_mtime_ns),
        str(st.st_ctime_ns),
        str(st.st_ino),
    )


def _recognised(file: InputFile, st: os.stat_result | None, row: str | None) -> str | None:
    """The sha256 that ``row`` remembers of ``file``, when the file's ``stat`` now (``st``), and as it was listed,
    is what it was then, and its mtime was not racy; else None: the file is read."""
    if st is None or row is None or len(fields := row.split(",")) != KNOWN_FIELDS:
        return None
    if not _as_listed(file, st):
        return None  # changed since it was listed
    try:
        *remembered, hashed_ns = (int(field) for field in fields[:6])
    except ValueError:
        return None
    now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    if tuple(remembered) != now or st.st_mtime_ns >= hashed_ns - RACY_NS:
        return None
    return fields[6] if SHA256.fullmatch(fields[6]) else None


def _remembered_sha256(planned: InputFile, row: str | None) -> str | None:
    """The sha256 that ``row`` (a rank's, ``rank_hashes``) remembers of the file as ``planned`` (its ``stat``:
    a plan records no sha256 of a new file), or None when the row is of another ``stat``."""
    if row is None or len(fields := row.split(",")) != KNOWN_FIELDS or not SHA256.fullmatch(fields[6]):
        return None
    was = _fields(planned.identity)
    same = fields[:4] == [str(planned.size), was[MTIME], was["ctime_ns"], was["ino"]]
    return fields[6] if same else None


Remembered = Callable[[], Mapping[str, str]]  # the rows ranks remembered (``rank_hashes``), by URL, read when asked


def difference(planned: InputFile, now: InputFile, remembered: Remembered | None = None) -> str | None:
    """How the file ``now`` (a fresh listing's) differs from the one ``planned``, or None when it is the same file:
    a file whose bytes did not change is. An object store's identity is its ETag, a digest of the bytes. Locally
    the size and the mtime are the fast check; when they agree but the inode or the change time differ (a
    ``chmod``, a copy that kept the mtime), the bytes are hashed and compared with the sha256 the plan recorded, or,
    for a file new to its plan (its planned identity is its ``stat``), the one a rank remembered of it at that
    ``stat`` (``remembered``: the rows, by URL, read only then)."""
    if now.size != planned.size:
        return f"its size changed from {planned.size:,} to {now.size:,} bytes"
    if not planned.identity.startswith(MTIME):  # an ETag, or a store's modification time
        return None if now.identity == planned.identity else f"it changed ({now.identity}; planned {planned.identity})"
    was, found = _fields(planned.identity), _fields(now.identity)
    if found[MTIME] != was[MTIME]:
        return f"it was modified (mtime {_mtime(found)}; planned {_mtime(was)})"
    if (found["ino"], found["ctime_ns"]) == (was["ino"], was["ctime_ns"]):
        return None
    sha256 = was.get("sha256") or _remembered_sha256(planned, (remembered() if remembered else {}).get(planned.url))
    if sha256 is None:
        return (
            "its inode or change time changed (a chmod, or a copy that kept its mtime), and its plan records no "
            "sha256 of its bytes to tell whether they did (a file new to its plan, whose rank's hash is not "
            "remembered, is known by its stat; or a plan made by an earlier version)"
        )
    digest = _sha256(now.url, now.identity)
    if digest != sha256:
        return f"its content changed (sha256 {digest[:12]}…; planned {sha256[:12]}…), its size and mtime kept"
    return None


def _fields(local: str) -> dict[str, str]:
    """A local identity's fields (``identity``, and the ``sha256`` a plan adds), by name."""
    return dict(field.split("=", 1) for field in local.split(","))


def _mtime(fields: dict[str, str]) -> str:
    """A local identity's mtime, in UTC to the nanosecond (a file can be modified within a microsecond)."""
    seconds, nanoseconds = divmod(int(fields[MTIME]), 10**9)
    return f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%dT%H:%M:%S}.{nanoseconds:09d}Z"


def content_identity(file: InputFile, storage_options: StorageOptions | None = None) -> str:
    """What tells this file's bytes (or this part's) from any other's, for the tokenization cache. On an object
    store, the ETag its listing gave, with its size: S3's ETag is the MD5 of the bytes (of the parts' MD5s, for a
    multipart upload), so other bytes give another one, whatever the size and the time; a store's version number
    changes with every write. Elsewhere (a local file), the sha256 of its bytes: an mtime can be set back and a
    rewrite in place keeps the size, so nothing cheaper tells. A part adds which one it is: the file's bytes decide
    its edges."""
    part = f",part={file.part.index + 1}/{file.part.count}" if file.part else ""
    if file.identity.startswith("etag="):
        return f"{file.identity},bytes={file.size}{part}"
    planned = _fields(file.identity).get("sha256") if file.identity.startswith(MTIME) else None
    return f"sha256={planned or _sha256(file.url, file.identity, storage_options)}{part}"


def _sha256(url: str, identity: str, storage_options: StorageOptions | None = None) -> str:
    """A file's sha256, once a process however many of its parts a rank holds (``identity``: a changed file's is
    another)."""
    return _sha256_once(*open_fs(url, storage_options), url, identity)


@functools.lru_cache(maxsize=64)
def _sha256_once(fs: fsspec.AbstractFileSystem, path: str, url: str, identity: str) -> str:
    try:
        with reaching(url):
            return file_sha256(path, fs)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{url}: could not be read to identify its content; {exc}") from exc


def check_unchanged(
    files: Sequence[InputFile], storage_options: StorageOptions | None = None, remembered: Remembered | None = None
) -> None:
    """Raise :class:`InputError` naming the first of ``files`` that is gone or no longer the file it was when
    listed, and how (``difference``, with the rows ranks ``remembered``): a build reads exactly the files it
    planned."""
    for file in files:
        fs, path = open_fs(file.url, storage_options)
        fs.invalidate_cache(path)
        try:
            with reaching(file.url):
                info = fs.info(path)
        except FileNotFoundError:
            raise InputError(
                f"{file.url}: gone since the build was planned; a build reads exactly its plan's files, "
                f"so run it under a new build id"
            ) from None
        now = InputFile(file.url, int(info.get("size") or 0), identity(fs, path, info), file.part)
        if changed := difference(file, now, remembered):
            raise InputError(
                f"{file.url}: changed since the build was planned: {changed}; a build reads exactly its plan's "
                f"files, so run it under a new build id"
            )


def _url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)


def shard(files: Sequence[InputFile], rank: int, world_size: int) -> list[InputFile]:
    """Rank ``r`` of ``w`` takes ``files[r::w]`` of the sorted list, as datatrove's ``get_shard`` does."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return list(files[rank::world_size])


def _no_loss_ranges(value: object, text: str) -> list[tuple[int, int]] | str | None:
    """Validated ranges, ``None`` when absent, or the reject reason."""
    if value is MISSING or value is None or value == []:
        return None
    if not isinstance(value, list):
        return "bad_no_loss_ranges"
    ranges = []
    for item in value:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
            or not 0 <= item[0] <= item[1] <= len(text)
        ):
            return "bad_no_loss_ranges"
        ranges.append((item[0], item[1]))
    return ranges


class DocumentReader:
    """Reads documents from a list of files (or parts of files), in order, tracking input bytes consumed for
    progress."""

    def __init__(
        self,
        files: Sequence[InputFile],
        text_key: str = "text",
        id_key: str = "id",
        keep_data: bool = False,
        renderer: Renderer | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        storage_options: StorageOptions | None = None,
    ):
        """``renderer`` makes a record's text (and its loss spans) from its fields instead of ``text_key``. A line
        or row of more than ``max_record_bytes`` is rejected as ``record_too_large``; a line is never held whole.
        ``storage_options`` open the files' URLs."""
        self.files = list(files)
        self.storage_options = storage_options
        self.renderer = renderer
        self.max_record_bytes = max_record_bytes
        self.text_key = text_key
        self.id_key = id_key
        self.keep_data = keep_data
        self.blank_lines = 0
        self._done_bytes = 0
        self._raw: io.IOBase | None = None
        self._span = (0, 0)  # of the file being read

    @property
    def total_bytes(self) -> int:
        return sum(f.span_bytes for f in self.files)

    @property
    def bytes_read(self) -> int:
        current = 0
        if self._raw is not None:
            try:
                start, end = self._span
                current = min(max(self._raw.tell() - start, 0), end - start)
            except (OSError, ValueError):
                current = 0
        return self._done_bytes + current

    def __iter__(self) -> Generator[Record | Rejected, None, None]:  # (a generator: callers close it)
        for file in self.files:
            kind, compression = file_format(file.url)
            self._span = file.span
            yield from self._parquet(file) if kind == "parquet" else self._jsonl(file, compression)
            self._done_bytes += file.span_bytes
            self._raw = None

    def _parse(
        self, obj: object, url: str, line: int, raw: bytes | bytearray | str, offset: int = -1
    ) -> Record | Rejected:
        def reject(reason: str) -> Rejected:
            text = raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")
            return Rejected(url, line, reason, text.rstrip("\n"))

        if not isinstance(obj, dict):
            return reject("not_an_object")
        rendered = self.renderer.render(obj) if self.renderer else text_field(obj, self.text_key)
        if isinstance(rendered, str):
            return reject(rendered)
        text = rendered.text
        ranges = _no_loss_ranges(obj.get("no_loss_ranges", MISSING), text)
        if isinstance(ranges, str):
            return reject(ranges)
        ranges = no_loss_ranges(rendered.loss_spans, len(text), ranges)
        doc_id = get_field(obj, self.id_key)
        doc_id = f"{url}/{line - 1}" if doc_id is MISSING or doc_id is None else str(doc_id)
        data = obj if self.keep_data else None
        return Record(text, doc_id, ranges, url, line, data, rendered.special_spans, offset)

    def _line(
        self, url: str, line_no: int, line: bytes | bytearray | _Oversized, offset: int
    ) -> Record | Rejected | None:
        """The record of one line (None for a blank one, which is counted) that starts at byte ``offset``."""
        if isinstance(line, _Oversized):
            return _too_large(url, line_no, line.head, line.size, self.max_record_bytes)
        if line_no == 1 and line.startswith(UTF8_BOM):  # editors on Windows write one
            line = line[len(UTF8_BOM) :]
        if not line.strip():
            self.blank_lines += 1
            return None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:
                line.decode("utf-8")
                reason = "malformed_json"
            except UnicodeDecodeError:
                reason = "invalid_utf8"
            return Rejected(url, line_no, reason, line.decode("utf-8", "backslashreplace").rstrip("\n"))
        return self._parse(obj, url, line_no, line, offset)

    def _jsonl(self, file: InputFile, compression: str | None) -> Iterator[Record | Rejected]:
        url = file.url
        fs, path = open_fs(url, self.storage_options)
        line_no = 0
        limit = self.max_record_bytes
        with fs.open(path, "rb") as raw:
            self._raw = raw
            try:
                start, end, before = line_span(raw, file) if file.part else (0, file.size, 0)
                source = Window(raw, start, end) if file.part else raw
                stream = _decompressed(source, compression)  # (held: freeing it would close ``raw``)
                offset = start if not compression else 0  # of the line, in the bytes the lines are read from
                for line_no, line in enumerate(_bounded_lines(stream, limit), before + 1):
                    at, offset = offset, offset + (line.size + 1 if isinstance(line, _Oversized) else len(line))
                    if (item := self._line(url, line_no, line, at)) is not None:
                        yield item
                if raw.tell() < end:  # a short read must never pass for a short file
                    raise InputError(f"{url}: read {raw.tell()} of its {end} bytes, then the storage said EOF")
                if compression and not raw.tell():  # gzip and zstd read it as empty, `gzip -t` as truncated
                    raise InputError(
                        f"{url}: 0 bytes: an empty compressed file is truncated (a valid {compression} stream has a "
                        "header); an empty input should be an empty .jsonl"
                    )
            # isal's stubs declare ``isal_zlib.error`` an Exception instance; it is a class (igzip_lib.IsalError)
            except (EOFError, BadGzipFile, isal_zlib.error, zstandard.ZstdError) as exc:  # type: ignore[misc]
                if compression == "gzip":  # the read that failed lost the lines it inflated before the fault
                    with fs.open(path, "rb") as again:
                        line_no = max(line_no, _whole_gzip_lines(again))
                where = f"after line {line_no} (the last good line)" if line_no else "before its first line"
                raise InputError(
                    f"{url}: corrupt or truncated {compression or 'file'} data {where}; {type(exc).__name__}: {exc}"
                ) from exc
            except OSError as exc:  # the storage failed, not the data: another try may read it
                raise StorageError(f"{url}: read failed after line {line_no}; {type(exc).__name__}: {exc}") from exc

    def _parquet(self, file: InputFile) -> Iterator[Record | Rejected]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        url = file.url
        fs, path = open_fs(url, self.storage_options)
        row = 0
        try:
            with fs.open(path, "rb") as raw:
                self._raw = raw
                parquet = pq.ParquetFile(raw)
                groups, row = row_groups(parquet.metadata, file.part)
                if groups == []:  # a part of a file with fewer row groups than parts
                    return
                columns = self._columns(parquet)
                batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=columns)
                for batch in batches:
                    for obj in batch.to_pylist():
                        row += 1
                        yield self._row(url, row, obj)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{url}: unreadable parquet after row {row}; {type(exc).__name__}: {exc}") from exc

    def _columns(self, parquet: pyarrow.parquet.ParquetFile) -> list[str] | None:
        """The columns a parquet file's records need: all of them for a template, which may name any field."""
        wanted = {self.text_key, self.id_key, "no_loss_ranges"}
        wanted |= {key.split(".")[0] for key in (self.text_key, self.id_key)}
        every = self.keep_data or self.renderer is not None
        return None if every else [n for n in parquet.schema_arrow.names if n in wanted]

    def _row(self, url: str, row: int, obj: dict[str, Any]) -> Record | Rejected:
        """The record of a parquet file's row number ``row`` (from 1)."""
        raw_row = orjson.dumps(obj, default=str)
        if len(raw_row) > self.max_record_bytes:
            return _too_large(url, row, raw_row, len(raw_row), self.max_record_bytes)
        return self._parse(obj, url, row, raw_row.decode(), row - 1)

    def at(self, file: InputFile, places: Sequence[tuple[int, int]]) -> list[Record | Rejected | None]:
        """The records that start at these places of a file, as its reading gives them, without reading the rest:
        each ``(offset, line)`` as ``Record.offset`` and ``Record.line`` give it, in order of offset. None where no
        line starts at the offset, or it is blank. A plain JSON-lines file is read at each offset only (a
        ``SAMPLE_READ`` buffer); a compressed one is decompressed from its start up to the last place, its bytes
        before discarded (gzip and zstd streams cannot be entered in the middle); a parquet file's row groups that
        hold the places are read, and only those."""
        kind, compression = file_format(file.url)
        fs, path = open_fs(file.url, self.storage_options)
        with fs.open(path, "rb") as raw:
            if kind == "parquet":
                return self._rows_at(file.url, raw, places)
            stream = _decompressed(raw, compression) if compression else io.BufferedReader(raw, SAMPLE_READ)
            found: list[Record | Rejected | None] = []
            position, last = 0, b"\n"  # in a compressed stream, which only reads forward: the byte before it
            for offset, line in places:
                if offset < position or offset < 0:  # within a line read already
                    found.append(None)
                    continue
                if offset > position or not compression:
                    before = max(offset - 1, 0)  # the byte before the line: the newline that ends the one before
                    if compression:
                        _skip(stream, before - position)
                    else:
                        stream.seek(before)
                    last = stream.read(1) if offset else b"\n"
                got = next(_bounded_lines(stream, self.max_record_bytes), None) if last == b"\n" else None
                size = 0 if got is None else got.size + 1 if isinstance(got, _Oversized) else len(got)
                position, last = offset + size, (b"\n" if size else last)
                found.append(None if got is None else self._line(file.url, line, got, offset))
            return found

    def _rows_at(self, url: str, raw: IO[bytes], places: Sequence[tuple[int, int]]) -> list[Record | Rejected | None]:
        """``at`` for a parquet file: its row groups that hold the places, read one at a time."""
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(raw)
        rows = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
        starts = list(itertools.accumulate(rows, initial=0))
        columns = self._columns(parquet)
        read = functools.lru_cache(maxsize=1)(lambda group: parquet.read_row_group(group, columns=columns))
        found: list[Record | Rejected | None] = []
        for offset, line in places:
            group = bisect.bisect_right(starts, offset) - 1
            if not 0 <= group < len(rows) or line != offset + 1:
                found.append(None)
                continue
            found.append(self._row(url, line, read(group).slice(offset - starts[group], 1).to_pylist()[0]))
        return found


def _decompressed(raw: io.RawIOBase | io.BufferedIOBase, compression: str | None) -> io.BufferedIOBase:
    """The file's bytes, decompressed, from a reader whose ``readline`` takes a limit (a remote fsspec file's
    does not)."""
    if compression == "gzip":  # ISA-L inflates ~3x faster than zlib: the reader keeps up with the encoder
        return igzip.GzipFile(fileobj=raw, mode="rb")
    return io.BufferedReader(_ZstdFrames(raw) if compression == "zstd" else raw, READ_BUFFER)


def _skip(stream: io.BufferedIOBase, size: int) -> None:
    """Read ``size`` bytes of a stream that cannot seek, a buffer at a time, keeping none."""
    while size > 0 and (piece := stream.read(min(size, READ_BUFFER))):
        size -= len(piece)


def _whole_gzip_lines(raw: IO[bytes]) -> int:
    """How many whole lines a gzip file's members give before its first fault (trailing garbage, a truncated or
    corrupt member), inflated a buffer at a time: the gzip reader raises with them unread when the fault comes in
    the read that inflated them."""
    lines, pending = 0, b""
    inflate = isal_zlib.decompressobj(31)
    try:
        while pending or (pending := raw.read(READ_BUFFER)):
            if inflate.eof:  # the next member
                inflate = isal_zlib.decompressobj(31)
            lines += inflate.decompress(pending, READ_BUFFER).count(b"\n")
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
    except isal_zlib.error:  # type: ignore[misc]  # (a class: its stubs say an instance, as above)
        pass
    return lines


@dataclass(frozen=True, slots=True)
class _Oversized:
    """A line above the limit, as far as it is kept."""

    head: bytes  # its first RAW_HEAD_BYTES
    size: int  # its bytes, newline excluded


def _bounded_lines(stream: io.BufferedIOBase, limit: int) -> Iterator[bytes | bytearray | _Oversized]:
    """The stream's lines, newline included; a line above ``limit`` bytes as an :class:`_Oversized`. Lines are
    read by ``READ_BUFFER`` bytes at most, so that no more than ``limit`` (and a buffer) of a line is ever held:
    one line of a small compressed file may inflate to gigabytes."""
    chunk = min(READ_BUFFER, limit + 1)
    while line := stream.readline(chunk):
        yield _long_line(stream, line, limit) if len(line) == chunk and not line.endswith(b"\n") else line


def _long_line(stream: io.BufferedIOBase, start: bytes, limit: int) -> bytearray | _Oversized:
    """The line that ``start`` begins, read on while it is within ``limit``; past it, its start and size."""
    line = bytearray(start)
    while len(line) - line.endswith(b"\n") <= limit:
        if line.endswith(b"\n") or not (piece := stream.readline(READ_BUFFER)):
            return line
        line += piece
    return _oversized(stream, line)


def _oversized(stream: io.BufferedIOBase, line: bytes | bytearray) -> _Oversized:
    """Reads the rest of a line that ``line`` begins by ``READ_BUFFER`` bytes, keeping its first
    ``RAW_HEAD_BYTES`` only."""
    size, head = len(line), line[:RAW_HEAD_BYTES]
    while not line.endswith(b"\n") and (line := stream.readline(READ_BUFFER)):
        size += len(line)
        head += line[: RAW_HEAD_BYTES - len(head)]
    return _Oversized(bytes(head).rstrip(b"\n"), size - line.endswith(b"\n"))


def _too_large(url: str, line: int, head: bytes, size: int, limit: int) -> Rejected:
    """A record above the limit, quarantined with its start and its size: enough to find and judge it."""
    start = head[:RAW_HEAD_BYTES].decode("utf-8", "backslashreplace")
    return Rejected(url, line, "record_too_large", f"{start}... [{size} bytes, above max_record_bytes={limit}]")
