"""What a block of a token file family is held to, wherever it is read (``verify`` reading it back, a stage as it
writes it): ids below the vocabulary size, loss bytes of 0 or 1, EOS before every document end (chunk and window
boundaries aside), an index that never decreases, and the counts and contents its record gives; what was found
(``Report``), and the blocks themselves, read and hashed on the way (``blocks``)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tokenization.formats.contents import Contents, Found
from tokenization.records import OutputEntry, PseudoEnds, SelfCheck
from tokenization.storage.checksums import Hasher
from tokenization.storage.folder import Folder

MAX_REPORTED = 10  # problems of one kind reported per file, then a count
INDEX_CHUNK = 1 << 20  # index entries checked at once: ~10 bytes of arrays each (their steps, a mask a kind)


@dataclass
class Report:
    """What checks found: the families and tokens read, the problems (each naming its file and, where it has one,
    the token offset), and notes on what was not checked and why."""

    files: int = 0
    tokens: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, where: str, message: str, offset: int | None = None) -> None:
        self.problems.append(f"{where}{f' @ token {offset}' if offset is not None else ''}: {message}")

    def problems_at(self, where: str, message: str, offsets: np.ndarray, count: int | None = None) -> None:
        """Report the first few offsets where a check failed, and how many there were (``count``: when ``offsets``
        holds only the first of them)."""
        for offset in offsets[:MAX_REPORTED].tolist():
            self.problem(where, message, offset)
        if (count := len(offsets) if count is None else count) > MAX_REPORTED:
            self.problem(where, f"{message}: {count - MAX_REPORTED} more like this")


@dataclass(frozen=True)
class Checks:
    """What a tokenizer lets verify check: ids below the vocabulary size, EOS at document ends (None: unchecked)."""

    vocab_size: int | None = None
    eos_id: int | None = None

    def made_by(self, check: SelfCheck) -> bool:
        """Whether a stage's own check checked at least what these checks ask."""
        return all(
            want is None or want == made
            for want, made in ((self.vocab_size, check.vocab_size), (self.eos_id, check.eos_id))
        )


def check_counts(entry: OutputEntry | None, tokens: int, entries: int, label: str, report: Report) -> None:
    """The tokens and index entries that the manifest records for this family, against the files."""
    if entry is None:
        return
    if entry.tokens != tokens:
        report.problem(label, f"holds {tokens} tokens, its manifest says {entry.tokens}")
    if entry.index_entries != entries:
        report.problem(label, f"its index holds {entries} entries, its manifest says {entry.index_entries}")


def check_loss(loss: np.ndarray, offset: int, label: str, report: Report, found: Found | None) -> None:
    """Loss bytes of 0 or 1, in a block that starts at ``offset``; ``found``: what the pass that hashed it counted
    (None: not hashed), the offsets looked for only where its largest is above 1."""
    if found is None or found.loss_top > 1:
        report.problems_at(f"{label}.loss", "loss byte is neither 0 nor 1", offset + np.flatnonzero(loss > 1))


def check_held(entry: OutputEntry | None, held: Contents, label: str, report: Report) -> None:
    """The pieces a family holds, hashed from its bytes, against those its writer recorded (when its record has
    them): a piece changed, lost or duplicated since, even with the sizes and checksums rewritten to match."""
    if entry is not None and entry.contents is not None and entry.contents.value != held:
        report.problem(label, f"holds {held.describe()}, its manifest records {entry.contents.value.describe()}")


def check_index(ends: np.ndarray, label: str, checks: Checks, report: Report) -> None:
    """Entries that go forward, and (with an EOS to check) no empty document: ``INDEX_CHUNK`` entries at a time, so
    that the check's arrays stay the same size however many documents a file holds (a merge's 3.2 GB output file:
    ~4 M)."""
    if len(ends) and ends[0] < 0:
        report.problem(f"{label}.index", "negative first entry", 0)
    kinds: dict[str, np.ufunc] = {"entry smaller than the one before": np.less}
    if checks.eos_id is not None:
        kinds["empty document"] = np.equal
    found: dict[str, list[np.ndarray]] = {message: [] for message in kinds}  # the first few of each chunk
    counts = dict.fromkeys(kinds, 0)
    for start in range(1, len(ends), INDEX_CHUNK):
        part = ends[start : start + INDEX_CHUNK]
        steps = part - ends[start - 1 : start - 1 + len(part)]
        for message, compare in kinds.items():
            at = part[compare(steps, 0)]
            found[message].append(at[:MAX_REPORTED])
            counts[message] += len(at)
    for message, firsts in found.items():
        if counts[message]:
            report.problems_at(f"{label}.index", message, np.concatenate(firsts), counts[message])


def check_tokens(
    block: np.ndarray,
    offset: int,
    cuts: np.ndarray,
    found: Found,
    pseudo: PseudoEnds | Literal["unknown"] | None,
    label: str,
    checks: Checks,
    report: Report,
) -> None:
    """A block of a family read from its file, at token ``offset``, with the family's index entries among it
    (``cuts``, relative to it) and what the pass that hashed it found: its ids, and the EOS before each document
    end (the entries above its start)."""
    check_ids(block, offset, label, checks, report, found)
    inside = cuts > 0
    check_eos(offset + cuts[inside], found.before[inside], pseudo, offset == 0, label, checks, report)


def check_ids(block: np.ndarray, offset: int, label: str, checks: Checks, report: Report, found: Found) -> None:
    """Ids below the vocabulary size, in a block of tokens that starts at token ``offset``; the offsets are looked
    for only where the largest id the pass that hashed it found (``found``) is beyond."""
    if checks.vocab_size is not None and found.id_top >= checks.vocab_size:
        report.problems_at(
            label,
            f"id beyond the vocabulary of {checks.vocab_size}",
            offset + np.flatnonzero(block >= checks.vocab_size),
        )


def check_eos(
    entries: np.ndarray,
    last_tokens: np.ndarray,
    pseudo: PseudoEnds | Literal["unknown"] | None,
    first: bool,
    label: str,
    checks: Checks,
    report: Report,
) -> None:
    """EOS before every index entry that ends a document (``last_tokens``: the token before each of ``entries``);
    ``pseudo``: the entries that are chunk or window boundaries, or "unknown"; ``first``: of a family's first
    block, which notes an unchecked family once."""
    if checks.eos_id is None:
        return
    if pseudo == "unknown":
        if first:
            report.notes.append(f"{label}: EOS not checked (its index mixes document ends with moved chunk ends)")
        return
    if pseudo:  # chunk or window boundaries are not document ends
        real = (entries % pseudo.every != 0) | (entries > pseudo.until)
        entries, last_tokens = entries[real], last_tokens[real]
    report.problems_at(label, f"document ends without EOS {checks.eos_id}", entries[last_tokens != checks.eos_id])


def blocks(folder: Folder, name: str, dtype: np.dtype, digest: Hasher, items: int) -> Iterator[tuple[int, np.ndarray]]:
    """The file as consecutive arrays of ``items`` items, hashing the bytes on the way: a block is hashed on a
    thread of its own (the hash releases the GIL) while it is checked and the next one read, so reading and hashing
    overlap instead of adding up."""
    step = items * dtype.itemsize
    offset = 0
    with folder.open(name, block_size=step) as handle, ThreadPoolExecutor(1, thread_name_prefix="hash") as hashing:
        hashed = None
        while data := handle.read(step):
            if hashed is not None:
                hashed.result()  # in order: one block at a time
            hashed = hashing.submit(digest.update, data)
            usable = len(data) // dtype.itemsize * dtype.itemsize
            yield offset, np.frombuffer(memoryview(data)[:usable], dtype)  # a view: no copy of the block
            offset += usable // dtype.itemsize
        if hashed is not None:
            hashed.result()
