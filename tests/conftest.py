"""Shared fixtures: a FakeClock; the loopback servers of ``tests/servers.py`` (one
fixture each: a real HTTP server that stamps requests with the FakeClock, and the
others); and a real ``redis-server`` (and a Redis Cluster) on loopback, started and
stopped by the tests through ``retry_after_adapter.testing.redis``.

Without a ``redis-server`` binary the Redis tests are skipped, unless the environment
variable ``CI`` is set (to anything but ``0``/``false``/``no``): in CI a missing server is
a failure, so the Redis tests can never be skipped silently there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import FakeClock
from retry_after_adapter.cooldown.sqlite import store as sqlite_store
from retry_after_adapter.testing import ports
from retry_after_adapter.testing.redis import RedisCluster, RedisServer
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
    with ports.closed_port() as port:
        yield port


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers on them: a hung server."""
    with ports.black_hole() as port:
        yield port


@pytest.fixture
def connect_hangs() -> Iterator[int]:
    """A port whose accept queue is full: a new connect gets no answer (its SYN is
    dropped) until the client gives up."""
    with ports.connect_hangs() as port:
        yield port


# ------------------------------------------------------------------ Redis
def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(message: str) -> None:
    """Skip outside CI; fail under CI (a missing dependency must not hide tests there)."""
    if in_ci():
        pytest.fail(f"{message} (CI is set, so this is an error rather than a skip)", pytrace=False)
    pytest.skip(message)


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
    server = RedisServer(tmp_path_factory.mktemp("redis"), binary=redis_binary).start()
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
        server = RedisServer(tmp_path / f"redis-{len(servers)}", tuple(extra_args), binary=redis_binary)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(
    redis_binary: str, redis_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisCluster]:
    """One 3-node cluster for the session (started on first use)."""
    try:
        cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
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

    ends = time.monotonic() + within
    while not guard.writeback.idle and time.monotonic() < ends:
        time.sleep(0.01)
