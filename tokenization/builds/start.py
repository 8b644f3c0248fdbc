"""The start of a build, before any work: what can be checked first (the allowed locations, an output apart from
the input and from the cache, the input files, the tokenizer and its EOS, a chat template), then the plan, made
once, and the run folder claimed with it (``Build.start``)."""

from __future__ import annotations

import logging

from tokenization.builds.choice import choose_at_plan
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Plan, Run, list_inputs
from tokenization.builds.shortfall import refuse_foreseen
from tokenization.errors import UsageError
from tokenization.inputs.content import with_content
from tokenization.inputs.listing import idle_ranks
from tokenization.output import known
from tokenization.output.cache import Cache
from tokenization.output.runs import claim, folder_for, read_claim, resolve_seed
from tokenization.storage.locations import AllowedLocations, check_disjoint, inside
from tokenization.tokenizer import reused
from tokenization.wording import counted

log = logging.getLogger(__name__)


def claimed_run(config: BuildConfig, run_id: str, allowed: AllowedLocations | None = None) -> Run:
    """Check what can be checked before any work (every location within the ``allowed`` ones when given, an
    output apart from the input, the input files, the tokenizer and its EOS, a chat template), then make the
    plan and claim the run's folder with it. A retry or a resume of the same run finds its own claim, and goes
    on only if it would plan the very same build (``Plan.refuse_another``)."""
    if allowed is not None:
        config.check_locations(allowed)
    run_dir = config.folder(folder_for(config.output, run_id))
    check_disjoint(config.inputs, config.output)
    if config.cache_location:
        check_disjoint(config.inputs, config.cache_location, "cache")
        _check_apart(run_id, run_dir.url, config.cache_location)
    listing, sources = list_inputs(config.inputs, config.source_names, config.storage_options)
    if allowed is not None:
        allowed.check_files("input", [f.url for f in listing.files])
    encoder = config.encoder()
    renderer = config.renderer(encoder)
    seed = resolve_seed(config.seed, run_id)
    rendering = None if renderer is None else renderer.sha256
    cache = Cache(config.cache_folder) if config.cache_folder else None
    recalled = known.recall(cache, config.inputs, len(listing.files)) if cache else known.Recalled({}, [])
    hashed = None if read_claim(run_dir) else with_content(listing, recalled.rows)  # a plan reads no file
    planned = listing if hashed is None else hashed.listing
    proposed = Plan.make(config, seed, encoder.sha256, encoder.eos_token, rendering, planned, sources)
    if cache is not None:  # before the run's claim: a folder that is no cache is refused first
        cache.claim()
        if hashed is not None and (hashed.known != recalled.rows or recalled.parts):
            known.remember(cache, config.inputs, hashed.known, recalled.parts)
        if hashed is not None:  # a new plan (a re-run's was checked when it was new)
            refuse_foreseen(config, proposed, encoder, cache)
    reading = None if hashed is None else hashed.reading(len(listing.files))
    run = Run(run_dir.url, claim(run_dir, run_id, proposed.record, encoder.facts(), reading))
    if run.plan.digest != proposed.digest:
        run.plan.refuse_another(proposed, listing, run_dir.url, lambda: recalled.rows)
    elif cache is not None and hashed is not None:  # a new plan: its choice made once, or never
        choose_at_plan(config, run.plan, encoder, cache, run_dir)
    files = run.plan.files
    log.info(
        "plan %s: %s (%d bytes), %s, seed %d; in %s",
        run.plan.digest[:12],
        counted(len(files), "input file"),
        sum(f.size for f in files),
        counted(config.num_ranks, "rank"),
        run.plan.seed,
        run_dir.url,
    )
    log.debug("plan: %s", run.plan.record)
    idle_ranks(config.num_ranks, run.plan.shared, config.split_input_mb)
    reused.policy_applied(encoder.file, encoder.policy)  # for a rank this process runs (``Build.run`` runs the first
    # here): HF's tokenizer the plan loaded, not loaded again (0.06 s for GPT-2, 1-3 s for larger vocabularies)
    return run


def _check_apart(run_id: str, run_dir: str, cache: str) -> None:
    """Refuse a build id whose folder is the tokenization cache's, or holds it: the run's files and the cache's
    would mix, and retention would delete the cache with the build."""
    if inside(cache, run_dir):
        raise UsageError(
            f"build id {run_id!r} names {run_dir}, which holds the tokenization cache {cache}: choose another "
            f"build id, or another cache"
        )
