"""The tokenization cache: each input file's first pass (its documents' tokens, ends and loss bytes, its counts and
its quarantined records) stored once, under a key of everything that decides it (``tokenization.tokenizer.cache_key``),
so that a nightly build tokenizes only the files that changed since the night before.

Layout under the cache's location::

    _CACHE.json                the cache's own file (``records.CacheFolder``): this folder is a cache
    entries/{key}.json         the entry's marker, written last and only where none is (``records.CacheEntry``):
                               which data folder holds the entry, each file's size and checksum, the file's counts
    data/{key}/{writer}/       the entry's files, under a folder of the writer's own: two writers never share a file
    uses/{owner}/{stem}.json   the entries a rank uses (``records.CacheUse``), written before it looks any up
    inputs/{key}.json          what the plans of one input found of its local files (``records.KnownInputs``)

**The folder.** Before its first write, a build's plan or a rank makes sure the folder is a cache (``claim``): it
has ``_CACHE.json``, or it is new or empty, or it holds exactly what a cache holds (a cache made by an earlier
version, which wrote no ``_CACHE.json``: it is adopted, once), and ``_CACHE.json`` is written then. Any other
folder is refused (``NotACache``) and nothing is written in it. Listing and cleaning refuse a folder without
``_CACHE.json``, and remove only what the cache's own names describe: an entry by its marker's key, and a data
folder named as a writer names it (``data/{key}/{writer}/``, holding plain files); nothing else under the folder.

**Writers.** A rank that misses encodes the file in its working folder, copies the files into a data folder of its
own (hard links when the cache is on the same local filesystem: no byte is copied), then creates the marker only
where none is (``If-None-Match`` on S3, ``O_EXCL`` locally). Two writers of one key, two ranks or two builds,
write the same bytes into two folders; the first marker wins, and the other writer removes its folder, so an entry
never mixes two writers. A writer that dies leaves a folder that no marker names, which cleaning removes once it
is ``IN_FLIGHT_SECONDS`` old.

**Readers.** A rank that hits copies (or links) the entry's files into its working folder and checks every size
and checksum (of the algorithm the marker names) against the marker before it uses any; its first pass then checks
the files against the marker's counts and against the input file (``stages.tokenize.hits``). A missing, partial or
corrupt entry (a marker of more than ``MARKER_BYTES``, which is never read whole; a file that is a folder) is logged
and removed, and its file is tokenized again (and stored anew): it is never used.

**What it trusts.** Anyone who can write the cache's folder can write an entry whose files, checksums and counts agree
with one another: the checksums catch damage, not intent. With a key (``output.signing``), markers are signed and
only those signed with it are used; without one, what such a writer can and cannot do to a build is
``stages.tokenize.hits``'s to say: a hit is held against its input file (read again, not encoded) and a sample of its
documents is encoded again. Reads are bounded (a marker at ``MARKER_BYTES``, a use at ``USE_BYTES``), and
cleaning touches only what the cache's own names describe, under a folder its own file identifies.

**Cleaning.** An entry stays while a use names it that is in flight (started less than ``IN_FLIGHT_SECONDS`` ago
and not finished) or whose build is still there (its ``_RUN.json``). Retention (``collect``) removes every other
entry, with the uses of builds that are gone; ``prune`` removes entries by age or down to a size, but never one a
use in flight names. An entry goes marker first, then its data, once the uses are read again: a reader that found
the marker before it went has written its use by then, and keeps the data it is copying. A cache may be shared by
builds of several outputs: a use whose build is on a storage that this one cannot read (no credentials for it, no
filesystem for its protocol) is kept, with a warning, for a build that can read it to clean; retention never fails
the build it runs after.

**The package.** ``names`` (the layout's names and patterns), ``store`` (the folder, its parts and their bounded
reads), ``claim`` (which folder is a cache), ``uses`` (which entries are in use), ``entries`` (lookup, fetch,
commit, discard), ``listing`` (the rows ``cache list`` shows) and ``cleaning`` (``collect`` and ``prune``); ``Cache``
holds them together, as callers use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tokenization.errors import reaching
from tokenization.output.cache import cleaning
from tokenization.output.cache.claim import check, claim
from tokenization.output.cache.entries import Entries
from tokenization.output.cache.listing import Listed, listed
from tokenization.output.cache.names import (
    DATA,
    DEFAULT_FOLDER,
    ENTRIES,
    IN_FLIGHT_SECONDS,
    KNOWN,
    MARKER_BYTES,
    OFF,
    OWN_FILE,
    USE_BYTES,
    USES,
    NotACache,
    chosen_location,
)
from tokenization.output.cache.sizes import measured
from tokenization.output.cache.store import Store
from tokenization.output.cache.uses import using
from tokenization.output.signing import Signer
from tokenization.records import CacheCleaning, CacheEntry, CacheSize
from tokenization.storage.folder import Folder

__all__ = [
    "DATA",
    "DEFAULT_FOLDER",
    "ENTRIES",
    "IN_FLIGHT_SECONDS",
    "KNOWN",
    "MARKER_BYTES",
    "OFF",
    "OWN_FILE",
    "USES",
    "USE_BYTES",
    "Cache",
    "Listed",
    "NotACache",
    "chosen_location",
]


class Cache:
    """The cache in the folder ``at``. Its retention asks whether the builds that used an entry are still there,
    with the same storage options: a build elsewhere that they cannot read counts as there."""

    def __init__(self, at: Folder):
        self.at = at
        self.store = Store(at)
        self.location = self.store.location
        self.signer = Signer.from_environment()  # with a key, every marker is signed, and only signed ones are used
        self._entries = Entries(self.store, self.signer)

    @property
    def read_only(self) -> bool:
        """Set by the first write that fails: storing is best effort, reading goes on."""
        return self.store.read_only

    # The folder: made a cache before the first write, checked before any listing or cleaning.

    def claim(self) -> None:
        """The folder made a cache before anything is written in it, or ``NotACache`` (``claim.claim``)."""
        claim(self.store)

    def check(self) -> None:
        """Refuse (``NotACache``) to list or clean a folder that has no cache's own file."""
        check(self.store)

    # A rank: its use, then a lookup, a fetch or a commit a file.

    @contextmanager
    def using(self, owner: str, keeps: str, stem: str, keys: Iterable[str]) -> Iterator[None]:
        """Record that rank ``stem`` of ``owner`` uses these entries (``uses.using``)."""
        with using(self.store, owner, keeps, stem, keys):
            yield

    def lookup(self, key: str) -> CacheEntry | None:
        return self._entries.lookup(key)

    def fetch(self, entry: CacheEntry, into: Path) -> dict[str, Path] | None:
        return self._entries.fetch(entry, into)

    def load(self, entry: CacheEntry) -> dict[str, bytes] | None:
        return self._entries.load(entry)

    def read(self, entry: CacheEntry, name: str) -> bytes | None:
        return self._entries.read(entry, name)

    def discard(self, entry: CacheEntry, problem: str, read_as: str | None = None) -> None:
        self._entries.discard(entry, problem, read_as)

    def commit(self, entry: CacheEntry, files: Mapping[str, Path]) -> CacheEntry | None:
        return self._entries.commit(entry, files)

    # Looking after it: listing, measuring, retention's collection and pruning, each only in a folder that is a cache.

    def entries(self) -> list[Listed]:
        """Every readable entry, with its last use, the most recently used first; damaged markers are logged and
        left out."""
        self.check()
        with reaching(self.location):
            return listed(self.store)

    def size(self) -> CacheSize:
        """Its entries, their files' bytes and the tokens they hold, as their markers show them: those remembered
        from the last measure, of markers unchanged since, and those read now (``sizes``); damaged markers are
        logged and left out."""
        self.check()
        with reaching(self.location):
            rows = measured(self.store)
        held, tokens = sum(row[2] for row in rows), sum(row[3] for row in rows)
        return CacheSize(location=self.location, entries=len(rows), bytes=held, tokens=tokens)

    def collect(self) -> CacheCleaning:
        """Retention's part (``cleaning.collect``), in a folder that is a cache."""
        self.check()
        with reaching(self.location):
            return cleaning.collect(self.store)

    def prune(self, older_than: float | None = None, max_bytes: int | None = None) -> CacheCleaning:
        """Entries removed by age, then down to ``max_bytes`` (``cleaning.prune``), in a folder that is a cache."""
        self.check()
        with reaching(self.location):
            return cleaning.prune(self.store, older_than, max_bytes)
