"""What a build's plan found of its local input files, kept in the tokenization cache for the next plan.

A plan records each local file's sha256 (``inputs.sources.with_content``); reading every byte of a corpus every
night to find that most files did not change costs what the corpus weighs. So the plan leaves, beside the cache's
entries, a row a file of what its ``stat`` said and the sha256 it computed (``records.KnownInputs``), and the next
plan of the same input takes the sha256 from there for every file whose ``stat`` still says the same: git's index,
for a corpus. The record is a memo: written whole, atomically, by each plan (the last one wins), read bounded, and
when it is missing, damaged or cannot be written, the plan only hashes more, and says so in the log.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tokenization.errors import reaching
from tokenization.output.cache import KNOWN, Cache
from tokenization.output.signing import signed_part
from tokenization.records import KnownInputs, RecordError
from tokenization.storage.files import join, read_head, write_bytes_atomic

log = logging.getLogger(__name__)

ROW_BYTES = 1 << 10  # a row's URL and its numbers, at most, as a record's bound: a larger record is damaged
SLACK_BYTES = 1 << 20


def recall(cache: Cache, inputs: Sequence[str], files: int) -> dict[str, str]:
    """The rows the last plan of ``inputs`` left, by URL (none when there is no record or it is damaged: logged);
    ``files``, how many the listing holds, bounds what is read."""
    path = _path(cache, inputs)
    limit = files * ROW_BYTES + SLACK_BYTES
    try:
        with reaching(cache.location):
            data = read_head(cache.fs, path, limit + 1)
        if len(data) > limit:
            raise RecordError(_url(cache, path), f"it holds more than {limit:,} bytes", KnownInputs.LABEL)
        known = KnownInputs.loads(data, _url(cache, path))
        if cache.signer is not None and (problem := cache.signer.problem(data)):
            raise RecordError(_url(cache, path), problem, KnownInputs.LABEL)
    except FileNotFoundError:
        return {}
    except (OSError, RecordError) as exc:  # a storage error too (StorageError): the plan reads the files instead
        log.warning("%s; every local input file is hashed", exc)
        return {}
    return known.files if known.inputs == list(inputs) else {}


def remember(cache: Cache, inputs: Sequence[str], rows: Mapping[str, str]) -> None:
    """Leave ``rows`` for the next plan of ``inputs``. A cache that cannot be written (read-only, unreachable) is
    logged: the next plan hashes its files again."""
    path = _path(cache, inputs)
    try:
        with reaching(cache.location):
            known = KnownInputs(inputs=list(inputs), files=dict(rows))
            if cache.signer is not None:
                known = replace(known, signature=cache.signer.sign(signed_part(known.to_json())))
            write_bytes_atomic(cache.fs, path, known.dumps())
    except OSError as exc:
        log.warning("%s: not written (%s); the next plan hashes every local input file again", _url(cache, path), exc)


def _path(cache: Cache, inputs: Sequence[str]) -> str:
    return join(cache.path, KNOWN, f"{hashlib.sha256(chr(10).join(inputs).encode()).hexdigest()}.json")


def _url(cache: Cache, path: str) -> str:
    return cache.location + path[len(cache.path.rstrip("/")) :]
