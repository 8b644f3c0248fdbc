"""Properties of the byte-moving engine, for any document lengths, orders, chunk sizes and block sizes."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenization.formats import moves, native, source_pool
from tokenization.formats.ds import SplitWriter, TokenFile, TokenFileWriter
from tokenization.formats.moves import fixed_units, permute_units
from tokenization.formats.source_pool import SourcePool

lengths_st = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60)


def _corpus(lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens that name their document (doc i is all ``i``), loss bytes that name the position's parity."""
    tokens = np.repeat(np.arange(len(lengths)), lengths)
    loss = (np.arange(len(tokens)) % 2).astype(np.uint8)
    return tokens, loss, np.cumsum(lengths)


# Every way a block reads a source: one span read, one pread a unit; and puts its units in order: the C helper's
# copies (where it can be built), or the numpy path's (Arrow's take).
READ_PATHS: dict[str, dict[str, Any]] = {
    "span": {"SPAN_READ_MAX_WASTE": 10**9},
    "pread": {"SPAN_READ_MAX_WASTE": 0},
}
read_paths = st.sampled_from([f"{read}-{put}" for read in sorted(READ_PATHS) for put in ("c", "numpy")])


def _permute(tmp_path, tokens, loss, ends, order, inner=None, block=1 << 20, max_tokens=None, path="pread-c"):
    for old in tmp_path.glob("*.ds*"):
        old.unlink()
    with TokenFileWriter(tmp_path / "src.ds", tokenizer="t", token_size=2, save_loss=True) as source:
        source.write(tokens, np.asarray(ends), loss)
    writer = SplitWriter(
        tmp_path, lambda s: f"out{s:03d}.ds", tokenizer="t", token_size=2, save_loss=True, max_tokens=max_tokens
    )
    assert source.written is not None
    pool = SourcePool([str(source.written.path)], 2, with_loss=True)
    read, put = path.split("-")
    helper = native.helper if put == "c" else lambda: None
    with pool, writer, patch.multiple(moves, **READ_PATHS[read]), patch.object(native, "helper", helper):
        permute_units(pool, ends, order, writer, inner_ends=inner, block_tokens=block)
    files = [TokenFile(str(w.path)) for w in writer.written]
    out_tokens = np.concatenate([np.asarray(f.tokens) for f in files])
    out_loss = np.concatenate([np.asarray(f.loss) for f in files])
    offsets = np.cumsum([0] + [f.num_tokens for f in files])
    out_ends = np.concatenate([np.asarray(f.ends, dtype=np.int64) + o for f, o in zip(files, offsets, strict=False)])
    return out_tokens, out_loss, out_ends


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seed=st.integers(0, 2**32 - 1), block=st.integers(1, 64), path=read_paths)
def test_document_shuffle_preserves_documents_and_loss_alignment(tmp_path_factory, lengths, seed, block, path) -> None:
    tmp_path = tmp_path_factory.mktemp("p")
    tokens, loss, ends = _corpus(lengths)
    order = np.random.default_rng(seed).permutation(len(lengths))
    out_tokens, out_loss, out_ends = _permute(tmp_path, tokens, loss, ends, order, block=block, path=path)
    docs = np.split(out_tokens, out_ends[:-1])
    assert [int(d[0]) for d in docs] == order.tolist()  # document j of the output is input document order[j]
    assert all((d == d[0]).all() and len(d) == lengths[d[0]] for d in docs)  # whole, in one piece
    starts = np.concatenate([[0], ends[:-1]])
    expected_loss = np.concatenate([loss[starts[i] : ends[i]] for i in order])
    assert np.array_equal(out_loss, expected_loss)  # loss bytes moved with their tokens


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths_st,
    seed=st.integers(0, 2**32 - 1),
    chunk=st.integers(1, 50),
    block=st.integers(1, 64),
    max_tokens=st.one_of(st.none(), st.integers(1, 100)),
    path=read_paths,
)
def test_chunk_shuffle_moves_every_document_end_with_its_chunk(
    tmp_path_factory, lengths, seed, chunk, block, max_tokens, path
) -> None:
    tmp_path = tmp_path_factory.mktemp("c")
    tokens, loss, doc_ends = _corpus(lengths)
    chunk_ends, full = fixed_units(len(tokens), chunk)
    order = np.random.default_rng(seed).permutation(full)
    if len(chunk_ends) > full:
        order = np.append(order, full)  # the kept tail
    out_tokens, out_loss, out_ends = _permute(
        tmp_path, tokens, loss, chunk_ends, order, doc_ends, block, max_tokens, path
    )
    pieces = [np.arange(k * chunk, min((k + 1) * chunk, len(tokens))) for k in order]
    source_positions = np.concatenate(pieces)
    assert np.array_equal(out_tokens, tokens[source_positions])
    assert np.array_equal(out_loss, loss[source_positions])
    expected_ends = set(np.cumsum([len(p) for p in pieces]).tolist())
    out_start = 0
    for piece in pieces:
        expected_ends |= {int(e) - int(piece[0]) + out_start for e in doc_ends if piece[0] < e <= piece[-1]}
        out_start += len(piece)
    assert out_ends.tolist() == sorted(expected_ends)


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, seed=st.integers(0, 2**32 - 1), block=st.integers(1, 64))
def test_some_pieces_hash_as_a_stream_of_them_alone(tmp_path_factory, lengths, seed, block) -> None:
    """A rank that moves a mixture's chosen documents hashes those, read alone: the same contents as a file that
    holds them end to end, with their sources, whatever the block."""
    tmp_path = tmp_path_factory.mktemp("p")
    tokens, loss, ends = _corpus(lengths)
    rng = np.random.default_rng(seed)
    chosen = np.flatnonzero(rng.random(len(lengths)) < 0.5)
    sources = rng.integers(0, 3, len(chosen))
    starts = np.concatenate([[0], ends[:-1]])
    with TokenFileWriter(tmp_path / "src.ds", tokenizer="t", token_size=2, save_loss=True) as source:
        source.write(tokens, np.asarray(ends), loss)
    parts = [np.arange(starts[k], ends[k]) for k in chosen]
    alone = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    with TokenFileWriter(tmp_path / "alone.ds", tokenizer="t", token_size=2, save_loss=True) as only:
        only.write(tokens[alone], np.cumsum([len(p) for p in parts]).astype(np.int64), loss[alone])
    assert source.written is not None and only.written is not None
    with SourcePool([str(source.written.path), str(only.written.path)], 2, with_loss=True) as pool:
        found = source_pool.pieces_contents(pool, 0, starts[chosen], ends[chosen], sources, block=block)
        (expected,) = source_pool.contents_of(
            pool, 1, (np.cumsum([len(p) for p in parts]), len(alone)), sources=[sources]
        )
    assert found == expected and found.pieces == len(chosen)


def test_a_block_buffer_is_given_again_only_once_nothing_holds_it() -> None:
    """A block's bytes go to a buffer no writer thread still writes or hashes: while any view of it lives (a slice,
    another dtype, a memoryview), another block gets another buffer; once none does, its buffer serves again."""
    blocks = source_pool.Blocks()
    first = blocks.take(1000)
    address = first.ctypes.data
    held = [first.view(np.uint16)[3:], memoryview(first[10:].data)]
    del first
    while held:
        assert blocks.take(800).ctypes.data != address
        held.pop()
    assert blocks.take(800).ctypes.data == address


def test_blocks_are_gathered_two_at_once_and_handed_on_in_their_order() -> None:
    """The moves gather two blocks at once (their reads release the GIL) and never more ahead of the writer; the
    writer takes them in their order, and a block that fails to gather fails the move where it comes, after the
    blocks before it."""
    running, most, made = [0], [0], list[int]()
    lock = threading.Lock()

    def gathered(k: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            made.append(k)
        time.sleep(0.002 * (k % 3))  # later blocks often done first
        with lock:
            running[0] -= 1
        if k == 7:
            raise ValueError("block 7 cannot be read")
        return k

    taken: list[int] = []
    with pytest.raises(ValueError, match="block 7"):
        for k in moves._ahead((partial(gathered, k) for k in range(12)), moves.GATHERED_AT_ONCE):
            assert len(made) <= len(taken) + 1 + moves.GATHERED_AT_ONCE  # this one, and two ahead at most
            taken.append(k)
    assert taken == list(range(7)) and most[0] == moves.GATHERED_AT_ONCE
