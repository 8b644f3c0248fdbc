"""The cache's names: what each folder and file under it is called, and the patterns that tell the cache's own files
from any other (claiming and cleaning touch nothing they do not match), with the bounds on what is read of them."""

from __future__ import annotations

import errno
import re

from tokenization.errors import TokenizationError

ENTRIES, DATA, USES = "entries", "data", "uses"
KNOWN = "inputs"  # what plans found of their local input files (``output.known``)
SIZES = "sizes.json"  # what its markers showed, by their names, sizes and times (``output.cache.sizes``)
OWN_FILE = "_CACHE.json"  # the cache's own file, at its top (``records.CacheFolder``)
DEFAULT_FOLDER = ".cache"  # under a build's output: a dot name, which no run's folder has (``runs.folder_for``)
OFF = "off"  # the cache setting that turns it off
IN_FLIGHT_SECONDS = 24 * 3600  # a rank's first pass takes less; a use unfinished after this belongs to a dead rank
MARKER_BYTES = 4 << 20  # a marker holds a few kB; a larger one is damaged, and never read whole
INLINE_BYTES = 64 << 10  # an entry's files of this many bytes at most are held in its marker, in place of a data
# folder, and by a hit in memory: a one-line file's are ~200 bytes, whose four reads and links cost more than them
USE_BYTES = 16 << 20  # a use lists its rank's keys, 72 bytes each: 230,000 input files a rank
KEY = re.compile(r"[0-9a-f]{64}")  # an entry's key (a sha256): nothing else under entries/ and data/ is an entry
WRITER = re.compile(r"[0-9a-f]{12}")  # a data folder's name
OWNER = re.compile(r"[0-9a-f]{16}")  # a use folder's name
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # an entry's file: a plain name, never a path
CACHE_FILE = re.compile(  # every file a cache writes, by its path under the cache (a use's temporary file too)
    rf"{ENTRIES}/{KEY.pattern}\.json|{DATA}/{KEY.pattern}/{WRITER.pattern}/{FILE_NAME.pattern}"
    rf"|{USES}/{OWNER.pattern}/[^/]+|{KNOWN}/[^/]+|{re.escape(SIZES)}"
)
NOT_THERE = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR)  # an entry's file missing, or a folder, or under a file


class NotACache(TokenizationError):
    """A folder given as a tokenization cache is not one: writing entries in it, or cleaning it, would mix the
    cache's files with others, or remove files the cache never wrote."""


def chosen_location(setting: str | None, default: str | None) -> str | None:
    """Where a cache setting puts the cache: the setting itself, ``default`` when it is not given, None when it is
    ``off``."""
    if setting is None:
        return default
    return None if setting.strip().lower() == OFF else setting


def marker_name(key: str) -> str:
    """An entry's marker, by its name in ``entries/``."""
    return f"{key}.json"
