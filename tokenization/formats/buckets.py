"""The bucketed global shuffle's randomness: a uniform permutation of every document that many tasks compute.

Each rank draws a bucket for each of its documents, uniformly among ``B`` and independently; each bucket task
then puts the documents of its bucket (gathered from every rank) in a uniformly random order. Read bucket after
bucket, the documents are in a uniformly random order: a given order of ``n`` documents needs the first ``k_1``
in bucket 0 (in that order), the next ``k_2`` in bucket 1 and so on, which happens with probability
``B^-n · Π 1/k_b!``; summed over the bucket sizes that is ``B^-n · B^n / n!`` (the multinomial theorem), that is
``1/n!``. datatrove's interleave, by contrast, keeps each rank's order and is not uniform.

A task needs only its own bucket: memory and local disk grow with ``n / B``, not with the corpus. The generators
are seeded by ``(seed, 0, rank)`` and ``(seed, 1, bucket)``, so the same seed gives the same bytes and no rank's
stream is a bucket's.
"""

from __future__ import annotations

import numpy as np

ASSIGN, ORDER = 0, 1  # the two families of streams drawn from one seed


def assign(seed: int, rank: int, documents: int, num_buckets: int) -> np.ndarray:
    """The bucket of each of a rank's documents, in input order."""
    return np.random.default_rng([seed, ASSIGN, rank]).integers(0, num_buckets, documents, dtype=np.int64)


def by_bucket(buckets: np.ndarray, num_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: the documents grouped by bucket, each group in input order; bucket ``b``'s documents
    are ``order[bounds[b]:bounds[b + 1]]``. One sort, whatever the number of buckets."""
    order = np.argsort(buckets, kind="stable")
    return order, np.searchsorted(buckets[order], np.arange(num_buckets + 1))


def order(seed: int, bucket: int, units: int) -> np.ndarray:
    """The uniformly random order of a bucket's ``units`` documents, gathered rank after rank."""
    return np.random.default_rng([seed, ORDER, bucket]).permutation(units)
