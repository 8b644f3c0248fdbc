"""What files are called: a rank's stem and token files, the merged files, and every name a rank may have written.

The names are datatrove's (``{save_filename}_{rank:05d}_{sub:05d}_doc_shuffled.ds``, ``NNN_{name}.ds``), so its
readers and its merger take our folders as theirs. Tokenize, the merge and the books all name files from here:
a name written one way and looked for another would lose a rank's files without an error.
"""

from __future__ import annotations

import re
from enum import Enum

from tokenization.formats import DS, MEGATRON

MEGATRON_INDEX = ".idx"
SOURCE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # a mixture source's name (``tokenization.mixing``)


class RankFileKind(str, Enum):
    """How a rank ordered a file's documents: the last part of its name (a StrEnum, which Python 3.10 lacks)."""

    UNSHUFFLED = "unshuffled"
    DOC_SHUFFLED = "doc_shuffled"
    CHUNK_SHUFFLED = "chunk_shuffled"
    BUCKET = "bucket"  # followed by the bucket's number: bucket00007

    def __str__(self) -> str:
        return self.value


SOURCE_FILE = re.compile(rf"\d{{5}}_\d{{5}}_({SOURCE_NAME})_(?:{'|'.join(kind for kind in RankFileKind)})\..*")


def rank_stem(rank: int, save_filename: str | None = None) -> str:
    """datatrove's prefix of a rank's names, ``{save_filename}_{rank:05d}`` (the rank alone without a name); the
    rank's lease, manifest, marker and quarantine are named by it too."""
    return "_".join(x for x in (save_filename, f"{rank:05d}") if x)


def rank_file_name(stem: str, sub: int, kind: RankFileKind, suffix: str = DS, source: str | None = None) -> str:
    """The ``sub``-th file a rank writes in ``kind`` order: ``00003_00000_doc_shuffled.ds``; of a mixture's
    ``source``, when the rank writes each source apart (Megatron output: ``00003_00000_web_doc_shuffled.bin``)."""
    return f"{stem}_{sub:05d}_{f'{source}_' if source else ''}{kind}{suffix}"


def source_in(name: str) -> str | None:
    """The mixture source a rank file's name holds (``rank_file_name``), or None."""
    found = SOURCE_FILE.fullmatch(name)
    return found and found.group(1)


def bucket_suffix(bucket: int) -> str:
    """How a rank's file of bucket ``b`` ends (``bucket00007.ds``): the merge of that bucket reads exactly these."""
    return f"{RankFileKind.BUCKET}{bucket:05d}{DS}"


def bucket_file_name(stem: str, sub: int, bucket: int) -> str:
    """The ``sub``-th file of bucket ``bucket`` a rank writes: ``00003_00000_bucket00007.ds``."""
    return f"{stem}_{sub:05d}_{bucket_suffix(bucket)}"


def bucket_folder(bucket: int) -> str:
    """The folder of a rank folder that holds every rank's files of bucket ``bucket`` (``bucket00007``): a prefix a
    bucket, so that a bucket's merge lists only its own files, and S3 serves each prefix its own request rate."""
    return f"{RankFileKind.BUCKET}{bucket:05d}"


BUCKET_FOLDER = re.compile(rf"{RankFileKind.BUCKET}\d{{5}}")  # what ``bucket_folder`` names


def bucket_in(folder: str) -> int:
    """The bucket a ``bucket_folder`` holds."""
    return int(folder.removeprefix(str(RankFileKind.BUCKET)))


def working_file_name(kind: RankFileKind) -> str:
    """A rank's file of one pass in its attempt's working folder, before its last pass names the published ones."""
    return f"{kind}{DS}"


def rank_file_pattern(stem: str) -> re.Pattern[str]:
    """Every token file a rank with this stem may have written, in any order, format, family member or attempt."""
    ordered = "|".join(kind for kind in RankFileKind if kind is not RankFileKind.BUCKET)
    formats = rf"{re.escape(DS)}(\.\w+)?|{re.escape(MEGATRON)}|{re.escape(MEGATRON_INDEX)}"
    kinds = rf"({ordered})({formats})|{RankFileKind.BUCKET}\d{{5}}{re.escape(DS)}(\.\w+)?"
    return re.compile(rf"{re.escape(stem)}_(\d{{5}}_)?({SOURCE_NAME}_)?({kinds})")


def merge_stem(save_filename: str, bucket: int | None = None) -> str:
    """Names a merge's lease, manifest and marker: one a bucket, so that bucket tasks share a folder."""
    return save_filename if bucket is None else f"{save_filename}_{RankFileKind.BUCKET}{bucket:05d}"


def merged_prefix(bucket: int | None = None) -> str:
    """What a bucket's merged files lead with (``00007_``), so a folder's sorted names read bucket after bucket."""
    return "" if bucket is None else f"{bucket:05d}_"


def merged_file_name(save_filename: str, number: int, width: int, bucket: int | None = None) -> str:
    """datatrove's ``NNN_{name}.ds`` (``width`` digits), after the bucket's prefix."""
    return f"{merged_prefix(bucket)}{number:0{width}d}_{save_filename}{DS}"
