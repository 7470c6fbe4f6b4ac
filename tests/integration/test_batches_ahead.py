"""A quota's next batch of permits taken ahead, once the process's threads have waited
for one (``_near.AHEAD``): the batch left is spent first, then the one taken ahead,
with no store operation between them and none of the first lapsing for the second.

Over a real SQLite file through its failure layer, at explicit (FakeClock) times; a
transaction of the test's own holds the file's write lock while one thread takes a
batch, so that another thread waits for it as a busy store would make it wait.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown._near import AHEAD
from tests.integration.test_near_copy import PermitLog

SCOPE = "ahead"
LIMIT = 10_000
PER = 10.0  # a hold of a tenth of it: the threads' real waits stay well within
MARGIN = 0.05
RATE = 200
MS = timedelta(milliseconds=1)


class Permits(PermitLog):
    """The store (a lock held 5 s at most), its failure layer, the near copy's batches,
    a FakeClock, and the permit rows the store writes (``test_near_copy.PermitLog``)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, timeout=5)
        self.batches = self.near

    def admit(self) -> Any:
        answer = self.guard.admit(Ask(scope=SCOPE, now=self.clock.now(), limit=LIMIT, per=PER, margin=MARGIN))
        assert answer.not_before is None, answer
        return answer

    def close(self) -> None:
        self.store.close()


def test_once_threads_waited_for_a_batch_the_next_is_taken_ahead_and_spent_after(tmp_path: Path) -> None:
    permits = Permits(tmp_path / "ahead.db")
    try:
        for _ in range(RATE + 1):  # a whole second at RATE a second: batches from now on
            permits.admit()
            permits.clock.advance(1 / RATE)
        size, hold = permits.batches.batch(SCOPE, LIMIT, PER, MARGIN)
        assert size > 2, size

        # One thread takes the next batch while the store is busy (the test holds its
        # write lock): another thread asks meanwhile and waits for that batch.
        blocker = sqlite3.connect(permits.path, timeout=5, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        answers: dict[str, Any] = {}

        def ask(name: str) -> None:
            answers[name] = permits.admit()

        taker = threading.Thread(target=ask, args=("taker",))
        taker.start()
        deadline = time.monotonic() + 5
        while not any(p.refilling for p in permits.batches._permits.values()):
            assert time.monotonic() < deadline, "the batch was never claimed"
            time.sleep(0.005)
        waiter = threading.Thread(target=ask, args=("waiter",))
        waiter.start()
        while not any(p.waited for p in permits.batches._permits.values()):  # (REFILL_WAIT at most)
            assert time.monotonic() < deadline, "the other thread did not wait for the batch"
            time.sleep(0.001)
        time.sleep(0.05)  # the batch takes a while to come: then, ahead
        blocker.execute("COMMIT")
        blocker.close()
        taker.join(10)
        waiter.join(10)
        first = answers["taker"]
        assert first.extra == size - 1, (first.extra, size)
        end = first.permit + timedelta(seconds=hold)
        assert answers["waiter"].permit == end  # it waited for the batch, and spent of it
        (state,) = permits.batches._permits.values()
        took = state.latency
        assert took >= 0.05, took

        # Spent one by one: once what is left would be spent within AHEAD times the
        # time that batch took to come, the next attempt takes the next batch ahead
        # (its own permit, and the batch), and the batch left is not given up for it.
        left = size - 2
        before = permits.written()
        while permits.written() == before:
            assert left > 0, "the batch was spent before the next was taken ahead"
            permits.clock.advance(0.002)
            answer = permits.admit()
            if permits.written() == before:
                assert answer.permit == end
                left -= 1
        assert permits.written() == before + size, "the next batch was not taken ahead whole"
        assert left <= RATE * AHEAD * took + 1, (left, took)
        assert answer.permit != end and answer.extra == size - 1, answer
        ahead_end = answer.permit + timedelta(seconds=hold)

        # The batch left is spent first, near, then the one taken ahead.
        written = permits.written()
        for _ in range(left):
            permits.clock.advance(0.002)
            assert permits.admit().permit == end
        permits.clock.advance(0.002)
        assert permits.admit().permit == ahead_end
        assert permits.written() == written, "a permit of a batch held here cost a store operation"
        # Neither batch was given back or lapsed for the other: both still count.
        assert permits.counting_until(end) == size - 1
        assert permits.counting_until(ahead_end) == size - 1
    finally:
        permits.close()


def test_a_lone_thread_never_takes_a_batch_ahead(tmp_path: Path) -> None:
    """No thread ever waited for a batch (one thread alone): each is spent to its last
    permit before the store is asked again, however long batches take to come."""
    permits = Permits(tmp_path / "lone.db")
    try:
        for _ in range(RATE + 1):
            permits.admit()
            permits.clock.advance(1 / RATE)
        size, hold = permits.batches.batch(SCOPE, LIMIT, PER, MARGIN)
        first = permits.admit()
        end = first.permit + timedelta(seconds=hold)
        written = permits.written()
        for _ in range(size - 1):
            permits.clock.advance(0.002)
            assert permits.admit().permit == end
        assert permits.written() == written
    finally:
        permits.close()
