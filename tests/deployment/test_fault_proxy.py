"""The simulated S3's proxy behaves like S3 where a benchmark relies on it: each request waits its latency, each
connection moves at most its bandwidth, several connections at once move more than one, and bytes pass unchanged."""

from __future__ import annotations

import http.client
import http.server
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness.cluster import FaultProxy

BODY = os.urandom(2 << 20)


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


def fetched(port: int) -> tuple[bytes, float]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/bucket/key")
    data = connection.getresponse().read()
    connection.close()
    return data, time.perf_counter() - started


def test_latency_and_a_bandwidth_cap_per_connection() -> None:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proxy = FaultProxy(upstream.server_address[1], None, bandwidth=8e6, latency=0.1)  # 2 MiB: ~0.26 s a connection
    try:
        data, alone = fetched(proxy.port)
        assert data == BODY and 0.1 + len(BODY) / 8e6 <= alone < 1.5
        with ThreadPoolExecutor(4) as pool:
            started = time.perf_counter()
            results = list(pool.map(lambda _: fetched(proxy.port), range(4)))
            together = time.perf_counter() - started
        assert all(data == BODY for data, _ in results)
        assert together < 2.5 * alone  # four connections at once: each at its own rate, not a quarter of one
        assert proxy.requests == 5 and proxy.injected == 0 and [r.kind for r in proxy.settled()] == ["GET"] * 5
    finally:
        proxy.stop()
        upstream.shutdown()
