"""The .ds family: byte layout, metadata text, token size, streaming writer, reader and file splitting."""

from __future__ import annotations

import humanize
import numpy as np
import pytest

from tokenization.formats.ds import (
    Metadata,
    SplitWriter,
    TokenFile,
    TokenFileError,
    TokenFileWriter,
    human_count,
    token_size_for_vocab,
)
from tokenization.records import FileSum
from tokenization.storage.checksums import BLAKE3, checksum


@pytest.mark.parametrize(
    "count",
    [
        0,
        1,
        9,
        12,
        999,
        1000,
        1234,
        99_949,
        99_950,
        99_999,
        100_000,
        999_499,
        999_500,
        999_999,
        1_235_000,
        123_456_789,
        10**12,
        2**40,
        10**15,
        10**18,
        10**21,
        10**27,
    ],
)
def test_human_count_matches_humanize(count: int) -> None:
    assert human_count(count) == humanize.metric(count, unit="T")


def test_metadata_text_is_exact_and_parses_with_pipes_in_the_name() -> None:
    meta = Metadata("s3://bucket/tok|v2/tokenizer.json", 4, 1_234_567)
    assert meta.render() == "s3://bucket/tok|v2/tokenizer.json|4\n1234567\n1.23 MT"
    assert Metadata.parse(meta.render()) == meta
    with pytest.raises(TokenFileError, match=r"x\.ds\.metadata: not a token-file metadata"):
        Metadata.parse("garbage", "x.ds.metadata")


@pytest.mark.parametrize(("vocab", "size"), [(50257, 2), (65024, 2), (65536, 2), (65537, 4), (128256, 4)])
def test_token_size_follows_datatrove(vocab: int, size: int) -> None:
    assert token_size_for_vocab(vocab) == size


@pytest.mark.parametrize("token_size", [2, 4])
def test_writer_bytes_are_little_endian_and_headerless(tmp_path, token_size: int) -> None:
    with TokenFileWriter(tmp_path / "x.ds", tokenizer="tok", token_size=token_size, save_loss=True) as writer:
        writer.write(np.array([1, 2, 3]), np.array([2, 3]), np.array([1, 0, 1]))
        writer.write(np.array([65535 if token_size == 2 else 70000]), np.array([1]), np.array([1]))
    written = writer.written

    fmt = "<u2" if token_size == 2 else "<u4"
    expected_tokens = np.array([1, 2, 3, 65535 if token_size == 2 else 70000], dtype=fmt).tobytes()
    assert (tmp_path / "x.ds").read_bytes() == expected_tokens
    assert (tmp_path / "x.ds.index").read_bytes() == np.array([2, 3, 4], dtype="<u8").tobytes()
    assert (tmp_path / "x.ds.loss").read_bytes() == b"\x01\x00\x01\x01"
    assert (tmp_path / "x.ds.metadata").read_text() == f"tok|{token_size}\n4\n4.00 T"
    assert written is not None
    assert written.tokens == 4 and written.index_entries == 3
    checksums = {f.name: f.sum for f in written.files}
    for name in ("x.ds", "x.ds.index", "x.ds.loss", "x.ds.metadata"):
        data = (tmp_path / name).read_bytes()
        assert checksums[name] == FileSum(bytes=len(data), blake3=checksum(data, BLAKE3))


def test_reader_takes_token_size_from_metadata_never_assumes(tmp_path) -> None:
    with TokenFileWriter(tmp_path / "x.ds", tokenizer="tok", token_size=4, save_loss=False) as writer:
        writer.write(np.array([100000, 7, 8]), np.array([1, 3]))
    f = TokenFile(str(tmp_path / "x.ds"))
    assert f.token_size == 4 and f.num_tokens == 3
    assert f.document(0).tolist() == [100000] and f.document(1).tolist() == [7, 8]
    assert f.loss is None
    with pytest.raises(TokenFileError, match="metadata says token_size 4, caller expects 2"):
        TokenFile(str(tmp_path / "x.ds"), token_size=2)
    (tmp_path / "x.ds.metadata").unlink()
    with pytest.raises(TokenFileError, match=r"x\.ds\.metadata is missing: pass the token size explicitly"):
        TokenFile(str(tmp_path / "x.ds"))


def _split(tmp_path, max_tokens, batches):
    with SplitWriter(
        tmp_path, lambda sub: f"part_{sub:05d}.ds", tokenizer="t", token_size=2, save_loss=True, max_tokens=max_tokens
    ) as writer:
        for lengths in batches:
            ends = np.cumsum(lengths)
            tokens = np.arange(ends[-1]) % 50
            writer.write(tokens, ends, ends, np.ones(ends[-1], dtype=np.uint8))
    return writer.written


def test_split_writer_closes_after_the_unit_that_passes_the_limit(tmp_path) -> None:
    written = _split(tmp_path, 10, [[4, 4, 4, 4], [20, 1]])
    # datatrove's rule: 4+4+4 > 10 closes the first file; 4+20 > 10 the second; the last holds what is left.
    assert [w.tokens for w in written] == [12, 24, 1]
    assert [TokenFile(str(w.path)).ends.tolist() for w in written] == [[4, 8, 12], [4, 24], [1]]


def test_split_writer_never_leaves_an_empty_trailing_file(tmp_path) -> None:
    written = _split(tmp_path, 8, [[4, 5]])
    assert [w.tokens for w in written] == [9]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "part_00000.ds",
        "part_00000.ds.index",
        "part_00000.ds.loss",
        "part_00000.ds.metadata",
    ]


def test_split_writer_without_limit_writes_one_file(tmp_path) -> None:
    written = _split(tmp_path, None, [[3, 3], [100]])
    assert len(written) == 1 and written[0].tokens == 106 and written[0].index_entries == 3


def test_split_writer_that_fails_publishes_only_the_files_it_finished(tmp_path) -> None:
    closed = []
    writer = SplitWriter(
        tmp_path,
        lambda sub: f"part_{sub:05d}.ds",
        tokenizer="t",
        token_size=2,
        save_loss=False,
        max_tokens=3,
        on_close=lambda written, units: closed.append(written.name),
    )
    with pytest.raises(ZeroDivisionError), writer:
        writer.write(np.arange(6), np.array([4, 6]), np.array([4, 6]), None)  # finishes part 0, opens part 1
        raise ZeroDivisionError("in the block")
    assert closed == ["part_00000.ds"] and [w.name for w in writer.written] == closed
    assert (tmp_path / "part_00000.ds.metadata").exists() and not (tmp_path / "part_00001.ds.metadata").exists()
    assert (tmp_path / "part_00001.ds").read_bytes() == np.arange(4, 6, dtype="<u2").tobytes()
