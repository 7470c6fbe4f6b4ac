"""Real processes sharing one cooldown: a SQLite file and a real redis-server.

8 processes x 8 threads extend random times into the same few scopes; afterwards every
scope holds exactly the maximum of everything written. Both ``spawn`` (the store is
pickled into the child) and ``fork`` (the child inherits the parent's store and its open
connection) are exercised.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter.cooldown import CooldownStore, RedisCooldownStore, SQLiteCooldownStore

UTC = timezone.utc
PROCESSES = 8
THREADS = 8
CALLS_PER_THREAD = 40
SCOPES = ("https://a.example:443", "https://b.example:443", "https://c.example:443")
LONG_SCOPE = "https://long.example:443"
RESULT_TIMEOUT = 40.0

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform"
)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def hammer(store: CooldownStore, base_ms: int, seed: int, results: Any) -> None:
    """One worker process: THREADS threads extend random times and check every reply.

    Reports ``(seed, {scope: max ms written}, [problems])`` on ``results``.
    """
    written: dict[str, int] = {}
    problems: list[str] = []
    lock = threading.Lock()

    def thread_main(thread_seed: int) -> None:
        rng = random.Random(thread_seed)
        last: dict[str, datetime] = {}
        mine: dict[str, int] = {}
        for _ in range(CALLS_PER_THREAD):
            scope = rng.choice((*SCOPES, LONG_SCOPE))
            ms = base_ms + rng.randrange(0, 3_600_000)
            until = datetime.fromtimestamp(ms / 1000, UTC)
            try:
                effective = store.extend(scope, until)
            except Exception as exc:
                problems.append(f"extend raised {type(exc).__name__}: {exc}")
                return
            if effective < until:
                problems.append(f"extend shortened: {effective} < {until}")
            if scope in last and effective < last[scope]:
                problems.append(f"stored time went backwards: {effective} < {last[scope]}")
            last[scope] = effective
            mine[scope] = max(mine.get(scope, 0), ms)
        with lock:
            for scope, ms in mine.items():
                written[scope] = max(written.get(scope, 0), ms)

    threads = [threading.Thread(target=thread_main, args=(seed * 1000 + n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RESULT_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        problems.append("a thread did not finish")
    results.put((seed, written, problems))


def run_processes(method: str, store: CooldownStore) -> None:
    """Run PROCESSES hammer workers under ``method`` and check the final state; while
    they run, the parent writes one long cooldown that no worker may shorten."""
    context: Any = multiprocessing.get_context(method)
    results = context.Queue()
    now = datetime.now(UTC)
    base_ms = _ms(now.replace(microsecond=now.microsecond // 1000 * 1000))
    long_until = datetime.fromtimestamp((base_ms + 2 * 3_600_000) / 1000, UTC)
    workers = [
        context.Process(target=hammer, args=(store, base_ms, seed, results), daemon=True)
        for seed in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        assert store.extend(LONG_SCOPE, long_until) == long_until
        reports: list[tuple[int, dict[str, int], list[str]]] = []
        deadline = time.monotonic() + RESULT_TIMEOUT
        while len(reports) < PROCESSES:
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"only {len(reports)} of {PROCESSES} workers reported in time")
        for worker in workers:
            worker.join(timeout=10)
            assert worker.exitcode == 0
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
    problems = [problem for _, _, found in reports for problem in found]
    assert problems == []
    expected: dict[str, int] = {}
    for _, written, _ in reports:
        for scope, ms in written.items():
            expected[scope] = max(expected.get(scope, 0), ms)
    assert set(expected) >= set(SCOPES)
    for scope in SCOPES:
        stored = store.get(scope)
        assert stored is not None and _ms(stored) == expected[scope], scope
    # The long cooldown outlasts every shorter one the workers wrote over it.
    assert store.get(LONG_SCOPE) == long_until


@pytest.mark.parametrize("method", ["spawn", pytest.param("fork", marks=needs_fork)])
def test_sqlite_processes_and_threads_end_with_the_maximum(method: str, tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "shared.db", timeout=10.0) as store:
        store.get("warm")  # the parent's connection is open before the workers start
        run_processes(method, store)


@pytest.mark.redis
@pytest.mark.parametrize("method", ["spawn", pytest.param("fork", marks=needs_fork)])
def test_redis_processes_and_threads_end_with_the_maximum(
    method: str, redis_url: str, redis_client: Any
) -> None:
    # from_url: picklable for spawn; under fork redis-py opens new connections in the child.
    store = RedisCooldownStore.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
    store.get("warm")
    try:
        run_processes(method, store)
    finally:
        store.close()


def child_uses_inherited_store(store: SQLiteCooldownStore, until: datetime, results: Any) -> None:
    try:
        inherited = store._slot() is None  # the parent's connection is not reused here
        effective = store.extend("forked", until)
        seen = store.get("forked")
        store.close()  # closes only what the child opened
        results.put((inherited, effective, seen, None))
    except Exception as exc:
        results.put((False, None, None, f"{type(exc).__name__}: {exc}"))


@needs_fork
def test_sqlite_store_created_before_fork_works_in_the_child(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "fork.db")
    before = datetime.fromtimestamp(int(time.time()) + 10, UTC)
    store.extend("forked", before)  # the parent's connection is open across the fork
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    later = before + timedelta(minutes=1)
    child = context.Process(target=child_uses_inherited_store, args=(store, later, results))
    child.start()
    try:
        fresh_connection, effective, seen, error = results.get(timeout=RESULT_TIMEOUT)
        child.join(timeout=10)
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
    assert error is None
    assert fresh_connection
    assert effective == later and seen == later
    assert child.exitcode == 0
    # The parent's own connection is intact after the child closed its store copy.
    assert store.get("forked") == later
    assert store.extend("forked", later + timedelta(seconds=1)) == later + timedelta(seconds=1)
    store.close()
