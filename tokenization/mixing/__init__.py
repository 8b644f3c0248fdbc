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

The package: ``spec`` reads and checks a mixture's spec, where it is given; here are its budget, the uses of each
document, their order, and the choice a plan makes of them (``RankChoice``), as the ranks and the merge read it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenization import orderings
from tokenization.errors import TokenizationError
from tokenization.records import Mixture, MixtureSource, SourceCounts, SourceMix
from tokenization.storage.folder import Folder
from tokenization.wording import counted


class MixtureShortfall(TokenizationError):
    """The sources, once counted, cannot make the mixture as asked (a source too small for its share, or none of
    its documents chosen): a data error, not a usage one, found by the merge after the ranks tokenized (or by the
    plan, from the cache's counts)."""


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
    targets = apportioned(total, shares)
    for source, have, need in zip(mixture.sources, available, targets, strict=True):
        _refuse_short(source, have, need, total)
    return targets


def foreseen(mixture: Mixture, known: Sequence[int | None]) -> None:
    """Refuse at plan what ``budget`` would refuse at the merge, from the tokens of the sources ``known`` (None: a
    source not known yet): all known, ``budget`` itself; with a budget, each known source against its target."""
    if all(have is not None for have in known):
        budget(mixture, [have or 0 for have in known])
    elif mixture.tokens is not None:
        for source, have, need in zip(mixture.sources, known, apportioned(mixture.tokens, mixture.shares), strict=True):
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


def merge_targets(mixture: Mixture, counts: Sequence[Sequence[SourceCounts]], bucket: int | None) -> list[int]:
    """Each source's target in a merge, from what every rank counted of it (``counts``: a rank's, a source each):
    its share of the budget (a source too small for it is refused here, by name, before a byte is written), or in
    the task of ``bucket`` its bucket's part of it (every bucket at the mixture's shares: ``bucket_targets``)."""
    available = [sum(rank[s].tokens for rank in counts) for s in range(len(mixture.sources))]
    targets = budget(mixture, available)
    if bucket is not None:
        held = np.array([[rank[s].bucket_tokens for rank in counts] for s in range(len(available))])
        targets = bucket_targets(mixture, held.sum(axis=1), bucket)
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
        raise MixtureShortfall(
            f"the mixture's {total:,} tokens do not fit its {held.shape[1]} buckets at its shares: the sources' "
            f"documents fell unevenly into them, and at most {sum(most):,} tokens keep every bucket at the mixture; "
            "lower tokens, or use fewer buckets"
        )
    budgets = apportioned(total, [m / sum(most) for m in most]) if sum(most) else [0] * len(most)
    return apportioned(budgets[bucket], shares)


def apportioned(total: int, shares: Sequence[float]) -> list[int]:
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
