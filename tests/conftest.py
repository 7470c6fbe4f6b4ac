"""Shared fixtures: a FakeClock; the loopback servers of ``tests/servers.py`` (one
fixture each: a real HTTP server that stamps requests with the FakeClock, and the
others); and a real ``redis-server`` on loopback, started and stopped by the tests.

Without a ``redis-server`` binary the Redis tests are skipped, unless the environment
variable ``CI`` is set (to anything but ``0``/``false``/``no``): in CI a missing server is
a failure, so the Redis tests can never be skipped silently there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import FakeClock
from retry_after_adapter.cooldown import sqlite as sqlite_store
from tests import servers
from tests.servers import (
    BodyServer,
    HoldingServer,
    KeepAliveServer,
    PromiseServer,
    RawServer,
    ThrottleServer,
    TLSServer,
)

#: How long a freshly started server may take to answer PING.
START_TIMEOUT = 10.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "clock_start(when): the ``clock`` fixture's FakeClock starts at ``when`` (an aware "
        "datetime, or a lambda returning one, called as the clock is made; a named function "
        "would be taken by pytest as the marked object), not on 2026-01-01",
    )


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> FakeClock:
    """The test's FakeClock: on FakeClock's default start, or where a ``clock_start``
    marker of the test (or of its module, ``pytestmark``) says. A module whose times
    must match its own constants, or stay ahead of a store's real clock, marks itself;
    the clock stays one definition for every test."""
    marker = request.node.get_closest_marker("clock_start")
    if marker is None:
        return FakeClock()
    (when,) = marker.args
    return FakeClock(start=when() if callable(when) else when)


@pytest.fixture(autouse=True)
def _no_random_sweep(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SQLiteCooldownStore.extend`` deletes rows expired for over an hour of real time,
    about once in 256 writes. The tests' FakeClock starts on 2026-01-01, so that sweep
    would delete a test's own rows at random (it did, once in CI): it runs only in tests
    marked ``random_sweep``. ``sweep()`` called by a test runs as always."""
    if request.node.get_closest_marker("random_sweep") is None:
        monkeypatch.setattr(sqlite_store, "_SWEEP_ONE_IN", 1 << 62)


# ------------------------------------------------------------------ loopback servers
@pytest.fixture
def server(clock: FakeClock) -> Iterator[ThrottleServer]:
    """A loopback server whose arrivals (and Date headers) follow the test's FakeClock."""
    srv = ThrottleServer(clock).start()
    yield srv
    srv.stop()


@pytest.fixture
def other_server(clock: FakeClock) -> Iterator[ThrottleServer]:
    """A second origin beside ``server``, on the same FakeClock."""
    srv = ThrottleServer(clock).start()
    yield srv
    srv.stop()


@pytest.fixture
def real_server() -> Iterator[ThrottleServer]:
    """A loopback server on the real clock, for tests where sockets must time out."""
    srv = ThrottleServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def holding() -> Iterator[HoldingServer]:
    """Holds each request 30 ms and counts the most it held at once."""
    srv = HoldingServer(0.03)
    yield srv
    srv.close()


@pytest.fixture
def slow_server() -> Iterator[HoldingServer]:
    """Holds each request 30 ms, one request per connection (HTTP/1.0), at the origin
    itself (``url`` has no path); ``seen``: how many were in flight at each arrival."""
    srv = HoldingServer(0.03, path="", protocol_version="HTTP/1.0")
    yield srv
    srv.close()


@pytest.fixture
def make_promise_server() -> Iterator[Callable[..., PromiseServer]]:
    """``make_promise_server(**kwargs)``: a running PromiseServer, closed after the test."""
    made: list[PromiseServer] = []

    def make(**kwargs: Any) -> PromiseServer:
        srv = PromiseServer(**kwargs)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


@pytest.fixture
def body_server() -> Iterator[Callable[[Callable[[int, str], servers.Body]], BodyServer]]:
    """``body_server(plan)``: a started BodyServer, stopped after the test."""
    made: list[BodyServer] = []

    def make(plan: Callable[[int, str], servers.Body]) -> BodyServer:
        srv = BodyServer(plan).start()
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture(scope="module")
def raw_server() -> Iterator[RawServer]:
    """A RawServer for the whole module (each test scripts it with its own clock)."""
    srv = RawServer()
    yield srv
    srv.close()


@pytest.fixture
def keepalive_server() -> Iterator[KeepAliveServer]:
    srv = KeepAliveServer()
    yield srv
    srv.close()


@pytest.fixture
def tls_server() -> Iterator[TLSServer]:
    srv = TLSServer()
    yield srv
    srv.stop()


@pytest.fixture
def server_process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A server in a process of its own (503 with ``Retry-After: 1``): (process, port)."""
    with servers.server_process() as running:
        yield running


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port with a bound but not listening socket: connecting is refused (and the
    port cannot be taken by anyone else while the test runs)."""
    with servers.closed_port() as port:
        yield port


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers on them: a hung server."""
    with servers.black_hole() as port:
        yield port


@pytest.fixture
def connect_hangs() -> Iterator[int]:
    """A port whose accept queue is full: a new connect gets no answer (its SYN is
    dropped) until the client gives up."""
    with servers.connect_hangs() as port:
        yield port


# ------------------------------------------------------------------ Redis
def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(message: str) -> None:
    """Skip outside CI; fail under CI (a missing dependency must not hide tests there)."""
    if in_ci():
        pytest.fail(f"{message} (CI is set, so this is an error rather than a skip)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, without persistence.

    ``kill()`` (SIGKILL), ``freeze()``/``thaw()`` (SIGSTOP/SIGCONT) and ``restart()``
    (same port, empty data) are for outage tests.
    """

    def __init__(self, binary: str, workdir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.workdir = workdir
        self.extra_args = extra_args
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start on a free port (a few tries: another process may take the port first)."""
        error = ""
        for _ in range(5):
            self.port = free_port()
            try:
                self._launch()
                return self
            except RuntimeError as exc:
                error = str(exc)
        raise RuntimeError(f"redis-server did not start: {error}")

    def restart(self) -> RedisServer:
        """Start again on the same port (after kill() or stop())."""
        self.stop()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self._launch()
                return self
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _launch(self) -> None:
        log = self.workdir / f"redis-{self.port}.log"
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(log),
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                self.proc = None
                raise RuntimeError(f"redis-server exited at start: {tail}")
            if self.answers_ping():
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT} s")

    def answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def kill(self) -> None:
        """SIGKILL: the server dies at once, dropping every connection and all data."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.thaw()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None


@pytest.fixture(scope="session")
def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        skip_or_fail("redis-server not found on PATH (Debian/Ubuntu: apt-get install redis-server)")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def redis_module() -> Any:
    try:
        import redis
    except ImportError:
        skip_or_fail("the redis package is not installed (pip install 'retry_after_adapter[redis]')")
    return redis


@pytest.fixture(scope="session")
def redis_server(
    redis_binary: str, redis_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """One server for the whole session; tests get it empty through ``redis_client``."""
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL; the server was started again if a test stopped it."""
    if redis_server.proc is None or not redis_server.answers_ping():
        redis_server.restart()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str, redis_module: Any) -> Iterator[Any]:
    """A client of the session server, which is FLUSHALLed before and after the test."""
    client = redis_module.Redis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    yield from _emptied(client)


def _emptied(client: Any) -> Iterator[Any]:
    """Yield ``client`` with its server (or cluster) emptied before and after; close it."""
    client.flushall()
    yield client
    try:
        client.flushall()
    finally:
        client.close()


@pytest.fixture
def redis_factory(
    redis_binary: str, redis_module: Any, tmp_path: Path
) -> Iterator[Callable[..., RedisServer]]:
    """Start extra servers of the test's own (to kill, freeze or protect with a
    password) without disturbing the session server; all are stopped afterwards."""
    servers: list[RedisServer] = []

    def make(*extra_args: str) -> RedisServer:
        server = RedisServer(redis_binary, tmp_path / f"redis-{len(servers)}", tuple(extra_args))
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


class RedisCluster:
    """A real 3-node Redis Cluster on 127.0.0.1 (three masters, no replicas), made with
    ``redis-cli --cluster create``; its data lives and dies with the test session."""

    NODES = 3

    def __init__(self, binary: str, workdir: Path) -> None:
        self.servers = [
            RedisServer(
                binary,
                workdir / f"node-{n}",
                (
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ),
            )
            for n in range(self.NODES)
        ]

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def start(self) -> RedisCluster:
        for server in self.servers:
            server.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            self.stop()
            raise RuntimeError("redis-cli not found (it comes with redis-server)")
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            self.stop()
            raise RuntimeError(
                f"redis-cli --cluster create failed: {created.stdout[-300:]} {created.stderr[-300:]}"
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [
                subprocess.run(
                    [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True, timeout=5
                ).stdout
                for port in self.ports
            ]
            if all("cluster_state:ok" in state for state in states):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within 30 s")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="session")
def redis_cluster(
    redis_binary: str, redis_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisCluster]:
    """One 3-node cluster for the session (started on first use)."""
    try:
        cluster = RedisCluster(redis_binary, tmp_path_factory.mktemp("cluster")).start()
    except RuntimeError as exc:
        skip_or_fail(str(exc))
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_client(redis_cluster: RedisCluster, redis_module: Any) -> Iterator[Any]:
    """A ``redis.RedisCluster`` client of the session cluster, emptied before and after."""
    from redis.cluster import RedisCluster as Client

    client = Client(
        host="127.0.0.1", port=redis_cluster.ports[0], socket_timeout=2.0, socket_connect_timeout=2.0
    )
    yield from _emptied(client)


def local_deferral(response: Any) -> Any:
    """The deferral of a call deferred before anything was sent: the adapter returns a
    locally built 429 (or, from a RetryAfterPoolManager, a urllib3 one) marked local."""
    from retry_after_adapter import deferral_of

    status = getattr(response, "status_code", getattr(response, "status", None))
    assert status == 429, status
    assert getattr(response, "local", False) is True
    assert response.headers["X-Local-Deferral"]
    deferral = deferral_of(response)
    assert deferral is not None
    assert int(response.headers["Retry-After"]) >= deferral.delay
    return deferral


def remove_log_redaction() -> None:
    """Take the filter ``redact_urllib3_logs()`` installed off every logger again."""
    import logging

    from retry_after_adapter.observe import RedactingFilter

    for name in list(logging.Logger.manager.loggerDict):
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, RedactingFilter)]:
            logger.removeFilter(f)


def written_back(guard: Any, within: float = 5.0) -> None:
    """Wait (at most ``within`` seconds) until ``guard``'s writer thread has written
    back every pending cooldown (and a replaced store everything this process knows):
    a recovered store is refilled by that thread, never on a call's thread (which has
    its deadline)."""
    import time

    ends = time.monotonic() + within
    while not guard.writeback.idle and time.monotonic() < ends:
        time.sleep(0.01)
