"""Quota admission (``Quota(limit, per=...)``) with real parts: the adapter against a
real loopback server, every store, and real processes sharing one SQLite file while
the server counts arrivals."""

from __future__ import annotations

import multiprocessing
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
    Quota,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
)
from retry_after_adapter.cooldown import Ask, Store
from retry_after_adapter.cooldown.guard import guard_of

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer
from .conftest import process_store, process_store_place

UTC = timezone.utc


def session(clock: Any, store: Any, quota: Quota, **kw: Any) -> requests.Session:
    kw.setdefault("total", 2)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, **kw), cooldown=store, quota=quota))
    return s


def test_a_quota_admits_limit_requests_then_defers_with_the_exact_time(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    quota = Quota(3, per=10, margin=0)
    server.serve([Reply(200)])
    start = clock.now()
    sessions = [session(clock, store, quota, max_wait=1) for _ in range(4)]
    assert [s.get(server.url).status_code for s in sessions[:3]] == [200, 200, 200]
    deferral = local_deferral(sessions[3].get(server.url))  # nothing sent
    assert deferral.reason == "quota"
    assert deferral.eligible_at == start + timedelta(seconds=10)
    assert server.count() == 3
    clock.advance(10)
    assert sessions[3].get(server.url).status_code == 200


def test_a_permit_that_would_come_after_the_deadline_defers_with_reason_deadline_at_its_time(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """The next permit is 10 s away: it fits ``max_wait=30`` but not ``deadline=2``: the
    deferral says the deadline forced it (reason ``deadline``, as the README's reasons
    table says) and is eligible when the permit frees, not in 0.1 s. Longer than
    ``max_wait`` it stays ``quota``."""
    store = MemoryCooldownStore()
    quota = Quota(1, per=10, margin=0)
    server.serve([Reply(200)])
    start = clock.now()
    assert session(clock, store, quota, max_wait=30, deadline=2).get(server.url).status_code == 200
    deferral = local_deferral(session(clock, store, quota, max_wait=30, deadline=2).get(server.url))
    assert deferral.reason == "deadline", deferral
    assert deferral.eligible_at == start + timedelta(seconds=10)
    assert 9.9 <= deferral.delay <= 10.0, deferral
    longer = local_deferral(session(clock, store, quota, max_wait=1, deadline=2).get(server.url))
    assert longer.reason == "quota" and longer.eligible_at == start + timedelta(seconds=10), longer
    assert server.count() == 1


def test_a_quota_wait_that_fits_is_waited_out(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    quota = Quota(2, per=5, margin=0)
    server.serve([Reply(200)])
    s = session(clock, store, quota, max_wait=10)
    assert [s.get(server.url).status_code for _ in range(3)] == [200, 200, 200]
    assert clock.sleeps == [5.0]
    gaps = [(b.at - a.at).total_seconds() for a, b in zip(server.seen, server.seen[1:], strict=False)]
    assert gaps == [0.0, 5.0]


def test_retries_take_permits_too(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(503, {"Retry-After": "1"}), Reply(200)])
    response = session(clock, store, Quota(2, per=60, margin=0), max_wait=5).get(server.url)
    assert response.deferral is not None and response.deferral.reason == "quota"  # the third attempt
    assert server.count() == 2


def test_the_pool_manager_takes_permits(server: ThrottleServer, clock: FakeClock) -> None:
    pool = RetryAfterPoolManager(
        retries=RetryAfterRetry(total=0, clock=clock, max_wait=1), cooldown=MemoryCooldownStore(),
        quota=Quota(1, per=30, margin=0),
    )  # fmt: skip
    server.serve([Reply(200)])
    assert pool.request("GET", server.url).status == 200
    assert local_deferral(pool.request("GET", server.url)).reason == "quota"
    assert server.count() == 1


def test_a_quota_needs_a_store_that_takes_permits() -> None:
    class OldStore(Store):
        def get(self, scope: str) -> datetime | None:
            return None

        def extend(self, scope: str, until: datetime) -> datetime:
            return until

    with pytest.raises(ConfigurationError, match=r"the QuotaLogs capability\)"):
        RetryAfterAdapter(cooldown=OldStore(), quota=Quota(1, per=1))
    with pytest.raises(ConfigurationError):
        RetryAfterAdapter(cooldown=None, quota=Quota(1, per=1))
    RetryAfterAdapter(cooldown=OldStore())  # a store of the core alone works for cooldowns
    for bad in ({"limit": 0, "per": 1}, {"limit": 1, "per": 0}, {"limit": 1, "per": 1, "margin": -1}):
        with pytest.raises(ConfigurationError):
            Quota(**bad)


# -- the stores: the sliding log ------------------------------------------------------


def test_every_store_grants_at_most_limit_in_any_window(store: Any) -> None:
    base = datetime.now(UTC).replace(microsecond=0)
    granted = []
    for i in range(40):  # one attempt every 0.25 s for 10 s, quota 3 per 2 s
        now = base + timedelta(milliseconds=250 * i)
        if store.acquire("s", 3, 2.0, now) is None:
            granted.append(now)
    for i, at in enumerate(granted):
        within = [t for t in granted[i:] if t < at + timedelta(seconds=2)]
        assert len(within) <= 3
    assert len(granted) == 15  # 3 at 0, 0.25, 0.5; then 3 more every 2 s: never fewer
    refused = store.acquire("s", 3, 2.0, granted[-1])
    assert refused == granted[-3] + timedelta(seconds=2)  # when the oldest of the 3 leaves
    assert store.acquire("other", 3, 2.0, granted[-1]) is None  # scopes are independent


def _inside_a_millisecond() -> datetime:
    """A time 0.7 ms into a whole millisecond (the stores keep whole milliseconds)."""
    return datetime.now(UTC).replace(microsecond=0) + timedelta(microseconds=700)


def test_a_permit_counts_its_whole_window_from_a_grant_inside_a_millisecond(store: Any) -> None:
    """A permit granted 0.7 ms into a millisecond counts ``per + margin`` from its grant,
    not from the millisecond's start (0.7 ms less: a request that reached the server
    within the margin could then share its server window with the next permit's)."""
    grant = _inside_a_millisecond()
    answer = store.admit(Ask(scope="s", now=grant, limit=1, per=1.0, margin=0.05))
    assert answer.not_before is None and answer.permit is not None
    assert answer.permit >= grant + timedelta(seconds=1.05)
    just_before = grant + timedelta(seconds=1.05) - timedelta(microseconds=200)
    refused = store.admit(Ask(scope="s", now=just_before, limit=1, per=1.0, margin=0.05))
    assert refused.not_before is not None, "a permit stopped counting before its grant + per + margin"


def test_a_batch_counts_hold_longer_from_a_grant_inside_a_millisecond(store: Any) -> None:
    """The extra permits of a batch granted 0.7 ms into a millisecond count ``per +
    margin + hold`` from the grant: just before that, only the others are free."""
    grant = _inside_a_millisecond()
    answer = store.admit(Ask(scope="b", now=grant, limit=8, per=1.0, margin=0.05, batch=4, hold=0.1))
    assert answer.not_before is None and answer.extra > 0
    at = grant + timedelta(seconds=1.15) - timedelta(microseconds=200)
    admitted = 0
    while admitted <= 8 and store.admit(Ask(scope="b", now=at, limit=8, per=1.0, margin=0.05)).not_before is None:
        admitted += 1
    assert admitted == 8 - answer.extra, "a batch's extra permits stopped counting before grant + per + margin + hold"


@pytest.mark.parametrize("exact", [False, True])
def test_a_settled_permit_counts_until_its_answer_plus_per_inside_a_millisecond(store: Any, exact: bool) -> None:
    """An attempt answered 0.7 ms into a millisecond reached the server by then: its
    permit, settled at that answer, counts until the answer + ``per``, never up to a
    millisecond less (the next permit could reach the server inside the same window)."""
    grant = datetime.now(UTC).replace(microsecond=0)
    permit = store.admit(Ask(scope="s", now=grant, limit=1, per=1.0)).permit
    assert permit is not None
    answered = _inside_a_millisecond() + timedelta(milliseconds=300)
    store.settle("s", 1, 1.0, permit, answered, exact)
    just_before = answered + timedelta(seconds=1) - timedelta(microseconds=200)
    refused = store.admit(Ask(scope="s", now=just_before, limit=1, per=1.0))
    assert refused.not_before is not None, "a settled permit stopped counting before its answer + per"
    assert store.admit(Ask(scope="s", now=answered + timedelta(seconds=1.001), limit=1, per=1.0)).not_before is None


# -- real processes on one SQLite file, counted by the server --------------------------


def _worker(url: str, kind: str, where: str, seconds: float, threads: int) -> None:
    # 64 threads in 8 processes on a small machine: between a permit and the server
    # seeing the request, the interpreter lock can hold a thread back ~0.2 s. The
    # margin covers that, so the server's own count stays within the quota.
    quota = Quota(100, per=1, margin=0.25)
    store = process_store(kind, where, "q8x8:")
    stop = time.monotonic() + seconds

    def run() -> None:
        s = requests.Session()
        # Failing closed: an operation the store does not answer in time defers the
        # attempt instead of admitting it on this process's own count (failing open
        # keeps local limits only: with 8 processes that is 8 quotas). What is
        # counted here is the shared quota, not how loaded the machine happens to be.
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=0, max_wait=0.5), cooldown=store, quota=quota, store_failure="closed"
        )
        s.mount("http://", adapter)
        while time.monotonic() < stop:
            s.get(url, timeout=5)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_eight_processes_of_eight_threads_never_exceed_the_quota_at_the_server(
    real_server: ThrottleServer, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    where = process_store_place(kind, tmp_path, request)
    real_server.serve([Reply(200)])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(real_server.url, kind, where, 2.5, 8)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    arrivals = sorted(s.at for s in real_server.seen)
    assert len(arrivals) >= 150  # the quota was the limit, not the machine
    worst = max(
        sum(1 for t in arrivals[i : i + 200] if t < at + timedelta(seconds=1))
        for i, at in enumerate(arrivals)
    )
    assert worst <= 100, worst


@pytest.mark.redis
def test_with_redis_an_attempt_costs_one_round_trip_and_two_with_a_cap_without_push(
    server: ThrottleServer, clock: FakeClock, redis_url: str, redis_client: Any, redis_module: Any
) -> None:
    from retry_after_adapter import RedisCooldownStore

    class Counting(redis_module.Redis):  # type: ignore[misc, name-defined]
        commands: list[str] = []

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            Counting.commands.append(str(args[0]))
            return super().execute_command(*args, **kwargs)

    client = Counting.from_url(redis_url, socket_timeout=2.0)
    store = RedisCooldownStore(client, prefix="rt:", timeout=2.0, push=False)
    server.serve([Reply(200)])

    def one_get(**kw: Any) -> list[str]:
        s = requests.Session()
        s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, total=0), cooldown=store, **kw))
        s.get(server.url)  # warm: scripts loaded, the success noted (once a second)
        near = guard_of(store).near
        for _ in range(100):  # the change channel subscribed (a few ms)
            if near is None or near.fresh():
                break
            time.sleep(0.01)
        Counting.commands.clear()
        assert s.get(server.url).status_code == 200
        return list(Counting.commands)

    assert one_get(quota=Quota(100, per=60)) == ["EVALSHA"]  # cooldown + permit + allowance
    assert one_get(quota=Quota(100, per=60), max_concurrency=4) == ["EVALSHA", "ZREM"]  # + give back
    # With push (the default), the process keeps the slot for its next attempt, and a
    # scope it knows, unchanged, needs no read: only the permit is asked for.
    pushed = RedisCooldownStore(client, prefix="rt2:", timeout=2.0)
    store = pushed
    assert one_get(quota=Quota(100, per=60), max_concurrency=4) == ["EVALSHA"]
    assert one_get(max_concurrency=4) == []
