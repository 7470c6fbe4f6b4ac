from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)

#: A time a day ahead of the real clock, whole seconds: Redis expires keys by its own
#: clock, so store tests on every backend use times that are still ahead there.
AHEAD = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def every_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The same test on each of the package's stores: a fresh memory store, a fresh
    SQLite file, and the session's Redis server (emptied before and after)."""
    if request.param == "memory":
        return MemoryCooldownStore()
    if request.param == "sqlite":
        return SQLiteCooldownStore(tmp_path / "every.db")
    from retry_after_adapter import RedisCooldownStore

    return RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="every:")


@pytest.fixture
def store(every_store: Any) -> Any:
    """``every_store`` under the name the store tests use. (test_redis_cluster.py, on a
    cluster, and the conformance kit's classes have a ``store`` of their own.)"""
    return every_store


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of a store shared by processes: a new SQLite file, or the session's Redis
    server (for ``store_from_url``)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/cooldown.db"
    # Timeouts for a loaded machine: the 0.1 s default is for outages, which these
    # tests do not stage (a timed-out read fails open, and sends early).
    return request.getfixturevalue("redis_url") + "?socket_timeout=2&socket_connect_timeout=2"


def process_store(kind: str, where: str, prefix: str) -> Any:
    """The shared store a worker process opens: a SQLite file, or Redis (with timeouts
    for a loaded machine: the 0.1 s default is for outages, which these tests do not
    stage, and a timed-out read fails open)."""
    if kind == "sqlite":
        return SQLiteCooldownStore(where)
    from retry_after_adapter import RedisCooldownStore

    return RedisCooldownStore.from_url(where, prefix=prefix, socket_timeout=2.0, socket_connect_timeout=2.0)


def process_store_place(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where worker processes find the shared store of ``kind``: a new SQLite file, or
    the session's Redis URL (emptied before and after the test)."""
    if kind == "sqlite":
        path = str(tmp_path / "shared.db")
        SQLiteCooldownStore(path).close()
        return path
    request.getfixturevalue("redis_client")
    return str(request.getfixturevalue("redis_url"))


def make_session(
    clock: FakeClock | None = None,
    store: MemoryCooldownStore | None = None,
    learn_rate: bool = True,
    **retry_kwargs: object,
) -> requests.Session:
    """A Session with a RetryAfterAdapter on http:// (its own store unless given one;
    ``learn_rate=False``: without the learned send rate)."""
    retry_kwargs.setdefault("total", 5)
    retry = RetryAfterRetry(clock=clock, **retry_kwargs)  # type: ignore[arg-type]
    session = requests.Session()
    session.mount(
        "http://",
        RetryAfterAdapter(
            max_retries=retry,
            cooldown=store if store is not None else MemoryCooldownStore(),
            learn_rate=learn_rate,
        ),
    )
    return session


def run_cli(*args: str, timeout: float = 30, cwd: Any = None) -> subprocess.CompletedProcess[str]:
    """The command line, run as a user runs it (``python -m retry_after_adapter``), in
    the working directory ``cwd`` (None: this one)."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "retry_after_adapter", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def release_and_gather(procs: list[Any], server: Any, barrier: Any, results: Any, wait: float) -> list[Any]:
    """Start ``procs`` (before the server's thread: nothing of it is forked), release
    them together through ``barrier`` once ``server`` runs, and return one report of
    each from ``results``; each must exit cleanly, and none is left running."""
    for p in procs:
        p.start()
    try:
        with server:
            barrier.wait(wait)
            reports = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return reports


def real_now() -> datetime:
    """The real time, whole milliseconds: a FakeClock starting here makes Redis's own
    expiry clock (the real one) agree with the fake one at the start."""
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


#: The ``clock`` fixture (and with it ``server``, whose arrivals and Date headers follow
#: it) starts at the real time in the tests marked so.
AT_REAL_TIME = pytest.mark.clock_start.with_args(real_now)


def kind_of(store: Any) -> str:
    if isinstance(store, SQLiteCooldownStore):
        return "sqlite"
    if isinstance(store, RedisCooldownStore):
        return "redis"
    return "memory"


def never_waiting(clock: Any, store: Any, *, who: str | None = None, **adapter_kw: Any) -> requests.Session:
    """A Session whose adapter never waits (``max_wait=0``: every wait is a deferral, so
    the FakeClock moves only when the test moves it) and sends each attempt once."""
    s = requests.Session()
    retry = RetryAfterRetry(clock=clock, total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, **adapter_kw))
    if who is not None:
        s.headers["X-Who"] = who
    return s
