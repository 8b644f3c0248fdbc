"""The tokenize stage end to end on the bundled sample: conservation, order, determinism, atomic re-runs."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.support.corpus import sample_records, write_jsonl
from tests.support.stages import documents, file_bytes, run
from tests.support.tokenizers import EOS, big_vocab_tokenizer
from tokenization.formats.ds import TokenFile
from tokenization.records import CompletionMarker
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
from tokenization.storage.checksums import BLAKE3, checksum
from tokenization.tokenizer.counts import TooManyRejects


def test_every_document_is_written_once_and_decodes_to_its_text(tmp_path, sample_corpus, sample_tokenizer) -> None:
    manifests = [run([sample_corpus], tmp_path, sample_tokenizer, rank=r, world_size=3, seed=7) for r in range(3)]
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    eos = tokenizer.token_to_id(EOS)
    docs = documents(tmp_path)
    assert all(d[-1] == eos for d in docs)
    decoded = Counter(tokenizer.decode(d[:-1], skip_special_tokens=False) for d in docs)
    texts = [r["text"] for r in sample_records()]
    assert decoded == Counter(t for t in texts if t)
    for m in manifests:
        c = m["counts"]
        assert c["docs_read"] == c["docs_written"] + c["empty"] + c["rejected_total"]
        assert c["tokens"] == c["tokens_written"] and c["tokens_dropped"] == 0
    assert sum(m["counts"]["empty"] for m in manifests) == texts.count("")
    assert sum(m["counts"]["special_token_literals_total"] for m in manifests) == sum(t.count(EOS) for t in texts)


def test_same_seed_same_bytes_other_seed_other_order(tmp_path, sample_corpus, sample_tokenizer) -> None:
    for name, seed in [("a", 5), ("b", 5), ("c", 6)]:
        run([sample_corpus], tmp_path / name, sample_tokenizer, seed=seed, save_loss=True)
    assert file_bytes(tmp_path / "a") == file_bytes(tmp_path / "b")
    assert documents(tmp_path / "a") != documents(tmp_path / "c")
    assert sorted(documents(tmp_path / "a")) == sorted(documents(tmp_path / "c"))


def test_permutation_is_datatroves_draw(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "plain", sample_tokenizer, shuffle_documents=False)
    run([sample_corpus], tmp_path / "shuffled", sample_tokenizer, seed=1234)
    plain = documents(tmp_path / "plain")
    order = np.random.default_rng(1234).permutation(len(plain))
    assert documents(tmp_path / "shuffled") == [plain[i] for i in order]


def test_unshuffled_keeps_input_order_and_splits_at_document_boundaries(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    run([sample_corpus], tmp_path / "one", sample_tokenizer, shuffle_documents=False)
    result = run(
        [sample_corpus], tmp_path / "split", sample_tokenizer, shuffle_documents=False, max_tokens_per_file=5000
    )
    names = [o["name"] for o in result["outputs"]]
    assert names == [f"00000_{i:05d}_unshuffled.ds" for i in range(len(names))] and len(names) > 5
    assert documents(tmp_path / "split") == documents(tmp_path / "one")
    files = [TokenFile(str(p)) for p in sorted((tmp_path / "split").glob("*.ds"))]
    for f in files[:-1]:  # each file passed the limit with its last document, not before
        ends = np.asarray(f.ends, dtype=np.int64)
        assert ends[-1] > 5000 >= (ends[-2] if len(ends) > 1 else 0)
    assert files[-1].num_tokens > 0


def test_chunk_shuffle_keeps_the_tail_and_carries_document_ends(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "docs", sample_tokenizer, seed=3, save_loss=True)
    result = run(
        [sample_corpus], tmp_path / "chunks", sample_tokenizer, seed=3, shuffle_chunk_size=1000, save_loss=True
    )
    docs = TokenFile(str(next((tmp_path / "docs").glob("*.ds"))))
    chunks = TokenFile(str(next((tmp_path / "chunks").glob("*chunk_shuffled.ds"))))
    total = docs.num_tokens
    full, tail = divmod(total, 1000)
    assert chunks.num_tokens == total and result["counts"]["partial_chunk_tokens"] == tail > 0
    rng = np.random.default_rng(3)
    rng.permutation(len(docs.ends))  # the document shuffle is the first draw
    order = rng.permutation(full)
    src, out = np.asarray(docs.tokens), np.asarray(chunks.tokens)
    expected = np.concatenate([src[k * 1000 : (k + 1) * 1000] for k in order] + [src[full * 1000 :]])
    assert np.array_equal(out, expected)
    assert np.array_equal(
        np.asarray(chunks.loss),
        np.concatenate(
            [np.asarray(docs.loss)[k * 1000 : (k + 1) * 1000] for k in order] + [np.asarray(docs.loss)[full * 1000 :]]
        ),
    )
    doc_ends = set(np.asarray(docs.ends).tolist())
    moved = set()
    for j, k in enumerate(order):
        moved |= {e - k * 1000 + j * 1000 for e in doc_ends if k * 1000 < e < (k + 1) * 1000}
    moved |= {(j + 1) * 1000 for j in range(full)} | {e for e in doc_ends if e > full * 1000}
    assert np.asarray(chunks.ends).tolist() == sorted(moved)


def test_drop_last_chunk_counts_what_it_drops(tmp_path, sample_corpus, sample_tokenizer) -> None:
    result = run([sample_corpus], tmp_path, sample_tokenizer, shuffle_chunk_size=1000, drop_last_chunk=True)
    c = result["counts"]
    assert c["tokens_written"] % 1000 == 0 and c["tokens_dropped"] == c["tokens"] - c["tokens_written"] > 0


def test_loss_bytes_stay_aligned_with_their_documents(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, seed=11, save_loss=True)
    f = TokenFile(str(next(tmp_path.glob("*.ds"))))
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    ends = np.asarray(f.ends, dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    assert f.loss is not None
    masked = [(s, e) for s, e in zip(starts, ends, strict=True) if not f.loss[s:e].all()]
    prompts = [r for r in sample_records() if r.get("no_loss_ranges")]
    assert len(masked) == len(prompts)
    for s, e in masked:
        loss, ids = np.asarray(f.loss[s:e]), np.asarray(f.tokens[s:e])
        assert loss[-1] == 1
        text = tokenizer.decode(ids[:-1].tolist())
        head = text[: text.index("### Response:\n") + len("### Response:\n")]
        assert tokenizer.decode(ids[loss == 0].tolist()) == head


def test_a_rerun_replaces_the_rank_completely(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, rank=1, world_size=2, max_tokens_per_file=3000)
    other = run([sample_corpus], tmp_path, sample_tokenizer, rank=0, world_size=2)
    other_bytes = {k: v for k, v in file_bytes(tmp_path).items() if k.startswith("00000_")}
    assert len([p for p in tmp_path.glob("00001_*.ds")]) > 3
    result = run([sample_corpus], tmp_path, sample_tokenizer, rank=1, world_size=2)
    assert sorted(p.name for p in tmp_path.glob("00001_*")) == sorted(result["outputs"][0]["files"])
    assert {k: v for k, v in file_bytes(tmp_path).items() if k.startswith("00000_")} == other_bytes
    assert other["outputs"][0]["name"] == "00000_00000_doc_shuffled.ds"
    assert not (tmp_path / ".staging").exists()


def test_manifest_checksums_and_marker(tmp_path, sample_corpus, sample_tokenizer) -> None:
    result = run([sample_corpus], tmp_path, sample_tokenizer, save_filename="web", seed=9, save_loss=True)
    manifest_bytes = (tmp_path / "_manifests" / "web_00000.json").read_bytes()
    marker = json.loads((tmp_path / "_completions" / "web_00000.json").read_text())
    manifest = json.loads(manifest_bytes)
    assert manifest == json.loads(json.dumps(result))
    published = {p.name for p in tmp_path.glob("web_00000_*")}
    assert marker == {
        "format": CompletionMarker.format_tag(),
        "manifest": "_manifests/web_00000.json",
        "sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "attempt": manifest["attempt"],
        "checked": None,  # a rank's files are checked by the stages after it, or by publish
        "files": {
            name: {
                "bytes": (tmp_path / name).stat().st_size,
                "blake3": checksum((tmp_path / name).read_bytes(), BLAKE3),
            }
            for name in published
        },
    }
    assert len(published) == 4
    assert manifest["seed"] == 9 and manifest["tokenizer"]["eos_id"] == 0
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(sample_tokenizer.read_bytes()).hexdigest()
    assert [i["url"] for i in manifest["inputs"]] == sorted(str(p) for p in sample_corpus.glob("*.jsonl.gz"))
    for output in manifest["outputs"]:
        for name, info in output["files"].items():
            data = (tmp_path / name).read_bytes()
            assert (len(data), checksum(data, BLAKE3)) == (info["bytes"], info["blake3"])


def test_throughput_counts_text_bytes_without_the_tokenizers_loading(tmp_path, sample_corpus, sample_tokenizer) -> None:
    result = run([sample_corpus], tmp_path, sample_tokenizer)
    text_bytes = sum(len(r["text"].encode()) for r in sample_records())
    load = result["tokenizer"]["load_seconds"]
    assert result["counts"]["text_bytes"] == text_bytes > 2 * result["input_bytes"]  # the input is gzipped
    assert 0 < load < result["seconds"]
    working = result["seconds"] - load
    rounded = 5e-4  # the manifest rounds the rate to 3 decimals: on a loaded machine it is below 1 MB/s
    assert result["throughput"]["text_mb_per_s"] == pytest.approx(text_bytes / 1e6 / working, rel=1e-3, abs=rounded)
    assert result["throughput"]["tokens_per_s"] == pytest.approx(result["counts"]["tokens"] / working, rel=1e-3)


def test_a_failed_rerun_leaves_no_marker(tmp_path, sample_tokenizer) -> None:
    good = write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "fine"}] * 3)
    run([good], tmp_path / "out", sample_tokenizer)
    assert (tmp_path / "out" / "_completions" / "00000.json").exists()
    write_jsonl(good, [{"text": "fine"}, "{broken", "{broken", "{broken"])
    with pytest.raises(
        TooManyRejects, match=r"rank 0: 3 rejected records exceed max_rejects=2; latest: .*a.jsonl line 4"
    ):
        run([good], tmp_path / "out", sample_tokenizer, max_rejects=2)
    assert not (tmp_path / "out" / "_completions" / "00000.json").exists()
    assert not (tmp_path / "out" / ".staging").exists()
    quarantined = (tmp_path / "out" / "_quarantine" / "00000.jsonl").read_text().splitlines()
    assert [json.loads(q)["line"] for q in quarantined] == [2, 3, 4]


def test_bad_records_are_quarantined_and_good_ones_match_a_clean_run(tmp_path, sample_tokenizer) -> None:
    clean = [{"id": str(i), "text": f"record {i} " * (i + 1)} for i in range(40)]
    dirty: list[dict | str] = list(clean)
    dirty[3:3] = ["{oops", '{"id": "n", "text": null}']
    dirty[20:20] = [{"id": "t", "text": 5}, "[]"]
    write_jsonl(tmp_path / "clean" / "a.jsonl", clean)
    write_jsonl(tmp_path / "dirty" / "a.jsonl", dirty)
    run([tmp_path / "clean"], tmp_path / "out_clean", sample_tokenizer, seed=2)
    result = run([tmp_path / "dirty"], tmp_path / "out_dirty", sample_tokenizer, seed=2, max_reject_fraction=0.1)
    assert file_bytes(tmp_path / "out_clean") == file_bytes(tmp_path / "out_dirty")
    assert result["counts"]["rejected"] == {
        "malformed_json": 1,
        "missing_text": 1,
        "text_not_string": 1,
        "not_an_object": 1,
    }
    lines = [json.loads(x) for x in (tmp_path / "out_dirty" / "_quarantine" / "00000.jsonl").read_text().splitlines()]
    assert [(q["line"], q["reason"], q["raw"]) for q in lines] == [
        (4, "malformed_json", "{oops"),
        (5, "missing_text", '{"id": "n", "text": null}'),
        (21, "text_not_string", '{"id": "t", "text": 5}'),
        (22, "not_an_object", "[]"),
    ]
    assert all(q["file"].endswith("dirty/a.jsonl") for q in lines)


def test_uint32_vocabulary_end_to_end(tmp_path) -> None:
    tokenizer = big_vocab_tokenizer(tmp_path / "tokenizer.json")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": "w69997 w1"}, {"text": "w65536"}])
    run([inputs], tmp_path / "out", tokenizer, shuffle_documents=False)
    f = TokenFile(str(next((tmp_path / "out").glob("*.ds"))))
    assert f.token_size == 4
    assert (tmp_path / "out" / f.url.rsplit("/", 1)[1]).read_bytes() == np.array(
        [69_999, 3, 0, 65_538, 0], dtype="<u4"
    ).tobytes()


def test_remote_output_is_uploaded_with_marker_last(tmp_path, sample_corpus, sample_tokenizer) -> None:
    import fsspec

    run([sample_corpus], tmp_path / "local", sample_tokenizer, seed=4, save_loss=True)
    run([sample_corpus], "memory://bucket/out", sample_tokenizer, seed=4, save_loss=True)
    memory = fsspec.filesystem("memory")
    for name, data in file_bytes(tmp_path / "local").items():
        assert memory.cat_file(f"/bucket/out/{name}") == data
    assert memory.exists("/bucket/out/_completions/00000.json")
    memory.rm("/bucket", recursive=True)


def test_without_an_eos_llama3_documents_end_with_its_own(tmp_path, sample_corpus) -> None:
    """Finding 6: without --eos-token, Llama-3 output had no separator between documents."""
    from tests.support.paths import shared_path

    llama3 = shared_path("tokenizers", "llama3", "tokenizer.json")
    config = TokenizeConfig(inputs=[str(sample_corpus)], output=str(tmp_path), tokenizer=str(llama3))
    result = tokenize_rank(config).to_json()
    assert (result["tokenizer"]["eos_token"], result["tokenizer"]["eos_id"]) == ("<|end_of_text|>", 128001)
    assert result["tokenizer"]["eos_source"] == "vocabulary"
    f = TokenFile(str(next(tmp_path.glob("*.ds"))))
    ends = np.asarray(f.ends, dtype=np.int64)
    assert len(ends) == result["counts"]["docs_written"] == 308
    assert np.all(np.asarray(f.tokens)[ends - 1] == 128001)


def test_a_rank_without_input_files_completes_empty(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """More ranks than input files: the spare rank publishes a manifest with nothing in it, not an error."""
    files = len(list(sample_corpus.glob("*.jsonl*")))
    result = run([sample_corpus], tmp_path, sample_tokenizer, rank=files, world_size=files + 1, save_loss=True)
    assert result["counts"]["docs_read"] == 0 and result["outputs"] == [] and result["inputs"] == []
    assert (tmp_path / "_completions" / f"{files:05d}.json").exists()
