"""s3:// inputs and outputs through s3fs, against moto's S3 server on loopback, and SeaweedFS's where a test says."""

from __future__ import annotations

import random

import pytest

from tests.support.s3 import ON_BOTH_STORES
from tests.support.stages import file_bytes, run
from tests.support.tokenizers import EOS
from tokenization.stages.verify import verify
from tokenization.storage.files import MAX_PARTS, MIB, MIN_PART_SIZE, part_size
from tokenization.storage.folder import Folder


@ON_BOTH_STORES
def test_s3_input_and_output_equal_a_local_run(tmp_path, s3, sample_corpus, sample_tokenizer) -> None:
    for path in sorted(sample_corpus.glob("*.jsonl.gz")):
        s3.fs.put_file(str(path), f"corpus/input/{path.name}")
    s3.fs.invalidate_cache()
    run([sample_corpus], tmp_path, sample_tokenizer, rank=1, world_size=2, seed=8, save_loss=True)
    remote = {"rank": 1, "world_size": 2, "seed": 8, "save_loss": True, "storage_options": s3.options}
    result = run(["s3://corpus/input"], "s3://corpus/tokens", sample_tokenizer, **remote)
    assert [i["url"] for i in result["inputs"]] == [
        "s3://corpus/input/part-00001.jsonl.gz",
        "s3://corpus/input/part-00003.jsonl.gz",
    ]
    s3.fs.invalidate_cache()
    for name, data in file_bytes(tmp_path).items():
        assert s3.fs.cat_file(f"corpus/tokens/{name}") == data
    assert s3.fs.exists("corpus/tokens/_completions/00001.json")
    assert not any(".staging" in p for p in s3.fs.find("corpus/tokens"))


@pytest.mark.parametrize("size", [0, 1, 80 * MIB, 100 * 2**30, 5 * 2**40])
def test_part_size_keeps_every_upload_under_the_part_limit(size: int) -> None:
    chosen = part_size(size)
    assert chosen >= MIN_PART_SIZE and chosen % MIB == 0
    assert -(-size // chosen) <= MAX_PARTS * 0.9


@ON_BOTH_STORES
def test_merge_and_context_shuffle_from_and_to_s3(tmp_path, s3, sample_corpus, sample_tokenizer) -> None:
    from tests.support.stages import merged, shuffled

    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=8, save_loss=True)
        run(
            [sample_corpus],
            "s3://corpus/ranks",
            sample_tokenizer,
            rank=rank,
            world_size=2,
            seed=8,
            save_loss=True,
            storage_options=s3.options,
        )
    merged(tmp_path / "ranks", tmp_path / "merged", seed=4, save_loss=True, merge_max_tokens_per_file=30_000)
    merged(
        "s3://corpus/ranks",
        "s3://corpus/merged",
        seed=4,
        save_loss=True,
        merge_max_tokens_per_file=30_000,
        storage_options=s3.options,
    )
    shuffled(tmp_path / "merged", tmp_path / "context", seed=6, context_window=999)
    shuffled("s3://corpus/merged", "s3://corpus/context", seed=6, context_window=999, storage_options=s3.options)
    s3.fs.invalidate_cache()
    for stage in ("merged", "context"):
        local = file_bytes(tmp_path / stage)
        assert len(local) >= 8
        for name, data in local.items():
            assert s3.fs.cat_file(f"corpus/{stage}/{name}") == data, f"{stage}/{name}"
    assert verify(Folder("s3://corpus/context", s3.options), str(sample_tokenizer), EOS).ok


def test_a_record_is_read_with_one_request(s3) -> None:
    """Markers and manifests are read by the thousand (every rank's, by each bucket task): a HEAD before each GET
    doubled the requests and the waiting."""
    from harness.cluster import FaultProxy
    from tokenization.storage.files import open_fs, read_many

    moto_port = int(s3.options["s3"]["endpoint_url"].rsplit(":", 1)[1])
    proxy = FaultProxy(moto_port, None)
    try:
        for name in ("a", "b", "c"):
            s3.fs.pipe(f"corpus/records/{name}.json", b"{}")
        fs, _ = open_fs("s3://corpus/records", {"s3": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
        read = read_many(fs, ["corpus/records/a.json", "corpus/records/b.json"])
        assert read == {"corpus/records/a.json": b"{}", "corpus/records/b.json": b"{}"}
        assert fs.cat_file("corpus/records/c.json") == b"{}"
        assert [r.kind for r in proxy.settled()] == ["GET"] * 3
    finally:
        proxy.stop()


@ON_BOTH_STORES
def test_a_multipart_upload_and_ranged_reads_give_back_every_byte(tmp_path, s3, monkeypatch) -> None:
    """``upload`` in parts (5 MiB, S3's smallest, several at once), ``download`` in ranged GETs, and the ranged
    reads of a record's head: the same bytes on every store."""
    from tokenization.storage import files

    data = random.Random(7).randbytes(12 * MIB + 12345)
    (tmp_path / "big.ds").write_bytes(data)
    monkeypatch.setattr(files, "part_size", lambda size: 5 * MIB)  # 3 parts
    monkeypatch.setattr(files, "TRANSFER_BUFFER", files.TRANSFER_STREAMS * MIB)  # download in 1 MiB ranges
    files.upload(tmp_path / "big.ds", s3.fs, "corpus/big.ds")
    s3.fs.invalidate_cache()
    assert s3.fs.info("corpus/big.ds")["ETag"].strip('"').endswith("-3")  # a multipart object's ETag
    files.download(s3.fs, "corpus/big.ds", tmp_path / "back.ds")
    assert (tmp_path / "back.ds").read_bytes() == data
    assert files.read_head(s3.fs, "corpus/big.ds", 1000) == data[:1000]
    assert files.read_many(s3.fs, ["corpus/big.ds", "corpus/gone.ds"], limit=99) == {
        "corpus/big.ds": data[:100],
        "corpus/gone.ds": None,
    }
    assert s3.fs.cat_file("corpus/big.ds", start=5 * MIB - 3, end=5 * MIB + 3) == data[5 * MIB - 3 : 5 * MIB + 3]
    with s3.fs.open("corpus/big.ds", "rb", block_size=MIB) as handle:
        handle.seek(len(data) - 10)
        assert handle.read() == data[-10:]
    if s3.proxy is not None:  # what SeaweedFS was asked: the parts, and the ranges
        kinds = [r.kind for r in s3.proxy.settled()]
        assert kinds.count("PART") == 3 and kinds.count("CREATE") == kinds.count("COMPLETE") == 1
        assert kinds.count("GET") >= 13
