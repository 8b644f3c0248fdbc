"""A published build's chain, checked again from its records: what ``tokenization verify RUN_DIR`` adds to the
verify of the dataset.

Publish checked the books once (``builds.accounting``) and wrote what they said into ``_BUILD.json``; the records
they were made of stay on storage after publish, though the intermediate token files go. So the chain is checked
again from them: each stage folder's records against each other (``stages.verify.check_records_alone``), the
contents from the ranks through the merge to the context shuffle, the tokens from stage to stage, and every
figure ``_BUILD.json`` records of the stages against what their records say now. A dataset forged with its own
records rewritten to match then fails on the link to the stage before it, or on ``_BUILD.json``; only a forger who
rewrites every record of the chain and ``_BUILD.json`` alike passes, which a signature alone can catch
(docs/verify.md).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, cast

import numpy as np

from tokenization.builds import accounting
from tokenization.formats.block_checks import Report
from tokenization.formats.checks import Listing
from tokenization.formats.ds import TokenFile, TokenFileError
from tokenization.output import manifest
from tokenization.output.runs import BUILD_MANIFEST, BuildError, Layout
from tokenization.records import BuildRecord, ContentsSum, ContextCounts, MergeCounts, RecordError, StageSummary
from tokenization.stages.verify import check_records_alone
from tokenization.storage.folder import Folder


def chain_problems(run: Folder, build: BuildRecord, dataset_tokens: int) -> list[str]:
    """What does not hold in the chain of a published build whose dataset holds ``dataset_tokens`` (its verify
    checked the dataset's own folder): one line each, naming the file or the link."""
    layout, report = Layout(run), Report()
    dataset = Folder(build.dataset).name
    for name, folder in layout.stages.items():
        if name != dataset and folder.is_folder():
            check_records_alone(Listing.of(folder), report)
    try:
        derived = _stage_books(layout, build)
        accounting.contents_flow(derived.tokenize, derived, chunked=bool(build.params.shuffle_chunk_size))
        flow = accounting.token_flow(derived.tokenize.tokens, derived, dataset_tokens)
    except RecordError as exc:  # it names its file
        return [*report.problems, str(exc)]
    except BuildError as exc:
        return [*report.problems, f"{run.url}: {exc}"]
    ranks = derived.tokenize
    if not ranks.holds:
        report.problem(
            run.url_of(Layout.RANKS),
            f"documents are not conserved: {ranks.docs_in:,} read, {ranks.docs_out:,} written + {ranks.empty:,} "
            f"empty + {ranks.quarantined:,} quarantined",
        )
    where = run.url_of(BUILD_MANIFEST)
    report.problems += [f"{where}: {line}" for line in _differences(build.stages, derived)]
    if build.mixture is not None:
        report.problems += _mixture_problems(layout.run.sub(dataset), build, where)
    if build.token_flow and flow != build.token_flow:
        report.problem(where, f"records the token flow {build.token_flow}, but the stages' records say {flow}")
    return report.problems


def _stage_books(layout: Layout, build: BuildRecord) -> StageSummary:
    """The books of every stage as their records on storage say now (publish made ``build.stages`` of them)."""
    ranks = accounting.rank_manifests(layout.ranks, build.stages.tokenize.ranks)
    tokenized = accounting.tokenize_summary(ranks, accounting.conservation(ranks), build.stages.tokenize.input_files)
    return StageSummary(
        tokenize=tokenized,
        merge=accounting.stage_counts(layout.merged, MergeCounts),
        context_shuffle=accounting.stage_counts(layout.context, ContextCounts),
    )


def _mixture_problems(dataset: Folder, build: BuildRecord, where: str) -> list[str]:
    """A mixture's sources in ``_BUILD.json`` against the merge's records (each source's documents chosen, uses and
    tokens), and against the dataset's ``.source`` sidecars, totalled again: each source's tokens (a build's context
    shuffle keeps every token, its tail too), and, where the dataset is the merge's files (one index entry a use),
    its uses."""
    lines = []
    accounts, merge = cast(list[Any], build.mixture), build.stages.merge
    if merge is not None and merge.sources is not None:
        for account, mix in zip(accounts, merge.sources, strict=False):
            for name in ("docs_chosen", "docs_repeated", "uses", "tokens_available", "tokens_chosen"):
                if getattr(account, name) != getattr(mix, name):
                    lines.append(
                        f"{where}: records mixture source {account.name!r} {name} {getattr(account, name):,}, but "
                        f"the merge's records say {getattr(mix, name):,}"
                    )
    held = _source_totals(dataset, [account.name for account in accounts])
    if held is None:  # a Megatron build's files are each of one source, named by it: no sidecars
        return lines
    merged = build.stages.context_shuffle is None  # the dataset is the merge's files: one entry a use
    for account, (entries, tokens) in zip(accounts, held, strict=True):
        if tokens != account.tokens_chosen:
            lines.append(
                f"{dataset.url}: its .source sidecars give mixture source {account.name!r} {tokens:,} tokens, but "
                f"{where} records {account.tokens_chosen:,} chosen"
            )
        if merged and entries != account.uses:
            lines.append(
                f"{dataset.url}: its .source sidecars give mixture source {account.name!r} {entries:,} documents, "
                f"but {where} records {account.uses:,} uses"
            )
    return lines


def _source_totals(dataset: Folder, names: list[str]) -> list[tuple[int, int]] | None:
    """Each source's index entries and tokens in the dataset's families, from their sidecars (None: no family
    has one). A family whose sidecar is missing or damaged is verify's to name: its entries count for none."""
    entries, tokens = np.zeros(len(names), np.int64), np.zeros(len(names), np.int64)
    found = False
    for url in manifest.token_files(dataset):
        try:
            family = TokenFile(url, storage_options=dataset.options)
            sources = family.sources
        except TokenFileError:
            continue
        if sources is None or family.metadata is None or len(sources) != len(family.ends):
            continue
        found = True
        ends = np.asarray(family.ends, dtype=np.int64)
        lengths = np.diff(ends, prepend=0)
        ids = np.array([names.index(n) if n in names else -1 for n in family.metadata.sources])
        known = sources < len(ids)
        mapped = ids[np.asarray(sources[known], dtype=np.int64)]
        ours = mapped >= 0
        entries += np.bincount(mapped[ours], minlength=len(names))
        tokens += np.bincount(mapped[ours], weights=lengths[known][ours], minlength=len(names)).astype(np.int64)
    return list(zip(entries.tolist(), tokens.tolist(), strict=True)) if found else None


def _differences(recorded: StageSummary, derived: StageSummary) -> list[str]:
    """Each figure of a stage that ``_BUILD.json`` records otherwise than the stage's records say."""
    lines = []
    for stage in ("tokenize", "merge", "context_shuffle"):
        said, found = getattr(recorded, stage), getattr(derived, stage)
        if said is None or found is None:
            if said != found:
                lines.append(f"records {stage} as {_shown(said)}, but its stage records say {_shown(found)}")
            continue
        for field in fields(said):
            if field.name == "inputs_problem":  # the plan's comparison, which publish made
                continue
            a, b = getattr(said, field.name), getattr(found, field.name)
            if a != b:
                lines.append(f"records {stage} {field.name} {_shown(a)}, but its stage records say {_shown(b)}")
    return lines


def _shown(value: Any) -> str:
    if isinstance(value, ContentsSum):
        return value.value.describe()
    return "none" if value is None else str(value)
