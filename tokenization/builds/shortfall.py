"""A mixture that its sources cannot make, found at plan, before any rank tokenizes, where the tokenization cache
already holds their files: a re-mix (new weights, a new budget) of sources an earlier build tokenized would
otherwise be refused only by the merge, after every rank ran.

A source's tokens are known when the cache holds an entry for each of its files (or parts), under the very key its
rank will look up: the sum of their entries' token counts is what the ranks will write of it. A source not wholly
in the cache is not known, and is left to the merge, which checks every source from what the ranks wrote. This only
refuses: an entry whose counts were forged can stop a build here, never let one through that the merge would
refuse.
"""

from __future__ import annotations

import logging

from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Plan
from tokenization.inputs.content import for_its_rank
from tokenization.mixing import foreseen
from tokenization.output.cache import Cache
from tokenization.records import CacheEntry, InputFile, Mixture
from tokenization.stages.tokenize.segments import file_key, source_readings
from tokenization.storage.concurrent import map_concurrently
from tokenization.tokenizer.encoding import Encoder

log = logging.getLogger(__name__)


def planned_entries(
    config: BuildConfig,
    mixture: Mixture,
    shared: list[InputFile],
    sources: list[int],
    encoder: Encoder,
    cache: Cache,
) -> list[CacheEntry | None]:
    """The cache's entry of each of the plan's ``shared`` files (or parts: what ranks look up), of its mixture
    ``sources``, under the very key its rank will look up (None: a miss, or a file new to the plan, whose key its
    rank will know once it hashed it: the plan reads no file)."""
    readings = source_readings(config, mixture, encoder)
    keys = [
        None if for_its_rank(file) else file_key(file, readings[s], encoder).digest
        for file, s in zip(shared, sources, strict=True)
    ]
    return map_concurrently(lambda key: None if key is None else cache.lookup(key), keys)


def refuse_foreseen(config: BuildConfig, plan: Plan, encoder: Encoder, cache: Cache) -> None:
    """Refuse ``plan``'s mixture (``config.mixed``) when the tokens ``cache`` holds of its sources tell that the
    merge would (``mixing.foreseen``). Megatron output is not merged, and takes whatever each source has."""
    mixture = config.mixed
    sources = plan.sources_of(plan.shared)
    if mixture is None or sources is None or config.output_format == "megatron":
        return
    entries = planned_entries(config, mixture, plan.shared, sources, encoder, cache)
    known: list[int | None] = [0] * len(mixture.sources)
    for source, entry in zip(sources, entries, strict=True):
        have = known[source]
        known[source] = None if entry is None or have is None else have + entry.counts.tokens
    told = [source.name for source, have in zip(mixture.sources, known, strict=True) if have is not None]
    if told:
        log.info("plan: the cache holds every file of mixture sources %s: their tokens are known", ", ".join(told))
    foreseen(mixture, known)
