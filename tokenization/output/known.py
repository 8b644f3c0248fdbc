"""What builds found of their local input files, kept in the tokenization cache for the next plan.

A build knows each local file by the sha256 of its bytes; reading every byte of a corpus every night to find that
most files did not change costs what the corpus weighs. So a row a file is kept, beside the cache's entries, of what
its ``stat`` said and its sha256 (``records.KnownInputs``), and the next plan of the same input takes the sha256
from there for every file whose ``stat`` still says the same: git's index, for a corpus. The plan reads no file:
the ranks hash the new and changed ones (``inputs.content.rank_hashes``), and each rank leaves its rows in a record
of its own (``remember_part``: ranks run at once, and one record they all rewrote would lose rows). The next plan
reads the input's record and its ranks' (``recall``), writes them back as one (``remember``) and removes the ranks'
it merged. Every record is a memo: written whole, atomically, read bounded, and when one is missing, damaged or
cannot be written, its files are only hashed again, by their ranks, and the log says so.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tokenization.errors import reaching
from tokenization.output.cache import KNOWN, Cache
from tokenization.output.signing import signed_part
from tokenization.records import KnownInputs, RecordError
from tokenization.storage.folder import Folder

log = logging.getLogger(__name__)

ROW_BYTES = 1 << 10  # a row's URL and its numbers, at most, as a record's bound: a larger record is damaged
SLACK_BYTES = 1 << 20
PART = "rank"  # a rank's record: ``{key}.rank.{who}.json`` beside its input's ``{key}.json``


@dataclass(frozen=True)
class Recalled:
    """The rows known of an input's files, by URL, and the ranks' records they were read from (``parts``)."""

    rows: dict[str, str]
    parts: list[str]


def recall(cache: Cache, inputs: Sequence[str], files: int) -> Recalled:
    """The rows the last plan of ``inputs`` left, with those its ranks left since (the latest a file, by when it
    was hashed), by URL: none of a record that is missing or damaged (logged); ``files``, how many the listing
    holds, bounds what is read of each record."""
    rows = _read(cache, _name(inputs), inputs, files)
    parts = _parts(cache, inputs)
    for name in parts:
        for url, row in _read(cache, name, inputs, files).items():
            if url not in rows or _hashed_ns(row) >= _hashed_ns(rows[url]):
                rows[url] = row
    return Recalled(rows, parts)


def remember(cache: Cache, inputs: Sequence[str], rows: Mapping[str, str], parts: Sequence[str] = ()) -> None:
    """Leave ``rows`` for the next plan of ``inputs``, in place of the ranks' records ``parts`` it read
    (``recall``): a rank that rewrote one meanwhile has its rows hashed again the next night, at worst. A cache
    that cannot be written (read-only, unreachable) is logged: the next night hashes its files again."""
    if _write(cache, _name(inputs), inputs, rows, "the next night's ranks hash every local input file again"):
        try:
            with reaching(cache.location):
                _folder(cache).remove_files(list(parts))
        except OSError as exc:  # read again, and merged again, by the next plan: only its time
            log.warning("%s: the ranks' records of known input files not removed (%s)", _url(cache, parts[0]), exc)


def remember_part(cache: Cache, inputs: Sequence[str], who: str, rows: Mapping[str, str]) -> None:
    """Leave the ``rows`` a rank hashed (``who``: the rank of a build, a plain name) for the next plan of
    ``inputs``, in a record of the rank's own."""
    _write(cache, f"{_key(inputs)}.{PART}.{who}.json", inputs, rows, "the next night's ranks hash these files again")


def _read(cache: Cache, name: str, inputs: Sequence[str], files: int) -> dict[str, str]:
    limit = files * ROW_BYTES + SLACK_BYTES
    try:
        with reaching(cache.location):
            data = _head(_folder(cache), name, limit + 1)
        if data is None:
            return {}
        if len(data) > limit:
            raise RecordError(_url(cache, name), f"it holds more than {limit:,} bytes", KnownInputs.LABEL)
        known = KnownInputs.loads(data, _url(cache, name))
        if cache.signer is not None and (problem := cache.signer.problem(data)):
            raise RecordError(_url(cache, name), problem, KnownInputs.LABEL)
    except RecordError as exc:  # it names the record
        log.warning("%s; its local input files are hashed", exc)
        return {}
    except OSError as exc:  # a storage error too (StorageError), which may not name it (a folder in its place)
        log.warning("%s: not read (%s); its local input files are hashed", _url(cache, name), exc)
        return {}
    return dict(known.files) if known.inputs == list(inputs) else {}


def _head(folder: Folder, name: str, size: int) -> bytes | None:
    """A record's first ``size`` bytes, None when it is not there: on S3 too, where the store's NoSuchKey comes with
    the FileNotFoundError and ``reaching`` would make it a storage error (a rank's record that a plan run at the
    same time merged and removed between its listing and this read is gone, not a failure)."""
    try:
        return folder.head(name, size)
    except FileNotFoundError:
        return None


def _write(cache: Cache, name: str, inputs: Sequence[str], rows: Mapping[str, str], otherwise: str) -> bool:
    """Whether ``rows`` were written as ``name``; when not, the log says so and what it costs (``otherwise``)."""
    try:
        with reaching(cache.location):
            known = KnownInputs(inputs=list(inputs), files=dict(rows))
            if cache.signer is not None:
                known = replace(known, signature=cache.signer.sign(signed_part(known.to_json())))
            _folder(cache).put(name, known.dumps())
    except OSError as exc:
        log.warning("%s: not written (%s); %s", _url(cache, name), exc, otherwise)
        return False
    return True


def _parts(cache: Cache, inputs: Sequence[str]) -> list[str]:
    """The ranks' records of ``inputs`` (``remember_part``), by name: files only, since the plan removes those it
    merged (a folder planted under a record's name would fail every plan that tried)."""
    folder, prefix = _folder(cache), f"{_key(inputs)}.{PART}."
    try:
        with reaching(cache.location):
            names = folder.files()
    except OSError as exc:
        log.warning("%s: not listed (%s); the ranks' records of known input files are not read", folder.url, exc)
        return []
    return [name for name in sorted(names) if name.startswith(prefix) and name.endswith(".json")]


def _hashed_ns(row: str) -> int:
    """When a row's sha256 was computed; 0 when it cannot tell, or tells a time to come, which no rank wrote: any
    other row of the file is preferred (a forged row must not outlast the row its rank corrected it with)."""
    fields = row.split(",")
    hashed_ns = int(fields[5]) if len(fields) > 5 and fields[5].isdigit() else 0
    return hashed_ns if hashed_ns <= time.time_ns() else 0


def _key(inputs: Sequence[str]) -> str:
    return hashlib.sha256(chr(10).join(inputs).encode()).hexdigest()


def _name(inputs: Sequence[str]) -> str:
    return f"{_key(inputs)}.json"


def _folder(cache: Cache) -> Folder:
    return cache.at.sub(KNOWN)


def _url(cache: Cache, name: str) -> str:
    return _folder(cache).url_of(name)
