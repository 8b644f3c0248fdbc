"""What a published build takes on storage, and the intermediate token files it lets go.

A build writes its tokens three times: the ranks' files (``ranks/``), the merge's (``merged/``) and the context
shuffle's (``context/``), the last of which is its dataset. Once the build is published nothing reads the others'
token files, so publish removes them, unless the build keeps them (``keep_intermediate``): the dataset is then the
one copy on storage. A folder that is the dataset (``merged/`` without a context shuffle, a Megatron build's
``ranks/``) always stays, and so do every stage's records (``_manifests/``, ``_completions/``, ``_quarantine/``),
which the books, the report and the quarantine read.

The build record names the folders whose token files go (``removed``) and is written first: removal starts only
once the build is complete, and whatever finds it published (a publish run again, ``Build.run``) finishes a removal
that was cut short. Its ``footprint`` gives each stage folder's bytes as they are once the removal is done, and the
tokenization cache's size, measured before the record is written.

Sizes come from one listing a folder, a folder at a time (a rank folder's bucket folders hold thousands of files
each, and only sums are kept), and the cache's from its markers (``Cache.size``).
"""

from __future__ import annotations

import logging
import posixpath
import re

from tokenization.builds.pages import size
from tokenization.errors import TokenizationError
from tokenization.output.cache import Cache, NotACache
from tokenization.output.runs import Layout
from tokenization.records import CacheSize, FolderBytes, Footprint
from tokenization.storage.folder import Folder

log = logging.getLogger(__name__)

TOKEN_FILE = re.compile(r".+\.ds(\.(index|loss|metadata|source))?")  # a .ds family's files, the dataset's metadata too
REMOVED_AT_ONCE = 1000  # files a removal request takes (S3's bulk delete takes 1,000 keys)


def intermediate(layout: Layout, dataset: Folder) -> list[str]:
    """The stage folders written before the dataset's, by name: ``ranks``, and ``merged`` when a context shuffle
    follows the merge; none for a Megatron build, whose rank files are its dataset."""
    names = list(layout.stages)
    return names[: list(layout.stages.values()).index(dataset)]


def measure(layout: Layout, removed: list[str], cache: Folder | None) -> Footprint:
    """Each stage folder's bytes (and the MDS copy's) once the token files of the ``removed`` ones are gone (a
    folder the build did not write is left out), and the size of the ``cache`` at that location, when there is one."""
    folders = []
    for name, folder in (layout.stages | {layout.MDS: layout.mds}).items():
        held = gone = 0
        for path, bytes_ in folder.walk():
            if name in removed and _token_file(path):
                gone += bytes_
            else:
                held += bytes_
        if held or gone:
            folders.append(FolderBytes(name=name, held=held, removed=gone))
    return Footprint(folders=folders, cache=cache_size(cache) if cache else None)


def cache_size(location: Folder) -> CacheSize | None:
    """The cache's size for the build record. The build does not depend on it: a cache that cannot be measured now
    (unreachable, or a folder that is no cache) is logged, and left out."""
    try:
        return Cache(location).size()
    except (OSError, TokenizationError) as exc:
        if isinstance(exc, NotACache) and not location.list():  # a read-only folder never made a cache: empty
            return None
        log.warning("cache %s: its size is not measured (%s)", location.url, exc)
        return None


def remove(layout: Layout, removed: list[str]) -> int:
    """Remove the token files of the ``removed`` stage folders, their records kept, a batch of files at a time;
    returns the bytes removed. Removing what is gone already removes nothing, so running it again finishes a
    removal that was cut short."""
    freed = files = 0
    for name in removed:
        folder = layout.stages[name]
        batch = []
        for path, bytes_ in folder.walk():
            if not _token_file(path):
                continue
            batch.append(path)
            freed, files = freed + bytes_, files + 1
            if len(batch) == REMOVED_AT_ONCE:
                folder.remove_files(batch)
                batch = []
        folder.remove_files(batch)
    if files:
        log.info(
            "%s: removed %d intermediate token files, %s, from %s (their records stay)",
            layout.run_dir,
            files,
            size(freed),
            ", ".join(f"{name}/" for name in removed),
        )
    return freed


def described(footprint: Footprint) -> str:
    """``ranks/ 54.1 kB (1.2 MB removed), merged/ 12.0 kB (1.2 MB removed), context/ 1.2 MB; cache 3.4 MB for
    330,214 tokens (10.3 bytes a token)``."""
    folders = ", ".join(
        f"{folder.name}/ {size(folder.held)}{f' ({size(folder.removed)} removed)' if folder.removed else ''}"
        for folder in footprint.folders
    )
    return folders + (f"; cache {cache_weight(footprint.cache)}" if footprint.cache else "")


def cache_weight(cache: CacheSize) -> str:
    """``3.4 MB for 330,214 tokens (10.3 bytes a token)``: what a cache takes against what it holds."""
    per_token = f" ({cache.bytes_per_token:.1f} bytes a token)" if cache.tokens else ""
    return f"{size(cache.bytes)} for {cache.tokens:,} tokens{per_token}"


def _token_file(path: str) -> bool:
    """A token file of the stage (its own, or a bucket folder's), never a record, a lease or a staged attempt."""
    return TOKEN_FILE.fullmatch(posixpath.basename(path)) is not None and not any(
        part.startswith(("_", ".")) for part in path.split("/")
    )
