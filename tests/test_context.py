"""Context-window shuffle: datatrove's window order, plus the loss, index, metadata and tail it loses."""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import run_datatrove_context_shuffler
from tests.test_merge import merged, synthetic_ranks
from tokenization.formats.ds import TokenFile
from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle


def shuffled(inputs, output, **options) -> dict:
    return context_shuffle(ContextShuffleConfig(input=str(inputs), output=str(output), **options)).to_json()


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
