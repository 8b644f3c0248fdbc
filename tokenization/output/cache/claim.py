"""Which folder is a cache: one is made a cache before its first write (``claim``) and checked before any listing or
cleaning (``check``), so that nothing is written in, or removed from, a folder that holds anything else."""

from __future__ import annotations

import logging
import time

from tokenization.errors import reaching
from tokenization.output.cache.names import CACHE_FILE, MARKER_BYTES, OWN_FILE, NotACache
from tokenization.output.cache.store import Store
from tokenization.records import CacheFolder, RecordError
from tokenization.storage.folder import PutMode
from tokenization.wording import counted

log = logging.getLogger("tokenization.output.cache")


def claim(store: Store) -> None:
    """Make sure the folder is a cache before anything is written in it: its own file is there, or is written now in
    a folder that is new, empty, or holds exactly what a cache holds (a cache made by an earlier version, adopted).
    ``NotACache`` for any other folder."""
    with reaching(store.location):
        if _identified(store):
            return
        files = sorted(store.at.found())  # a whole listing: once, when a cache is made
        if (stray := next((name for name in files if not CACHE_FILE.fullmatch(name)), None)) is not None:
            raise NotACache(
                f"{store.location}: not a tokenization cache: it holds {stray or 'an object of its name'}, which a "
                f"cache never writes, and no {OWN_FILE}; give the cache a folder of its own (a new or empty one)"
            )
        try:
            store.at.put(OWN_FILE, CacheFolder(created=time.time()).dumps(), PutMode.CREATE)
        except FileExistsError:
            return  # made by another rank or build a moment earlier
        except OSError as exc:
            store.unwritable(exc)
            return
    if files:
        log.info(
            "cache %s: made by an earlier version (%s); adopted, %s written",
            store.location,
            counted(len(files), "file"),
            OWN_FILE,
        )


def check(store: Store) -> None:
    """Refuse (``NotACache``) to list or clean a folder that has no cache's own file."""
    with reaching(store.location):
        if _identified(store):
            return
    raise NotACache(
        f"{store.location}: not a tokenization cache (it has no {OWN_FILE}), so nothing in it is listed or "
        f"removed; a cache made by an earlier version gets one from the next build that uses it, when the folder "
        f"holds only what a cache holds"
    )


def _identified(store: Store) -> bool:
    """Whether the folder has the cache's own file; ``NotACache`` when what is there is not one."""
    try:
        if (data := store.bounded(store.at, OWN_FILE, MARKER_BYTES, CacheFolder.LABEL)) is None:
            return False
        CacheFolder.loads(data, store.at.url_of(OWN_FILE))
    except RecordError as exc:
        raise NotACache(f"{exc}; a tokenization cache is a folder with a valid one") from None
    return True
