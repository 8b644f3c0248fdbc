"""s3:// inputs and outputs through s3fs, against moto's S3 server on loopback."""

from __future__ import annotations

import socket
import urllib.request

import fsspec
import pytest

from tests.conftest import EOS
from tests.test_tokenize import file_bytes, run
from tokenization.storage import MAX_PARTS, MIB, MIN_PART_SIZE, part_size
from tokenization.verify import verify


@pytest.fixture
def s3(monkeypatch):
    """A fresh moto S3 server with one bucket; s3fs is pointed at it through fsspec's config."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))  # moto keeps state
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("corpus")
    yield fs
    fsspec.filesystem("s3").clear_instance_cache()
    server.stop()


def test_s3_input_and_output_equal_a_local_run(tmp_path, s3, sample_corpus, sample_tokenizer) -> None:
    for path in sorted(sample_corpus.glob("*.jsonl.gz")):
        s3.put_file(str(path), f"corpus/input/{path.name}")
    s3.invalidate_cache()
    run([sample_corpus], tmp_path, sample_tokenizer, rank=1, world_size=2, seed=8, save_loss=True)
    result = run(["s3://corpus/input"], "s3://corpus/tokens", sample_tokenizer, rank=1, world_size=2, seed=8,
                 save_loss=True)  # fmt: skip
    assert [i["url"] for i in result["inputs"]] == [
        "s3://corpus/input/part-00001.jsonl.gz",
        "s3://corpus/input/part-00003.jsonl.gz",
    ]
    s3.invalidate_cache()
    for name, data in file_bytes(tmp_path).items():
        assert s3.cat_file(f"corpus/tokens/{name}") == data
    assert s3.exists("corpus/tokens/_completions/00001.json")
    assert not any(".staging" in p for p in s3.find("corpus/tokens"))


@pytest.mark.parametrize("size", [0, 1, 80 * MIB, 100 * 2**30, 5 * 2**40])
def test_part_size_keeps_every_upload_under_the_part_limit(size: int) -> None:
    chosen = part_size(size)
    assert chosen >= MIN_PART_SIZE and chosen % MIB == 0
    assert -(-size // chosen) <= MAX_PARTS * 0.9


def test_merge_and_context_shuffle_from_and_to_s3(tmp_path, s3, sample_corpus, sample_tokenizer) -> None:
    from tests.test_context import shuffled
    from tests.test_merge import merged

    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=8, save_loss=True)
        run([sample_corpus], "s3://corpus/ranks", sample_tokenizer, rank=rank, world_size=2, seed=8, save_loss=True)
    merged(tmp_path / "ranks", tmp_path / "merged", seed=4, save_loss=True, max_tokens_per_file=30_000)
    merged("s3://corpus/ranks", "s3://corpus/merged", seed=4, save_loss=True, max_tokens_per_file=30_000)
    shuffled(tmp_path / "merged", tmp_path / "context", seed=6, window_size=999)
    shuffled("s3://corpus/merged", "s3://corpus/context", seed=6, window_size=999)
    s3.invalidate_cache()
    for stage in ("merged", "context"):
        local = file_bytes(tmp_path / stage)
        assert len(local) >= 8
        for name, data in local.items():
            assert s3.cat_file(f"corpus/{stage}/{name}") == data, f"{stage}/{name}"
    assert verify("s3://corpus/context", str(sample_tokenizer), EOS).ok
