"""Flat in the number of scopes: every record a scope leaves in a store (quota permits,
concurrency leases, the announced allowance, freshness) and in this process (the
failure layer's local copy, the engine's meters) goes once it can no longer matter, a
few at a time as other scopes are written, and nothing that still matters ever goes.

Real parts: the memory store, a SQLite file, the session's ``redis-server``, a real
adapter against the project's ``QuotaServer`` on loopback. Times are explicit (``now=``
or a FakeClock): nothing here waits for a record to expire.
"""

from __future__ import annotations

import itertools
import sqlite3
from contextlib import closing
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)
from retry_after_adapter.cooldown import Ask, Lease
from retry_after_adapter.cooldown import memory as memory_module
from retry_after_adapter.cooldown.allowance import ALLOWANCE_KEPT
from retry_after_adapter.cooldown.freshness import FRESHNESS_KEPT
from retry_after_adapter.cooldown.guard import StoreGuard
from retry_after_adapter.cooldown.sqlite import rules as sqlite_rules
from retry_after_adapter.cooldown.sqlite import store as sqlite_module
from retry_after_adapter.engine.meters import MAX_METERS, Meters, meters_of
from retry_after_adapter.scope import public_scope
from retry_after_adapter.testing import QuotaServer

UTC = timezone.utc
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Past every keep period of a record written at T0: a permit's window, a lease's ttl,
#: an allowance ALLOWANCE_KEPT past its reset, freshness FRESHNESS_KEPT past its note.
LATER = T0 + timedelta(seconds=FRESHNESS_KEPT + ALLOWANCE_KEPT + 86_400)
#: More scopes than a memory store keeps without sweeping.
MANY = memory_module._SWEEP_AT + 300


def leave_records(store: Any, scope: str, at: datetime, *, released: bool = True) -> None:
    """What one call of a new scope leaves: a quota permit and a lease taken, the lease
    given back (or not: a worker killed mid-attempt), an announced allowance, a note."""
    token = f"{scope}/token"
    answer = store.admit(Ask(scope=scope, now=at, limit=100, per=1.0, lease=Lease(slots=8, ttl=60.0, token=token)))
    assert answer.not_before is None, answer
    if released:
        store.release(scope, token)
    store.allow(scope, 50, at + timedelta(seconds=1), at, answer.seq, 100, 1.0)
    store.note(scope, "success", at)


def hold_live_records(store: Any, at: datetime) -> None:
    """Scope ``live``: records that all still matter for a long while after ``at``: two
    permits of ``2 per 3600 s``, a lease of one slot for two hours, an allowance used up
    until a reset two hours ahead, and an error noted a day before."""
    assert store.admit(Ask(scope="live", now=at, limit=2, per=3600.0)).not_before is None
    assert store.admit(Ask(scope="live", now=at, limit=2, per=3600.0)).not_before is None
    assert store.admit(Ask(scope="live", now=at, lease=Lease(slots=1, ttl=7200.0, token="live-token"))).not_before is None
    store.allow("live", 0, at + timedelta(hours=2), at)
    store.note("live", "throttled", at - timedelta(days=1))


def assert_live_records_hold(store: Any, at: datetime) -> None:
    """Everything :func:`hold_live_records` took at ``at - 60 s`` still holds at ``at``."""
    start = at - timedelta(seconds=60)
    # The allowance (used up until its reset) holds the scope back first...
    assert store.admit(Ask(scope="live", now=at)).not_before == start + timedelta(hours=2)
    store.allow("live", 5, at + timedelta(hours=3), at)  # ...until a later window frees it:
    # ...then the permits still count...
    assert store.admit(Ask(scope="live", now=at, limit=2, per=3600.0)).not_before == start + timedelta(seconds=3600)
    # ...and the lease is still held.
    busy = store.admit(Ask(scope="live", now=at, lease=Lease(slots=1, ttl=30.0, token="other")))
    assert busy.slot_busy and busy.not_before == start + timedelta(seconds=7200)
    record = store.freshness("live")
    assert record is not None and record.last_error == "throttled"


# ============================================================ the memory store
def memory_scopes(store: MemoryCooldownStore, prefix: str) -> dict[str, int]:
    return {
        name: sum(1 for scope in getattr(store, name) if scope.startswith(prefix))
        for name in ("_permits", "_leases", "_allowance", "_fresh")
    }


def test_memory_forgets_the_records_of_scopes_that_no_longer_matter() -> None:
    store = MemoryCooldownStore()
    for n in range(MANY):
        leave_records(store, f"old-{n}", T0, released=n % 2 == 0)
    kept = memory_scopes(store, "old-")
    # Every record still matters at T0 but the leases given back (already swept, some).
    assert kept.pop("_leases") >= MANY // 2
    assert kept == dict.fromkeys(("_permits", "_allowance", "_fresh"), MANY)
    # Writes of other scopes, past every keep period, sweep the old ones a few at a time.
    for n in range(2 * MANY):
        leave_records(store, f"new-{n}", LATER + timedelta(milliseconds=n))
    assert memory_scopes(store, "old-") == dict.fromkeys(("_permits", "_leases", "_allowance", "_fresh"), 0)
    # And the sweep queues hold what the dicts hold, no more.
    assert len(store._permit_scopes) == len(store._permits) <= memory_module._SWEEP_AT + 1
    assert len(store._fresh_scopes) == len(store._fresh) == 2 * MANY  # noted now: news still


def test_memory_keeps_records_that_still_matter_however_many_scopes_pass() -> None:
    store = MemoryCooldownStore()
    start = LATER - timedelta(seconds=60)
    hold_live_records(store, start)
    for n in range(3 * MANY):  # the sweep looks at "live" many times over
        leave_records(store, f"other-{n}", LATER)
    assert_live_records_hold(store, LATER)
    # Scopes written now all still matter (freshness for 30 days): kept.
    assert len(store._fresh) == 3 * MANY + 1


def test_a_small_memory_store_forgets_nothing() -> None:
    store = MemoryCooldownStore()
    for n in range(100):
        leave_records(store, f"old-{n}", T0, released=False)
    for n in range(100):
        leave_records(store, f"new-{n}", LATER)
    assert memory_scopes(store, "old-") == dict.fromkeys(("_permits", "_leases", "_allowance", "_fresh"), 100)


def test_a_settled_permit_comes_back_after_its_scope_was_swept() -> None:
    """A permit whose answer came after it stopped counting is put back by ``settle``
    even when the sweep dropped its scope's permits meanwhile: it reached the server."""
    store = MemoryCooldownStore()
    permit = store.admit(Ask(scope="slow", now=T0, limit=1, per=1.0)).permit
    assert permit is not None
    for n in range(MANY):  # a second later: "slow"'s permit stopped counting, swept
        leave_records(store, f"other-{n}", T0 + timedelta(seconds=2))
    assert "slow" not in store._permits
    answered = T0 + timedelta(seconds=3)
    store.settle("slow", 1, 1.0, permit, answered)
    assert store.admit(Ask(scope="slow", now=answered, limit=1, per=1.0)).not_before == answered + timedelta(seconds=1)


# ============================================================ SQLite
def sqlite_rows(store: SQLiteCooldownStore, like: str) -> dict[str, int]:
    with closing(sqlite3.connect(store.path, timeout=5)) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table} WHERE scope LIKE ?", (like,)).fetchone()[0]
            for table in ("permit_log", "lease", "allowance", "freshness")
        }


def test_sqlite_deletes_the_rows_of_scopes_that_no_longer_matter(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "scopes.db")
    for n in range(120):
        leave_records(store, f"old-{n}", T0, released=n % 2 == 0)
    assert sqlite_rows(store, "old-%") == {"permit_log": 120, "lease": 60, "allowance": 120, "freshness": 120}
    for n in range(40):  # each write deletes a few rows of other scopes that stopped mattering
        leave_records(store, f"new-{n}", LATER)
    assert sqlite_rows(store, "old-%") == {"permit_log": 0, "lease": 0, "allowance": 0, "freshness": 0}
    store.close()


def test_sqlite_keeps_rows_that_still_matter(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "live.db")
    hold_live_records(store, LATER - timedelta(seconds=60))
    for n in range(40):
        leave_records(store, f"other-{n}", LATER)
    assert_live_records_hold(store, LATER)
    store.close()


def test_sqlite_sweeps_find_their_rows_through_an_index(tmp_path: Path) -> None:
    """Each write's sweep looks up what stopped mattering in an index: it costs the rows
    it deletes, never a scan of a table (which grows with every scope)."""
    store = SQLiteCooldownStore(tmp_path / "plans.db")
    store.note("s", "success", T0)  # opens the file: the schema and its indexes
    statements = {
        sqlite_rules.SWEEP_PERMITS: (0, 8),
        sqlite_rules.SWEEP_LEASES: (0, 8),
        sqlite_module._SWEEP_ALLOWANCE: (0, "s", 8),
        sqlite_module._SWEEP_FRESHNESS: (0, 8),
        sqlite_module._SWEEP_SOME: (0, 8),
    }
    with closing(sqlite3.connect(store.path)) as conn:
        for statement, args in statements.items():
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, args)]
            assert not [step for step in plan if step.startswith("SCAN")], (statement, plan)
            assert any("USING" in step and "INDEX" in step for step in plan), (statement, plan)
    store.close()


# ============================================================ Redis
def keys_without_ttl(client: Any) -> list[str]:
    """Every key of the server kept forever (PTTL -1; -2: expired since the SCAN)."""
    return [key.decode() for key in client.scan_iter(count=1000) if client.pttl(key) == -1]


@pytest.mark.redis
def test_every_redis_key_a_scope_leaves_has_a_ttl(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client, prefix="scopes:")
    now = datetime.now(UTC)  # Redis expires keys by its own clock: the real one
    # A plain scope, one whose "}" is no hash tag, one with a hash tag of its own.
    for scope in ("https://api.example:443|sha256:0f", "tenant}odd", "{tagged}tenant"):
        store.extend(scope, now - timedelta(seconds=5))  # ended: does not hold admit back
        granted = store.admit(Ask(scope=scope, now=now, limit=5, per=60.0, lease=Lease(slots=2, ttl=30.0, token="a")))
        assert granted.not_before is None and granted.permit is not None
        store.settle(scope, 5, 60.0, granted.permit, now + timedelta(seconds=1))  # late: moved
        assert store.lease(scope, 2, 30.0, now, "b") is None
        store.release(scope, "a")
        store.allow(scope, 3, now + timedelta(seconds=10), now, granted.seq, 10, 10.0)
        store.note(scope, "success", now)
        store.note(scope, "throttled", now)
    assert store.acquire("plain", 5, 60.0) is None  # now None: the store's own present
    # Per scope its cooldown, permits, leases, allowance and freshness; "plain"'s permits.
    assert int(redis_client.dbsize()) == 3 * 5 + 1
    assert keys_without_ttl(redis_client) == []


@pytest.mark.redis
def test_a_reservation_s_keys_keep_a_ttl_when_its_holder_goes_late(redis_client: Any) -> None:
    # The holder keeps its permit open shorter than its reservation did (an attempt's
    # 1 s against 10 s): its open entry is rewritten in place, its key's life kept.
    store = RedisCooldownStore(redis_client, prefix="scopes:")
    now = datetime.now(UTC)
    ask = Ask(scope="late", now=now, limit=1, per=1.0, margin=0.05, opened=10.0, reserve_by=now + timedelta(seconds=5))
    first = store.admit(ask)
    place = store.admit(ask)
    assert first.permit is not None and place.reserved is not None and place.permit is not None
    store.settle("late", 1, 1.0, first.permit, now + timedelta(milliseconds=10), exact=True)
    went = place.reserved + timedelta(milliseconds=20)
    goes = store.admit(replace(ask, now=went, held=place.permit, opened=1.0))
    assert goes.not_before is None and goes.permit == place.permit  # its stored end kept
    assert keys_without_ttl(redis_client) == []


@pytest.mark.redis
def test_a_shorter_lease_never_shortens_the_life_of_a_longer_one(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client, prefix="scopes:")
    now = datetime.now(UTC)
    assert store.lease("s", 4, 600.0, now, "long") is None
    assert store.lease("s", 4, 5.0, now, "short") is None
    assert redis_client.pttl(store.companion("s", "lease")) > 590_000
    held = store.holds(now + timedelta(seconds=10))["s"]
    assert held == [held[0]] and held[0].kind == "leases" and held[0].number == 1


# ============================================================ this process
def test_meters_stay_bounded_and_busy_ones_stay() -> None:
    meters = Meters()
    busy = [f"busy-{n}" for n in range(10)]
    for scope in busy:
        meters[scope].wire.add(1)
    for n in range(3 * MAX_METERS):
        meters[f"idle-{n}"].sent.append(float(n))
    assert len(meters) <= MAX_METERS
    assert all(scope in meters for scope in busy)


def test_meters_with_thousands_on_the_wire_do_not_scan_for_every_new_scope() -> None:
    meters = Meters()
    for n in range(MAX_METERS):
        meters[f"busy-{n}"].wire.add(1)
    meters["one-more"]  # a pass: every meter busy, none dropped
    assert meters.limit >= 2 * MAX_METERS
    for n in range(100):  # no pass until the kept meters have doubled
        meters[f"new-{n}"]
    assert len(meters) == MAX_METERS + 101


def test_the_failure_layers_local_copy_forgets_what_no_longer_matters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guarded store mirrors allowances and freshness in its local copy (a memory
    store): that copy is swept like any memory store (fewer scopes here to keep it
    short)."""
    monkeypatch.setattr(memory_module, "_SWEEP_AT", 32)
    guard = StoreGuard(SQLiteCooldownStore(tmp_path / "guarded.db"))
    for n in range(100):
        guard.allow(f"old-{n}", 5, T0 + timedelta(seconds=1), T0)
        guard.note(f"old-{n}", "success", T0)
    assert len(guard.local._allowance) == len(guard.local._fresh) == 100
    for n in range(100):
        guard.allow(f"new-{n}", 5, LATER + timedelta(seconds=1), LATER)
        guard.note(f"new-{n}", "success", LATER)
    assert memory_scopes(guard.local, "old-") == dict.fromkeys(
        ("_permits", "_leases", "_allowance", "_fresh"), 0
    )
    guard.close()


def test_an_adapter_meeting_a_new_scope_per_call_keeps_only_what_matters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's setup on a fake clock (a day per call, so records expire as it runs):
    one adapter, ``Quota(100, per=1)``, ``max_concurrency=8``, a server announcing
    ``RateLimit`` fields, a new scope per call. The scopes of the first calls leave no
    record anywhere (fewer scopes than in production before sweeping starts)."""
    monkeypatch.setattr(memory_module, "_SWEEP_AT", 64)
    clock = FakeClock(start=T0)
    store = MemoryCooldownStore()
    counter = itertools.count()
    adapter = RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=2, clock=clock),
        cooldown=store,
        quota=Quota(100, per=1),
        max_concurrency=8,
        scope=public_scope(lambda request: f"tenant-{next(counter)}"),
    )
    calls = 300
    with QuotaServer(10**6, 1, clock=clock, quota_headers="ietf") as server, requests.Session() as session:
        session.mount("http://", adapter)
        for n in range(calls):
            response = session.get(f"{server.url}/t/{n}", timeout=5)
            assert response.status_code == 200 and response.deferral is None
            clock.advance(86_400)
    assert len(store._allowance) >= 64  # announced allowances were kept, then swept
    early = {f"tenant-{n}" for n in range(100)}
    for name in ("_permits", "_leases", "_allowance", "_fresh"):
        kept = getattr(store, name)
        assert not early & set(kept), name
        assert len(kept) <= 64 + 31 + memory_module._SWEEP_PER_WRITE, (name, len(kept))
    assert len(meters_of(store)) <= MAX_METERS
