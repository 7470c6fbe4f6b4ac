"""The concurrency cap's slots, what admission holds and gives back (the cap itself is
``test_concurrency.py``'s), with real parts: a loopback HTTP server (``PromiseServer``)
that counts the requests it has in progress, real SQLite files, and real
``redis-server`` processes (the session's, and ones of the test's own that are killed
and restarted on the same port).

1. A concurrency slot is never leaked: when the store grants an admission and its
   lease, and the failure layer's local copy then turns the grant into "not yet" (it
   holds a cooldown the store did not have yet), the lease is given back.
2. The cap covers the whole attempt, body included: a slot is held until the body has
   been read (or, with ``stream=True``, until the response is closed or read to its end),
   not only until the headers arrive.
3. A cooldown learned while the store was down is written back within a second or two
   of its recovery, even if the process that learned it makes no further call.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
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
    budget,
    deferral_of,
)
from retry_after_adapter.cooldown.guard import BREAKER_FIRST, guard_of

from ..conftest import RedisServer, local_deferral
from ..servers import PromiseServer

UTC = timezone.utc


def leases_held(store: Any, scope: str, client: Any = None) -> int:
    """How many concurrency leases ``store`` holds for ``scope``, read from the store's
    own records: the memory store's lease table, the SQLite ``lease`` table (with a
    connection of our own), the Redis lease set (with a plain client). Slots this
    process keeps idle for its next attempt (a shared store's near copy) are given back
    first: they are not held by an attempt."""
    if isinstance(store, MemoryCooldownStore):
        return len(store._leases.get(scope, {}))
    near = guard_of(store).near
    if near is not None:
        near.slots.release_all()
    if isinstance(store, SQLiteCooldownStore):
        with closing(sqlite3.connect(store.path, timeout=5)) as db:
            row = db.execute("SELECT count(*) FROM lease WHERE scope = ?", (scope,)).fetchone()
        return int(row[0])
    assert isinstance(store, RedisCooldownStore)
    redis_client = client if client is not None else store.client
    return int(redis_client.zcard(store.companion(scope, "lease")))


def kind_of(store: Any) -> str:
    if isinstance(store, MemoryCooldownStore):
        return "memory"
    return "sqlite" if isinstance(store, SQLiteCooldownStore) else "redis"


def run_threads(count: int, work: Callable[[int], None], join: float = 10.0) -> list[BaseException]:
    """Run ``work(i)`` on ``count`` threads started together; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(i: int) -> None:
        try:
            start.wait(5)
            work(i)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    return errors


# -- 1. concurrency slots are never leaked after a 429 -----------------------------------


class Outage:
    """A shared store of ``kind`` that can be broken and mended: a SQLite file whose
    directory is renamed away and back, or a redis-server of the test's own that is
    killed and restarted (empty) on the same port."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.client: Any = None
        if kind == "sqlite":
            self.directory = tmp_path / "d"
            self.directory.mkdir()
            self.away = tmp_path / "moved"
            self.store: Any = SQLiteCooldownStore(self.directory / "cooldown.db")
        else:
            self.redis_module = request.getfixturevalue("redis_module")
            self.redis: RedisServer = request.getfixturevalue("redis_factory")()
            self.store = RedisCooldownStore.from_url(self.redis.url)

    def down(self) -> None:
        if self.kind == "sqlite":
            self.directory.rename(self.away)
        else:
            self.redis.kill()

    def up(self) -> None:
        if self.kind == "sqlite":
            self.away.rename(self.directory)
        else:
            self.redis.restart()
            self.client = self.redis_module.Redis.from_url(
                self.redis.url, socket_timeout=2.0, socket_connect_timeout=2.0
            )

    def close(self) -> None:
        self.store.close()
        if self.client is not None:
            self.client.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_slot_granted_by_the_store_but_held_back_by_a_pending_cooldown_is_given_back(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    make_promise_server: Callable[..., PromiseServer],
) -> None:
    """The smallest scenario: a 429 learned while the store is down waits in the failure
    layer's local copy; the store comes back empty; the next call's admission is granted
    by the store, slot included, and then held back by the local cooldown (written back
    in the same operation). That slot must be given back: with ``max_concurrency=1``,
    a call after the cooldown goes out."""
    clock = FakeClock(start=datetime.now(UTC))
    server = make_promise_server()
    server.replies = {1: (429, {"Retry-After": "5"})}  # the second request; 200s otherwise
    outage = Outage(kind, tmp_path, request)
    store = outage.store
    guard = guard_of(store)
    guard.breaker.monotonic = clock.monotonic
    s = requests.Session()
    retry = RetryAfterRetry(total=0, clock=clock, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=1))
    try:
        assert s.get(server.url, timeout=5).status_code == 200  # healthy: warm
        assert leases_held(store, server.scope) == 0
        outage.down()
        throttled = s.get(server.url, timeout=5)  # fail open: sent, and the 429 kept locally
        assert throttled.status_code == 429 and not throttled.local
        assert deferral_of(throttled) is not None
        assert guard.pending == 1  # the cooldown waits in the local copy to be written back
        outage.up()
        clock.advance(BREAKER_FIRST)  # the breaker lets the next operation probe the store
        held_back = s.get(server.url, timeout=5)
        assert local_deferral(held_back).reason == "cooldown"
        assert server.total == 2
        held = leases_held(store, server.scope, outage.client)
        assert held == 0, (
            f"{kind}: the store granted the admission and a lease, the failure layer turned it "
            f"into 'not yet' (a local cooldown), and {held} lease(s) were never given back"
        )
        clock.advance(6)  # past the cooldown: the only slot must be free
        after = s.get(server.url, timeout=5)
        assert after.status_code == 200 and not after.local, (
            f"{kind}: after the cooldown the call was deferred with reason "
            f"{deferral_of(after).reason if deferral_of(after) else None!r}: the slot leaked"
        )
        assert server.total == 3
        assert leases_held(store, server.scope, outage.client) == 0
    finally:
        outage.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_slot_granted_while_a_stranded_cooldown_is_written_back_is_given_back(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    make_promise_server: Callable[..., PromiseServer],
) -> None:
    """No outage at all: a 429 arrives after its call's deadline, so the cooldown it
    sets is kept in the local copy and its write is left for the next store operation
    (stranded). The next call's admission is granted by the store, slot included, then
    held back by that cooldown (written back in the same operation). The slot must be
    given back."""
    clock = FakeClock(start=datetime.now(UTC))
    server = make_promise_server()
    server.replies = {0: (429, {"Retry-After": "5"})}  # 200s after the first
    # The first answer takes two seconds (of the test's clock): past its call's deadline.
    server.before_reply = lambda index: clock.advance(2.0) if index == 0 else None
    if kind == "sqlite":
        store: Any = SQLiteCooldownStore(tmp_path / "cooldown.db")
    else:
        store = RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="stranded:")
    guard = guard_of(store)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, clock=clock, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=1))
    with budget(deadline=1.0):
        late = s.get(server.url, timeout=5)
    assert late.status_code == 429 and not late.local
    assert deferral_of(late) is not None
    assert guard.local.get(server.scope) is not None and not guard.down  # learned; store healthy
    assert leases_held(store, server.scope) == 0  # that attempt's slot came back

    held_back = s.get(server.url, timeout=5)  # granted by the store, held back locally
    assert local_deferral(held_back).reason == "cooldown"
    assert server.total == 1
    held = leases_held(store, server.scope)
    assert held == 0, (
        f"{kind}: the store granted the admission and a lease, the failure layer turned it "
        f"into 'not yet' (a cooldown it was writing back), and {held} lease(s) were never given back"
    )
    clock.advance(6)  # past the cooldown: the only slot must be free
    after = s.get(server.url, timeout=5)
    assert after.status_code == 200 and not after.local, deferral_of(after)
    assert leases_held(store, server.scope) == 0


#: Rounds of the burst below, and calls a worker makes per round at most.
ROUNDS = 3
CALLS = 20


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def burst_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``every_store``, with a SQLite lock timeout of 2 s: 64 threads writing to one file
    on 2 cores can wait past the default 0.25 s, and a run of such waits opens the
    failure layer's breaker (its releases are then skipped and the leases expire by
    themselves), which is not what the burst test is about."""
    if request.param == "memory":
        return MemoryCooldownStore()
    if request.param == "sqlite":
        return SQLiteCooldownStore(tmp_path / "burst.db", timeout=2.0)
    return RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="burst:")


def test_sixty_four_threads_and_a_429_leak_no_slot(
    burst_store: Any, make_promise_server: Callable[..., PromiseServer]
) -> None:
    """The bug report's scenario: 64 threads with a Session each, ``max_concurrency=8``,
    ``total=0``; the server answers one request with 429 ``Retry-After: 1`` while the
    workers keep calling (a worker whose call is deferred for want of a slot calls
    again 50 ms later; one that meets the cooldown stops). After each burst the store
    holds no lease of the scope; after the cooldown, a batch of 8 runs 8 at once.

    The calls run on a FakeClock started at the real time and never wait
    (``max_wait=0``), so the cooldown's second is skipped by moving the clock, not
    slept: a few bursts fit in a few seconds."""
    store = burst_store
    kind = kind_of(store)
    clock = FakeClock(start=datetime.now(UTC))
    server = make_promise_server(hold=0.01)
    outcomes: list[str] = []
    lock = threading.Lock()

    def session(max_wait: float) -> requests.Session:
        s = requests.Session()
        retry = RetryAfterRetry(total=0, clock=clock, max_wait=max_wait, raise_on_status=False)
        # learn_rate=False: the learned rate would admit the batch after the cooldown
        # by what the server accepted before its 429 (this is about the slots alone).
        s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=8, learn_rate=False))
        return s

    def outcome(response: requests.Response) -> str:
        deferral = deferral_of(response)
        local = getattr(response, "local", False)
        return str(deferral.reason) if local and deferral is not None else str(response.status_code)

    def worker(i: int) -> None:
        s = session(0.0)
        for _ in range(CALLS):
            seen = outcome(s.get(server.url, timeout=5))
            with lock:
                outcomes.append(seen)
            if seen in ("cooldown", "429"):
                return  # the cooldown is known: this worker's part of the burst is over
            if seen != "200":
                time.sleep(0.05)  # deferred (no slot free): call again shortly

    for burst in range(1, ROUNDS + 1):
        server.replies = {server.total + 10: (429, {"Retry-After": "1"})}
        server.restart_counts()
        outcomes.clear()
        errors = run_threads(64, worker)
        assert not errors, errors
        assert "429" in outcomes  # the 429 was met, and its cooldown learned
        held = leases_held(store, server.scope)
        assert held == 0, (
            f"{kind}: after burst {burst} of {ROUNDS}, {held} of 8 concurrency leases were never "
            f"given back (outcomes: { {o: outcomes.count(o) for o in sorted(set(outcomes))} })"
        )
        clock.advance(2)  # past the cooldown

    # A batch of 8 after the cooldown runs 8 at once.
    server.gather = 8
    server.gather_timeout = 2.0  # ends as soon as 8 are in: room for a loaded machine
    server.restart_counts()
    sent_before = server.total
    outcomes.clear()

    def batch(i: int) -> None:
        seen = outcome(session(1.0).get(server.url, timeout=5))
        with lock:
            outcomes.append(seen)

    errors = run_threads(8, batch)
    assert not errors, errors
    assert server.most == 8, (
        f"{kind}: a batch of 8 after the cooldown ran at most {server.most} at once "
        f"({server.total - sent_before} sent; outcomes {sorted(outcomes)})"
    )
    assert outcomes == ["200"] * 8
    assert leases_held(store, server.scope) == 0


# -- 2. the cap covers the whole attempt, body included ---------------------------------

BODY = b"x" * 1024
BODY_DELAY = 0.3


def test_the_cap_holds_until_the_body_has_arrived(
    every_store: Any, make_promise_server: Callable[..., PromiseServer]
) -> None:
    """16 threads, ``max_concurrency=2``, a server that sends its headers at once and
    its body 0.3 s later: never more than 2 requests in progress at the server."""
    store = every_store
    server = make_promise_server(body=BODY, body_delay=BODY_DELAY)
    bodies: list[bytes] = []

    def call(i: int) -> None:
        s = requests.Session()
        retry = RetryAfterRetry(total=0, max_wait=5, raise_on_status=False)
        s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=2))
        response = s.get(server.url, timeout=5)
        assert response.status_code == 200 and not response.local, deferral_of(response)
        bodies.append(response.content)

    started = time.monotonic()
    errors = run_threads(16, call)
    took = time.monotonic() - started
    assert not errors, errors
    assert bodies == [BODY] * 16
    assert server.total == 16
    assert server.most <= 2, (
        f"{kind_of(store)}: the server had {server.most} requests in progress at once under "
        f"max_concurrency=2 (the slot was given back when the headers arrived, before the body; "
        f"16 calls took {took:.2f} s)"
    )
    assert leases_held(store, server.scope) == 0


def test_a_streamed_response_holds_its_slot_until_closed_or_read(
    every_store: Any, make_promise_server: Callable[..., PromiseServer]
) -> None:
    """With ``stream=True`` the slot is held until the response is closed or its body
    read to the end: two open streamed responses fill ``max_concurrency=2``, a third
    call defers with reason ``concurrency`` without sending; closing one (or reading
    one to its end) lets a new call go."""
    store = every_store
    kind = kind_of(store)
    clock = FakeClock(start=datetime.now(UTC))  # waits for a slot cost no real time
    server = make_promise_server(body=BODY)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, clock=clock, max_wait=5, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=2))

    first = s.get(server.url, stream=True, timeout=5)
    second = s.get(server.url, stream=True, timeout=5)
    assert first.status_code == second.status_code == 200
    assert server.total == 2
    with budget(max_wait=0.2):
        third = s.get(server.url, timeout=5)
    deferral = deferral_of(third)
    got = (
        f"a local {third.status_code} ({deferral.reason})"
        if deferral
        else f"a {third.status_code} from the server"
    )
    assert deferral is not None and deferral.reason == "concurrency", (
        f"{kind}: with two streamed responses open under max_concurrency=2, a third call got {got}; "
        f"the server saw {server.total} requests (the slots were given back when the headers arrived)"
    )
    assert third.local and server.total == 2  # nothing was sent
    assert leases_held(store, server.scope) == 2

    first.close()  # closing a streamed response gives its slot back
    with budget(max_wait=0.2):
        fourth = s.get(server.url, timeout=5)
    assert fourth.status_code == 200 and not fourth.local, deferral_of(fourth)
    assert fourth.content == BODY and server.total == 3

    assert second.content == BODY  # read to its end: its slot comes back too
    with budget(max_wait=0.2):
        fifth = s.get(server.url, stream=True, timeout=5)
        sixth = s.get(server.url, stream=True, timeout=5)
    assert not fifth.local and not sixth.local, (deferral_of(fifth), deferral_of(sixth))
    assert server.total == 5
    fifth.close()
    sixth.close()
    assert leases_held(store, server.scope) == 0


# -- 3. a cooldown learned during an outage is written back without another call --------


@pytest.mark.redis
def test_a_cooldown_learned_while_redis_was_down_is_written_back_without_another_call(
    redis_factory: Callable[..., RedisServer],
    redis_module: Any,
    make_promise_server: Callable[..., PromiseServer],
) -> None:
    """A 429 with ``Retry-After: 30`` met while Redis is down is kept in the process;
    Redis restarts (empty, same port) and the process makes no further call. Within
    two seconds the cooldown is in Redis, and a fresh store object on the same URL and
    prefix, through a new adapter, defers with reason ``cooldown`` before sending."""
    redis = redis_factory()
    server = make_promise_server()
    server.default = (429, {"Retry-After": "30"})
    server.replies = {0: (200, {})}
    store = RedisCooldownStore.from_url(redis.url)
    s = requests.Session()
    s.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=1, raise_on_status=False), cooldown=store),
    )
    assert s.get(server.url, timeout=5).status_code == 200  # healthy: the store in use
    redis.kill()
    learned_at = datetime.now(UTC)
    throttled = s.get(server.url, timeout=5)
    assert throttled.status_code == 429 and not throttled.local
    assert deferral_of(throttled) is not None
    assert guard_of(store).pending == 1  # kept in the process, to be written back
    assert server.total == 2

    redis.restart()
    restarted = time.monotonic()
    client = redis_module.Redis.from_url(redis.url, socket_timeout=2.0, socket_connect_timeout=2.0)
    fresh: RedisCooldownStore | None = None
    try:
        key = store.key(server.scope)
        raw = client.get(key)
        for _ in range(40):  # at most 2 s
            if raw is not None or time.monotonic() - restarted > 2.0:
                break
            time.sleep(0.05)
            raw = client.get(key)
        assert raw is not None, (
            f"the cooldown learned during the outage was not in Redis {time.monotonic() - restarted:.2f} s "
            f"after it came back (no further call was made in the process that learned it; "
            f"{guard_of(store).pending} still pending there)"
        )
        stored = datetime.fromtimestamp(int(raw) / 1000, UTC)
        assert stored >= learned_at + timedelta(seconds=29)

        fresh = RedisCooldownStore.from_url(redis.url)  # another process would open this
        other = requests.Session()
        other.mount(
            "http://",
            RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=1, raise_on_status=False), cooldown=fresh),
        )
        assert local_deferral(other.get(server.url, timeout=5)).reason == "cooldown"
        assert server.total == 2  # nothing was sent
    finally:
        client.close()
        if fresh is not None:
            fresh.close()
        store.close()
