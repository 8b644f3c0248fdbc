"""A real Airflow deployment on this machine, for the distributed tests and the scale benchmark (``bench.scale``),
not part of the library: api-server, scheduler, dag-processor, triggerer and two Celery workers (``default``;
``large_disk`` with concurrency 1) on PostgreSQL and Redis, with S3 served by SeaweedFS's ``weed mini``
(``harness.seaweedfs``) where ``weed`` is installed, else by moto's server, through a proxy that answers every Nth
request with 503 SlowDown.

Everything it creates is its own and is removed afterwards: a database, a Redis db, an S3 store, an AIRFLOW_HOME,
the processes (stopped by process group, also on failure). Their logs are copied to ``artifacts/`` on failure.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS, weed_binary

ROOT = Path(__file__).resolve().parents[1]  # the repository root: this file is harness/cluster.py
PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432"
# The deployment's topology, shared with the docker-compose test: Airflow components, and workers by queue.
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
WORKERS = {"default-worker": ("default", 4), "large-disk-worker": ("large_disk", 1)}
MERGE_POOL = ("tokenization_merge", 1)
REDIS = ("127.0.0.1", 6379)
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": ROOT}  # a helper process's output


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the test deployment: each worker reports the name it was given."""
    return os.environ.get("TOKENIZATION_TEST_WORKER_NAME") or socket.getfqdn()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def services_missing() -> str | None:
    """Why the distributed test cannot run here, or None."""
    try:
        import celery  # noqa: F401
        import psycopg2
    except ImportError as exc:
        return f"{exc.name} is not installed (the 'airflow' dependency group, Python >= 3.11)"
    try:
        psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3).close()
    except psycopg2.OperationalError as exc:
        return f"no PostgreSQL on 127.0.0.1:5432 ({str(exc).strip()})"
    try:
        with socket.create_connection(REDIS, timeout=3) as sock:
            sock.sendall(b"PING\r\n")
            if not sock.recv(16).startswith(b"+PONG"):
                return "127.0.0.1:6379 does not answer like Redis"
    except OSError as exc:
        return f"no Redis on 127.0.0.1:6379 ({exc})"
    return None


def _postgres(sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


def s3_kind(method: str, target: str) -> str:
    """What an S3 request is, from its method and target: LIST, GET, HEAD, PUT, PART, CREATE (a multipart upload),
    COMPLETE, DELETE, or the method for anything else."""
    path, _, query = target.partition("?")
    if method == "GET" and (path.rstrip("/").count("/") <= 1 or "list-type" in query):
        return "LIST"
    if method == "PUT" and "partNumber" in query:
        return "PART"
    if method == "POST" and "uploads" in query.split("&"):
        return "CREATE"
    if method == "POST" and "uploadId" in query:
        return "COMPLETE"
    return method


HEARTBEAT_TIMEOUT = "90"  # seconds without heartbeats before a task is failed and retried: docker-compose's (why)
PACED_WRITE = 256 << 10  # bytes of a response written at a time under a bandwidth cap


@dataclass(frozen=True)
class Request:
    at: float  # when it arrived
    kind: str
    path: str  # bucket and key, or the bucket and the listed prefix
    injected: bool
    seconds: float = 0.0  # from its arrival to the last byte of its answer
    method: str = ""
    status: int = 0  # the store's answer (503 for an injected fault; 0: none, the connection failed)


class FaultProxy:
    """Forwards HTTP to ``target``, as S3 behaves rather than as a loopback server does: every ``every``-th request
    gets a 503 SlowDown instead (None: none does); each request waits ``latency`` seconds first (S3's first byte
    takes 20-50 ms); and a connection moves its body at most ``bandwidth`` bytes a second each way (None: no cap),
    so that several connections at once move more than one, as on S3. Every request is logged (``log``) so that a
    benchmark can say which stage asked S3 for what; once its answer is sent, which its client may have read
    already: ``settled`` waits for the requests under way."""

    def __init__(
        self, target_port: int, every: int | None, bandwidth: float | None = None, latency: float = 0.0, port: int = 0
    ):
        self.target_port, self.every = target_port, every
        self.bandwidth, self.latency = bandwidth, latency
        self.requests = self.injected = self.in_flight = 0
        self.log: list[Request] = []
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)  # notified as the requests under way reach none
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                with proxy.lock:  # before its answer, so before its client can have read one
                    proxy.in_flight += 1
                try:
                    self._forward()
                finally:
                    with proxy.idle:
                        proxy.in_flight -= 1
                        proxy.idle.notify_all()

            def _forward(self) -> None:
                arrived, started = time.time(), time.perf_counter()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.pace(started + proxy.latency, len(body))  # the upload, at the connection's rate
                with proxy.lock:
                    proxy.requests += 1
                    fail = proxy.every is not None and proxy.requests % proxy.every == 0
                    proxy.injected += fail
                path, _, query = self.path.partition("?")
                prefix = dict(urllib.parse.parse_qsl(query)).get("prefix", "")
                kind = s3_kind(self.command, self.path)
                listed = f"{path.rstrip('/')}/{prefix}" if kind == "LIST" else path
                self.status = 0
                try:
                    self._answer(fail, body)
                finally:
                    seconds = time.perf_counter() - started
                    logged = Request(
                        arrived, kind, urllib.parse.unquote(listed), fail, seconds, self.command, self.status
                    )
                    with proxy.lock:
                        proxy.log.append(logged)

            def _answer(self, fail: bool, body: bytes) -> None:
                if fail:
                    payload = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                    self.status = 503
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                self.status = response.status
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # a HEAD answer has no body but the object's Content-Length
                length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                start, view = time.perf_counter(), memoryview(data)
                for at in range(0, len(data), PACED_WRITE):  # the download, at the connection's rate: a piece
                    chunk = view[at : at + PACED_WRITE]  # goes once its bytes would have arrived
                    proxy.pace(start, at + len(chunk))
                    self.wfile.write(chunk)
                upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up (a cancelled read)
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pace(self, since: float, sent: int) -> None:
        """Wait until ``sent`` bytes since ``since`` (a ``perf_counter`` time) keep to the bandwidth cap."""
        due = since + (sent / self.bandwidth if self.bandwidth else 0.0)
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)

    def settled(self, seconds: float = 30, leaving: int = 0) -> list[Request]:
        """The log once no request is under way: every request whose answer a client has read is in it. ``leaving``
        requests may stay under way: those a stopped client had half sent, whose rest comes when it goes on."""
        with self.idle:
            if not self.idle.wait_for(lambda: self.in_flight <= leaving, seconds):
                raise TimeoutError(f"{self.in_flight} request(s) still under way after {seconds:.0f} s")
            return list(self.log)

    def stop(self) -> None:
        self.server.shutdown()


@contextlib.contextmanager
def s3_in_processes(bandwidth: float | None, latency: float) -> Iterator[str]:
    """A simulated S3 whose store (moto's server) and proxy (a :class:`FaultProxy` without faults) each run in a
    process of their own, so that neither takes the other's core, nor the measured task's: yields its endpoint."""
    moto_port, proxy_port = free_port(), free_port()
    proxy = [sys.executable, "-m", "harness.cluster", *map(str, (moto_port, proxy_port, bandwidth or 0, latency))]
    processes = [moto_server(moto_port), subprocess.Popen(proxy, **QUIET)]
    try:
        Cluster._wait(lambda: _accepts(proxy_port), 60, f"the simulated S3's proxy on port {proxy_port}")
        yield f"http://127.0.0.1:{proxy_port}"
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)


def moto_server(port: int) -> subprocess.Popen:
    """moto's S3 server in a process of its own, quiet, empty and answering: in the caller's process it would
    share one interpreter lock with everything the caller does (a test, a benchmark, a proxy), and slow both."""
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], **QUIET)
    Cluster._wait(lambda: _accepts(port), 60, f"moto's server on port {port}")
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"))
    return process


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class Cluster:
    """Start with :meth:`start`, always :meth:`stop` (a context manager does both)."""

    def __init__(
        self,
        workdir: Path,
        fail_ranks: str = "1",
        workers: dict[str, tuple[str, int]] = WORKERS,
        merge_slots: int = MERGE_POOL[1],
        fault_every: int | None = 7,
        settings: dict[str, str] | None = None,
        s3_bandwidth: float | None = None,
        s3_latency: float = 0.0,
        stall_merge: bool = False,
    ):
        """``workers`` maps each Celery worker's name to its queues (comma-separated) and concurrency;
        ``merge_slots`` sizes the merge pool; every ``fault_every``-th S3 request gets a 503; ``settings`` are
        more environment variables of every component (``TOKENIZATION_SCHEDULE``, ...); ``s3_bandwidth`` (bytes a
        second a connection) and ``s3_latency`` (seconds a request) make the simulated S3 behave like one;
        ``stall_merge`` stops the first merge for good after its first file (see tests/faults), so that a test can
        kill the large-disk worker mid-merge (:meth:`kill_and_restart`)."""
        self.workdir = workdir
        self.settings = settings or {}
        self.workers, self.merge_slots, self.fault_every = workers, merge_slots, fault_every
        self.s3_bandwidth, self.s3_latency = s3_bandwidth, s3_latency
        self.home = workdir / "airflow-home"
        self.logs = workdir / "process-logs"
        self.db = f"tokenization_test_{secrets.token_hex(4)}"
        self.redis_db = self._free_redis_db()
        self.port = free_port()
        self.password = secrets.token_urlsafe(12)
        self.jwt_secret = secrets.token_hex(32)  # every component must share it
        self.fail_ranks, self.stall_merge = fail_ranks, stall_merge
        self.processes: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, tuple[list[str], str | None]] = {}
        self.weed = weed_binary()  # S3 is SeaweedFS where it is installed, else moto
        self.seaweedfs: SeaweedFS | None = None
        self.moto: subprocess.Popen | None = None
        self.proxy: FaultProxy | None = None
        self.token: str | None = None

    @staticmethod
    def _free_redis_db() -> int:
        """An empty Redis database, claimed with a key set only if absent: clusters started at once (tests run in
        parallel) never share one. ``stop`` flushes it, the claim with it."""
        for db in range(15, 0, -1):
            if _redis_dbsize(db) == 0 and _redis_claim(db):
                return db
        raise RuntimeError("no empty Redis database among 1..15")

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop(failed=True)
            raise
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.stop(failed=exc_type is not None)

    @property
    def store(self) -> str:
        """The S3 server behind the proxy: ``seaweedfs`` or ``moto``."""
        return "seaweedfs" if self.weed else "moto"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, worker: str | None = None) -> dict[str, str]:
        assert self.proxy is not None, "the cluster is not started"
        conn_aws = {  # SeaweedFS checks the signatures against its identity; moto takes any keys
            "conn_type": "aws",
            "login": ACCESS_KEY,
            "password": SECRET_KEY,
            "extra": {"endpoint_url": f"http://127.0.0.1:{self.proxy.port}", "region_name": "us-east-1"},
        }
        conn_api = {"conn_type": "http", "host": self.url, "login": "admin", "password": self.password}
        env = (
            os.environ.copy()
            | {
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                "PYTHONPATH": str(ROOT),
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "OPENBLAS_NUM_THREADS": "1",  # as docker-compose.yaml sets it for the tasks
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "harness.cluster.worker_hostname",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{PG_URL}/{self.db}",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{self.redis_db}",
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://postgres@127.0.0.1:5432/{self.db}",
                "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": HEARTBEAT_TIMEOUT,
                "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn_aws),
                "AIRFLOW_CONN_AIRFLOW_API": json.dumps(conn_api),
                "TOKENIZATION_TASK_RETRIES": "0",
                "TOKENIZATION_MAX_ACTIVE_RUNS": "2",
                "TOKENIZATION_OUTPUT": "s3://corpus/builds",
                "TOKENIZATION_ALLOWED_LOCATIONS": f"s3://corpus,{ROOT / 'sample'}",
                "AIRFLOW__CORE__MAX_MAP_LENGTH": "4096",
                "TOKENIZATION_SCHEDULE": "none",  # runs are the tests' own, unless a test schedules them
            }
            | self.settings
        )
        if worker:
            env["TOKENIZATION_TEST_WORKER_NAME"] = worker
            env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(free_port())
            if worker == "default-worker":  # its ranks fail their first attempt: see tests/faults
                env["PYTHONPATH"] = f"{ROOT / 'tests' / 'faults'}:{ROOT}"
                env |= {"FAULT_RANKS": self.fail_ranks, "FAULT_DIR": str(self.workdir)}
            if worker == "large-disk-worker" and self.stall_merge:
                env["PYTHONPATH"] = f"{ROOT / 'tests' / 'faults'}:{ROOT}"
                # the lease's TTL below the heartbeat timeout, as LEASE_TTL_SECONDS is below compose's recovery
                env |= {"FAULT_STALL_MERGE": "1", "FAULT_DIR": str(self.workdir), "FAULT_LEASE_TTL": "15"}
                env |= {"FAULT_HEARTBEAT": "2"}
        return env

    def start(self) -> None:
        self.home.mkdir(parents=True)
        self.logs.mkdir(parents=True)
        (self.home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": self.password}))
        if self.weed:
            self.seaweedfs = SeaweedFS(self.weed)
            store_port = self.seaweedfs.port
        else:
            store_port = free_port()
            self.moto = moto_server(store_port)
        self.proxy = FaultProxy(store_port, self.fault_every, self.s3_bandwidth, self.s3_latency)
        _postgres(f"CREATE DATABASE {self.db}")
        self._run("airflow", "db", "migrate")
        self._run("airflow", "pools", "set", MERGE_POOL[0], str(self.merge_slots), "corpus-tokenization merge")
        # the api-server's port picked again just before it starts, as the other components learn it from their
        # environment: picked when the cluster was made, the migrate's seconds let another test's server take it
        self.port = free_port()
        commands = {name: (["airflow", name], None) for name in COMPONENTS}
        commands["api-server"][0].extend(["--port", str(self.port)])
        for name, (queues, concurrency) in self.workers.items():
            worker = ["airflow", "celery", "worker", "-q", queues, "-c", str(concurrency), "-H", name]
            commands[name] = (worker, name)
        self.commands = commands
        for name in commands:
            self._launch(name)
        self._wait(lambda: self._healthy(), 180, "the api-server and scheduler to become healthy")
        self.token = self._token()

    def _launch(self, name: str) -> None:
        command, worker = self.commands[name]
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.processes[name] = subprocess.Popen(
            command, env=self.env(worker), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL a component and every process under it at once (a worker's machine lost: its tasks stop without
        a word), then start it again under the same name."""
        import psutil

        root = psutil.Process(self.processes[name].pid)
        doomed = [root, *root.children(recursive=True)]
        for proc in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(doomed, timeout=30)
        self._launch(name)

    def _run(self, *command: str) -> None:
        done = subprocess.run(command, env=self.env(), capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def _healthy(self) -> bool:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.logs / (name + '.log')}")
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                health = json.load(response)
        except (urllib.error.URLError, OSError):
            return False
        return all(health.get(k, {}).get("status") == "healthy" for k in ("scheduler", "dag_processor", "triggerer"))

    def _token(self) -> str:
        body = json.dumps({"username": "admin", "password": self.password}).encode()
        request = urllib.request.Request(
            f"{self.url}/auth/token", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["access_token"]

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                body = response.read()
                return json.loads(body) if body else {}
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code} {exc.read()[:500]!r}") from exc

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of the run, page by page (the API serves at most 100 a request)."""
        found: list[dict] = []
        while True:
            page = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100&offset={len(found)}")
            found += page["task_instances"]
            if not page["task_instances"] or len(found) >= page["total_entries"]:
                return found

    @staticmethod
    def _wait(check, seconds: float, what: str) -> None:
        deadline = time.time() + seconds
        while time.time() < deadline:
            if check():
                return
            time.sleep(2)
        raise TimeoutError(f"timed out after {seconds:.0f}s waiting for {what}")

    def wait_for(self, check, seconds: float, what: str) -> None:
        self._wait(check, seconds, what)

    def stop(self, failed: bool) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 30
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if failed and self.logs.exists():
            artifacts = ROOT / "artifacts" / "distributed"
            shutil.rmtree(artifacts, ignore_errors=True)
            shutil.copytree(self.logs, artifacts)
            if (self.home / "logs").exists():
                shutil.copytree(self.home / "logs", artifacts / "task-logs")
            if self.seaweedfs:
                shutil.copy(self.seaweedfs.log, artifacts / "weed.log")
        if self.proxy:
            self.proxy.stop()
        if self.seaweedfs:
            self.seaweedfs.stop()
        if self.moto:
            self.moto.terminate()
            self.moto.wait(30)
        with contextlib.suppress(OSError):
            _redis_flush(self.redis_db)
        with contextlib.suppress(Exception):
            _postgres(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")


def _redis_dbsize(db: int) -> int:
    reply = _redis_session(["SELECT", str(db)], ["DBSIZE"])
    return int(reply.split(b"\r\n")[-2].lstrip(b":"))


def _redis_claim(db: int) -> bool:
    reply = _redis_session(["SELECT", str(db)], ["SET", "tokenization-test-cluster", str(os.getpid()), "NX"])
    return reply.endswith(b"+OK\r\n")


def _redis_flush(db: int) -> None:
    _redis_session(["SELECT", str(db)], ["FLUSHDB"])


def _redis_session(*commands: list[str]) -> bytes:
    """Send several commands on one connection (SELECT lasts only for its connection); their replies, read until
    each has come (each is one line: these commands' are), not what the first read happened to hold."""
    payload = b"".join(
        f"*{len(c)}\r\n".encode() + b"".join(f"${len(p)}\r\n{p}\r\n".encode() for p in c) for c in commands
    )
    reply = b""
    with socket.create_connection(REDIS, timeout=5) as sock:
        sock.sendall(payload)
        while reply.count(b"\r\n") < len(commands):
            if not (received := sock.recv(4096)):
                raise ConnectionError(f"Redis closed the connection after {reply!r}")
            reply += received
    return reply


if __name__ == "__main__":  # python -m harness.cluster TARGET_PORT PORT BANDWIDTH LATENCY: a proxy alone, no faults
    target, port, bandwidth, latency = sys.argv[1:5]
    FaultProxy(int(target), None, float(bandwidth) or None, float(latency), port=int(port))
    threading.Event().wait()
