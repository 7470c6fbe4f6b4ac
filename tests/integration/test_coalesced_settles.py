"""Settles written together (``cooldown._coalesce``), on a real SQLite file and a real
``redis-server``: a fleet's settles ride few store operations, a binding quota still
holds at the server and is not slowed, and a process killed with settles waiting
leaves its permits counting (one that exits writes them)."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry, store_from_url
from retry_after_adapter.cooldown._coalesce import settle_delay
from retry_after_adapter.cooldown.base import Ask
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.testing import QuotaServer

SCOPE = "https://api.example.com:443"


def in_threads(count: int, work: Any) -> float:
    """``work()`` in ``count`` threads started together; the seconds until all ended."""
    started = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return time.monotonic() - started


def test_a_fleets_settles_ride_few_store_operations(store_url: str) -> None:
    """Eight threads, 400 GETs under ``Quota(10**6, per=1)`` (its permits taken open:
    each answer settles one): every settle reaches the store, in at most one operation
    per 10 requests (one each before)."""
    store = store_from_url(store_url)
    adapter = RetryAfterAdapter(RetryAfterRetry(total=2), cooldown=store, quota=Quota(10**6, per=1))
    with QuotaServer(10**6, 1) as server, requests.Session() as session:
        session.mount("http://", adapter)

        def work() -> None:
            for _ in range(50):
                assert session.get(server.url + "/x", timeout=10).status_code == 200

        in_threads(8, work)
        settles = guard_of(store).settles
        settles.flush()
        assert server.stats().requests == 400
    assert settles.carried == 400
    assert settles.flushes <= 40, (settles.flushes, settles.carried)


def test_a_binding_quota_holds_at_the_server_and_is_not_slowed(store_url: str) -> None:
    """``Quota(4, per=0.5)``, six threads of two GETs each, on a server allowing 4 per
    0.5 s counted from the first request: no 429 (every window holds), and the 12 go in
    about three windows (the settles land long before their permits' ends)."""
    store = store_from_url(store_url)
    adapter = RetryAfterAdapter(RetryAfterRetry(total=2, max_wait=10), cooldown=store, quota=Quota(4, per=0.5))
    with QuotaServer(4, 0.5, align="first") as server, requests.Session() as session:
        session.mount("http://", adapter)

        def work() -> None:
            for _ in range(2):
                assert session.get(server.url + "/x", timeout=10).status_code == 200

        wall = in_threads(6, work)
        stats = server.stats()
    assert stats.ok == 12 and stats.throttled == 0 and stats.early == 0, stats
    assert guard_of(store).settles.carried >= 1
    assert wall < 3.5, wall  # the ideal: 1.0 s and one request's time (12 at 4 per 0.5 s)


# A process that takes three open permits of Quota(3, per=1), settles them (each waits
# to be written with others), prints when, then is killed or exits.
CHILD = """
import os, signal, sys
from datetime import datetime, timezone
from retry_after_adapter import store_from_url
from retry_after_adapter.cooldown.base import Ask
from retry_after_adapter.cooldown.guard import guard_of

url, how = sys.argv[1], sys.argv[2]
guard = guard_of(store_from_url(url))
scope = "https://api.example.com:443/" + how
for _ in range(3):
    granted = guard.admit(Ask(scope, datetime.now(timezone.utc), 3, 1.0, opened=10.0))
    assert granted.not_before is None and granted.permit is not None, granted
    guard.settle(scope, 3, 1.0, granted.permit, None, exact=True)
assert guard.settles.carried == 0  # all three wait
print(datetime.now(timezone.utc).timestamp(), flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0)
"""


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_process_ending_with_settles_waiting(store_url: str, how: str) -> None:
    """Killed (SIGKILL) with three settles waiting: its open permits still count past
    their answers + per (the quota's three are spent; nothing more goes). Exiting: they
    are written at exit, and the quota is free again at answer + per."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD, store_url, how], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == (-9 if how == "kill" else 0), child.stderr[-2000:]
    answered = datetime.fromtimestamp(float(child.stdout.split()[-1]), timezone.utc)
    store = store_from_url(store_url)
    later = answered + timedelta(seconds=1.0 + 2 * settle_delay(1.0) + 0.3)
    admission = store.admit(Ask(SCOPE + "/" + how, later, 3, 1.0, opened=10.0))
    if how == "kill":
        assert admission.not_before is not None  # the permits count: open, not settled
    else:
        assert admission.not_before is None  # settled at exit: they ended at answer + per


@pytest.mark.redis
def test_on_redis_a_quota_and_a_cap_cost_one_round_trip_per_request(redis_url: str, redis_module: Any) -> None:
    """``Quota(10**6, per=1)`` and ``max_concurrency=100`` that never bind, 8 threads x
    50 GETs, the round trips this process sends to Redis counted at its client: the
    admission of each open permit (one each: never batched), its settle in a pipeline of
    many, and its slot held by the process for the next attempt (no ``ZREM`` each:
    three round trips a request before)."""
    sent: collections.Counter[str] = collections.Counter()

    class Counting(redis_module.Redis):  # type: ignore[misc, name-defined]
        def execute_command(self, *args: Any, **options: Any) -> Any:
            sent[str(args[0]).upper()] += 1
            return super().execute_command(*args, **options)

        def pipeline(self, *args: Any, **kwargs: Any) -> Any:
            pipe = super().pipeline(*args, **kwargs)
            execute = pipe.execute

            def counted(*a: Any, **k: Any) -> Any:
                sent["PIPELINE"] += 1
                return execute(*a, **k)

            pipe.execute = counted
            return pipe

    from retry_after_adapter import RedisCooldownStore

    client = Counting.from_url(redis_url)
    store = RedisCooldownStore(client, prefix="rt:")
    adapter = RetryAfterAdapter(
        RetryAfterRetry(total=2), cooldown=store, quota=Quota(10**6, per=1), max_concurrency=100
    )
    with QuotaServer(10**6, 1) as server, requests.Session() as session:
        session.mount("http://", adapter)

        def work() -> None:
            for _ in range(50):
                assert session.get(server.url + "/x", timeout=10).status_code == 200

        in_threads(8, work)
        guard_of(store).settles.flush()
        requests_done = server.stats().requests
    client.close()
    assert requests_done == 400
    per_request = {name: count / requests_done for name, count in sent.items()}
    assert per_request.get("ZREM", 0) <= 0.05, per_request
    assert per_request.get("PIPELINE", 0) <= 0.1, per_request
    assert sum(per_request.values()) <= 1.25, per_request
