"""Stores written against older releases' store protocols (0.x, 0.4, 0.5 signatures),
through the adapter against a real loopback HTTP server: what the package still
promises them.

- A fail-closed adapter whose breaker probe runs out of the call's time while the store
  hangs sends nothing: it answers with a local 429 ``cooldown-unknown``.
- A 0.x store (no ``admit``) whose ``acquire`` fails leaves no concurrency slot held.
- A 0.4 store with its own ``admit`` keeps being asked through that ``admit`` when a
  concurrency lease is wanted too, so the allowance it learned holds.
- A 0.x store without ``allow``/``note`` costs no helper-thread operations for them.

(A redirect hop that used up the deadline and a cancelled wait in urllib3's own loop,
pinned beside these once, are the engine's: ``test_engine.py``.)
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
)
from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown.guard import BREAKER_FIRST, guard_of
from retry_after_adapter.errors import CooldownStoreError

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer

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
        return self.m.admit(Ask(scope, now, limit, per, lease, margin))

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
        return tuple(self.m.admit(Ask(scope, now, limit, window, lease)))

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
