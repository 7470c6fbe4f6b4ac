"""Batch admission on every store: the extra quota permits and the extra admissions of
an announced allowance one ``admit`` takes for a process to spend, from the headroom
only, each permit counting its hold longer, and none past the server's reset."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import FakeClock, SQLiteCooldownStore
from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown.allowance import allowance_reserve
from retry_after_adapter.cooldown.base import extra_permits
from retry_after_adapter.cooldown.guard import guard_of

from .conftest import AHEAD

SCOPE = "https://api.example.com:443"


def free_now(store: Any, limit: int, per: float, at: Any) -> int:
    """How many single permits the store still grants at ``at`` (taking them)."""
    taken = 0
    while store.admit(Ask(scope=SCOPE, now=at, limit=limit, per=per)).not_before is None:
        taken += 1
        assert taken <= limit
    return taken


def test_a_batch_takes_extras_from_the_headroom_only(store: Any) -> None:
    answer = store.admit(Ask(scope=SCOPE, now=AHEAD, limit=20, per=10.0, batch=8, hold=0.5))
    assert answer.not_before is None and answer.permit is not None
    assert answer.extra == 7  # asked 8: the first and seven more
    assert answer.permit == AHEAD + timedelta(seconds=10)
    # 20 - 8 taken = 12 free; the next batch leaves a quarter of the limit (5) alone.
    second = store.admit(Ask(scope=SCOPE, now=AHEAD, limit=20, per=10.0, batch=16, hold=0.5))
    assert second.extra == extra_permits(16, 12, 20) == 6
    assert free_now(store, 20, 10.0, AHEAD) == 20 - 8 - 7


def test_extras_count_their_hold_longer_and_then_lapse(store: Any) -> None:
    store.admit(Ask(scope=SCOPE, now=AHEAD, limit=10, per=1.0, batch=4, hold=0.5))  # 1 + 3 extras
    # At per (1 s) the first permit lapsed, the extras (1.5 s) still count.
    assert free_now(store, 10, 1.0, AHEAD + timedelta(seconds=1.2)) == 10 - 3
    # Past per + hold, every one lapsed: the whole limit again (those just taken lapse too).
    assert free_now(store, 10, 1.0, AHEAD + timedelta(seconds=3)) == 10


def test_a_quota_near_its_limit_is_spent_one_permit_at_a_time(store: Any) -> None:
    for _ in range(15):
        assert store.admit(Ask(scope=SCOPE, now=AHEAD, limit=20, per=10.0)).not_before is None
    answer = store.admit(Ask(scope=SCOPE, now=AHEAD, limit=20, per=10.0, batch=8, hold=0.5))
    assert answer.not_before is None and answer.extra == 0  # 5 free: all reserve


def test_a_batch_counts_more_admissions_of_an_announced_allowance(store: Any) -> None:
    reset = AHEAD + timedelta(seconds=30)
    store.allow(SCOPE, 40, reset, AHEAD, None, 40, 60.0)
    answer = store.admit(Ask(scope=SCOPE, now=AHEAD, batch=8))
    assert answer.not_before is None and answer.seq == 0
    assert answer.units == 7 and answer.units_until == reset
    # The next admission is numbered after the batch's: 0 + 1 + 7.
    assert store.admit(Ask(scope=SCOPE, now=AHEAD)).seq == 8
    # What is left (40 - 9 = 31) less the reserve (10) bounds the next batch.
    big = store.admit(Ask(scope=SCOPE, now=AHEAD, batch=64))
    assert big.units == 31 - 1 - allowance_reserve(40, 40) == 20


def test_no_allowance_batch_past_the_reset(store: Any) -> None:
    reset = AHEAD + timedelta(seconds=5)
    store.allow(SCOPE, 40, reset, AHEAD, None, 40, 0.0)  # a limit, no window: counted past the reset
    late = store.admit(Ask(scope=SCOPE, now=reset + timedelta(seconds=1), batch=8))
    assert late.not_before is None and late.units == 0


# ------------------------------------------------ the near copy spends the batches
class CountingSQLite(SQLiteCooldownStore):
    """A real SQLite store that counts its admission transactions."""

    admits = 0

    def admit(self, *args: Any, **kwargs: Any) -> Any:
        type(self).admits += 1
        return super().admit(*args, **kwargs)


def spend(guard: Any, start: Any, count: int, step: float) -> list[int | None]:
    """``count`` admissions ``step`` seconds apart from ``start``: their numbers (None:
    refused)."""
    seqs: list[int | None] = []
    for i in range(count):
        answer = guard.admit(Ask(scope=SCOPE, now=start + timedelta(seconds=i * step)))
        seqs.append(answer.seq if answer.not_before is None else None)
    return seqs


def test_the_near_copy_spends_an_announced_allowance_in_batches(tmp_path: Path) -> None:
    CountingSQLite.admits = 0
    store = CountingSQLite(tmp_path / "near.db")
    guard = guard_of(store)
    assert guard.near is not None
    clock = FakeClock(start=AHEAD)
    store.allow(SCOPE, 1000, AHEAD + timedelta(seconds=60), AHEAD, None, 1000, 60.0)
    seqs = spend(guard, clock.now(), 600, 0.005)  # 200 per second for 3 s
    assert None not in seqs
    assert len(set(seqs)) == 600  # every admission its own number
    # The first second is one admission per operation (the rate is not known yet); then
    # batches of up to 16: the last 400 in about 25 operations.
    assert CountingSQLite.admits < 200 + 400 / 8, CountingSQLite.admits
    record = MemoryLike(store)
    assert record.admitted >= max(s for s in seqs if s is not None) + 1  # never fewer counted than spent


class MemoryLike:
    """The allowance record a SQLite file keeps for SCOPE."""

    def __init__(self, store: SQLiteCooldownStore) -> None:
        with closing(sqlite3.connect(store.path)) as db:
            row = db.execute("SELECT n FROM allowance WHERE scope = ?", (SCOPE,)).fetchone()
        self.admitted = int(row[0])


def test_two_processes_near_copies_never_spend_more_than_announced(tmp_path: Path) -> None:
    """Two store objects on one file (each its own near copy, as two processes have)
    spend an announcement of 100 in batches, interleaved: at most 100 admitted."""
    path = tmp_path / "two.db"
    first, second = SQLiteCooldownStore(path), SQLiteCooldownStore(path)
    guards = [guard_of(first), guard_of(second)]
    first.allow(SCOPE, 100, AHEAD + timedelta(seconds=60), AHEAD, None, 100, 60.0)
    admitted = 0
    for i in range(400):  # 200 per second per copy for 1 s, then on
        at = AHEAD + timedelta(seconds=i * 0.005)
        for guard in guards:
            if guard.admit(Ask(scope=SCOPE, now=at)).not_before is None:
                admitted += 1
    assert admitted == 100


def test_a_thread_ended_after_a_busy_retry_never_deadlocks_the_sqlite_store(tmp_path: Path) -> None:
    """A thread whose operation met a busy file once, then succeeded, and ended: its
    connection's finalizer may run from the garbage collector on any thread, one that
    holds the store's lock included; it must not wait for that lock."""
    import gc
    import threading

    store = SQLiteCooldownStore(tmp_path / "busy.db")
    raised = [False]

    def operation(conn: sqlite3.Connection) -> int:
        if not raised[0]:
            raised[0] = True
            raise sqlite3.OperationalError("database is locked")
        return 1

    worker = threading.Thread(target=lambda: store._run(operation))
    worker.start()
    worker.join(5)
    done = threading.Event()

    def collect_under_the_lock() -> None:
        with store._lock:
            gc.collect()
        done.set()

    threading.Thread(target=collect_under_the_lock, daemon=True).start()
    assert done.wait(5), "the finalizer waited for the lock its own thread held"


@pytest.mark.redis
def test_a_redis_batch_never_shortens_the_life_of_a_longer_permit(redis_client: Any) -> None:
    """A permit counting 5 s (a long margin), then another worker's batch on the same
    quota counting about 1 s: the permit set lives past the longer permit (it used to be
    set to expire a second after the batch's end, dropping the longer one with it)."""
    from datetime import datetime, timezone

    from retry_after_adapter import RedisCooldownStore

    store = RedisCooldownStore(redis_client, prefix="batch-ttl:")
    now = datetime.now(timezone.utc)
    longer = store.admit(Ask(scope=SCOPE, now=now, limit=5, per=1.0, margin=4.0))
    batch = store.admit(Ask(scope=SCOPE, now=now, limit=5, per=1.0, margin=0.05, batch=3))
    assert longer.permit is not None and batch.extra == 2
    lives_ms = redis_client.pttl(store.quota_key(SCOPE, 5, 1.0))
    assert lives_ms >= (longer.permit - now).total_seconds() * 1000, lives_ms
