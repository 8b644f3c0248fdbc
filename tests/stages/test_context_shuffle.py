"""Context-window shuffle: datatrove's window order, plus the loss, index, metadata and tail it loses."""

from __future__ import annotations

import json

import numpy as np

from tests.support.references import run_datatrove_context_shuffler
from tests.support.stages import merged, shuffled, synthetic_ranks
from tokenization.formats.ds import TokenFile
from tokenization.formats.source_pool import contents_of
from tokenization.stages import context_shuffle as stage


def test_windows_follow_datatrove_and_nothing_is_lost(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 2, 300)
    run_datatrove_context_shuffler(inputs, tmp_path / "dt", seed=42, window_size=1000)
    result = shuffled(inputs, tmp_path / "ours", seed=42, context_window=1000)
    rng = np.random.default_rng(42)
    for path in sorted(inputs.glob("*.ds")):
        src = TokenFile(str(path))
        out = TokenFile(str(tmp_path / "ours" / path.name))
        theirs = (tmp_path / "dt" / path.name).read_bytes()
        full, tail = divmod(src.num_tokens, 1000)
        assert tail > 0 and out.num_tokens == src.num_tokens
        assert (tmp_path / "ours" / path.name).read_bytes()[: len(theirs)] == theirs  # datatrove's windows, in order
        order = rng.permutation(full)  # one draw per file, in file order
        windows = np.concatenate(
            [np.arange(k * 1000, (k + 1) * 1000) for k in order] + [np.arange(full * 1000, src.num_tokens)]
        )
        assert np.array_equal(np.asarray(out.tokens), np.asarray(src.tokens)[windows])
        assert np.array_equal(np.asarray(out.loss), np.asarray(src.loss)[windows])
        src_ends = set(np.asarray(src.ends).tolist())
        out_ends = set(np.asarray(out.ends).tolist())
        position = np.empty_like(windows)
        position[windows] = np.arange(len(windows))  # where each source token went
        moved = {int(position[e - 1]) + 1 for e in src_ends}  # where each document now ends
        assert out_ends == moved | {(j + 1) * 1000 for j in range(full)}
        assert out.metadata is not None
        assert out.metadata.token_count == src.num_tokens and out.metadata.tokenizer == "tok"
    assert result["counts"]["tail_tokens_kept"] == sum(TokenFile(str(p)).num_tokens % 1000 for p in inputs.glob("*.ds"))
    manifest = json.loads((tmp_path / "ours" / "_manifests" / "context_00000.json").read_text())
    for output in manifest["outputs"]:
        full = TokenFile(str(inputs / output["name"])).num_tokens // 1000 * 1000
        assert output["pseudo_ends"] == {"every": 1000, "until": full}


def test_drop_tail_is_datatroves_output_exactly(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 3, 100)
    run_datatrove_context_shuffler(inputs, tmp_path / "dt", seed=1, window_size=777)
    result = shuffled(inputs, tmp_path / "ours", seed=1, context_window=777, drop_tail=True)
    for path in sorted(inputs.glob("*.ds")):
        assert (tmp_path / "ours" / path.name).read_bytes() == (tmp_path / "dt" / path.name).read_bytes()
    assert result["counts"]["tokens_dropped"] == sum(TokenFile(str(p)).num_tokens % 777 for p in inputs.glob("*.ds"))


def test_shards_split_the_files_and_keep_their_names(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 5, 20)
    whole = merged(inputs, tmp_path / "merged", seed=3, merge_max_tokens_per_file=9000)
    names = [o["name"] for o in whole["outputs"]]
    for shard in range(2):
        shuffled(tmp_path / "merged", tmp_path / "ctx", seed=9, context_window=500, shard=shard, num_shards=2)
    assert sorted(p.name for p in (tmp_path / "ctx").glob("*.ds")) == sorted(names)
    first = json.loads((tmp_path / "ctx" / "_manifests" / "context_00001.json").read_text())
    assert [o["name"] for o in first["outputs"]] == names[1::2]
    assert (tmp_path / "ctx" / "_completions" / "context_00001.json").exists()


def test_a_proof_from_records_gives_the_bytes_and_books_of_one_read_again(tmp_path, monkeypatch) -> None:
    """Files with records are proved from them, reading no byte again; the same files without records are read
    again: the same bytes and the same books either way, the tail kept or dropped."""
    reread = []

    def recorded(*args, **kw):
        reread.append(args[0].urls)
        return contents_of(*args, **kw)

    monkeypatch.setattr(stage, "contents_of", recorded)
    merged(synthetic_ranks(tmp_path / "in", 3, 200), tmp_path / "recorded", seed=3, merge_max_tokens_per_file=30_000)
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in (tmp_path / "recorded").glob("*.ds*"):
        (bare / path.name).write_bytes(path.read_bytes())
    for drop_tail in (False, True):
        results = {
            inputs.name: shuffled(
                inputs, tmp_path / f"{inputs.name}-{drop_tail}", seed=5, context_window=999, drop_tail=drop_tail
            )
            for inputs in (tmp_path / "recorded", bare)
        }
        assert [urls[0].split("/")[-2] for urls in reread] == ["bare"] * len(
            list(bare.glob("*.ds"))
        )  # each read again, once
        reread.clear()
        assert results["recorded"]["counts"] == results["bare"]["counts"]
        assert results["recorded"]["counts"]["contents_in"]["pieces"] == 600
        for path in (tmp_path / f"recorded-{drop_tail}").glob("*.ds*"):
            assert path.read_bytes() == (tmp_path / f"bare-{drop_tail}" / path.name).read_bytes()


def test_a_file_shorter_than_a_window_with_its_tail_dropped_is_counted_not_written(tmp_path) -> None:
    inputs = synthetic_ranks(tmp_path / "in", 2, 3)
    short = min(inputs.glob("*.ds"), key=lambda p: TokenFile(str(p)).num_tokens)
    window = TokenFile(str(short)).num_tokens + 1
    result = shuffled(inputs, tmp_path / "ours", seed=1, context_window=window, drop_tail=True)
    written = {o["name"] for o in result["outputs"]}
    assert short.name not in written and not (tmp_path / "ours" / short.name).exists()
    sizes = [TokenFile(str(p)).num_tokens for p in inputs.glob("*.ds")]
    counts = result["counts"]
    assert counts["tokens_dropped"] == sum(n % window for n in sizes) and counts["contents_in"]["pieces"] == 6
    assert counts["contents_in"]["tokens"] == sum(sizes) == counts["tokens"] + counts["tokens_dropped"]
