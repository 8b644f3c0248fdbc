"""Every stage proves that its shuffle is a permutation (issue 37): the contents of what it read (an order-free
hash of its pieces) are those of what it wrote, the books link the stages, and verify hashes the files again."""

from __future__ import annotations

import hashlib
import json
import shutil
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.checksums import resum
from tests.support.stages import merged, run
from tests.support.tokenizers import EOS
from tokenization.builds.accounting import contents_flow
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.formats import kept, moves, rejoin
from tokenization.formats.contents import Contents, ContentsHasher, ShuffleCheckFailed, contents_each, stream_contents
from tokenization.formats.ds import TokenFileError
from tokenization.formats.kept import KeptPieces
from tokenization.output.runs import BuildError
from tokenization.records import BuildRecord, ContentsSum
from tokenization.stages import context_shuffle
from tokenization.stages.context_shuffle import ContextShuffleConfig
from tokenization.stages.merge import moves as merge_moves
from tokenization.stages.tokenize import document_shuffle
from tokenization.stages.tokenize.segments import Held, Loaded
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder

# The C helper and the numpy path, on the same inputs: the proofs and checks must find the same.
pytestmark = pytest.mark.usefixtures("byte_path")


def contents(tokens: np.ndarray, ends: list[int] | np.ndarray, loss: np.ndarray | None = None) -> Contents:
    hasher = ContentsHasher()
    hasher.add(np.asarray(tokens), np.asarray(ends, dtype=np.int64), loss)
    return hasher.result()


def pieces(lengths: list[int], seed: int = 0, vocab: int = 50_000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).astype(np.uint32) for n in lengths]


def stream(parts: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    return np.concatenate(parts), np.cumsum([len(p) for p in parts]).tolist()


def test_the_contents_are_those_of_the_pieces_in_any_order() -> None:
    parts = pieces([5, 1, 300, 7_000, 2, 2])
    whole = contents(*stream(parts))
    assert (whole.pieces, whole.tokens) == (6, sum(map(len, parts)))
    assert contents(*stream(parts[::-1])) == whole
    assert Contents.total(contents(p, [len(p)]) for p in parts) == whole
    tokens, ends = stream(parts)
    assert contents(tokens, [0, *ends[:2], ends[1], *ends[2:]]) == whole  # empty pieces hold nothing
    for block in (3, 4096):  # read in blocks, a piece spanning many
        assert stream_contents(lambda a, b: (tokens[a:b], None), [(np.asarray(ends), len(tokens))], block) == [whole]


def test_streams_end_to_end_hashed_in_one_pass_each_have_their_own_contents() -> None:
    streams = [stream(pieces(lengths, seed)) for seed, lengths in enumerate([[3], [1, 1, 2], [700, 5], [9]])]
    streams[1][1].insert(0, 0)  # an entry at its start, and two equal ones: empty pieces, which hold nothing
    streams[2][1].insert(1, streams[2][1][0])
    sizes = [len(tokens) for tokens, _ in streams]
    starts = np.cumsum(sizes) - sizes
    cuts = np.concatenate([np.asarray(ends, np.int64) + at for (_, ends), at in zip(streams, starts, strict=True)])
    firsts = np.cumsum([len(ends) for _, ends in streams]) - [len(ends) for _, ends in streams]
    tokens = np.concatenate([tokens for tokens, _ in streams])
    loss = np.random.default_rng(9).integers(0, 2, len(tokens)).astype(np.uint8)
    alone = [contents(t, e, loss[a : a + len(t)]) for (t, e), a in zip(streams, starts, strict=True)]
    assert contents_each(tokens, loss, cuts, firsts) == alone
    assert contents_each(tokens, None, cuts, firsts) == [contents(t, e) for t, e in streams]


def test_small_segments_read_together_hold_what_each_holds_read_alone() -> None:
    segments = [
        Loaded(tokens, np.asarray(ends, np.uint64), loss)
        for (tokens, ends), loss in [
            (stream(pieces([4, 2], 1)), None),
            (stream(pieces([1], 2)), np.zeros(1, np.uint8)),
            ((np.zeros(0, np.uint32), []), None),  # no token: read alone
            ((pieces([6], 3)[0], [4, 2]), None),  # its index goes back (damaged): read alone
            ((pieces([6], 4)[0], [3]), None),  # tokens after its index: read alone
            (stream(pieces([3, 5, 1], 5)), np.array([1, 0, 1, 1, 1, 0, 1, 1, 0], np.uint8)),
        ]
    ]
    for plain in (False, True):
        together = Held.read_many(segments, plain=plain)
        alone = [Held.read(segment, plain=plain) for segment in segments]
        for a, b in zip(together, alone, strict=True):
            facts = [(h.top, h.loss_top, h.loss_ones, h.contents, h.plain) for h in (a, b)]
            assert facts[0] == facts[1]
            assert a.segment is b.segment and np.array_equal(a.ends, b.ends)


@pytest.mark.parametrize(
    "fault",
    [
        "a piece twice, another never",
        "a boundary moved",
        "two pieces joined",
        "two tokens swapped in a piece",
        "a token changed",
        "a loss byte flipped",
    ],
)
def test_any_change_to_the_pieces_changes_the_contents(fault: str) -> None:
    tokens, ends = stream(pieces([40, 40, 40, 40, 2000]))
    loss = np.ones(len(tokens), np.uint8)
    whole = contents(tokens, ends, loss)
    if fault == "a piece twice, another never":
        tokens[40:80] = tokens[0:40]
    elif fault == "a boundary moved":
        ends[1] += 1
    elif fault == "two pieces joined":
        del ends[0]
    elif fault == "two tokens swapped in a piece":
        tokens[[200, 1100]] = tokens[[1100, 200]]
    elif fault == "a token changed":
        tokens[1500] += 1
    else:
        loss[7] = 0
    assert contents(tokens, ends, loss) != whole


def duplicating(move):
    """``move_units`` that writes the first unit again in place of the last: one piece twice and one never, the
    shape of the empty-index bug (in a block of its own, which the engine's overlap check cannot see)."""

    def faulty(pool, source, starts, ends, writer, *args, **kwargs):
        source, starts, ends = (np.asarray(a) for a in (source, starts, ends))
        if len(starts) < 2:
            return move(pool, source, starts, ends, writer, *args, **kwargs)
        move(pool, source[:-1], starts[:-1], ends[:-1], writer, *args, **kwargs)
        return move(pool, source[:1], starts[:1], ends[:1], writer, *args, **kwargs)

    return faulty


@pytest.mark.parametrize("chunks", [None, 512])
def test_pass_2_that_loses_a_document_publishes_nothing(tmp_path, monkeypatch, sample_corpus, sample_tokenizer, chunks):
    module = moves if chunks else document_shuffle
    monkeypatch.setattr(module, "move_units", duplicating(module.move_units))
    with pytest.raises(ShuffleCheckFailed, match=r"^rank 0: (pass 2|the chunk shuffle) wrote other pieces than it"):
        run([sample_corpus], tmp_path, sample_tokenizer, seed=1, shuffle_chunk_size=chunks)
    assert not list(tmp_path.glob("*.ds")) and not list(tmp_path.glob("_completions/*"))


def test_a_merge_that_loses_a_document_publishes_nothing(tmp_path, monkeypatch, sample_corpus, sample_tokenizer):
    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=1, save_loss=True)
    monkeypatch.setattr(merge_moves, "move_units", duplicating(merge_moves.move_units))
    with pytest.raises(ShuffleCheckFailed, match=r"^merge merged wrote other pieces than it read"):
        merged(tmp_path / "ranks", tmp_path / "merged", seed=2, save_loss=True, merge_max_tokens_per_file=5_000)
    assert not list((tmp_path / "merged").glob("*.ds*")) and not list((tmp_path / "merged").glob("_manifests/*"))


@pytest.mark.parametrize("mode", ["windows", "windows, input without records", "packed"])
def test_a_context_shuffle_that_loses_a_window_publishes_nothing(
    tmp_path, monkeypatch, sample_corpus, sample_tokenizer, mode
):
    """Proved by joining the windows again into the input's recorded documents, or by reading the input again."""
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=1, save_loss=True)
    if mode.endswith("without records"):  # as datatrove's files come
        shutil.rmtree(tmp_path / "ranks" / "_manifests")
    monkeypatch.setattr(context_shuffle, "move_units", duplicating(context_shuffle.move_units))
    config = ContextShuffleConfig(
        input=str(tmp_path / "ranks"),
        output=str(tmp_path / "context"),
        context_window=257,
        context_mode=mode.split(",")[0],
        pad_id=0,
    )
    with pytest.raises(ShuffleCheckFailed, match=r"^context shuffle of .*00000_00000_doc_shuffled.ds wrote other"):
        context_shuffle.context_shuffle(config)
    assert not list((tmp_path / "context").glob("*.ds*"))


def test_verify_hashes_the_pieces_again(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """An index entry moved by one token, every size kept and every checksum rewritten to match: only the
    contents can tell, and verify (without a tokenizer, so no EOS check) does."""
    run([sample_corpus], tmp_path, sample_tokenizer, seed=1)
    assert verify(Folder(str(tmp_path))).ok
    (index,) = tmp_path.glob("*.ds.index")
    ends = np.fromfile(index, "<u8")
    ends[3] += 1
    ends.tofile(index)
    manifest_path, marker_path = tmp_path / "_manifests" / "00000.json", tmp_path / "_completions" / "00000.json"
    manifest, marker = json.loads(manifest_path.read_text()), json.loads(marker_path.read_text())
    resum(manifest["outputs"][0]["files"][index.name], index.read_bytes())
    resum(marker["files"][index.name], index.read_bytes())
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    marker["sha256"] = hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    marker_path.write_text(json.dumps(marker, sort_keys=True))
    recorded = ContentsSum(**manifest["outputs"][0]["contents"]).value
    (ds,) = tmp_path.glob("*.ds")
    held = contents(np.fromfile(ds, "<u2"), ends.astype(np.int64))
    assert held != recorded
    problems = verify(Folder(str(tmp_path))).problems
    assert problems == [f"{ds}: holds {held.describe()}, its manifest records {recorded.describe()}"]


def test_the_books_link_the_stages(tmp_path, sample_corpus, sample_tokenizer) -> None:
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path),
        tokenizer=str(sample_tokenizer),
        eos_token=EOS,
        seed=3,
        num_ranks=2,
        context_window=1025,
        num_context_shards=2,
        merge_max_tokens_per_file=20_000,
    )
    record: BuildRecord = Build.start(config, "books").run().record
    stages = record.stages
    read = stages.tokenize.contents_in
    assert read is not None and stages.merge is not None and stages.context_shuffle is not None
    assert stages.context_shuffle.contents_out is not None
    assert read.pieces == record.conservation.docs_out and read.tokens == record.stages.tokenize.tokens
    assert stages.tokenize.contents_out == read == stages.merge.contents_in == stages.merge.contents_out
    assert stages.context_shuffle.contents_in == read and stages.context_shuffle.contents_out.tokens == read.tokens
    contents_flow(stages.tokenize, stages, chunked=False)
    other = ContentsSum.of(replace(read.value, sum=read.value.sum ^ 1))
    with pytest.raises(BuildError, match=r"^the merge read .* but the ranks wrote .*: a piece was lost, duplicated"):
        contents_flow(stages.tokenize, replace(stages, merge=replace(stages.merge, contents_in=other)), chunked=False)
    with pytest.raises(BuildError, match=r"^the context shuffle read .* but the merge wrote"):
        broken = replace(stages.context_shuffle, contents_in=other)
        contents_flow(stages.tokenize, replace(stages, context_shuffle=broken), chunked=False)


def test_a_rank_smaller_than_a_chunk_with_its_tail_dropped_writes_nothing(tmp_path, sample_corpus, sample_tokenizer):
    done = run([sample_corpus], tmp_path, sample_tokenizer, shuffle_chunk_size=10**9, drop_last_chunk=True)
    counts = done["counts"]
    assert done["outputs"] == [] and counts["tokens_dropped"] == counts["tokens"] > 0
    assert counts["contents_out"] == {"pieces": 0, "tokens": 0, "sum": "0" * 16}


class Windowed:
    """A stream of ``documents`` random documents (a document ending on a window's edge, one across four windows,
    empty ones), cut into windows of 997 tokens and their pieces (``rejoin.Cuts``, walked in spans of ``span``),
    the tail after the last window dropped and hashed alone, as a context shuffle does."""

    window = 997

    def __init__(self, folder: Path, documents: int, span: int = rejoin.SPAN, length: int = 100_000) -> None:
        self.folder, self.written = folder, 0  # where each shuffle's writer keeps its pieces, one folder each
        rng = np.random.default_rng(1)
        self.tokens = rng.integers(0, 50_000, length).astype(np.uint16)
        self.loss = rng.integers(0, 2, length).astype(np.uint8)
        index = np.append(np.sort(rng.integers(1, length, documents)), length)
        index = np.union1d(index[(index < 1994) | (index > 6000)], [1994, 6000])
        self.index = np.sort(np.append(index, index[:3]))
        self.edges = np.arange(self.window, length + 1, self.window)
        self.cuts = rejoin.Cuts(self.index, self.edges, span)
        self.kept = int(self.edges[-1])
        behind = self.cuts.after(self.kept)
        tail = ContentsHasher(keep=np.arange(len(behind)))
        tail.add(self.tokens[self.kept :], behind - self.kept, self.loss[self.kept :])
        tail.result()
        self.tail = tail.kept_pieces()
        self.documents = contents(self.tokens, self.index, self.loss)

    def shuffled(self, order: np.ndarray, swap: tuple[int, int] | None = None):
        """The windows written in ``order`` (with ``swap``, two windows' bytes exchanged, their index kept), each
        cut at the cuts inside it, the pieces the proof keeps kept (on disk, as a writer keeps them)."""
        window, every = self.window, self.cuts.every()
        starts, ends = self.edges[order] - window, self.edges[order]
        plan = rejoin.cut_pieces(self.cuts, starts, ends)
        assert len(plan.chosen) <= 2 * len(order)
        self.written += 1
        parts = KeptPieces(self.folder / str(self.written), plan.chosen, plan.numbers, plan.counts.every)
        hasher = ContentsHasher(keep=plan.chosen, into=parts.add)
        exchanged = dict(zip(swap, swap[::-1], strict=True)) if swap else {}
        for a, b in zip(starts, ends, strict=True):
            w = exchanged.get(a // window, a // window) * window  # where its bytes are read
            hasher.add(self.tokens[w : w + window], every[(every > a) & (every <= b)] - a, self.loss[w : w + window])
        written = hasher.result()
        parts.sealed()
        return written, parts, plan.counts

    def rejoined(self, written: Contents, parts: KeptPieces, counts: rejoin.PieceCounts) -> Contents | None:
        return rejoin.rejoined_contents(written, parts.reader(), counts, self.cuts, self.tail)


@pytest.mark.parametrize(("span", "bucket"), [(rejoin.SPAN, kept.BUCKET), (16, kept.BUCKET), (16, 8)])
def test_pieces_cut_smaller_and_shuffled_join_again_into_the_documents(
    byte_path, tmp_path, monkeypatch, span, bucket
) -> None:
    """What a context shuffle proves without reading its input again: the pieces it wrote that window edges cut (two
    a window at most), put back in the input's order and joined at the input's index with the dropped tail, stand
    for the input's documents they were cut from, and the whole is the input's documents' contents; the same when
    the cuts are walked in many spans (16 entries each) as in one, and when the kept pieces wait in many bucket
    files (8 numbers each) as in one."""
    monkeypatch.setattr(kept, "BUCKET", bucket)
    stream = Windowed(tmp_path, 300, span)
    assert stream.cuts.every().tolist() == np.union1d(stream.index, stream.edges).tolist()
    assert len(list(stream.cuts.spans())) == 1 if span == rejoin.SPAN else len(list(stream.cuts.spans())) > 10
    order = np.random.default_rng(2).permutation(len(stream.edges))
    written, parts, counts = stream.shuffled(order)
    files = len(list(parts.folder.iterdir()))
    assert files == 1 if bucket > counts.every else files > 10
    every = stream.cuts.every()
    assert written == contents(stream.tokens[: stream.kept], every[every <= stream.kept], stream.loss[: stream.kept])
    assert stream.rejoined(written, parts, counts) == stream.documents
    assert stream.rejoined(*stream.shuffled(order, swap=(0, 1))) != stream.documents  # two windows' bytes exchanged
    assert stream.rejoined(*stream.shuffled(np.append(order[:-1], order[0]))) != stream.documents  # one twice


@pytest.mark.parametrize("fault", ["swap", "twice"])
def test_a_fault_in_a_later_span_of_the_cuts_is_caught(byte_path, tmp_path, fault) -> None:
    """Windows far into the stream, whose cuts are walked in a later span than the first: two of their bytes
    exchanged, or one written twice and its neighbour never, do not join again into the documents."""
    stream = Windowed(tmp_path, 3_000, span=64)
    spans = list(stream.cuts.spans())
    late = int(np.searchsorted(stream.edges, spans[len(spans) // 2].lo))  # a window of a middle span
    assert late > 2 * len(stream.edges) // 5
    order = np.arange(len(stream.edges))
    if fault == "swap":
        shuffled = stream.shuffled(order, swap=(late, late + 1))
    else:
        shuffled = stream.shuffled(np.where(order == late + 1, late, order))
    assert stream.rejoined(*stream.shuffled(order)) == stream.documents
    assert stream.rejoined(*shuffled) != stream.documents


def test_the_proofs_working_memory_does_not_grow_with_the_documents_of_a_file(tmp_path) -> None:
    """The same windows over a hundred times the documents: the join holds a span of the cuts at a time, so what it
    allocates beyond its inputs grows by less than the index it walks (8 bytes a document), where holding the cuts
    whole takes that and more."""
    peaks = []
    for documents in (300, 30_000):
        stream = Windowed(tmp_path / str(documents), documents, span=256)
        order = np.random.default_rng(2).permutation(len(stream.edges))
        shuffled = stream.shuffled(order)
        tracemalloc.start()
        try:
            assert stream.rejoined(*shuffled) == stream.documents
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] - peaks[0] < 8 * 30_000 / 4, peaks


def test_a_context_shuffle_refuses_an_input_that_is_not_the_file_its_stage_wrote(
    tmp_path, sample_corpus, sample_tokenizer
):
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=1, save_loss=True)
    (ds,) = (tmp_path / "ranks").glob("*.ds")
    tokens = np.fromfile(ds, "<u2")
    tokens[[10, 20]] = tokens[[20, 10]]  # two tokens of a document swapped: sizes, ids and EOS all as before
    tokens.tofile(ds)
    config = ContextShuffleConfig(input=str(tmp_path / "ranks"), output=str(tmp_path / "context"), context_window=257)
    with pytest.raises(TokenFileError, match=rf"^{ds}: holds .* its manifest records .*: it is not the file its stage"):
        context_shuffle.context_shuffle(config)
    assert not list((tmp_path / "context").glob("*.ds*"))


def test_cuts_of_an_index_out_of_order_are_walked_to_its_end() -> None:
    """A damaged file's index, entries out of order where a span ends: the walk still ends, every entry walked once
    (the proof then fails, and the file read again names it)."""
    index = np.arange(1, 101, dtype=np.int64)
    index[15] = 0  # the first span's last entry, below where the span starts
    cuts = rejoin.Cuts(index, np.array([50, 100]), span=16)
    assert sum(len(span.entries) for span in cuts.spans()) == len(index)


def test_kept_pieces_start_afresh_and_a_piece_never_kept_fails_the_join(byte_path, tmp_path) -> None:
    """A crashed attempt's bucket files are not appended to; and a plan that names a piece past the stream's end
    (so that its writer never kept it) does not join into the documents."""
    stream = Windowed(tmp_path, 300)
    stale = tmp_path / "1"
    stale.mkdir()
    (stale / "000000").write_bytes(b"\0" * kept.RECORD.itemsize)  # one record a crashed writer left
    order = np.random.default_rng(2).permutation(len(stream.edges))
    written, parts, counts = stream.shuffled(order)
    assert parts.folder == stale and stream.rejoined(written, parts, counts) == stream.documents
    plan = rejoin.cut_pieces(stream.cuts, stream.edges[order] - stream.window, stream.edges[order])
    more = KeptPieces(tmp_path / "more", np.append(plan.chosen, 10**9), np.append(plan.numbers, 1), 1)
    hasher = ContentsHasher(keep=more.chosen, into=more.add)
    every = stream.cuts.every()
    for a in stream.edges[order] - stream.window:
        b = a + stream.window
        hasher.add(stream.tokens[a:b], every[(every > a) & (every <= b)] - a, stream.loss[a:b])
    written = hasher.result()
    more.sealed()
    assert (
        len(more) == len(plan.chosen)
        and rejoin.rejoined_contents(written, more.reader(), plan.counts, stream.cuts, stream.tail) is None
    )


def test_a_merge_input_changed_since_its_record_is_named_not_called_a_bug(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    """The merge proves its files from its inputs' records: one token of a rank file changed after its stage wrote
    it is refused naming that file, not reported as a bug of the merge, and nothing is published."""
    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=1, save_loss=True)
    changed = sorted((tmp_path / "ranks").glob("*.ds"))[1]
    data = bytearray(changed.read_bytes())
    data[1001] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.raises(TokenFileError, match=rf"^{changed}: holds .*: it is not the file its stage wrote$"):
        merged(tmp_path / "ranks", tmp_path / "merged", seed=2, save_loss=True, merge_max_tokens_per_file=5_000)
    assert not list((tmp_path / "merged").glob("_manifests/*"))
