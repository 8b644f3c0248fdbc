"""A local file that only grew by whole lines appended since the last night, proven from its bytes: its rank takes
the earlier bytes' documents from the tokenization cache and encodes only the lines after them
(``stages.tokenize.first_pass``).

Nightly corpora grow by appends, and a night should cost what changed. The plan knows what the last night hashed of
a file that changed (``InputFile.earlier``: its size and sha256 then). The rank that hashes the file anyway
(``inputs.content.rank_hashes``) hashes its first ``size`` bytes in the same read (``hashlib``'s ``copy`` at that
offset) and counts the newlines before it. The file grew by lines when those bytes' sha256 is the earlier one and
the last of them is a newline: every line of the earlier file is then a line of this one, whole, with the same
number and at the same offset, and the lines after are new. A file edited anywhere else, one whose earlier bytes
did not end a line, a compressed file (whose bytes change throughout) and a part of a split file are read whole.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tokenization.inputs.formats import file_format
from tokenization.inputs.local import MTIME
from tokenization.records import InputFile

READ_BYTES = 8 << 20
SHA256_HEX = 64


@dataclass(frozen=True)
class Tail:
    """Where a grown file's appended lines start (``offset``: the earlier file's size), the lines before them, and
    the sha256 of the earlier bytes, whose cache entry holds their documents."""

    offset: int
    lines: int
    sha256: str


def earlier(file: InputFile, row: str | None) -> str | None:
    """What a plan records of a local ``file`` that changed (``InputFile.earlier``), from the row the last night
    remembered of it (``inputs.content``'s: size, ..., sha256): its size and sha256 then, when the file is larger
    now and could have grown by lines (a whole, uncompressed JSON-lines file); else None."""
    if row is None or not file.identity.startswith(MTIME) or not _plain(file):
        return None
    fields = row.split(",")
    size, sha256 = fields[0], fields[-1]
    if not size.isdigit() or not 0 < int(size) < file.size or len(sha256) != SHA256_HEX:
        return None
    return f"{int(size)},{sha256}"


def hashed(path: str, file: InputFile) -> tuple[str, Tail | None]:
    """The sha256 of the local file at ``path`` (``file`` as planned), read once; and, when ``file`` records its
    earlier bytes, its ``Tail`` if it only grew by lines appended to them (None otherwise)."""
    size, was = _earlier(file)
    digest, before, lines, last = hashlib.sha256(), None, 0, b""
    with open(path, "rb") as handle:
        at = 0
        while piece := handle.read(READ_BYTES):
            if before is None and size and at + len(piece) >= size:
                cut = size - at
                digest.update(piece[:cut])
                before, last = digest.copy().hexdigest(), piece[cut - 1 : cut]
                lines += piece.count(b"\n", 0, cut)
                digest.update(piece[cut:])
            else:
                digest.update(piece)
                if before is None:
                    lines += piece.count(b"\n")
            at += len(piece)
    grew = before is not None and before == was and last == b"\n" and at > size
    return digest.hexdigest(), Tail(size, lines, was) if grew else None


def provable(file: InputFile) -> bool:
    """Whether ``file`` records its earlier bytes, and is whole and plain: whether ``hashed`` may find a tail."""
    return file.earlier is not None and _plain(file)


def _earlier(file: InputFile) -> tuple[int, str]:
    """The earlier size and sha256 that ``file`` records (0 and "" when none, or not a whole plain file)."""
    if file.earlier is None or not provable(file):
        return 0, ""
    size, sha256 = file.earlier.split(",", 1)
    return int(size), sha256


def _plain(file: InputFile) -> bool:
    """Whether ``file`` is a whole, uncompressed JSON-lines file: one whose appended lines are appended bytes."""
    return file.part is None and file_format(file.url) == ("jsonl", None)
