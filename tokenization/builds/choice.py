"""A re-mix pays for what it chooses: when the tokenization cache holds every file of a mixture's sources, the plan
chooses the documents, so that each rank writes only those some source's share uses, and the merge reads only them.

Why the plan. The merge chooses from every document's tokens, in its own order: the rank files end to end, each
rank's documents in its shuffle's order. That shuffle is drawn from the seed and the rank's number of documents
alone (``orderings.shuffled``), and a cached file's documents are its entry's index, so where every file is a hit,
the merge's order and every length are known before any rank runs: from the entries' indexes (8 bytes a document,
not its tokens). The plan then makes the merge's very choice (``mixing.choose``) and writes, for each rank, its
documents in the order it writes them with their lengths, sources and uses (``mixing.save_choice``, in the run
folder, the list of them last). A rank drops the documents of no use before it moves a byte, after checking that
its documents are the ones the plan read (the same lengths, in the same order); the merge chooses again, from the
plan's full lengths, so it computes the same uses and order as a build without the cache, and checks that the
rank files hold exactly the chosen documents. The bytes are those of a build that moved everything.

Why not the other ways. Rank files that point into the cache entries instead of holding tokens would save the
ranks' writes too, but would make every reader of a rank folder (verify, the books, the footprint) follow them into
the cache, whose entries a prune may remove. A choice in the ranks themselves would need every source's lengths in
each rank. The plan's choice is a small file a rank, each of its retries, and the merge all read, made once: it is
written only with a new plan, and a resumed plan keeps it (or its absence), so ranks never see two choices.

When a hit the plan read is no longer what the rank finds (removed as unfit, tokenized again to other lengths),
the rank fails, naming its files: its documents would not be the ones chosen. A new build id plans again, from what
the cache then holds.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from tokenization import mixing, orderings
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Plan
from tokenization.builds.shortfall import planned_entries
from tokenization.formats.ds import INDEX_DTYPE
from tokenization.formats.names import rank_stem
from tokenization.output.cache import Cache
from tokenization.stages.tokenize.segments import SEGMENT
from tokenization.storage.concurrent import map_concurrently
from tokenization.storage.folder import Folder
from tokenization.tokenizer.encoding import Encoder
from tokenization.wording import counted

log = logging.getLogger(__name__)


def choose_at_plan(config: BuildConfig, plan: Plan, encoder: Encoder, cache: Cache, run_dir: Folder) -> bool:
    """Write the choice of ``plan``'s mixture into ``run_dir`` when the ``cache`` holds every file of it (each
    entry's index readable), and the build merges whole documents in one task (no buckets). Whether it did."""
    mixture = config.mixed
    sources = plan.sources_of(plan.shared)
    if mixture is None or sources is None or config.output_format != "ds" or config.num_buckets:
        return False
    entries = planned_entries(config, mixture, plan.shared, sources, encoder, cache)
    hits = [entry for entry in entries if entry is not None]
    indexes = map_concurrently(lambda entry: cache.read(entry, f"{SEGMENT}.index"), hits)
    if len(hits) < len(entries) or any(index is None for index in indexes):
        return False
    each = [_documents(index, s) for index, s in zip(indexes, sources, strict=True) if index is not None]
    n = config.num_ranks
    ranks = {rank_stem(r): _rank_documents(config, plan.seed, each[r::n]) for r in range(n)}  # ``Plan.share``'s
    whole = mixing.joined(list(ranks.values()))
    available = [int(whole.lengths[whole.sources == s].sum()) for s in range(len(mixture.sources))]
    targets = mixing.budget(mixture, available)
    uses, _ = mixing.choose(mixture, targets, whole.sources, whole.lengths, plan.seed, 0)
    bounds = np.cumsum([0] + [len(documents.lengths) for documents in ranks.values()])
    choices = {stem: replace(c, uses=uses[bounds[k] : bounds[k + 1]]) for k, (stem, c) in enumerate(ranks.items())}
    mixing.save_choice(run_dir.sub(mixing.CHOICE), choices)
    kept = int((whole.lengths * (uses > 0)).sum())
    log.info(
        "plan: every file of the mixture is in the cache: the ranks will write the %s it chooses (%s of %s tokens)",
        counted(int(np.count_nonzero(uses)), "document"),
        f"{kept:,}",
        f"{int(whole.lengths.sum()):,}",
    )
    return True


def _documents(index: bytes, source: int) -> mixing.RankChoice:
    """A file's (or part's) documents, as its cache entry's index ends them, each of its mixture ``source``."""
    lengths = np.diff(np.frombuffer(index, INDEX_DTYPE).astype(np.int64), prepend=0)
    return mixing.RankChoice(lengths, np.full(len(lengths), source, np.int64), np.zeros(len(lengths), np.int64))


def _rank_documents(config: BuildConfig, seed: int, files: list[mixing.RankChoice]) -> mixing.RankChoice:
    """A rank's documents as its files will hold them: those of its ``files`` (``Plan.share``'s, in order) end to
    end, then in its shuffle's order (``stages.tokenize.document_shuffle``); each one's tokens and source."""
    documents = mixing.joined(files)
    if config.shuffle_documents and len(documents.lengths):
        order = orderings.shuffled(orderings.generator(seed), len(documents.lengths))
        documents = mixing.RankChoice(documents.lengths[order], documents.sources[order], documents.uses)
    return documents
