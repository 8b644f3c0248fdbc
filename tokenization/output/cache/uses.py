"""Which entries are in use: a rank records the entries it uses before it looks any up (``using``), and cleaning
keeps an entry while a use in flight names it, or one whose build is still there. A build on a storage this one
cannot read counts as there (its entries are kept for a build that can read it to clean)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from tokenization.errors import reaching
from tokenization.output.cache.claim import claim
from tokenization.output.cache.names import IN_FLIGHT_SECONDS, USE_BYTES
from tokenization.output.cache.store import Store
from tokenization.records import CacheUse, RecordError
from tokenization.storage.folder import Folder, StorageOptions, file_at
from tokenization.storage.locations import split_protocol

log = logging.getLogger("tokenization.output.cache")


@dataclass(frozen=True, slots=True)
class Used:
    """A use as cleaning reads it: the folder of its owner under ``uses/``, its file's name there, and the use."""

    folder: Folder
    name: str
    use: CacheUse


@contextmanager
def using(store: Store, owner: str, keeps: str, stem: str, keys: Iterable[str]) -> Iterator[None]:
    """Record that rank ``stem`` of ``owner`` uses these entries: in flight while the block runs (no cleaning removes
    them), then kept while ``keeps`` exists. The folder is claimed first (``claim``)."""
    claim(store)
    folder, name = store.uses.sub(hashlib.sha256(owner.encode()).hexdigest()[:16]), f"{stem}.json"
    use = CacheUse(owner=owner, keeps=keeps, stem=stem, keys=sorted(set(keys)), started=time.time(), finished=None)
    try:
        if not store.read_only:
            with reaching(store.location):
                folder.put(name, use.dumps())
    except OSError as exc:  # no use to keep entries for: none is stored, and cleaning may take those read
        store.unwritable(exc)
    try:
        yield
    finally:
        try:
            if not store.read_only:
                with reaching(store.location):
                    folder.put(name, replace(use, finished=time.time()).dumps())
        except OSError as exc:  # it stays in flight for a day: its entries are only kept longer
            log.warning("%s: could not mark this use finished (%s)", folder.url_of(name), exc)


def read_uses(store: Store) -> list[Used]:
    """Every readable use; a damaged one (one of more than ``USE_BYTES`` too) is logged and left out."""
    names = [name for name in store.uses.found() if name.endswith(".json")]
    found = []
    for name, data in store.read_all(store.uses, names, USE_BYTES):
        owner, _, file = name.partition("/")  # uses/{owner}/{stem}.json
        try:
            found.append(Used(store.uses.sub(owner), file, CacheUse.loads(data, store.uses.url_of(name))))
        except RecordError as exc:
            log.warning("%s; its entries are not kept for it", exc)
    return found


def in_flight(use: CacheUse, now: float) -> bool:
    return use.finished is None and now - use.started < IN_FLIGHT_SECONDS


def in_flight_keys(store: Store, now: float) -> set[str]:
    return {key for used in read_uses(store) if in_flight(used.use, now) for key in used.use.keys}


def builds_there(runs: set[str], storage_options: StorageOptions | None) -> dict[str, bool]:
    """Whether each build's ``_RUN.json`` is still there. A storage that cannot be read from here (a build of another
    output, whose credentials this one has not) is logged once, and its builds count as there: their entries are
    kept, for a build that can read it to clean."""
    there, unreadable = {}, set()
    for url in sorted(runs):
        storage = _storage_of(url)
        if storage in unreadable:
            there[url] = True
            continue
        try:
            there[url] = _exists(url, storage_options)
        except Exception as exc:  # no credentials for it, no filesystem for its protocol, a store that is down
            unreadable.add(storage)
            log.warning(
                "cache retention: cannot tell whether the builds on %s are still there (%s: %s); the entries they "
                "used are kept",
                storage,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "no details",
            )
            there[url] = True
    return there


def _storage_of(url: str) -> str:
    """The store a URL is on, as retention names it: ``s3://bucket``, or the path itself on this machine."""
    protocol, path = split_protocol(url)
    return f"{protocol}://{path.split('/', 1)[0]}" if protocol else url


def _exists(url: str, storage_options: StorageOptions | None) -> bool:
    folder, name = file_at(url, storage_options)
    with reaching(url):
        return folder.exists(name, fresh=True)
