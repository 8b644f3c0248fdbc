"""Every seeded order the stages draw, in one place: the determinism contract.

Output is a pure function of the inputs, the params and the seed. Where datatrove draws an order, the draw here is
the same call on the same generator in the same sequence, so the same seed gives datatrove's order, byte for byte:

- a rank (``tokenize``): one ``default_rng(seed)``; ``permutation(documents)`` first (the document shuffle), then,
  with chunks, ``permutation(full chunks)`` from the same generator (datatrove's DocumentTokenizer);
- a context shuffle: one ``default_rng(seed)`` for the task, ``permutation(full windows)`` for each file, drawn file
  after file in the task's file order (datatrove's DocumentTokenizerContextShuffler);
- the merge's ``interleave``: ``default_rng(seed).shuffle(file ids)`` (the same draw as datatrove's
  ``permutation(file_ids)`` in DocumentTokenizerMerger); its ``shuffle`` mode: ``default_rng(seed).permutation``
  of every document.

Unlike datatrove, a partial last chunk or window is kept, after the shuffled full ones (``with_tail``), unless it is
dropped and counted. The orders that datatrove does not have:

- the bucketed merge (``bucket_of``, ``bucket_order``), from streams of its own, never from the generators above:
  generators seeded ``(seed, 0, rank)`` and ``(seed, 1, bucket)``. Each rank draws a bucket for each of its
  documents, uniformly among ``B``; each bucket puts its documents (gathered rank after rank) in a uniformly random
  order. Read bucket after bucket, the documents are in a uniformly random order: a given order of ``n`` documents
  needs the first ``k_1`` in bucket 0 (in that order), the next ``k_2`` in bucket 1 and so on, with probability
  ``B^-n · Π 1/k_b!``; summed over the bucket sizes that is ``B^-n · B^n / n!`` (the multinomial theorem), that is
  ``1/n!``. datatrove's interleave, by contrast, keeps each rank's order and is not uniform. A task needs only its
  own bucket: memory and local disk grow with ``n / B``, not with the corpus;
- packed windows, from the context shuffle task's generator, in its place of that file's window permutation: one
  63-bit seed for the order of ties in Best-Fit Decreasing (``packing_draws``, then ``tie_order``), then the
  windows' places;
- a mixture's merge (``tokenization.mixing``), from streams of its own, generators seeded ``(seed, 2, source,
  part)`` and ``(seed, 3, part)`` (``part``: 0 for the whole merge, ``1 + b`` for bucket ``b``): the order in which
  a source's documents join the subset that its fractional use takes (``mixture_subset``), then, for the
  interleave, the order of each source's uses and where each falls within its own span (``mixture_draws``).
"""

from __future__ import annotations

import numpy as np

ASSIGN, ORDER = 0, 1  # the bucketed merge's two families of streams drawn from one seed
SUBSET, PLACES = 2, 3  # a mixture's two families


def generator(seed: int) -> np.random.Generator:
    """The generator of a rank, of a context shuffle task, or of a merge: datatrove's."""
    return np.random.default_rng(seed)


def shuffled(rng: np.random.Generator, units: int) -> np.ndarray:
    """The next permutation of ``units`` (documents, full chunks or full windows) from a rank's or a task's
    generator."""
    return rng.permutation(units)


def with_tail(order: np.ndarray, full: int, keep_tail: bool) -> np.ndarray:
    """A permutation of ``full`` chunks or windows, with the partial one after them (unit ``full``) when kept."""
    return np.append(order, full) if keep_tail else order


def interleave(seed: int, file_ids: np.ndarray) -> None:
    """The merge's interleave, in place: which file each output document comes from, in order."""
    generator(seed).shuffle(file_ids)


def merge_order(seed: int, documents: int) -> np.ndarray:
    """The merge's ``shuffle`` mode: a uniform permutation of every document, file-major."""
    return generator(seed).permutation(documents)


def bucket_of(seed: int, rank: int, documents: int, num_buckets: int) -> np.ndarray:
    """The bucket of each of a rank's documents, in input order."""
    return np.random.default_rng([seed, ASSIGN, rank]).integers(0, num_buckets, documents, dtype=np.int64)


def by_bucket(buckets: np.ndarray, num_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: the documents grouped by bucket, each group in input order; bucket ``b``'s documents
    are ``order[bounds[b]:bounds[b + 1]]``. One sort, whatever the number of buckets."""
    order = np.argsort(buckets, kind="stable")
    return order, np.searchsorted(buckets[order], np.arange(num_buckets + 1))


def bucket_order(seed: int, bucket: int, units: int) -> np.ndarray:
    """The uniformly random order of a bucket's ``units`` documents, gathered rank after rank."""
    return np.random.default_rng([seed, ORDER, bucket]).permutation(units)


def packing_draws(rng: np.random.Generator) -> int:
    """The seed of a file's Best-Fit Decreasing ties, drawn first; its windows' places come next from ``rng``."""
    return int(rng.integers(2**63))


def tie_order(seed: int, pieces: int) -> np.ndarray:
    """The seeded order that breaks Best-Fit Decreasing's ties between pieces of one length."""
    return np.random.default_rng(seed).permutation(pieces)


def mixture_subset(seed: int, source: int, part: int, documents: int) -> np.ndarray:
    """The order in which a source's documents (of the merge's ``part``) join its fractional use's subset."""
    return np.random.default_rng([seed, SUBSET, source, part]).permutation(documents)


def mixture_draws(seed: int, part: int) -> np.random.Generator:
    """The generator of a mixture's interleave in the merge's ``part``: for each source in turn, the order of its
    uses, then where each falls within its own span."""
    return np.random.default_rng([seed, PLACES, part])
