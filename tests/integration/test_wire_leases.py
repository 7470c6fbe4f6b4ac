"""What an attempt on the wire holds counts for the attempt, whatever the renewals do:
two real store objects on one real SQLite file (or the session's real Redis), one of
them renewing slowly (a store subclass that sleeps in ``renew`` and ``renew_open``, as
a loaded store or a starved process does), against a loopback server that holds each
request and counts what it holds at once.

A process keeps capacity for reuse with a short life it renews (``_near.LIFE``); an
attempt's own slot counts its ``lease_ttl`` and its own open quota permit its full open
time from the moment its request goes, so a late renewal never lets another process's
attempt reach the server beside it.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    MemoryCooldownStore,
    Quota,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)
from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown._near import Near
from retry_after_adapter.cooldown.guard import guard_of
from tests.integration import near_children
from tests.servers import HoldingServer

#: Stores and processes, not a urllib3 line: the README's test command runs them (see tox.ini).
pytestmark = pytest.mark.slow

KINDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis)]


def _slow(cls: type, seconds: float) -> type:
    """``cls`` whose renewals (``renew``, ``renew_open``) each take ``seconds`` more."""

    class Slow(cls):  # type: ignore[misc, valid-type]
        renewals = 0

        def renew(self, *args: Any, **kwargs: Any) -> Any:
            type(self).renewals += 1
            time.sleep(seconds)
            return super().renew(*args, **kwargs)

        def renew_open(self, *args: Any, **kwargs: Any) -> Any:
            type(self).renewals += 1
            time.sleep(seconds)
            return super().renew_open(*args, **kwargs)

    return Slow


def _stores(kind: str, tmp_path: Path, request: pytest.FixtureRequest, seconds: float) -> tuple[Any, Any]:
    """A slow-renewing store and a plain one, sharing the same data."""
    if kind == "sqlite":
        where, cls = str(tmp_path / "shared.db"), SQLiteCooldownStore
    else:
        request.getfixturevalue("redis_client")  # emptied before and after
        where, cls = str(request.getfixturevalue("redis_url")), RedisCooldownStore
    slow = near_children.open_store(kind, where, "wire:", _slow(cls, seconds))
    return slow, near_children.open_store(kind, where, "wire:")


def _session(store: Any, **kw: Any) -> requests.Session:
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0.5, deadline=10)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=False, **kw))
    return s


def _until(seconds: float, started: float) -> None:
    """Wait (in short steps) until ``seconds`` past ``started`` (time.monotonic())."""
    while (left := started + seconds - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def _at_server(server: HoldingServer, started: float) -> None:
    while server.total < 2 and time.monotonic() - started < 10:
        time.sleep(0.005)


@pytest.mark.parametrize("kind", KINDS)
def test_a_slot_on_the_wire_outlives_a_late_renewal(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``max_concurrency=1``: A (its store renewing 0.8 s late) sends an attempt the
    server holds 2.5 s; B (another store object) asks 1.4 s in, past the slot's renewed
    life (``LIFE``, 1 s), and is deferred: the server never holds two. (The slot lived
    a second, renewed, in use too: B was sent beside A.)"""
    a_store, b_store = _stores(kind, tmp_path, request, 0.8)
    server = HoldingServer(hold=2.5)
    try:
        a, b = _session(a_store, max_concurrency=1), _session(b_store, max_concurrency=1)
        started = time.monotonic()
        assert a.get(server.url.replace("/x", "/warm"), timeout=10).status_code == 200  # kept for reuse
        results: list[int] = []
        thread = threading.Thread(target=lambda: results.append(a.get(server.url, timeout=10).status_code))
        thread.start()
        _at_server(server, started)
        sent = time.monotonic()
        _until(1.4, sent)
        r = b.get(server.url, timeout=10)
        thread.join(10)
        assert results == [200]
        print(f"\n{kind}: B {r.status_code}, deferred {r.deferral is not None}, most at the server {server.most}, "
              f"A's renewals {type(a_store).renewals}")
        assert server.most == 1, "another process's attempt reached the server beside the slot's attempt"
        assert r.deferral is not None
    finally:
        server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_open_permit_on_the_wire_outlives_a_late_renewal(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``Quota(1, per=1)``: A (its store renewing 1.2 s late) sends an attempt the
    server holds 3.5 s; B asks 2.7 s in, past what the permit's renewals kept (per +
    margin + ``OPEN_LIFE`` each), and is deferred: the permit counts until A's answer +
    per. (The permit lived ``OPEN_LIFE`` past per, renewed: B was sent beside A.)"""
    a_store, b_store = _stores(kind, tmp_path, request, 1.2)
    server = HoldingServer(hold=3.5)
    try:
        a, b = _session(a_store, quota=Quota(1, per=1)), _session(b_store, quota=Quota(1, per=1))
        assert guard_of(a_store).near is not None
        results: list[int] = []
        started = time.monotonic()
        thread = threading.Thread(target=lambda: results.append(a.get(server.url, timeout=10).status_code))
        thread.start()
        while server.total < 1 and time.monotonic() - started < 10:
            time.sleep(0.005)
        _until(2.7, started)
        r = b.get(server.url, timeout=10)
        thread.join(10)
        assert results == [200]
        print(f"\n{kind}: B {r.status_code}, deferred {r.deferral is not None}, most at the server {server.most}, "
              f"A's renewals {type(a_store).renewals}")
        assert server.most == 1, "another process's attempt reached the server inside the quota's one permit"
        assert r.deferral is not None
    finally:
        server.close()


# ============================ the near copy's renewal of open permits, on a real store
class _GatedMemory(MemoryCooldownStore):
    """A memory store whose ``renew_open`` waits for ``gate`` (at most 5 s) once it has
    said it ``entered``: a renewal under way in a slow store."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def renew_open(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.gate.wait(5)
        return super().renew_open(*args, **kwargs)


def _open_permit(store: MemoryCooldownStore, scope: str, opened: float) -> tuple[str, int, float, datetime]:
    """An open permit of ``Quota(5, per=1)`` granted in ``store`` now, counting
    ``opened`` seconds past per: the near copy's key of it."""
    answer = store.admit(Ask(scope=scope, now=datetime.now(timezone.utc), limit=5, per=1.0, opened=opened))
    assert answer.not_before is None and answer.permit is not None
    return (scope, 5, 1.0, answer.permit)


def test_a_renewal_in_the_store_never_holds_up_a_settle() -> None:
    """While the reaper's renewal of open permits waits on the store, a caller's settle
    takes ``open_lock`` at once (it waited for the whole store operation: a caller's
    admission path waited for a renewal, whatever its deadline), and finds the end the
    store has its permit at; the renewal then applies to the permits still unsettled."""
    store = _GatedMemory()
    permits = Near(lambda scope, token: None, lambda scope: None).permits
    permits.renew_open = store.renew_open
    key = _open_permit(store, "gated", 0.5)  # 0.5 s past per: renewed at once
    permits.opened(key, 1, 1.0, 9.0)
    try:
        assert store.entered.wait(5), "the reaper did not renew"
        t0 = time.monotonic()
        assert permits.open_lock.acquire(timeout=1.0), "a settle waited for the renewal in the store"
        try:
            waited = time.monotonic() - t0
            assert permits.settling(key) == key[3]  # not moved yet: the store has it there
        finally:
            permits.open_lock.release()
    finally:
        store.gate.set()
    assert waited < 0.5
    deadline = time.monotonic() + 5
    while store.entered.is_set() and time.monotonic() < deadline and key in permits._open:
        time.sleep(0.01)
    assert key not in permits._open  # settled: never renewed again


def test_two_grants_in_one_millisecond_are_both_renewed() -> None:
    """Two open permits of one quota granted to end in the same millisecond in one
    process share the near copy's key: both are counted there (the second no longer
    replaces the first), so settling one leaves the other renewed."""
    permits = Near(lambda scope, token: None, lambda scope: None).permits
    key = ("same-ms", 5, 1.0, datetime(2030, 1, 1, tzinfo=timezone.utc))
    permits.opened(key, 1, 1.0, 9.0)
    permits.opened(key, 1, 1.0, 9.0)
    with permits.open_lock:
        assert permits.settling(key) == key[3]
    assert key in permits._open and permits._open[key].count == 1, "the second grant's permit is no longer renewed"


@pytest.mark.parametrize("kind", KINDS)
def test_a_busy_process_passes_its_slots_on_without_a_store_operation(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One Session of 8 threads (``max_concurrency=8``, ``lease_ttl`` 60 s), 25 GETs
    each: a slot given back while other attempts of the process are under way is kept
    as it is and taken again as it is (its lease covers ``lease_ttl`` from each reuse
    for 5 s); only a slot kept with none under way has its end set a second ahead. The
    store operations that set a kept slot's end stay well under one per request (one
    at each give-back and one at each reuse: two per request)."""
    _, store = _stores(kind, tmp_path, request, 0.0)
    server = HoldingServer(hold=0.005)
    try:
        s = _session(store, max_concurrency=8)
        s.get(server.url, timeout=10)
        near = guard_of(store).near
        assert near is not None
        before = near.slots.moved

        def run() -> None:
            for _ in range(25):
                assert s.get(server.url, timeout=10).status_code == 200

        threads = [threading.Thread(target=run) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        moved = near.slots.moved - before
        print(f"\n{kind}: {moved} kept slots' ends set for 200 requests, most at the server {server.most}")
        assert server.most <= 8
        assert moved <= 200 * 0.5, f"{moved} store operations setting kept slots' ends for 200 requests"
    finally:
        server.close()
