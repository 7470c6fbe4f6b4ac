"""Behaviours that a restructure of the engine and the store failure layer once broke,
pinned with real parts: a loopback HTTP server, real requests and urllib3 loops, and
stores written against older releases' store protocols.

- A fail-closed adapter whose breaker probe runs out of the call's time while the store
  hangs sends nothing: it answers with a local 429 ``cooldown-unknown``.
- Without a store (``cooldown=None``), a redirect hop that used up the deadline defers
  with reason ``deadline`` before the next hop is sent.
- A 0.x store (no ``admit``) whose ``acquire`` fails leaves no concurrency slot held.
- In urllib3's own retry loop, a wait cancelled through ``budget(cancel=...)`` gives a
  deferral (and hook records) that keep the last response's status and Retry-After.
- A 0.4 store with its own ``admit`` keeps being asked through that ``admit`` when a
  concurrency lease is wanted too, so the allowance it learned holds.
- A 0.x store without ``allow``/``note`` costs no helper-thread operations for them.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import requests
import urllib3

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    budget,
)
from retry_after_adapter.cooldown import Ask, Lease
from retry_after_adapter.cooldown.guard import BREAKER_FIRST, guard_of
from retry_after_adapter.errors import CooldownStoreError, MaxRetryDeferred

from ..conftest import local_deferral
from ..servers import Reply, Seen, ThrottleServer

#: Quota headers announcing one request left in a 60 s window.
ONE_LEFT = {"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset-After": "60"}


def mount(adapter: RetryAfterAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    return session


# -- fail closed: the breaker's probe runs out of the call's time ----------------------


class SwitchableStore:
    """A shared store with the 0.5 signatures (kept in memory) that can be switched to
    fail on every operation, or to hang until released."""

    stamps_grants = True

    def __init__(self) -> None:
        self.m = MemoryCooldownStore()
        self.mode = "ok"
        self.release_hang = threading.Event()
        self.calls: list[str] = []

    def _gate(self, name: str) -> None:
        self.calls.append(name)
        if self.mode == "fail":
            raise CooldownStoreError("down")
        if self.mode == "hang":
            self.release_hang.wait(2.0)

    def get(self, scope: str) -> Any:
        self._gate("get")
        return self.m.get(scope)

    def extend(self, scope: str, until: datetime) -> Any:
        self._gate("extend")
        return self.m.extend(scope, until)

    def admit(
        self,
        scope: str,
        now: datetime,
        limit: Any = None,
        per: Any = None,
        lease: Any = None,
        margin: float = 0.0,
    ) -> Any:
        self._gate("admit")
        # A store of 0.x is given a lease as a tuple (slots, ttl, token).
        slot = None if lease is None else Lease(slots=lease[0], ttl=lease[1], token=lease[2])
        return self.m.admit(Ask(scope=scope, now=now, limit=limit, per=per, lease=slot, margin=margin))

    def acquire(self, scope: str, limit: int, per: float, now: Any = None, margin: float = 0.0) -> Any:
        self._gate("acquire")
        return self.m.acquire(scope, limit, per, now, margin)

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> Any:
        self._gate("lease")
        return self.m.lease(scope, limit, ttl, now, token)

    def release(self, scope: str, token: str) -> Any:
        self._gate("release")
        return self.m.release(scope, token)

    def allow(self, *args: Any) -> Any:
        self._gate("allow")
        return self.m.allow(*args)

    def settle(self, *args: Any) -> Any:
        self._gate("settle")
        return self.m.settle(*args)

    def note(self, *args: Any) -> Any:
        self._gate("note")
        return self.m.note(*args)

    def freshness(self, scope: str) -> Any:
        return self.m.freshness(scope)

    def freshness_entries(self) -> Any:
        return self.m.freshness_entries()

    def entries(self) -> Any:
        return self.m.entries()


@pytest.fixture
def switchable() -> Iterator[SwitchableStore]:
    store = SwitchableStore()
    yield store
    store.release_hang.set()  # a helper thread still waiting on the hung store ends now


def test_fail_closed_probe_out_of_the_calls_time_sends_nothing(
    clock: FakeClock, server: ThrottleServer, switchable: SwitchableStore
) -> None:
    guard_of(switchable).breaker.monotonic = clock.monotonic  # the breaker's back-off follows the test clock

    def session(deadline: float | None) -> requests.Session:
        retry = RetryAfterRetry(0, clock=clock, deadline=deadline)
        return mount(
            RetryAfterAdapter(retry, cooldown=switchable, store_failure="closed", quota=Quota(100, per=60))
        )

    switchable.mode = "fail"
    first = session(None).get(f"{server.url}/a")
    assert local_deferral(first).reason == "cooldown-unknown", "a failing store must fail closed"
    assert server.count() == 0

    clock.advance(BREAKER_FIRST)  # the back-off has passed: the next operation is the probe
    switchable.mode = "hang"
    switchable.calls.clear()
    response = session(0.1).get(f"{server.url}/b")  # 0.1 s left: less than the store's timeout

    assert switchable.calls, "the probe was expected to reach the store (setup)"
    assert server.count() == 0, (
        f"a fail-closed call whose probe ran out of time sent {[s.path for s in server.seen]}"
    )
    assert response.status_code == 429
    assert response.headers.get("X-Local-Deferral") == "cooldown-unknown", (
        f"expected a local cooldown-unknown deferral, got {response.headers.get('X-Local-Deferral')!r}"
    )
    assert local_deferral(response).reason == "cooldown-unknown"


# -- no store: a redirect hop that used up the deadline ---------------------------------


@pytest.mark.parametrize("store", ["none", "memory"])
def test_redirect_hop_that_used_up_the_deadline_defers_before_the_next_hop(
    clock: FakeClock, server: ThrottleServer, store: str
) -> None:
    def slow_redirect(seen: Seen) -> Reply:
        if seen.path == "/start":
            clock.advance(5.0)  # this hop took 5 s of the call's 2 s deadline
            return Reply(302, {"Location": "/next"}, b"")
        return Reply(200)

    server.responder = slow_redirect
    cooldown = None if store == "none" else MemoryCooldownStore()
    session = mount(RetryAfterAdapter(RetryAfterRetry(3, deadline=2.0, clock=clock), cooldown=cooldown))

    response = session.get(f"{server.url}/start")

    assert [s.path for s in server.seen] == ["/start"], (
        f"the next hop was sent after the deadline had passed: {[s.path for s in server.seen]}"
    )
    assert response.status_code == 429
    assert response.headers.get("X-Local-Deferral") == "deadline"
    assert local_deferral(response).reason == "deadline"


# -- a 0.x store without admit: a failed acquire leaves no slot held --------------------


class Store0xSlots:
    """A 0.x store: get/extend/acquire/lease/release (no admit); acquire can fail."""

    def __init__(self) -> None:
        self.d: dict[str, datetime] = {}
        self.held: dict[str, int] = {}
        self.fail = 0

    def get(self, scope: str) -> datetime | None:
        return self.d.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        self.d[scope] = max(until, self.d.get(scope, until))
        return self.d[scope]

    def acquire(self, scope: str, limit: int, per: float, now: datetime) -> None:
        if self.fail:
            self.fail -= 1
            raise CooldownStoreError("down")
        return None

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> datetime | None:
        if len(self.held) >= limit:
            return now
        self.held[token] = 1
        return None

    def release(self, scope: str, token: str) -> None:
        self.held.pop(token, None)


def test_legacy_store_failed_acquire_leaves_no_concurrency_slot_held(
    clock: FakeClock, server: ThrottleServer
) -> None:
    store = Store0xSlots()
    retry = RetryAfterRetry(0, clock=clock)
    session = mount(RetryAfterAdapter(retry, cooldown=store, quota=Quota(10, per=60), max_concurrency=2))
    store.fail = 1

    response = session.get(f"{server.url}/a")

    assert response.status_code == 200, "the store failing open lets the call through"
    assert server.count() == 1
    assert store.held == {}, f"{len(store.held)} concurrency slot(s) still held after the call"


# -- urllib3's own loop: a cancelled wait keeps the response it waited after ------------


def test_stock_urllib3_cancelled_wait_keeps_the_503_and_its_retry_after(
    clock: FakeClock, server: ThrottleServer
) -> None:
    server.serve([Reply(503, {"Retry-After": "5"}, b"busy")])
    records: list[Any] = []
    pool = urllib3.PoolManager(retries=RetryAfterRetry(3, clock=clock, on_decision=records.append))
    cancel = threading.Event()
    cancel.set()

    with budget(cancel=cancel), pytest.raises(MaxRetryDeferred) as raised:
        pool.request("GET", f"{server.url}/busy")

    deferral = raised.value.deferral
    assert server.count() == 1
    assert deferral.reason == "cancelled"
    assert deferral.status == 503, f"the deferral lost the last response's status: {deferral.status!r}"
    assert deferral.retry_after == "5", f"the deferral lost its Retry-After: {deferral.retry_after!r}"
    assert deferral.attempts == 1
    assert records, "the on_decision hook was never called"
    assert (records[-1].action, records[-1].reason) == ("defer", "cancelled")
    assert [r.status for r in records] == [503] * len(records), (
        f"hook records lost the 503: {[(r.action, r.reason, r.status) for r in records]}"
    )


# -- a 0.4 store with its own admit: its allowance holds when a lease is wanted too -----


class Store04:
    """A store written for 0.4: admit(scope, now, limit, window, lease) without margin,
    allow, and a lease with its own slot table."""

    def __init__(self) -> None:
        self.m = MemoryCooldownStore()
        self.ops: list[str] = []
        self.held: dict[str, int] = {}

    def get(self, scope: str) -> Any:
        self.ops.append("get")
        return self.m.get(scope)

    def extend(self, scope: str, until: datetime) -> Any:
        return self.m.extend(scope, until)

    def admit(
        self, scope: str, now: datetime, limit: Any = None, window: Any = None, lease: Any = None
    ) -> Any:
        self.ops.append("admit")
        slot = None if lease is None else Lease(slots=lease[0], ttl=lease[1], token=lease[2])
        answer = self.m.admit(Ask(scope=scope, now=now, limit=limit, per=window, lease=slot))
        return (answer.cooldown, answer.not_before, answer.seq, answer.slot_busy)  # the tuple of 0.4

    def allow(self, *args: Any) -> Any:
        return self.m.allow(*args)

    def acquire(self, scope: str, limit: int, per: float, now: datetime) -> Any:
        self.ops.append("acquire")
        return self.m.acquire(scope, limit, per, now)

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> Any:
        self.ops.append("lease")
        if len(self.held) >= limit:
            return now
        self.held[token] = 1
        return None

    def release(self, scope: str, token: str) -> None:
        self.ops.append("release")
        self.held.pop(token, None)
        self.m.release(scope, token)


def test_legacy_04_store_own_admit_keeps_its_announced_allowance_with_a_lease(
    clock: FakeClock, server: ThrottleServer
) -> None:
    server.serve([Reply(200, ONE_LEFT)])
    store = Store04()
    retry = RetryAfterRetry(0, clock=clock, max_wait=1)
    session = mount(RetryAfterAdapter(retry, cooldown=store, max_concurrency=4))

    results = []
    for _ in range(3):
        store.ops.clear()
        response = session.get(f"{server.url}/q")
        results.append((response.status_code, response.headers.get("X-Local-Deferral"), tuple(store.ops)))

    assert [(status, local) for status, local, _ in results] == [(200, None), (200, None), (429, "quota")], (
        f"the allowance the server announced (1 left after the first) did not hold: {results}"
    )
    assert server.count() == 2
    assert all("admit" in ops for _, _, ops in results), f"the store's own admit was not asked: {results}"


# -- a 0.x store without allow/note: no helper-thread work for them ---------------------


class Store0x:
    """A 0.x store: get and extend only (no timeout: operations run on helper threads)."""

    def __init__(self) -> None:
        self.d: dict[str, datetime] = {}

    def get(self, scope: str) -> datetime | None:
        return self.d.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        self.d[scope] = max(until, self.d.get(scope, until))
        return self.d[scope]


def test_legacy_store_without_allow_or_note_gets_only_admissions_on_helper_threads(
    clock: FakeClock, server: ThrottleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hundred = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "50", "X-RateLimit-Reset-After": "60"}
    server.responder = lambda seen: Reply(200, hundred) if seen.path == "/q" else Reply(500, body=b"no")
    session = mount(RetryAfterAdapter(RetryAfterRetry(0, clock=clock), cooldown=Store0x()))

    # Observe (not replace) what is handed to helper threads: each operation still runs.
    submitted: list[str] = []
    submit = concurrent.futures.ThreadPoolExecutor.submit

    def recording_submit(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        submitted.append(getattr(fn, "__name__", repr(fn)))
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", recording_submit)

    for _ in range(10):
        assert session.get(f"{server.url}/q").status_code == 200
    for _ in range(10):
        assert session.get(f"{server.url}/e").status_code == 500

    assert not {"allow", "note", "settle"} & set(submitted), (
        f"a store without allow/note was asked for them on helper threads: {submitted}"
    )
    assert set(submitted) <= {"admit", "get"}, f"unexpected helper-thread operations: {set(submitted)}"
    assert len(submitted) <= 20, f"{len(submitted)} helper-thread store operations for 20 requests"
