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
import functools
import hashlib
import io
import json
import math
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenization import orderings
from tokenization.errors import TokenizationError, UsageError
from tokenization.formats.names import SOURCE_NAME
from tokenization.records import Mixture, MixtureSource, RecordError, SourceMix
from tokenization.storage.files import StorageOptions, open_fs
from tokenization.storage.folder import Folder
from tokenization.wording import counted

MAX_SOURCES = 256  # a document's source is one byte in the ``.ds.source`` sidecar
# A budget's and a repetition's bounds: the merge holds every use of a document in memory (16 bytes each), so a
# source repeated without end, or a budget past any corpus, would only fail after every rank tokenized. 10^15
# tokens is ten times the largest corpora, and stays within float64's exact integers (2^53), which the shares
# apportion in; a thousand uses of each document is past any schedule that repeats a small source.
MAX_TOKENS = 10**15
MAX_REPETITION = 1000
MAX_DEPTH = 3  # a mixture's mapping, its list of sources, a source's mapping: its values are numbers and strings
TOO_DEEP = (
    "nested deeper than a mixture: a mapping of 'tokens' and 'sources', a list of mappings of numbers and strings"
)
NAME = re.compile(SOURCE_NAME)  # a source's name: in file names, metadata, reports and logs
MIXTURE_SCHEMA = {  # the DAG's trigger form validates a mixture with it; ``read_mixture`` checks the rest
    "type": "object",
    "required": ["sources"],
    "additionalProperties": False,
    "properties": {
        "tokens": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_TOKENS,
            "description": "the budget, EOS included",
        },
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
                    "max_repetition": {"type": "number", "minimum": 1, "maximum": MAX_REPETITION},
                    "text_key": {"type": ["string", "null"]},
                    "template": {"type": ["string", "null"]},
                },
            },
        },
    },
}


class MixtureError(UsageError):
    """A spec that is not a mixture, or one that cannot be made whatever the sources hold: refused where it is read."""


class MixtureShortfall(TokenizationError):
    """The sources, once counted, cannot make the mixture as asked (a source too small for its share, or none of
    its documents chosen): a data error, not a usage one, found by the merge after the ranks tokenized (or by the
    plan, from the cache's counts)."""


def read_mixture(data: object, where: str) -> Mixture:
    """The mixture ``data`` (a JSON object, from a file or a DAG param) describes, checked; ``where`` it came from
    is named by every error."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list):
        raise MixtureError(f"{where}: a mixture is a mapping with a list of 'sources' (and 'tokens')")
    if _too_deep(data):
        raise MixtureError(f"{where}: {TOO_DEEP}")
    _no_strangers(data, Mixture, where)
    for k, source in enumerate(data["sources"]):
        if isinstance(source, dict):
            _no_strangers(source, MixtureSource, f"{where}: sources[{k}]")
    given = {"tokens": None, **_whole_tokens(data, where)}  # its optional fields said: a record reads every field
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
    if mixture.tokens is not None and mixture.tokens > MAX_TOKENS:
        raise MixtureError(f"{where}: tokens is {mixture.tokens:,}: a budget is at most {MAX_TOKENS:,} tokens (10^15)")
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
        if source.max_repetition > MAX_REPETITION:
            raise MixtureError(
                f"{at}: max_repetition {source.max_repetition:g} is above {MAX_REPETITION:,}, the most a source's "
                "documents may be used"
            )
        if not source.input:
            raise MixtureError(f"{at}: no input")
    _check_shares(mixture, where)
    return mixture


def _too_deep(data: dict[str, Any]) -> bool:
    """Whether ``data`` holds a list or a mapping below a source's fields (looked at without recursion: a spec may
    be nested past Python's stack, or hold itself, through a YAML alias)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return True
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False


def _whole_tokens(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` with its budget an integer when it is a whole number written as a float (``5e4``, ``50000.0``:
    JSON and YAML read an exponent as a float); any other fraction is refused."""
    tokens = data.get("tokens")
    if not isinstance(tokens, float):
        return data
    if not tokens.is_integer():
        raise MixtureError(f"{where}: tokens is {tokens:g}: a budget is a whole number of tokens")
    return {**data, "tokens": int(tokens)}


def _check_shares(mixture: Mixture, where: str) -> None:
    """Every source's share is a positive number, and, given a budget, at least one token of it: a source whose
    share rounds to nothing would be left out of its own mixture."""
    try:
        shares = mixture.shares
    except OverflowError:
        raise MixtureError(f"{where}: the weights add up past the largest number: scale them down") from None
    for source, share in zip(mixture.sources, shares, strict=True):
        if not share > 0:
            raise MixtureError(f"{where}: source {source.name!r}: weight {source.weight:g} is 0 of the weights' sum")
    if mixture.tokens is None:
        return
    for source, target in zip(mixture.sources, _apportioned(mixture.tokens, shares), strict=True):
        if not target:
            raise MixtureError(
                f"{where}: source {source.name!r}: its share (weight {source.weight:g}) of a budget of "
                f"{counted(mixture.tokens, 'token')} rounds to 0 tokens: raise tokens or its weight"
            )


def _no_strangers(given: dict[str, Any], kind: type, where: str) -> None:
    """Refuse a key that is no field of ``kind``, with the field it was likely meant to be."""
    known = [f.name for f in dataclasses.fields(kind)]
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (its fields: {', '.join(known)})"
            raise MixtureError(
                f"{where}: {key!r} is not a field of a mixture{' source' * (kind is MixtureSource)}{hint}"
            )


def load_mixture_file(path: str, storage_options: StorageOptions | None = None) -> dict[str, Any]:
    """A mixture file's object, at a path or fsspec URL (opened with ``storage_options``): JSON (``.json``, read as
    JSON reads it) or YAML, its numbers read as YAML 1.2 reads them (``1e-3`` is a number; JSON is YAML too); an
    error names the file. A source's relative ``input`` is made relative to the file's folder, so that a spec means
    the same files wherever it is run from."""
    import yaml  # a mixture file is the only YAML the project reads

    try:
        fs, at = open_fs(path, storage_options)
        with fs.open(at, "rb") as file:
            text = file.read().decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else yaml.load(text, Loader=_loader())  # a SafeLoader
    except json.JSONDecodeError as exc:
        raise MixtureError(f"{path}: not JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:  # its own text spans lines and quotes the file
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise MixtureError(f"{path}: not YAML or JSON: {at}{exc.problem}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (a NUL): its own text spans two lines
        raise MixtureError(f"{path}: not YAML or JSON: {_refused_character(text, exc)}") from None
    except RecursionError:
        raise MixtureError(f"{path}: {TOO_DEEP}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise MixtureError(f"{path}: cannot be read as a mixture ({type(exc).__name__}: {exc})") from None
    read_mixture(data, path)  # its errors name the file
    folder = path.rsplit("/", 1)[0] if "://" in path else os.path.dirname(os.path.abspath(path))
    return {
        **_whole_tokens(data, path),
        "sources": [{**s, "input": _located(s["input"], folder)} for s in data["sources"]],
    }


def _located(given: str, folder: str) -> str:
    """A source's input as the spec in ``folder`` (a local folder or a URL) means it: a relative path from that
    folder (its ``..`` folded away, as a path is read); a URL, an absolute path or one from the home folder as
    given."""
    if "://" in given or given.startswith(("/", "~")):
        return given
    scheme, _, rest = folder.rpartition("://")
    joined = posixpath.normpath(posixpath.join(rest, given)) if scheme else os.path.normpath(os.path.join(rest, given))
    return f"{scheme}://" * bool(scheme) + joined + "/" * given.endswith("/")  # a folder's "/" kept


def _refused_character(text: str, exc: Exception) -> str:
    """Where the character YAML's reader refused is, and which (``yaml.reader.ReaderError``), in one line."""
    position, character, reason = (getattr(exc, name) for name in ("position", "character", "reason"))
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    code = character if isinstance(character, int) else ord(character)
    return f"line {line}, column {column}: the character U+{code:04X}: {reason}"


@functools.cache
def _loader() -> type:
    """A safe YAML loader whose floats are YAML 1.2's: an exponent needs neither a dot nor a sign (YAML 1.1 reads
    ``1e-3`` and ``5e4`` as strings); its other scalars are PyYAML's (``1_000`` is an integer)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    float_tag = "tag:yaml.org,2002:float"
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != float_tag]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(float_tag, YAML_FLOAT, list("-+0123456789."))
    return Loader


YAML_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def budget(mixture: Mixture, available: Sequence[int]) -> list[int]:
    """Each source's target tokens, from the budget (or, without one, the largest the weights allow within each
    source's ``max_repetition``) and its share; a source too small for its target is refused, by name."""
    shares = mixture.shares
    for source, have in zip(mixture.sources, available, strict=True):
        if not have:
            raise _no_tokens(source)
    caps = [math.floor(s.max_repetition * a) for s, a in zip(mixture.sources, available, strict=True)]
    total = mixture.tokens
    if total is None:
        total = min(math.floor(cap / share) for cap, share in zip(caps, shares, strict=True))
    targets = _apportioned(total, shares)
    for source, have, need in zip(mixture.sources, available, targets, strict=True):
        _refuse_short(source, have, need, total)
    return targets


def foreseen(mixture: Mixture, known: Sequence[int | None]) -> None:
    """Refuse at plan what ``budget`` would refuse at the merge, from the tokens of the sources ``known`` (None: a
    source not known yet): all known, ``budget`` itself; with a budget, each known source against its target."""
    if all(have is not None for have in known):
        budget(mixture, [have or 0 for have in known])
    elif mixture.tokens is not None:
        for source, have, need in zip(
            mixture.sources, known, _apportioned(mixture.tokens, mixture.shares), strict=True
        ):
            if have is not None:
                _refuse_short(source, have, need, mixture.tokens)


def _refuse_short(source: MixtureSource, have: int, need: int, total: int) -> None:
    """Refuse a source of ``have`` tokens that cannot give its target, ``need`` of the mixture's ``total``."""
    if not have:
        raise _no_tokens(source)
    if not need:
        raise MixtureShortfall(
            f"mixture source {source.name!r}: its share (weight {source.weight:g}) of the mixture's "
            f"{counted(total, 'token')} rounds to 0 tokens: raise its weight"
        )
    cap = math.floor(source.max_repetition * have)
    if need > cap:
        times = f"{source.max_repetition:g} times" if source.max_repetition > 1 else "once (max_repetition 1)"
        raise MixtureShortfall(
            f"mixture source {source.name!r} has {have:,} tokens, used at most {times}: {cap:,}; its "
            f"{source.weight:g} of the weights needs {need:,} of the {total:,}: lower its weight or the budget, "
            "or raise its max_repetition"
        )


def _no_tokens(source: MixtureSource) -> MixtureShortfall:
    return MixtureShortfall(
        f"mixture source {source.name!r} has no tokens: the ranks kept none of its documents (its files are "
        "empty, or every document in them was empty or rejected)"
    )


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
        raise MixtureShortfall(
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


def check_chosen(source: MixtureSource, target: int, tokens: np.ndarray, counts: np.ndarray, where: str) -> None:
    """Refuse a source of which ``uses`` chose no document for its ``target`` (each of its documents, of ``tokens``
    tokens, is longer than twice the target): the mixture would leave it out, or be empty."""
    if target and not counts.any():
        shortest = f"its shortest document has {int(tokens.min()):,}" if len(tokens) else "it has no document"
        raise MixtureShortfall(
            f"{where}mixture source {source.name!r}: no document fits its target of {counted(target, 'token')} "
            f"({shortest}): raise tokens or its weight"
        )


def choose(
    mixture: Mixture, targets: Sequence[int], sources: np.ndarray, lengths: np.ndarray, seed: int, part: int
) -> tuple[np.ndarray, list[SourceMix]]:
    """How many times each document (its ``sources`` and ``lengths``, in the merge's order) is used for each
    source's target, and what each source gave: each source's ``uses`` over its own documents, drawn with
    ``orderings.mixture_subset`` (``part``: 0 for a whole merge, a bucket's number + 1). The merge chooses with it,
    and so does a plan that knows every document's length from the cache (``builds.choice``): one choice."""
    counts = np.zeros(len(sources), np.int64)
    shares = []
    for s, (source, share) in enumerate(zip(mixture.sources, mixture.shares, strict=True)):
        mine = np.flatnonzero(sources == s)
        chosen = counts[mine] = uses(lengths[mine], targets[s], orderings.mixture_subset(seed, s, part, len(mine)))
        check_chosen(source, targets[s], lengths[mine], chosen, "" if part == 0 else f"bucket {part - 1}: ")
        shares.append(
            SourceMix(
                name=source.name,
                target=share,
                docs_available=len(mine),
                tokens_available=int(lengths[mine].sum()),
                docs_chosen=int(np.count_nonzero(chosen)),
                docs_repeated=int(np.count_nonzero(chosen > 1)),
                uses=int(chosen.sum()),
                tokens_chosen=int((chosen * lengths[mine]).sum()),
            )
        )
    return counts, shares


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


CHOICE = "choice"  # the folder of a build's run folder that holds a choice made at plan (``builds.choice``)
CHOSEN = "_CHOSEN.json"  # in it, written last: each rank's file and its sha256


@dataclass(frozen=True)
class RankChoice:
    """A rank's documents in the order its files hold them (its shuffle's), as a plan chose them before the rank
    ran: each one's tokens, mixture source and uses (0: not chosen, which the rank does not write)."""

    lengths: np.ndarray
    sources: np.ndarray
    uses: np.ndarray

    def data(self) -> bytes:
        with io.BytesIO() as out:
            np.save(out, np.stack([self.lengths, self.sources, self.uses]).astype(np.int64), allow_pickle=False)
            return out.getvalue()


def joined(choices: Sequence[RankChoice]) -> RankChoice:
    """The ranks' choices end to end: every document in the merge's order (the rank files sorted, rank by rank)."""
    parts = [[getattr(c, name) for c in choices] for name in ("lengths", "sources", "uses")]
    return RankChoice(*(np.concatenate(part) if part else np.zeros(0, np.int64) for part in parts))


def save_choice(folder: Folder, choices: dict[str, RankChoice]) -> None:
    """Each rank's choice (by its stem, in rank order) into ``folder``, then the list of them, last: a choice is
    there only once it is whole."""
    sums = {}
    for stem, choice in choices.items():
        data = choice.data()
        folder.put(f"{stem}.npy", data)
        sums[stem] = hashlib.sha256(data).hexdigest()
    folder.put(CHOSEN, json.dumps({"ranks": sums}, sort_keys=True).encode())


def read_choice(folder: Folder, stems: Sequence[str] | None = None) -> dict[str, RankChoice] | None:
    """The choice a plan made (None: it made none), of the ranks ``stems`` (default: every rank, in rank order),
    each file checked against the sha256 the list records."""
    if not folder.exists(CHOSEN):
        return None
    sums = json.loads(folder.read(CHOSEN))["ranks"]
    found = {}
    for stem in sorted(sums) if stems is None else stems:
        data = folder.read(f"{stem}.npy") if stem in sums else b""
        if hashlib.sha256(data).hexdigest() != sums.get(stem):
            raise TokenizationError(f"{folder.url_of(stem + '.npy')}: not the choice its plan wrote, or none")
        lengths, sources, uses = np.load(io.BytesIO(data), allow_pickle=False)
        found[stem] = RankChoice(lengths, sources, uses)
    return found
