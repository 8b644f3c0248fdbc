"""The checks of a token file family, shared by ``verify`` (which reads every byte) and by the stages, which check
what they write as they write it (``OwnCheck``), so that both hold the files to the same rules.

A ``.ds`` family: its metadata gives the token size, its index increases and ends at the token count, its ids are
below the vocabulary size, every document ends in EOS (chunk and window boundaries aside, ``PseudoEnds``), its loss
bytes are 0 or 1, one a token, and what it holds (``contents``) is what its writer recorded. A Megatron pair: its
pointers agree with its lengths, which add up to its ``.bin``. Files are streamed in blocks of ``BLOCK_BYTES``,
hashed on the way, so memory stays bounded by the block size and the index arrays. Every problem is reported with
its file and, where it has one, the token offset. What a block is held to, wherever it is read, is
``block_checks``; this module reads the families and their records.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Literal

import numpy as np

from tokenization.errors import TokenizationError
from tokenization.formats.block_checks import (
    MAX_REPORTED,
    Checks,
    Report,
    blocks,
    check_counts,
    check_eos,
    check_held,
    check_ids,
    check_index,
    check_loss,
    check_tokens,
)
from tokenization.formats.contents import ContentsHasher, Found, within
from tokenization.formats.ds import (
    INDEX_DTYPE,
    LOSS_DTYPE,
    SOURCE,
    SOURCE_DTYPE,
    Metadata,
    Observer,
    TokenFileError,
    map_array,
    token_dtype,
)
from tokenization.formats.megatron import MegatronFile
from tokenization.formats.names import BUCKET_FOLDER
from tokenization.records import OutputEntry, PseudoEnds, SelfCheck
from tokenization.storage.checksums import ALGORITHM, hasher
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import Folder
from tokenization.wording import counted

BLOCK_BYTES = 64 << 20  # read, checked and hashed at a time: memory stays bounded whatever a file's size


class SelfCheckFailed(TokenizationError):
    """A stage's own files failed verify's checks before upload: nothing of the attempt is published."""


class OwnCheck:
    """A stage's check of the files it writes (``where`` names it), family by family before it uploads them, with
    verify's checks against ``checks``, and no byte read back: the writer shows it each block as it writes it
    (``watch``: ids, loss bytes, EOS before every document end), then ``family`` reads the family's index and
    metadata and checks each file's size against what its writer recorded, whose checksum the writer took of the very
    bytes it wrote. ``result`` goes into the stage's manifest and marker."""

    def __init__(self, checks: Checks, where: str):
        self.checks, self.where = checks, where
        self.families: list[str] = []
        self.tokens = 0
        self.notes: list[str] = []
        self._watched: dict[str, _Watched] = {}

    def watch(self, path: Path, pseudo: PseudoEnds | Literal["unknown"] | None) -> Observer:
        """The observer for the writer of the family at ``path`` (``TokenFileWriter``'s ``observe``); ``pseudo``:
        its entries that are chunk or window boundaries, as its manifest entry will say."""
        watched = self._watched[path.name] = _Watched(self.checks, str(path), pseudo)
        return watched

    def family(self, folder: Path, entry: OutputEntry) -> None:
        """Check one written family (its files in ``folder``, under their output names, written while watched);
        SelfCheckFailed names the problems."""
        watched = self._watched.pop(entry.name)
        local, report = Listing.of(Folder(str(folder))), watched.report
        frame = _ds_frame(local, entry.name, entry, self.checks, report)
        if frame is not None and frame.tokens != watched.tokens:
            report.problem(local.label(entry.name), f"holds {frame.tokens} tokens, its writer wrote {watched.tokens}")
        for name, info in sorted(entry.files.items()):
            size = local.size(name)
            if size is None:
                report.problem(local.label(name), "missing")
            elif size != info.bytes:
                report.problem(local.label(name), f"{size} bytes, its writer recorded {info.bytes}")
        if report.problems:
            shown = "; ".join(report.problems[:MAX_REPORTED])
            more = f" (and {len(report.problems) - MAX_REPORTED} more)" if len(report.problems) > MAX_REPORTED else ""
            raise SelfCheckFailed(
                f"{self.where}: {entry.name} fails verify before upload, so nothing is published: {shown}{more}"
            )
        self.families.append(entry.name)
        self.tokens += watched.tokens
        self.notes += [note.replace(local.label(entry.name), entry.name) for note in report.notes]

    def result(self) -> SelfCheck:
        c = self.checks
        return SelfCheck(
            families=self.families, tokens=self.tokens, vocab_size=c.vocab_size, eos_id=c.eos_id, notes=self.notes
        )


class _Watched:
    """One family's blocks checked as its writer writes them, on the writer's hashing thread, as verify checks the
    blocks it reads; an index entry at a block's start ends the block before, whose last token is kept."""

    def __init__(self, checks: Checks, label: str, pseudo: PseudoEnds | Literal["unknown"] | None):
        self.checks, self.label, self.pseudo = checks, label, pseudo
        self.report = Report()
        self.tokens = 0
        self._last = np.zeros(1, np.int64)

    def __call__(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None, found: Found) -> None:
        offset, checks, report = self.tokens, self.checks, self.report
        check_ids(tokens, offset, self.label, checks, report, found)
        if loss is not None:
            check_loss(loss, offset, self.label, report, found)
        if checks.eos_id is not None:
            before = found.before
            if offset == 0:  # an entry at 0 ends no document (the index check reports it)
                before, ends = before[ends > 0], ends[ends > 0]
            before = np.where(ends > 0, before, self._last[0])
            check_eos(offset + ends, before, self.pseudo, offset == 0, self.label, checks, report)
        if len(tokens):
            self._last = tokens[-1:].astype(np.int64)
        self.tokens += len(tokens)


@dataclass
class Listing:
    """The folder being verified, as one listing saw it: the listing answers every size and existence question (a
    HEAD each on S3), and each file is hashed once, however many records list it."""

    folder: Folder
    sizes: dict[str, int]  # the folder's own entries, by name
    digests: dict[tuple[str, str], str] = field(default_factory=dict)  # by file and algorithm
    vouched: set[str] = field(default_factory=set)  # files whose checksum is their marker's: not read (``verify``)
    subfolders: dict[str, dict[str, int]] = field(default_factory=dict)  # their entries, once one is asked about

    @classmethod
    def of(cls, folder: Folder) -> Listing:
        """The folder's listing; a rank folder's bucket folders are listed too (concurrently), and their files
        are the folder's, named ``bucket00007/...`` as the records name them."""
        sizes = folder.sizes()
        buckets = [name for name in sizes if BUCKET_FOLDER.fullmatch(name)]
        for bucket, listing in zip(buckets, map_concurrently(lambda b: folder.sub(b).sizes(), buckets), strict=True):
            del sizes[bucket]
            sizes |= {f"{bucket}/{name}": size for name, size in listing.items()}
        return cls(folder, sizes)

    @property
    def url(self) -> str:
        return self.folder.location

    def label(self, name: str) -> str:
        return self.folder.url_of(name)

    def size(self, name: str) -> int | None:
        """A file's size, None when it is absent; a file of another subfolder (the quarantine) lists that
        subfolder."""
        sub, base = posixpath.split(name)  # a name inside the folder, not a URL
        if not sub or name in self.sizes:
            return self.sizes.get(name)
        if sub not in self.subfolders:
            self.subfolders[sub] = self.folder.sub(sub).sizes()
        return self.subfolders[sub].get(base)

    def checksum(self, name: str, algorithm: str) -> str:
        """A file's checksum of ``algorithm`` (its record's: ``storage.checksums``), streamed in blocks (memory stays
        bounded) unless it was taken already, as its family was checked."""
        if (name, algorithm) not in self.digests:
            digest = hasher(algorithm)
            for _ in blocks(self.folder, name, np.dtype(np.uint8), digest, BLOCK_BYTES):
                pass
            self.digests[name, algorithm] = digest.hexdigest()
        return self.digests[name, algorithm]


@dataclass(frozen=True)
class _Frame:
    """What a ``.ds`` family's small files say: its index, token size and tokens, whether its loss bytes, if
    it has any, go with its tokens, and a mixture's the source of each index entry (its ``.source`` sidecar)."""

    ends: np.ndarray
    token_size: int
    tokens: int
    has_loss: bool
    aligned: bool
    sources: np.ndarray | None = None


def _ds_frame(listed: Listing, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> _Frame | None:
    """One ``.ds`` family's metadata and index, checked against its sizes and its manifest entry; None when the
    token size or the index cannot be known (a problem says why)."""
    label, folder, sizes = listed.label(name), listed.folder, listed.sizes
    size = sizes[name]
    meta = None
    if name + ".metadata" in sizes:
        try:
            meta = Metadata.parse(folder.read(name + ".metadata").decode("utf-8"), f"{label}.metadata")
        except (TokenFileError, UnicodeDecodeError) as exc:
            report.problem(f"{label}.metadata", str(exc))
    else:
        report.problem(f"{label}.metadata", "missing: the token size is unknown")
    if name + ".index" not in sizes:
        report.problem(f"{label}.index", "missing")
        return None
    try:
        index = map_array(folder, name + ".index", INDEX_DTYPE, f"{label}.index", sizes[name + ".index"])
        ends = index.view("<i8")  # not a copy: an entry above 2**63 reads negative, so out of order
    except TokenFileError as exc:
        report.problem(f"{label}.index", str(exc))
        return None
    last = int(ends[-1]) if len(ends) else 0
    token_size = meta.token_size if meta else (size // last if last and size // last in (2, 4) else None)
    if token_size not in (2, 4):
        report.problem(label, f"token size {token_size} is neither 2 nor 4")
        return None
    tokens = size // token_size
    if size % token_size or tokens != last:
        report.problem(label, f"{size} bytes of {token_size}-byte tokens, but the index ends at token {last}")
    if meta and meta.token_count != tokens:
        report.problem(f"{label}.metadata", f"says {meta.token_count} tokens, the file holds {tokens}")
    check_index(ends, label, checks, report)
    check_counts(entry, tokens, len(ends), label, report)
    sources = None
    if name + SOURCE in sizes or (meta and meta.sources):
        sources = _check_sources(listed, name, len(ends), meta, report)
    has_loss = name + ".loss" in sizes
    aligned = not has_loss or sizes[name + ".loss"] == tokens  # its loss bytes, if any, go with its tokens
    if not aligned:
        report.problem(f"{label}.loss", f"{sizes[name + '.loss']} bytes for {tokens} tokens")
    return _Frame(ends, token_size, tokens, has_loss, aligned, sources)


def _check_sources(
    listed: Listing, name: str, entries: int, meta: Metadata | None, report: Report
) -> np.ndarray | None:
    """A mixture's family: its ``.source`` sidecar holds one known source an index entry, and its metadata names
    them (``formats.sidecar``); returns them, when it does."""
    label = listed.label(name + SOURCE)
    named = len(meta.sources) if meta else 0
    if name + SOURCE not in listed.sizes:
        report.problem(label, f"missing, though its metadata names {named} sources")
        return None
    if listed.sizes[name + SOURCE] != entries:
        report.problem(label, f"{listed.sizes[name + SOURCE]:,} bytes for {entries:,} index entries")
        return None
    found = np.frombuffer(listed.folder.read(name + SOURCE), dtype=SOURCE_DTYPE)
    if len(found) and int(found.max()) >= named:
        report.problem(label, f"names source {int(found.max())}, but the metadata names {named} sources")
        return None
    return found


def verify_ds(listed: Listing, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> None:
    """One ``.ds`` family, its checksums and contents taken as it streams."""
    report.files += 1
    frame = _ds_frame(listed, name, entry, checks, report)
    if frame is None:
        return
    label, ends, aligned = listed.label(name), frame.ends, frame.aligned
    pseudo = None if entry is None else entry.pseudo_ends
    items = BLOCK_BYTES // frame.token_size  # tokens a block, and loss bytes
    algorithm, loss_algorithm = _algorithm(entry, name), _algorithm(entry, name + ".loss")
    digest, loss_digest, held = hasher(algorithm), hasher(loss_algorithm), ContentsHasher(sources=frame.sources)
    token_blocks = blocks(listed.folder, name, token_dtype(frame.token_size), digest, items)
    loss_blocks: Iterator[tuple[int, np.ndarray | None]]
    if frame.has_loss and aligned:
        loss_blocks = blocks(listed.folder, name + ".loss", LOSS_DTYPE, loss_digest, items)
    else:
        loss_blocks = repeat((0, None), -(-listed.sizes[name] // (items * frame.token_size)))
    for (offset, block), (_, loss) in zip(token_blocks, loss_blocks, strict=True):
        cuts = within(ends, offset, offset + len(block))
        found = held.checked(block, cuts, loss)
        check_tokens(block, offset, cuts, found, pseudo, label, checks, report)
        if loss is not None:
            check_loss(loss, offset, label, report, found)
    listed.digests[name, algorithm] = digest.hexdigest()
    if frame.has_loss and not aligned:  # read on its own, for its checksum and values
        for offset, loss in blocks(listed.folder, name + ".loss", LOSS_DTYPE, loss_digest, items):
            check_loss(loss, offset, label, report, None)
    if frame.has_loss:
        listed.digests[name + ".loss", loss_algorithm] = loss_digest.hexdigest()
    if aligned:
        check_held(entry, held.result(), label, report)
    report.tokens += frame.tokens


def verify_megatron(listed: Listing, name: str, entry: OutputEntry | None, checks: Checks, report: Report) -> None:
    report.files += 1
    label = listed.label(name)
    try:
        mg = MegatronFile(label, listed.folder.options)
    except TokenFileError as exc:
        report.problem(label, str(exc))
        return
    lengths = mg.lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    size, total = listed.sizes[name], int(ends[-1]) if len(ends) else 0
    if total * mg.dtype.itemsize != size:
        report.problem(label, f"{size} bytes, but the sequence lengths add up to {total} tokens")
    expected = (ends - lengths) * mg.dtype.itemsize
    report.problems_at(
        mg.url + ".idx", "byte pointer disagrees with the lengths", np.flatnonzero(mg.pointers != expected)
    )
    doc = mg.document_indices
    if len(doc) == 0 or doc[0] != 0 or doc[-1] != len(lengths) or np.any(np.diff(doc) < 0):
        report.problem(mg.url + ".idx", "document indices do not run from 0 to the sequence count")
    report.problems_at(label, "negative sequence length", np.flatnonzero(lengths < 0))
    check_counts(entry, total, len(lengths), label, report)
    algorithm = _algorithm(entry, name)
    digest, held = hasher(algorithm), ContentsHasher()
    for offset, block in blocks(listed.folder, name, mg.dtype, digest, BLOCK_BYTES // mg.dtype.itemsize):
        cuts = within(ends, offset, offset + len(block))
        found = held.checked(block, cuts)
        check_tokens(block, offset, cuts, found, None if entry is None else entry.pseudo_ends, label, checks, report)
    listed.digests[name, algorithm] = digest.hexdigest()
    check_held(entry, held.result(), label, report)
    report.tokens += size // mg.dtype.itemsize


def _algorithm(entry: OutputEntry | None, name: str) -> str:
    """The checksum a file's record names (``records.FileSum``), which verify takes as it reads the file; this
    version's where no record lists it."""
    listed = entry.files.get(name) if entry is not None else None
    return ALGORITHM if listed is None else listed.algorithm


def verify_dataset_metadata(listed: Listing, report: Report) -> None:
    """A merged dataset's ``{name}.ds.metadata`` (with no ``{name}.ds``) counts the tokens of ``NNN_{name}.ds``."""
    names = set(listed.sizes)
    for meta_name in sorted(n for n in names if n.endswith(".ds.metadata") and n[: -len(".metadata")] not in names):
        stem = meta_name[: -len(".ds.metadata")]
        parts = [n for n in names if n.endswith(f"_{stem}.ds") and n.split("_", 1)[0].isdigit()]
        label = listed.label(meta_name)
        try:
            meta = Metadata.parse(listed.folder.read(meta_name).decode("utf-8"), label)
        except (TokenFileError, UnicodeDecodeError) as exc:
            report.problem(label, str(exc))
            continue
        total = sum(listed.sizes[n] // meta.token_size for n in parts)
        if meta.token_count != total:
            report.problem(label, f"says {meta.token_count} tokens, its {counted(len(parts), 'file')} hold {total}")
