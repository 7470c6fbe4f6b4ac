"""Behaviours that a restructure of the engine and the store failure layer once broke,
pinned with real parts: a loopback HTTP server, real requests and urllib3 loops, and
stores of one's own.

- A fail-closed adapter whose breaker probe runs out of the call's time while the store
  hangs sends nothing: it answers with a local 429 ``cooldown-unknown``.
- Without a store (``cooldown=None``), a redirect hop that used up the deadline defers
  with reason ``deadline`` before the next hop is sent.
- In urllib3's own retry loop, a wait cancelled through ``budget(cancel=...)`` gives a
  deferral (and hook records) that keep the last response's status and Retry-After.
- A core store (no ``Allowances``, no ``FreshnessLog``) costs no helper-thread
  operations for them.
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
from retry_after_adapter.cooldown import Admission, Answer, Ask, QuotaLogs, Store
from retry_after_adapter.cooldown.guard import BREAKER_FIRST, guard_of
from retry_after_adapter.deferred import MaxRetryDeferred
from retry_after_adapter.errors import CooldownStoreError

from ..conftest import local_deferral
from ..servers import Reply, Seen, ThrottleServer

#: Quota headers announcing one request left in a 60 s window.
ONE_LEFT = {"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset-After": "60"}


def mount(adapter: RetryAfterAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    return session


# -- fail closed: the breaker's probe runs out of the call's time ----------------------


class SwitchableStore(Store, QuotaLogs):
    """A shared store of one's own (kept in memory) that can be switched to fail on
    every operation, or to hang until released."""

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

    def admit(self, ask: Ask) -> Admission:
        self._gate("admit")
        return self.m.admit(ask)

    def answer(self, answer: Answer) -> None:
        self._gate("answer")
        self.m.answer(answer)


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


# -- a core store without allow/note: no helper-thread work for them --------------------


class CoreStore(Store):
    """A store of the core alone: get and extend (not Bounded: operations run on helper
    threads)."""

    def __init__(self) -> None:
        self.d: dict[str, datetime] = {}

    def get(self, scope: str) -> datetime | None:
        return self.d.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        self.d[scope] = max(until, self.d.get(scope, until))
        return self.d[scope]


def test_core_store_without_allow_or_note_gets_only_admissions_on_helper_threads(
    clock: FakeClock, server: ThrottleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hundred = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "50", "X-RateLimit-Reset-After": "60"}
    server.responder = lambda seen: Reply(200, hundred) if seen.path == "/q" else Reply(500, body=b"no")
    session = mount(RetryAfterAdapter(RetryAfterRetry(0, clock=clock), cooldown=CoreStore()))

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
