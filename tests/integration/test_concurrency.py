"""Concurrency caps (``max_concurrency``) with real parts: a loopback server that
counts the requests it holds at once, threads, real processes on one SQLite file, and
a worker killed while it holds a slot."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)

from ..conftest import local_deferral
from ..servers import HoldingServer, Reply, ThrottleServer
from .conftest import process_store, process_store_place

UTC = timezone.utc


def test_threads_never_exceed_the_cap(holding: HoldingServer) -> None:
    store = MemoryCooldownStore()
    errors: list[BaseException] = []

    def worker() -> None:
        s = requests.Session()
        s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=store, max_concurrency=2))
        for _ in range(4):
            try:
                assert s.get(holding.url, timeout=5).status_code == 200
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert holding.total == 32
    assert holding.most == 2  # the cap, reached and never exceeded
    scope = f"http://127.0.0.1:{holding.httpd.server_address[1]}"
    assert store._leases[scope] == {}  # every slot was given back


def _process(url: str, kind: str, where: str, threads: int) -> None:
    store = process_store(kind, where, "slots:")

    def run() -> None:
        s = requests.Session()
        s.mount(
            "http://",
            RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=10), cooldown=store, max_concurrency=3),
        )
        for _ in range(3):
            s.get(url, timeout=10)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_processes_sharing_a_store_never_exceed_the_cap(
    holding: HoldingServer, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    where = process_store_place(kind, tmp_path, request)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process, args=(holding.url, kind, where, 4)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert holding.total == 48
    assert holding.most <= 3


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_killed_workers_slot_comes_back_after_its_lease(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    where = process_store_place(kind, tmp_path, request)
    store = process_store(kind, where, "slots:")
    code = (
        "import os, signal, sys\n"
        "from datetime import datetime, timezone\n"
        "from tests.integration.conftest import process_store\n"
        "s = process_store(sys.argv[1], sys.argv[2], 'slots:')\n"
        "assert s.lease('scope', 1, 0.5, datetime.now(timezone.utc), 'worker') is None\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    repo = Path(__file__).resolve().parents[2]  # where the child imports the tests from
    done = subprocess.run([sys.executable, "-c", code, kind, where], cwd=repo, timeout=60)
    assert done.returncode == -signal.SIGKILL
    busy_until = store.lease("scope", 1, 5, datetime.now(UTC), "me")
    assert busy_until is not None  # the dead worker still holds the only slot...
    time.sleep(max(0.0, (busy_until - datetime.now(UTC)).total_seconds()) + 0.01)
    assert store.lease("scope", 1, 5, datetime.now(UTC), "me") is None  # ...until its lease ran out


def test_no_slot_within_the_budget_defers_with_reason_concurrency(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    scope = f"http://127.0.0.1:{server.port}"
    assert store.lease(scope, 1, 30, clock.now(), "someone else") is None  # the only slot, taken
    server.serve([Reply(200)])
    s = requests.Session()
    retry = RetryAfterRetry(total=0, clock=clock, max_wait=0.2)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=1))
    deferral = local_deferral(s.get(server.url))
    assert deferral.reason == "concurrency"
    assert deferral.eligible_at == clock.now() + timedelta(seconds=30) - timedelta(seconds=sum(clock.sleeps))
    assert server.count() == 0
    store.release(scope, "someone else")
    assert s.get(server.url).status_code == 200


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_every_shared_store_holds_and_releases_slots(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        store: Any = SQLiteCooldownStore(tmp_path / "s.db")
    else:
        from retry_after_adapter import RedisCooldownStore

        store = RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="ltest:")
    now = datetime.now(UTC).replace(microsecond=0)
    assert store.lease("s", 2, 10, now, "a") is None
    assert store.lease("s", 2, 10, now, "b") is None
    assert store.lease("s", 2, 10, now, "c") == now + timedelta(seconds=10)
    store.release("s", "a")
    assert store.lease("s", 2, 10, now, "c") is None
    assert store.lease("s", 2, 10, now + timedelta(seconds=11), "d") is None  # b and c expired


def test_max_concurrency_is_checked() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError):
            RetryAfterAdapter(max_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        RetryAfterAdapter(max_concurrency=2, lease_ttl=0)
    with pytest.raises(ConfigurationError):
        RetryAfterAdapter(cooldown=None, max_concurrency=2)


def test_max_waiting_bounds_the_calls_queued_on_a_scope(real_server: ThrottleServer) -> None:
    store = MemoryCooldownStore()
    scope = f"http://127.0.0.1:{real_server.port}"
    store.extend(scope, datetime.now(UTC) + timedelta(seconds=0.4))  # everyone waits 0.4 s
    real_server.serve([Reply(200)])
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        s = requests.Session()
        s.mount(
            "http://", RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=5), cooldown=store, max_waiting=2)
        )
        response = s.get(real_server.url)
        with lock:
            outcomes.append("sent" if not getattr(response, "local", False) else response.deferral.reason)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.02)  # the first two are waiting when the others arrive
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["cooldown"] * 4 + ["sent"] * 2
    assert real_server.count() == 2
