"""moto's S3 server on loopback, for the ``s3`` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import Iterator
from typing import NamedTuple

import fsspec


class S3(NamedTuple):
    fs: fsspec.AbstractFileSystem
    options: dict


@contextlib.contextmanager
def moto_s3(monkeypatch) -> Iterator[S3]:
    """A fresh moto S3 server with one bucket, and the storage options that point s3fs at it: the stages get them
    through their configs, as a build gets them from its Airflow connection; fsspec's global config stays empty."""
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
    monkeypatch.delitem(fsspec.config.conf, "s3", raising=False)
    fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir("corpus")
    yield S3(fs, {"s3": {"endpoint_url": endpoint}})
    assert "s3" not in fsspec.config.conf  # nothing was configured for the whole process
    fs.clear_instance_cache()
    server.stop()
