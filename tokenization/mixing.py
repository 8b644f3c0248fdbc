"""Mixing sources at token shares, exactly, when the merge writes the tokens: how many times each document is
used, and an order that carries the mixture through every stretch of the output.

The unit is the whole document with its EOS; mixing never cuts one. A source's target is its share of the budget
(``budget``). A source used ``k + f`` times gives every document ``k`` times and a seeded subset for the fraction
``f``, whose tokens come within one document of the target, and within a few tokens on text of many documents
(``uses``): the documents of a seeded permutation that fit, in its order, then the one that best fills what is
left. A source too small for its share under its
``max_repetition`` is refused before a byte is written, naming it, its tokens and the tokens it needs.

The order (``interleaved``) is a seeded stratified merge, not a uniform shuffle: each source's uses are put in a
seeded random order, and each use is placed at a random point of its own span of that source's tokens, as a
fraction of them; the uses of every source are then sorted by that fraction. Read to any point, the output has
then taken the same fraction of every source's chosen tokens, give or take one document each: any stretch of the
output carries each source at its share, within a document of each source (a uniform shuffle would hold it only
on average, ~1/sqrt(documents) off in each stretch). A bucketed merge does the same within each bucket, and
gives every bucket the mixture's shares exactly, with a part of the budget in proportion to what the bucket can
hold at those shares (``bucket_targets``): every bucket carries the mixture.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Sequence

import numpy as np

from tokenization.errors import UsageError
from tokenization.formats.names import SOURCE_NAME
from tokenization.records import Mixture, MixtureSource, RecordError
from tokenization.storage.files import StorageOptions, open_fs

MAX_SOURCES = 256  # a document's source is one byte in the ``.ds.source`` sidecar
NAME = re.compile(SOURCE_NAME)  # a source's name: in file names, metadata, reports and logs
MIXTURE_SCHEMA = {  # the DAG's trigger form validates a mixture with it; ``read_mixture`` checks the rest
    "type": "object",
    "required": ["sources"],
    "additionalProperties": False,
    "properties": {
        "tokens": {"type": ["integer", "null"], "minimum": 1, "description": "the budget, EOS included"},
        "sources": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_SOURCES,
            "items": {
                "type": "object",
                "required": ["name", "input", "weight"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": f"^{NAME.pattern}$"},
                    "input": {"type": "string", "minLength": 1},
                    "weight": {"type": "number", "exclusiveMinimum": 0},
                    "max_repetition": {"type": "number", "minimum": 1},
                    "text_key": {"type": ["string", "null"]},
                    "template": {"type": ["string", "null"]},
                },
            },
        },
    },
}


class MixtureError(UsageError):
    """A mixture that cannot be made as asked: a spec that is not one, or a source too small for its share."""


def read_mixture(data: object, where: str) -> Mixture:
    """The mixture ``data`` (a JSON object, from a file or a DAG param) describes, checked; ``where`` it came from
    is named by every error."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list):
        raise MixtureError(f"{where}: a mixture is a mapping with a list of 'sources' (and 'tokens')")
    _no_strangers(data, Mixture, where)
    for k, source in enumerate(data["sources"]):
        if isinstance(source, dict):
            _no_strangers(source, MixtureSource, f"{where}: sources[{k}]")
    given = {"tokens": None, **data}  # its optional fields said: a record reads every field
    given["sources"] = [{"max_repetition": 1, **s} if isinstance(s, dict) else s for s in data["sources"]]
    try:
        mixture = Mixture.from_json(given, where)
    except RecordError as exc:
        raise MixtureError(str(exc)) from None
    if not mixture.sources:
        raise MixtureError(f"{where}: no sources: a mixture names at least one")
    if len(mixture.sources) > MAX_SOURCES:
        raise MixtureError(f"{where}: {len(mixture.sources)} sources, more than the {MAX_SOURCES} a mixture may have")
    if mixture.tokens is not None and mixture.tokens < 1:
        raise MixtureError(f"{where}: tokens is {mixture.tokens}: a budget is at least 1 token")
    names: set[str] = set()
    for source in mixture.sources:
        at = f"{where}: source {source.name!r}"
        if not NAME.fullmatch(source.name):
            raise MixtureError(f"{at}: a name is letters, digits, '_', '.' or '-' (at most 64), starting with one")
        if source.name in names:
            raise MixtureError(f"{at}: named twice; each source has a name of its own")
        names.add(source.name)
        if not (math.isfinite(source.weight) and source.weight > 0):
            raise MixtureError(f"{at}: weight {source.weight} is not a positive number")
        if not (math.isfinite(source.max_repetition) and source.max_repetition >= 1):
            raise MixtureError(f"{at}: max_repetition {source.max_repetition} is below 1 (1: never repeat)")
        if not source.input:
            raise MixtureError(f"{at}: no input")
    return mixture


def _no_strangers(given: dict, kind: type, where: str) -> None:
    """Refuse a key that is no field of ``kind``, with the field it was likely meant to be."""
    known = [f.name for f in dataclasses.fields(kind)]
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (its fields: {', '.join(known)})"
            raise MixtureError(
                f"{where}: {key!r} is not a field of a mixture{' source' * (kind is MixtureSource)}{hint}"
            )


def load_mixture_file(path: str, storage_options: StorageOptions | None = None) -> dict:
    """A mixture file's object: YAML (``.yaml``, ``.yml``) or JSON, at a path or fsspec URL (opened with
    ``storage_options``); an error names the file."""
    import yaml  # a mixture file is the only YAML the project reads

    try:
        fs, at = open_fs(path, storage_options)
        with fs.open(at, "rb") as file:
            text = file.read().decode("utf-8")
        data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.MarkedYAMLError as exc:  # its own text spans lines and quotes the file
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise MixtureError(f"{path}: not YAML or JSON: {at}{exc.problem}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise MixtureError(f"{path}: cannot be read as a mixture ({type(exc).__name__}: {exc})") from None
    read_mixture(data, path)  # its errors name the file
    return data


def budget(mixture: Mixture, available: Sequence[int]) -> list[int]:
    """Each source's target tokens, from the budget (or, without one, the largest the weights allow within each
    source's ``max_repetition``) and its share; a source too small for its target is refused, by name."""
    shares = mixture.shares
    caps = [math.floor(s.max_repetition * a) for s, a in zip(mixture.sources, available, strict=True)]
    total = mixture.tokens
    if total is None:
        total = min(math.floor(cap / share) for cap, share in zip(caps, shares, strict=True))
    targets = _apportioned(total, shares)
    for source, have, cap, need in zip(mixture.sources, available, caps, targets, strict=True):
        if need > cap:
            times = f"{source.max_repetition:g} times" if source.max_repetition > 1 else "once (max_repetition 1)"
            raise MixtureError(
                f"mixture source {source.name!r} has {have:,} tokens, used at most {times}: {cap:,}; its "
                f"{source.weight:g} of the weights needs {need:,} of the {total:,}: lower its weight or the budget, "
                "or raise its max_repetition"
            )
    return targets


def bucket_targets(mixture: Mixture, held: np.ndarray, bucket: int) -> list[int]:
    """Each source's target in ``bucket``, given what every bucket ``held`` of each source (tokens, sources x
    buckets): every bucket gets the mixture's shares exactly, and a part of the budget in proportion to the most it
    could hold at those shares within each source's ``max_repetition`` (random buckets hold the sources unevenly).
    Without a budget, the whole is the most all buckets hold; a budget they cannot hold is refused."""
    shares = mixture.shares
    reps = [source.max_repetition for source in mixture.sources]
    most = [
        min(math.floor(r * int(h[b]) / w) for r, h, w in zip(reps, held, shares, strict=True))
        for b in range(held.shape[1])
    ]
    total = sum(most) if mixture.tokens is None else mixture.tokens
    if total > sum(most):
        raise MixtureError(
            f"the mixture's {total:,} tokens do not fit its {held.shape[1]} buckets at its shares: the sources' "
            f"documents fell unevenly into them, and at most {sum(most):,} tokens keep every bucket at the mixture; "
            "lower tokens, or use fewer buckets"
        )
    budgets = _apportioned(total, [m / sum(most) for m in most]) if sum(most) else [0] * len(most)
    return _apportioned(budgets[bucket], shares)


def _apportioned(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``shares``, in integers that add up to it (largest remainders)."""
    exact = [total * share for share in shares]
    parts = [math.floor(x) for x in exact]
    for k in sorted(range(len(parts)), key=lambda k: parts[k] - exact[k])[: total - sum(parts)]:
        parts[k] += 1
    return parts


def uses(tokens: np.ndarray, target: int, subset: np.ndarray) -> np.ndarray:
    """How many times each document of a source (of ``tokens`` tokens each) is used for ``target`` tokens: every one
    ``k`` times, and once more the documents of ``subset`` (a seeded permutation, ``orderings.mixture_subset``) that
    fit, in its order: its longest prefix within the rest, then, from the documents after it, those that still
    fit, a run at a time; last, the one document that best fills what is left. The gap left is less than the
    shortest document that did not fit: on text whose lengths are log-normal (the web's), a few tokens, where one
    long document at the prefix's end would have left it as long as itself. Each round is a vectorized prefix sum;
    rounds end when nothing fits, within ~log(documents) of them."""
    tokens = np.asarray(tokens, dtype=np.int64)
    total = int(tokens.sum())
    if not total:
        return np.zeros(len(tokens), np.int64)
    k, gap = divmod(int(target), total)
    counts = np.full(len(tokens), k, np.int64)
    left = np.asarray(subset, dtype=np.int64)
    while gap and len(left):
        left = left[tokens[left] <= gap]  # those that still fit, in the subset's order
        taken = np.cumsum(tokens[left])
        m = int(np.searchsorted(taken, gap, side="right"))  # the longest run of them within the gap
        if not m:
            break
        counts[left[:m]] += 1
        gap -= int(taken[m - 1])
        left = left[m:]
    unused = np.flatnonzero(counts == k)
    if gap and len(unused):
        best = int(unused[np.argmin(np.abs(tokens[unused] - gap))])
        if abs(int(tokens[best]) - gap) < gap:
            counts[best] += 1
    return counts


def interleaved(sources: np.ndarray, tokens: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The order of the output: unit ids (a unit used ``counts`` times appears as often), each source's uses in a
    random order, all sorted by where each falls in its source's chosen tokens (``rng``:
    ``orderings.mixture_draws``; sources drawn in id order)."""
    ids, keys = [], []
    for source in np.unique(sources[counts > 0]).tolist():
        mine = np.flatnonzero((sources == source) & (counts > 0))
        copies = np.repeat(mine, counts[mine])[rng.permutation(int(counts[mine].sum()))]
        lengths = tokens[copies].astype(np.float64)
        before = np.cumsum(lengths) - lengths
        keys.append((before + rng.random(len(copies)) * lengths) / max(lengths.sum(), 1.0))
        ids.append(copies)
    if not ids:
        return np.zeros(0, np.int64)
    order = np.argsort(np.concatenate(keys), kind="stable")
    return np.concatenate(ids)[order]
