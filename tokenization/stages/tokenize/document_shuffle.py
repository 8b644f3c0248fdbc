"""Pass 2 of a rank (``stages.tokenize``): the rank's documents, its segments' end to end (``first_pass``), into
its files by moving bytes, never re-tokenizing: scattered into buckets, or in the document permutation (or input
order), then, optionally, in the chunk permutation of fixed-size chunks; a mixture's files with each document's
source, and with the plan's choice of them, only those it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tokenization import orderings
from tokenization.formats import names, sidecar
from tokenization.formats.contents import Contents, check_kept, sorted_union
from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileWriter, WrittenTokenFile
from tokenization.formats.moves import (
    Units,
    fixed_units,
    move_units,
    permute_units,
    prefix_end,
    written_contents,
)
from tokenization.formats.names import RankFileKind
from tokenization.formats.source_pool import SourcePool, contents_of, pieces_contents
from tokenization.mixing import RankChoice
from tokenization.output.runs import PlanConflict
from tokenization.stages.tokenize.segments import Segment
from tokenization.storage.concurrent import meanwhile
from tokenization.tokenizer.counts import Counts
from tokenization.tokenizer.encoding import Encoder

if TYPE_CHECKING:
    from tokenization.stages.tokenize import TokenizeConfig


def second_pass(
    config: TokenizeConfig,
    encoder: Encoder,
    segments: list[Segment],
    counts: Counts,
    work: Path,
    sources: list[str] | None = None,
    choice: RankChoice | None = None,
) -> list[WrittenTokenFile]:
    """Pass 2: the rank's documents, its segments' end to end, into its files: scattered into buckets, or in the
    document permutation (or input order), then, with chunks, in the chunk permutation; each a byte move. A
    mixture's files (``sources``: its source names) each get the source of every document (``formats.sidecar``);
    with the plan's ``choice`` of them, only those it uses are moved (``builds.choice``)."""
    paths, of_source = _families(segments)
    documents = Units.documents(paths, encoder.token_size)
    if not len(documents.ends):
        _check_choice(config.rank, segments, of_source, documents, choice)
        return []
    rng = orderings.generator(config.seed)
    chunks = config.shuffle_chunk_size
    kind = RankFileKind.DOC_SHUFFLED if config.shuffle_documents else RankFileKind.UNSHUFFLED
    mix = None if sources is None else _Mix(of_source, sources)
    expected = counts.contents
    with SourcePool(paths, encoder.token_size, config.save_loss) as pool:
        if config.num_buckets:
            written = _scatter(config, encoder, pool, documents, work, config.num_buckets, mix)
        else:
            order = np.arange(len(documents.ends))
            if config.shuffle_documents:
                order = orderings.shuffled(rng, len(documents.ends))
            name_for = (lambda _: names.working_file_name(kind)) if chunks else config.output_name
            if choice is not None:
                chosen = order[_check_choice(config.rank, segments, of_source, documents.take(order), choice)]
                with meanwhile(_chosen_contents, pool, of_source, documents, chosen) as proof:
                    written = _write(config, encoder, pool, documents.take(chosen), work, name_for, last=True, mix=mix)
                    expected = proof.result()
            elif mix is not None and config.output_format == "megatron":
                written = _apart(config, encoder, pool, documents.take(order), work, mix)
            else:
                written = _write(config, encoder, pool, documents.take(order), work, name_for, last=not chunks, mix=mix)
    check_kept(f"rank {config.rank}: pass 2", expected, written_contents(written))
    if not chunks:
        return written
    (whole,) = written
    return _chunk_shuffle(config, encoder, whole.path, rng, counts, work, chunks)


def _families(segments: list[Segment]) -> tuple[list[str], np.ndarray]:
    """The ``.ds`` families that hold the rank's segments, in order, each once (a run of small cache hits shares
    one, ``first_pass``), with the source of each (a run's hits are of one)."""
    paths: list[str] = []
    sources: list[int] = []
    for segment in segments:
        if not paths or paths[-1] != str(segment.path):
            paths.append(str(segment.path))
            sources.append(segment.source)
    return paths, np.array(sources, dtype=np.int64)


def _check_choice(
    rank: int, segments: list[Segment], of_source: np.ndarray, documents: Units, choice: RankChoice | None
) -> np.ndarray:
    """Which of the rank's ``documents`` (in the order its files hold them) the plan's ``choice`` keeps, once they
    are the very documents it chose from: the same tokens each, of the same sources (``of_source``: each file's);
    else the rank stops, since another document's bytes in a chosen one's place would change the mixture."""
    if choice is None:
        return np.arange(len(documents.ends))
    sources = of_source[documents.source]
    lengths = documents.ends - documents.starts
    if not (np.array_equal(lengths, choice.lengths) and np.array_equal(sources, choice.sources)):
        files = ", ".join(s.file.url for s in segments if s.encoded) or "none"
        raise PlanConflict(
            f"rank {rank}: its documents are not those the plan chose the mixture from ({len(lengths):,} documents "
            f"of {int(lengths.sum()):,} tokens, planned {len(choice.lengths):,} of {int(choice.lengths.sum()):,}; "
            f"files tokenized again since the plan: {files}): run the build under a new build id"
        )
    return np.flatnonzero(choice.uses > 0)


def _chosen_contents(pool: SourcePool, of_source: np.ndarray, documents: Units, chosen: np.ndarray) -> Contents:
    """What the rank's files must hold: the chosen documents (``chosen``: their numbers among ``documents``, in
    the files' order), each of its file's source (``of_source``), read from the files on a thread while they move;
    the others are never read."""
    used = Contents()
    for i, source in enumerate(of_source.tolist()):
        mine = np.sort(chosen[documents.source[chosen] == i])
        if len(mine):
            sources = np.full(len(mine), source, np.int64)
            used += pieces_contents(pool, i, documents.starts[mine], documents.ends[mine], sources)
    return used


def _write(
    config: TokenizeConfig,
    encoder: Encoder,
    pool: SourcePool,
    units: Units,
    work: Path,
    name_for: Callable[[int], str],
    *,
    last: bool,
    mix: _Mix | None = None,
) -> list[WrittenTokenFile]:
    """These units, in this order, into the files ``_writer`` makes (with a mixture's sidecars, given ``mix``)."""
    tokens = int((units.ends - units.starts).sum())
    with _writer(config, encoder, work, name_for, tokens, last=last, mixed=mix is not None) as writer:
        move_units(pool, *units, writer)
    if mix is None:
        return writer.written
    return sidecar.attach(writer.written, mix.segment_sources[units.source], mix.names)


def _apart(
    config: TokenizeConfig, encoder: Encoder, pool: SourcePool, documents: Units, work: Path, mix: _Mix
) -> list[WrittenTokenFile]:
    """A mixture's documents, each source into files of its own, named by it (Megatron output: its
    ``megatron_data_path.txt`` weighs each source's files by the mixture's weights)."""
    sources = mix.segment_sources[documents.source]
    written = []
    for number, name in enumerate(mix.names):
        ours = documents.take(np.flatnonzero(sources == number))
        if len(ours.ends):
            written += _write(config, encoder, pool, ours, work, partial(config.output_name, source=name), last=True)
    return written


def _writer(
    config: TokenizeConfig,
    encoder: Encoder,
    work: Path,
    name_for: Callable[[int], str],
    tokens: int,
    *,
    last: bool,
    mixed: bool = False,
) -> SplitWriter:
    """A writer of ``tokens`` into files named ``name_for(sub)``: the rank's own (``last``: split at
    ``max_tokens_per_file``, in its format), or one working file for the pass after; a mixture's (``mixed``) keeps
    each entry's hash, which its sidecar gives its source."""
    return SplitWriter(
        work,
        name_for,
        tokenizer=config.tokenizer,
        token_size=encoder.token_size,
        save_loss=config.save_loss,
        max_tokens=config.max_tokens_per_file if last else None,
        writer_class=config.writer_class if last else TokenFileWriter,
        keep_hashes=mixed,
        expected_tokens=tokens,
    )


def _chunk_shuffle(
    config: TokenizeConfig,
    encoder: Encoder,
    source: Path,
    rng: np.random.Generator,
    counts: Counts,
    work: Path,
    chunk: int,
) -> list[WrittenTokenFile]:
    """The chunk permutation of ``chunk`` tokens (``config.shuffle_chunk_size``) of the documents as ordered in
    ``source``; the partial last chunk kept last, or dropped and counted."""
    doc_ends = np.asarray(TokenFile(str(source), encoder.token_size).ends, dtype=np.int64)
    total_tokens = int(doc_ends[-1])
    chunk_ends, full = fixed_units(total_tokens, chunk)
    tail = total_tokens - full * chunk
    order = orderings.with_tail(
        orderings.shuffled(rng, full), full, keep_tail=bool(tail) and not config.drop_last_chunk
    )
    if tail and config.drop_last_chunk:
        counts.tokens_dropped += tail
    elif tail:
        counts.partial_chunk_tokens = tail
    kept = prefix_end(chunk_ends, len(order))  # the dropped tail aside
    writer = _writer(config, encoder, work, config.output_name, kept, last=True)
    cuts = sorted_union(doc_ends[doc_ends <= kept], chunk_ends[: len(order)])
    pool = SourcePool([str(source)], encoder.token_size, config.save_loss)
    with pool, meanwhile(contents_of, pool, 0, (cuts, kept)) as contents:  # the rank file read again, meanwhile
        with writer:
            permute_units(pool, chunk_ends, order, writer, inner_ends=doc_ends)
        (expected,) = contents.result()
    check_kept(f"rank {config.rank}: the chunk shuffle", expected, written_contents(writer.written))
    return writer.written


def _scatter(
    config: TokenizeConfig,
    encoder: Encoder,
    pool: SourcePool,
    documents: Units,
    work: Path,
    num_buckets: int,
    mix: _Mix | None,
) -> list[WrittenTokenFile]:
    """Pass 2 of a bucketed shuffle into ``num_buckets`` (``config.num_buckets``): each document to the bucket
    drawn for it, in input order within a bucket (the bucket's merge orders them), published in that bucket's
    folder; buckets that drew no document get no file."""
    drawn = orderings.bucket_of(config.seed, config.rank, len(documents.ends), num_buckets)
    order, bounds = orderings.by_bucket(drawn, num_buckets)
    written = []
    for bucket in np.flatnonzero(np.diff(bounds)).tolist():
        ours = documents.take(order[bounds[bucket] : bounds[bucket + 1]])
        files = _write(config, encoder, pool, ours, work, partial(config.bucket_name, bucket), last=True, mix=mix)
        written += [replace(w, folder=names.bucket_folder(bucket)) for w in files]
    return written


class _Mix(NamedTuple):
    """A mixture rank's sources: each family's (``_families``, in the rank's file order), and their names."""

    segment_sources: np.ndarray
    names: list[str]
