"""Packed context windows. Best-Fit Decreasing by length classes (tokenization/formats/packing.py) packs exactly as
the textbook rule does, one piece after another, and cuts only the documents longer than a window; the context
shuffle's packed mode keeps every document's tokens and loss, pads at loss 0, and a build adds up its real tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.builds import in_process
from tests.support.references import in_trainer_env
from tests.support.tokenizers import EOS
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFile, TokenFileError, TokenFileWriter
from tokenization.formats.packing import Pieces, best_fit_decreasing, pack
from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle
from tokenization.tokenizer.loading import TokenizerFile


def one_by_one(lengths: np.ndarray, capacity: int, seed: int) -> tuple[np.ndarray, int]:
    """The rule as written: pieces longest first (ties in the seeded order), each into the window with the least
    room that fits it, else a new one."""
    shuffled = np.random.default_rng(seed).permutation(len(lengths))
    rooms: list[int] = []
    windows = np.empty(len(lengths), np.int64)
    for i in shuffled[np.argsort(-lengths[shuffled], kind="stable")]:
        fits = [w for w, room in enumerate(rooms) if room >= lengths[i]]
        if fits:
            best = min(fits, key=lambda w: rooms[w])
        else:
            rooms.append(capacity)
            best = len(rooms) - 1
        rooms[best] -= int(lengths[i])
        windows[i] = best
    return windows, len(rooms)


def fills(windows: np.ndarray, lengths: np.ndarray, count: int) -> list[int]:
    return sorted(np.bincount(windows, weights=lengths, minlength=count).astype(int).tolist())


@pytest.mark.parametrize("trial", range(200))
def test_it_packs_as_the_rule_does_one_piece_after_another(trial: int) -> None:
    rng = np.random.default_rng(trial)
    capacity = int(rng.integers(1, 70))
    lengths = rng.integers(1, capacity + 1, int(rng.integers(0, 120)))
    packing = best_fit_decreasing(lengths, capacity, seed=trial)
    windows, count = one_by_one(lengths, capacity, seed=trial)
    assert packing.count == count
    assert fills(packing.windows, lengths, packing.count) == fills(windows, lengths, count)
    assert np.all(packing.fill(lengths) <= capacity) and np.all(packing.fill(lengths) > 0)
    assert sorted(packing.order.tolist()) == list(range(len(lengths)))
    placed = np.empty_like(packing.order)
    placed[packing.order] = np.arange(len(lengths))
    by_window = np.lexsort((placed, packing.windows))  # a window's pieces in placement order: longest first
    same = packing.windows[by_window][1:] == packing.windows[by_window][:-1]
    assert np.all(lengths[by_window][1:][same] <= lengths[by_window][:-1][same])


def test_the_same_seed_gives_the_same_packing_and_another_seed_another_one() -> None:
    lengths = np.random.default_rng(0).integers(1, 300, 5_000)
    one, again, other = (best_fit_decreasing(lengths, 2049, seed) for seed in (7, 7, 8))
    assert np.array_equal(one.windows, again.windows) and np.array_equal(one.order, again.order)
    assert not np.array_equal(one.windows, other.windows)
    assert one.count == other.count  # ties broken otherwise, the same windows filled


def test_realistic_documents_leave_almost_no_padding() -> None:
    lengths = np.clip(np.random.default_rng(1).lognormal(5.5, 1.0, 50_000).astype(np.int64), 1, 2049)
    packing = best_fit_decreasing(lengths, 2049, seed=0)
    assert packing.count == -(-int(lengths.sum()) // 2049)  # no window more than the tokens need


def test_pieces_leave_a_document_that_fits_whole_and_cut_a_longer_one_into_windows() -> None:
    lengths = np.array([5, 10, 11, 1, 25, 30])
    pieces = Pieces.of_documents(np.cumsum(lengths), 10)
    assert pieces.lengths.tolist() == [5, 10, 10, 1, 1, 10, 10, 5, 10, 10, 10]
    assert pieces.starts.tolist() == [0, 5, 15, 25, 26, 27, 37, 47, 52, 62, 72]
    assert np.array_equal(pieces.ends, pieces.starts + pieces.lengths)
    assert (pieces.whole, pieces.split, pieces.split_pieces) == (3, 3, 8)  # ceil(n / window) pieces, never more
    empty = Pieces.of_documents(np.array([3, 3, 25]), 10)  # an empty entry is no piece
    assert empty.starts.tolist() == [0, 3, 13, 23] and empty.lengths.tolist() == [3, 10, 10, 2]


def test_a_piece_longer_than_a_window_or_empty_is_refused() -> None:
    with pytest.raises(ValueError, match=r"piece lengths must be 1\.\.10, got 1\.\.11"):
        best_fit_decreasing(np.array([1, 11]), 10, seed=0)
    with pytest.raises(ValueError, match=r"piece lengths must be 1\.\.10, got 0\.\.3"):
        best_fit_decreasing(np.array([0, 3]), 10, seed=0)
    assert best_fit_decreasing(np.array([], dtype=np.int64), 10, seed=0).count == 0


def test_a_packed_file_is_every_piece_once_and_windows_of_exactly_the_capacity() -> None:
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(4.0, 1.2, 3_000).astype(np.int64), 1, 700)
    doc_ends = np.cumsum(lengths)
    packed = pack(doc_ends, 256, np.random.default_rng(5))
    real = packed.source == 0
    assert sorted(zip(packed.starts[real].tolist(), packed.ends[real].tolist(), strict=True)) == sorted(
        zip(packed.pieces.starts.tolist(), packed.pieces.ends.tolist(), strict=True)
    )
    out_ends = np.cumsum(packed.ends - packed.starts)
    assert out_ends[-1] == packed.windows * 256
    assert np.isin(np.arange(1, packed.windows + 1) * 256, out_ends).all()  # no unit crosses a window's end
    pads = ~real
    assert np.array_equal(
        packed.starts[pads],
        np.cumsum(packed.ends[pads] - packed.starts[pads]) - (packed.ends[pads] - packed.starts[pads]),
    )  # padding ranges end to end: no two overlap
    assert (
        packed.padding_tokens == int((packed.ends - packed.starts)[pads].sum()) == packed.windows * 256 - lengths.sum()
    )
    again = pack(doc_ends, 256, np.random.default_rng(5))
    assert np.array_equal(again.starts, packed.starts) and np.array_equal(again.source, packed.source)


PAD = 999_999_999


def unique_tokens(folder: Path, lengths: list[np.ndarray]) -> Path:
    """Rank files whose every token names its document and place (``doc * 100_000 + i``), loss on every other."""
    folder.mkdir(parents=True)
    for f, doc_lengths in enumerate(lengths):
        tokens = np.concatenate([d * 100_000 + np.arange(n) for d, n in enumerate(doc_lengths)])
        writer = TokenFileWriter(
            folder / f"{f:05d}_00000_doc_shuffled.ds", tokenizer="tok", token_size=4, save_loss=True
        )
        writer.write(tokens, np.cumsum(doc_lengths), (tokens % 2).astype(np.uint8))
        writer.close()
    return folder


def packed_shuffle(inputs: Path, output: Path, window: int, seed: int = 3) -> dict:
    config = ContextShuffleConfig(
        input=str(inputs),
        output=str(output),
        seed=seed,
        context_window=window,
        context_mode="packed",
        pad_id=PAD,
        pad_token="<pad>",
    )
    return context_shuffle(config).to_json()


def test_packed_windows_hold_every_document_whole_or_in_window_sized_pieces(tmp_path) -> None:
    rng = np.random.default_rng(11)
    lengths = [rng.integers(1, 5_000, 1_500), np.clip(rng.lognormal(5.5, 1.1, 2_000).astype(np.int64), 1, 9_000)]
    inputs = unique_tokens(tmp_path / "in", lengths)
    result = packed_shuffle(inputs, tmp_path / "out", 2049)
    padding = whole = split = pieces_of_split = 0
    for path, doc_lengths in zip(sorted(inputs.glob("*.ds")), lengths, strict=True):
        out = TokenFile(str(tmp_path / "out" / path.name))
        tokens, loss, ends = np.asarray(out.tokens), np.asarray(out.loss), np.asarray(out.ends, dtype=np.int64)
        assert len(tokens) % 2049 == 0  # every window exactly full
        assert set(range(2049, len(tokens) + 1, 2049)) <= set(ends.tolist())  # and its end an index entry
        pads = tokens == PAD
        assert not loss[pads].any() and np.array_equal(loss[~pads], tokens[~pads] % 2)  # real tokens keep their loss
        padding += int(pads.sum())
        starts = np.concatenate([[0], ends[:-1]])
        runs: dict[int, list[np.ndarray]] = {}
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            run = tokens[a:b]
            if run[0] == PAD:
                assert (run == PAD).all() and b % 2049 == 0  # padding fills a window's end
                continue
            assert a // 2049 == (b - 1) // 2049  # no piece crosses a window's edge
            assert np.array_equal(run, run[0] + np.arange(len(run)))  # a piece is its document's tokens, in order
            runs.setdefault(int(run[0]) // 100_000, []).append(run)
        assert sorted(runs) == list(range(len(doc_lengths)))
        for doc, found in runs.items():
            n = int(doc_lengths[doc])
            joined = np.sort(np.concatenate(found))
            assert np.array_equal(joined, doc * 100_000 + np.arange(n))  # every token once
            assert len(found) == (1 if n <= 2049 else -(-n // 2049))  # whole when it fits, else ceil(n / window)
            whole += n <= 2049
            split += n > 2049
            pieces_of_split += len(found) if n > 2049 else 0
    counts = result["counts"]
    assert (counts["documents_whole"], counts["documents_split"], counts["split_pieces"]) == (
        whole,
        split,
        pieces_of_split,
    )
    assert counts["padding_tokens"] == padding <= 0.01 * counts["tokens"]
    assert sum(counts["padding_histogram"]) == counts["windows"] == counts["tokens"] // 2049
    assert result["pad"] == {"id": PAD, "token": "<pad>"}
    for output in result["outputs"]:
        assert output["pseudo_ends"] == {"every": 2049, "until": output["tokens"]}  # window ends are not documents'
    again = packed_shuffle(inputs, tmp_path / "again", 2049)
    other = packed_shuffle(inputs, tmp_path / "other", 2049, seed=4)
    names = [p.name for p in sorted(inputs.glob("*.ds"))]
    assert all((tmp_path / "again" / n).read_bytes() == (tmp_path / "out" / n).read_bytes() for n in names)
    assert again["counts"] == counts and other["counts"]["windows"] == counts["windows"]
    assert any((tmp_path / "other" / n).read_bytes() != (tmp_path / "out" / n).read_bytes() for n in names)


READ_WITH_DATATROVE = """
import json, sys
from datatrove.utils.dataset import DatatroveFolderDataset
data = DatatroveFolderDataset(sys.argv[1], seq_len=int(sys.argv[2]) - 1, token_size=4, return_positions=True)
print(json.dumps([{k: v.tolist() for k, v in data[i].items()} for i in range(len(data))]))
"""


def test_datatroves_reader_returns_one_packed_window_a_sample_each_document_from_position_0(tmp_path) -> None:
    rng = np.random.default_rng(5)
    inputs = unique_tokens(tmp_path / "in", [rng.integers(1, 700, 300), rng.integers(1, 300, 200)])
    result = packed_shuffle(inputs, tmp_path / "out", 257)
    samples = json.loads(in_trainer_env(READ_WITH_DATATROVE, str(tmp_path / "out"), "257"))
    windows = np.concatenate([TokenFile(str(p)).tokens for p in sorted((tmp_path / "out").glob("*.ds"))])
    assert len(samples) == result["counts"]["windows"] == len(windows) // 257
    assert np.array_equal([s["input_ids"] for s in samples], windows.reshape(-1, 257))
    for sample in samples:
        tokens, positions = np.array(sample["input_ids"]), np.array(sample["positions"])
        pad = tokens == PAD
        starts = np.flatnonzero((np.diff(tokens, prepend=-1) != 1) & ~(pad & np.roll(pad, 1)) | (np.arange(257) == 0))
        runs = np.diff(np.append(starts, 257))
        assert np.array_equal(positions, np.arange(257) - np.repeat(starts, runs))  # from 0 at a piece or padding
        # and a piece's first position is its place in its document: 0 for every document packed whole
        assert ((tokens[~pad] % 100_000 - positions[~pad]) % 257 == 0).all()


def test_packing_needs_a_pad_and_loss_bytes_and_leaves_no_tail_to_drop(tmp_path) -> None:
    common: dict[str, Any] = {"input": str(tmp_path), "output": str(tmp_path / "out"), "context_mode": "packed"}
    with pytest.raises(UsageError, match="give --pad-id"):
        ContextShuffleConfig(**common)
    with pytest.raises(UsageError, match="no tail to drop"):
        ContextShuffleConfig(**common, pad_id=0, drop_tail=True)
    (tmp_path / "in").mkdir()
    writer = TokenFileWriter(tmp_path / "in" / "a.ds", tokenizer="tok", token_size=2, save_loss=False)
    writer.write(np.arange(10), np.array([4, 10]))
    writer.close()
    with pytest.raises(TokenFileError, match=r"a\.ds\.loss is missing: packed windows pad at loss 0"):
        context_shuffle(ContextShuffleConfig(**common | {"input": str(tmp_path / "in")}, pad_id=0))


@pytest.mark.parametrize("merge", [{}, {"merge_mode": "bucketed", "num_buckets": 3}], ids=["one merge", "bucketed"])
def test_a_packed_build_adds_up_its_real_tokens_apart_from_padding(
    tmp_path, sample_corpus, sample_tokenizer, merge
) -> None:
    settings = {"eos_token": EOS, "num_ranks": 2, "seed": 5, "context_window": 257, "num_context_shards": 2} | merge
    with pytest.raises(UsageError, match="context_mode packed pads windows at loss 0: it needs save_loss"):
        BuildConfig(
            input=str(sample_corpus),
            output=str(tmp_path),
            tokenizer=str(sample_tokenizer),
            context_mode="packed",
            **settings,
        )
    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path),
        tokenizer=str(sample_tokenizer),
        context_mode="packed",
        save_loss=True,
        **settings,
    )
    record = in_process(Build.start(config, "packed")).record
    context = record.stages.context_shuffle
    assert record.verify.ok and record.tokens == context.tokens == context.windows * 257
    assert context.real_tokens == record.stages.merge.tokens == record.stages.tokenize.tokens
    assert context.padding_tokens > 0
    assert context.documents_whole + context.documents_split == record.conservation.docs_out
    manifest = json.loads((Path(record.dataset) / "_manifests" / "context_00000.json").read_text())
    assert manifest["pad"]["token"] == EOS  # the sample tokenizer has no pad token: its EOS pads
    report = json.loads((tmp_path / "packed" / "report.json").read_text())["packing"]
    assert report["padding_tokens"] == context.padding_tokens and report["windows"] == context.windows
    assert sum(row["windows"] for row in report["histogram"]) == context.windows
    page = (tmp_path / "packed" / "report.html").read_text()
    assert 'id="padding-histogram"' in page and f"{context.documents_split:,} longer than a window split" in page
    assert f"{record.tokens:,} ({context.padding_tokens:,} of them padding)" in page


def test_the_pad_is_the_tokenizers_own_pad_token_when_it_names_one(tmp_path, sample_tokenizer) -> None:
    copy = tmp_path / "tok" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(sample_tokenizer.read_bytes())
    assert TokenizerFile.load(str(copy)).pad() is None  # the sample has none: a build pads with its EOS
    eos_id = TokenizerFile.load(str(copy)).tokenizer.token_to_id(EOS)
    (copy.parent / "tokenizer_config.json").write_text(json.dumps({"pad_token": {"content": EOS}}))
    assert TokenizerFile.load(str(copy)).pad() == (EOS, eos_id)
    (copy.parent / "tokenizer_config.json").unlink()
    data = json.loads(copy.read_text())
    data["padding"] = {
        "strategy": "BatchLongest",
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": eos_id,
        "pad_type_id": 0,
        "pad_token": EOS,
    }
    copy.write_text(json.dumps(data))
    assert TokenizerFile.load(str(copy)).pad() == (EOS, eos_id)
