"""Liveness as well as safety: holding back is never slower than what the server allows.

Each scenario is a real loopback server whose answers follow a script over the test's
``FakeClock``, and one worker that sends as fast as it is admitted (waits advance the
clock, so a scenario of minutes runs in a blink): the learned rate recovers after
transient throttles and follows a quota that rises or falls; eligible times are the
earliest time admission could succeed, never a bound kept for unanswered permits; a
throttle without a usable Retry-After slows the scope down. Nothing is sent early.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
    deferral_of,
)
from retry_after_adapter.cooldown.base import Ask
from retry_after_adapter.cooldown.rate import QUIET_HELD, QUIET_MOVED
from retry_after_adapter.engine.admission import MAX_ROUNDS
from retry_after_adapter.observe import DecisionRecord
from retry_after_adapter.scope import RequestInfo, origin_scope

from ..servers import Reply, Seen, ThrottleServer

OK = Reply(200)


def throttle(retry_after: str | None = "1", status: int = 429) -> Reply:
    return Reply(status, {"Retry-After": retry_after} if retry_after is not None else {}, b"slow down")


@dataclass
class Scenario:
    """A server's script over time: ``answer(n, t)`` for the n-th request (from 1) at
    ``t`` seconds since the start; what it answered is kept."""

    answer: Callable[[int, float], Reply]
    start: datetime | None = None
    log: list[tuple[float, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, seen: Seen) -> Reply:
        with self.lock:
            assert self.start is not None
            t = (seen.at - self.start).total_seconds()
            reply = self.answer(len(self.log) + 1, t)
            self.log.append((t, reply.status))
            return reply

    def good(self, since: float, until: float = float("inf")) -> int:
        return sum(1 for t, status in self.log if since <= t < until and status < 400)

    def statuses(self, status: int) -> list[float]:
        return [t for t, s in self.log if s == status]


@dataclass
class Run:
    """What one worker saw: every admission wait and deferral (time, reason)."""

    waits: list[tuple[float, str]] = field(default_factory=list)
    deferrals: list[tuple[float, str]] = field(default_factory=list)


@pytest.fixture
def scripted(server: ThrottleServer, clock: FakeClock) -> Iterator[Callable[[Callable[[int, float], Reply]], Scenario]]:
    def start(answer: Callable[[int, float], Reply]) -> Scenario:
        scenario = Scenario(answer, clock.now())
        server.responder = scenario
        return scenario

    yield start
    server.responder = None


#: Seconds of the fake clock each call takes (its answer's time): 100 calls a second at
#: most, what the server allows when it is healthy.
CALL_TIME = 0.01


def drive(server: ThrottleServer, clock: FakeClock, seconds: float, requests_at_most: int = 8000,
          store: Any = None, **adapter: Any) -> Run:
    """One worker that sends as fast as it is admitted for ``seconds`` of the fake clock
    (at most ``requests_at_most`` calls), each call taking :data:`CALL_TIME`; a deferred
    call waits for its eligible time."""
    run = Run()
    start = clock.now()

    def seen(record: DecisionRecord) -> None:
        at = (clock.now() - start).total_seconds()
        if record.action == "retry" and record.reason in ("cooldown", "quota", "rate", "concurrency"):
            run.waits.append((at, str(record.reason)))
        elif record.action == "defer":
            run.deferrals.append((at, str(record.reason)))

    retry = RetryAfterRetry(total=3, deadline=30, clock=clock, on_decision=seen, raise_on_status=False)
    session = requests.Session()
    store = store if store is not None else MemoryCooldownStore()
    session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=store, **adapter))
    for _ in range(requests_at_most):
        if (clock.now() - start).total_seconds() >= seconds:
            break
        response = session.get(server.url)
        clock.advance(CALL_TIME)
        deferral = deferral_of(response)
        if deferral is not None:
            clock.advance(max(0.0, (deferral.eligible_at - clock.now()).total_seconds()))
    return run


def last_throttle(scenario: Scenario) -> float:
    return max(scenario.statuses(429) + scenario.statuses(503), default=0.0)


# -- the learned rate recovers after transient throttles ------------------------------------------


def every_25th(times: int) -> Callable[[int, float], Reply]:
    def answer(n: int, t: float) -> Reply:
        return throttle("1") if n % 25 == 0 and n // 25 <= times else OK

    return answer


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("sporadic 429s", every_25th(4)),
        ("a deploy's 503s", lambda n, t: throttle("2", 503) if t < 3 else OK),
        ("alternating 429s", lambda n, t: throttle("1") if t < 6 and n % 2 == 0 else OK),
        ("one 429 after two 200s", lambda n, t: throttle("1") if n == 3 else OK),
    ],
)
def test_the_learned_rate_holds_nothing_back_a_few_windows_after_transient_throttles(
    server: ThrottleServer, clock: FakeClock, scripted: Any, name: str, answer: Callable[[int, float], Reply]
) -> None:
    """The throttles had nothing to do with a rate: once they stop, the rate holds
    nothing back within a few windows (its probes find no limit) and the scope is open
    again. (0.9 kept the most the server accepted in one window as a ceiling for an
    hour: it held the worker back every window to the end.)"""
    scenario = scripted(answer)
    run = drive(server, clock, seconds=40)
    ended = last_throttle(scenario)
    held = [at for at, why in run.waits + run.deferrals if why == "rate"]
    window = 2.0  # the longest Retry-After here: no window learned is longer
    assert max(held, default=ended) - ended <= (1 + max(QUIET_HELD, QUIET_MOVED)) * window, (name, held[-5:])
    # From 5 s after the last throttle, what the server allows (a call per CALL_TIME).
    assert scenario.good(ended + 5, 40) >= 0.9 * (40 - ended - 5) / CALL_TIME, name


@pytest.mark.parametrize("retry_after", [5, 60, 3600])
def test_one_429_on_a_young_scope_costs_its_cooldown_and_nothing_after(
    server: ThrottleServer, clock: FakeClock, scripted: Any, retry_after: int
) -> None:
    """The third request of a new scope is answered 429 with a Retry-After of 5 s, a
    minute or an hour, then the server takes everything. The cooldown ends when it
    ends; from 2 s after it, the defaults get 0.9 of what ``learn_rate=False`` gets or
    more (before: the learned window was the time to the cooldown's end, and the two
    sends before the 429 were all it let through per window: 3 answers against 904 in
    5 s with 8 threads, a few an hour for an hour's Retry-After)."""
    got = {}
    for learn in (True, False):
        scenario = scripted(lambda n, t: throttle(str(retry_after)) if n == 3 else OK)
        drive(server, clock, seconds=retry_after + 12, learn_rate=learn)
        (at,) = scenario.statuses(429)
        end = at + retry_after
        assert scenario.good(at, end) == 0  # nothing inside the cooldown
        got[learn] = scenario.good(end + 2, end + 12)
        clock.advance(7200)  # the next run's scope starts afresh (the server is the same)
    assert got[False] >= 0.9 * 10 / CALL_TIME
    assert got[True] >= 0.9 * got[False], got


def test_a_throttle_without_a_usable_retry_after_backs_the_scope_off(
    server: ThrottleServer, clock: FakeClock, scripted: Any
) -> None:
    """A 429 with no Retry-After (or ``Retry-After: 0``) on every answer: 0.9 sent as
    fast as it could, every one a 429. The learned rate backs the scope off 1, 2, 4...
    seconds (never 0, at most 20), and recovers when the server does."""
    scenario = scripted(lambda n, t: (throttle(None) if n % 2 else throttle("0")) if t < 60 else OK)
    run = drive(server, clock, seconds=90)
    throttled = scenario.statuses(429)
    assert 5 <= len(throttled) <= 12, throttled
    gaps = [b - a for a, b in itertools.pairwise(throttled)]
    assert all(gap >= 0.999 for gap in gaps)  # never two within a second: nothing at 0
    assert max(gaps) <= 20.5
    assert any(why == "rate" for _, why in run.waits + run.deferrals)
    assert scenario.good(80, 90) >= 0.9 * 10 / CALL_TIME  # the server came back at 60: so did the worker


# -- a quota nobody announced: followed as it rises and falls ---------------------------------------


def fixed_window(limit_at: Callable[[float], int], window: float) -> Callable[[int, float], Reply]:
    counts: dict[int, int] = {}

    def answer(n: int, t: float) -> Reply:
        index = int(t // window)
        counts[index] = counts.get(index, 0) + 1
        if counts[index] > limit_at(t):
            return throttle(str(int(-(-((index + 1) * window - t) // 1))))
        return OK

    return answer


def test_the_learned_rate_follows_an_unannounced_quota_that_rises(
    server: ThrottleServer, clock: FakeClock, scripted: Any
) -> None:
    """20 per 2 s, then 80 per 2 s from 20 s on: from three windows after the rise, the
    worker gets 0.9 of what the server allows or more (its Retry-After, in whole seconds,
    tells its window to a second at best), and the probes cost at most one 429 a
    window."""
    scenario = scripted(fixed_window(lambda t: 20 if t < 20 else 80, 2.0))
    drive(server, clock, seconds=50)
    assert scenario.good(26, 50) >= 0.9 * 80 * 12  # windows 26-50 s: three after the rise
    per_window = [sum(1 for t in scenario.statuses(429) if i * 2.0 <= t < i * 2.0 + 2.0) for i in range(25)]
    assert max(per_window[1:]) <= 1, per_window  # one worker: a refused probe, or a known send


def test_the_learned_rate_follows_an_unannounced_quota_that_falls(
    server: ThrottleServer, clock: FakeClock, scripted: Any
) -> None:
    """80 per 2 s, then 20 per 2 s from 20 s on: within a few windows the worker sends
    what the server allows, one refused send a window at most, never a storm."""
    scenario = scripted(fixed_window(lambda t: 80 if t < 20 else 20, 2.0))
    drive(server, clock, seconds=50)
    assert scenario.good(26, 50) >= 0.9 * 20 * 12
    per_window = [sum(1 for t in scenario.statuses(429) if i * 2.0 <= t < i * 2.0 + 2.0) for i in range(25)]
    assert max(per_window) <= 1, per_window


# -- tight eligible times ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_calls_refused_by_permits_in_flight_wait_for_their_window_not_for_how_long_a_permit_is_kept(
    kind: str, real_server: ThrottleServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``Quota(4, per=0.5)``, 10 calls at once, each with a 1.6 s deadline: the permits
    of the first four are open (answers of a new adapter are expected late) and count
    10 s longer until their answers settle them, but the calls they refuse are told to
    look again at grant + per + margin: every call fits (three rounds, 1 s), none is
    deferred, and no window at the server holds more than four. (0.9 deferred the six
    with an eligible time 10.55 s ahead.)"""
    if kind == "memory":
        store: Any = MemoryCooldownStore()
    elif kind == "sqlite":
        store = SQLiteCooldownStore(tmp_path / "tight.db")
    else:
        from retry_after_adapter import RedisCooldownStore

        store = RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="tight:")
    adapter = RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=2, deadline=1.6), cooldown=store, quota=Quota(4, per=0.5)
    )
    barrier = threading.Barrier(10)
    results: list[tuple[int, Any]] = []

    def call() -> None:
        session = requests.Session()
        session.mount("http://", adapter)
        barrier.wait()
        response = session.get(real_server.url)
        results.append((response.status_code, deferral_of(response)))

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [status for status, _ in results] == [200] * 10, results
    arrivals = sorted(seen.at for seen in real_server.seen)
    window = timedelta(seconds=0.5)
    assert max(sum(1 for b in arrivals if a <= b < a + window) for a in arrivals) <= 4


def test_a_deferral_and_a_local_429_name_the_window_not_the_open_permit_bound(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """``Quota(3, per=60)``: three calls on the wire (the server holds their answers), two
    more refused by their permits, which are open (they count 10 s longer until their
    answers settle them): the deferrals are eligible at the grant + per + margin, and
    the local 429s say ``Retry-After: 61`` (whole seconds, up), not 70 or 71."""
    adapter = RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=2, deadline=1, clock=clock),
        cooldown=MemoryCooldownStore(),
        quota=Quota(3, per=60),
    )
    gate = threading.Event()
    server.serve([Reply(gate=gate)] * 3 + [OK])
    granted = clock.now()
    held: list[int] = []

    def call() -> None:
        session = requests.Session()
        session.mount("http://", adapter)
        held.append(session.get(server.url).status_code)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    while server.count() < 3:
        threading.Event().wait(0.005)
    session = requests.Session()
    session.mount("http://", adapter)
    for _ in range(2):
        response = session.get(server.url)
        deferral = deferral_of(response)
        assert response.status_code == 429 and response.headers["X-Local-Deferral"]
        assert deferral is not None and deferral.reason == "quota"
        assert deferral.eligible_at <= granted + timedelta(seconds=60.05)
        assert int(response.headers["Retry-After"]) <= 61
    gate.set()
    for thread in threads:
        thread.join(10)
    assert held == [200] * 3 and server.count() == 3


async def test_async_tasks_refused_by_a_quota_are_told_its_window(server: ThrottleServer, clock: FakeClock) -> None:
    """The async httpx transport: 40 tasks at once on ``Quota(8, per=2)``, a deadline too
    short to wait for the window (1.9 s, which also bounds each real send): every
    deferral is eligible within the window plus its margin (0.9 said "+12.05 s", the
    bound an open permit is kept)."""
    httpx = pytest.importorskip("httpx")
    from retry_after_adapter.httpx import AsyncRetryAfterTransport

    transport = AsyncRetryAfterTransport(
        RetryAfterRetry(total=2, deadline=1.9, clock=clock), cooldown=MemoryCooldownStore(), quota=Quota(8, per=2)
    )
    async with httpx.AsyncClient(transport=transport) as client:
        responses = await asyncio.gather(*(client.get(server.url) for _ in range(40)))
    delays = [d.delay for d in map(deferral_of, responses) if d is not None]
    assert len(delays) == 32 and server.count() == 8
    assert max(delays) <= 2.05 + 1e-6, max(delays)
    assert all(int(r.headers["Retry-After"]) <= 3 for r in responses if r.status_code == 429)


#: ``max_waiting`` for the rounds' tests: a call counted among a scope's waiters is not
#: given a reserved place (``Plan.reserves``), so it looks again at each wake, as any
#: waiter does on a store without ``Reservations``: the rounds are what is tested.
UNRESERVED = 1000


class RivalClock(FakeClock):
    """A FakeClock on which, each time a call sleeps (the first ``turns`` times), a rival
    worker takes every permit of ``quota`` that freed meanwhile, right as the sleeper
    wakes: the sleeper is refused at each look, round after round."""

    def __init__(self, store: MemoryCooldownStore, scope: str, quota: Quota, turns: int, lag: float = 0.0) -> None:
        super().__init__()
        self.store, self.scope, self.quota, self.turns, self.lag = store, scope, quota, turns, lag
        self.taken = 0

    def take(self) -> None:
        ask = Ask(scope=self.scope, now=self.now(), limit=self.quota.limit, per=self.quota.per, margin=self.quota.margin)
        while self.store.admit(ask).not_before is None:
            self.taken += 1

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        slept = super().sleep(seconds, cancel)
        if self.turns > 0:
            self.turns -= 1
            self.take()
            if not self.turns:
                self.advance(self.lag)  # the sleeper is scheduled ``lag`` late after the last
        return slept


def test_a_call_that_waited_every_round_looks_again_before_it_defers(server: ThrottleServer) -> None:
    """``Quota(2, per=1)``: a rival worker takes the permits that free up right as the
    call wakes, for all but the last of the call's :data:`MAX_ROUNDS` waits. The call's
    last wait ends as the rival's last permits stop counting: it looks once more and
    goes. (0.14 deferred it without that look, for the length of its last wait again: a
    worker whose call had spent its rounds at a window's start was told to come back a
    window later, 1.33 x the ideal in 4 runs of 21 of a job worker under
    ``Quota(30, per=3)``.)"""
    store = MemoryCooldownStore()
    quota = Quota(2, per=1.0)
    scope = origin_scope(RequestInfo("GET", server.url, {}))
    clock = RivalClock(store, scope, quota, turns=MAX_ROUNDS - 1)
    clock.take()  # the rival holds both permits from the start
    decisions: list[DecisionRecord] = []
    retry = RetryAfterRetry(total=2, deadline=60, max_wait=60, clock=clock, on_decision=decisions.append)
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(
        max_retries=retry, cooldown=store, quota=quota, max_waiting=UNRESERVED
    ))  # fmt: skip
    response = session.get(server.url)
    assert deferral_of(response) is None and response.status_code == 200
    assert server.count() == 1 and clock.taken == 2 * MAX_ROUNDS
    assert [d.action for d in decisions] == ["retry"] * MAX_ROUNDS


def test_a_call_that_reserves_its_place_is_not_overtaken_by_a_rival(server: ThrottleServer) -> None:
    """The same rival, and a call that reserves (the defaults: no ``max_waiting``): its
    first look reserves the first permit to free; the rival finds none at its wake, and
    the call goes after that one wait, confirmed at its time."""
    store = MemoryCooldownStore()
    quota = Quota(2, per=1.0)
    scope = origin_scope(RequestInfo("GET", server.url, {}))
    clock = RivalClock(store, scope, quota, turns=MAX_ROUNDS - 1)
    clock.take()
    decisions: list[DecisionRecord] = []
    retry = RetryAfterRetry(total=2, deadline=60, max_wait=60, clock=clock, on_decision=decisions.append)
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=store, quota=quota))
    response = session.get(server.url)
    assert deferral_of(response) is None and response.status_code == 200
    assert server.count() == 1 and [d.action for d in decisions] == ["retry"]
    assert clock.monotonic() - 1000.0 <= quota.window + 0.01  # one wait: its place


async def test_an_async_call_that_waited_every_round_looks_again_before_it_defers(server: ThrottleServer) -> None:
    """The same on the async httpx transport (its driver runs the same admission steps)."""
    httpx = pytest.importorskip("httpx")
    from retry_after_adapter.httpx import AsyncRetryAfterTransport

    store = MemoryCooldownStore()
    quota = Quota(2, per=1.0)
    scope = origin_scope(RequestInfo("GET", server.url, {}))
    clock = RivalClock(store, scope, quota, turns=MAX_ROUNDS - 1)
    clock.take()
    retry = RetryAfterRetry(total=2, deadline=60, max_wait=60, clock=clock)
    transport = AsyncRetryAfterTransport(retry, cooldown=store, quota=quota, max_waiting=UNRESERVED)
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get(server.url)
    assert deferral_of(response) is None and response.status_code == 200
    assert server.count() == 1 and clock.taken == 2 * MAX_ROUNDS


def test_a_call_out_of_rounds_is_told_when_the_earliest_permit_frees(server: ThrottleServer) -> None:
    """The same rival, for every wait of the call's rounds, the call scheduled
    0.3 s late after its last: it defers, eligible when the rival's last permits stop
    counting (0.75 s on), looked up as it gives up (0.14 said the last wait's length
    from now, 1.05 s: 0.3 s late). ``max_wait=10``: the rounds' waits (about 16 s) add
    up past it, so the call takes no round beyond :data:`MAX_ROUNDS`."""
    store = MemoryCooldownStore()
    quota = Quota(2, per=1.0)
    scope = origin_scope(RequestInfo("GET", server.url, {}))
    clock = RivalClock(store, scope, quota, turns=MAX_ROUNDS, lag=0.3)
    clock.take()
    retry = RetryAfterRetry(total=2, deadline=60, max_wait=10, clock=clock)
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(
        max_retries=retry, cooldown=store, quota=quota, max_waiting=UNRESERVED
    ))  # fmt: skip
    response = session.get(server.url)
    deferral = deferral_of(response)
    assert deferral is not None and deferral.reason == "quota" and server.count() == 0
    assert abs(deferral.delay - (quota.window - 0.3)) < 1e-3, deferral.delay


# -- the reason, and an open scope costs no store operation --------------------------------------


def test_learned_rate_deferrals_have_a_reason_of_their_own(
    server: ThrottleServer, clock: FakeClock, scripted: Any
) -> None:
    scripted(fixed_window(lambda t: 20, 2.0))
    run = drive(server, clock, seconds=6)
    reasons = {why for _, why in run.waits + run.deferrals}
    assert "rate" in reasons and "quota" not in reasons


def test_an_open_scope_is_admitted_near_without_a_store_operation(tmp_path: Path, real_server: ThrottleServer) -> None:
    """With the defaults on a SQLite store (push on), once the cold start finds no
    limit the scope is open: admission is answered by the near copy, so a GET costs no
    write transaction (0.9 asked the store for every attempt while a rate was kept)."""
    store = SQLiteCooldownStore(tmp_path / "open.db")
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(max_retries=RetryAfterRetry(total=1), cooldown=store))
    for _ in range(700):
        assert session.get(real_server.url).status_code == 200
    scope = origin_scope(RequestInfo("GET", real_server.url, {}))
    rate = store.rate_of(scope)
    assert rate is not None and rate.open
    writes = _count_writes(store, lambda: [session.get(real_server.url) for _ in range(200)])
    assert writes <= 2, writes


def _count_writes(store: SQLiteCooldownStore, work: Callable[[], object]) -> int:
    """Write transactions ``store`` began while ``work`` ran (its connections' ``BEGIN
    IMMEDIATE``s, counted by a trace callback on each)."""
    began = [0]

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            began[0] += 1

    for conn in list(store._conns):  # the test's own thread's connection included
        conn.set_trace_callback(trace)
    work()
    for conn in list(store._conns):
        conn.set_trace_callback(None)
    return began[0]


# -- a quota that holds still, several threads: the refused probes it costs --------------------------


class SteppedClock(FakeClock):
    """A fake clock for several worker threads: a worker's ``sleep`` blocks until the
    clock reaches its end, and the clock moves only when every worker sleeps, to the
    earliest end (a request in flight takes no time on it; its real time is the
    threads' race). Any other thread's sleep moves it as a FakeClock's does."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.turn = threading.Condition()
        self.workers = 0
        self.ends: dict[object, float] = {}
        self.local = threading.local()

    def join(self) -> None:
        with self.turn:
            self.workers += 1
            self.local.worker = True

    def leave(self) -> None:
        with self.turn:
            self.workers -= 1
            self.local.worker = False
            self._step()

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        if not getattr(self.local, "worker", False):
            return super().sleep(seconds, cancel)
        if cancel is not None and cancel.is_set():
            return False
        me = object()
        with self.turn:
            self.ends[me] = self.monotonic() + max(0.0, seconds)
            self._step()
            stuck = 0
            while me in self.ends:
                if not self.turn.wait(1.0):
                    stuck += 1
                    assert stuck < 20, "the workers stopped moving"
        return True

    def _step(self) -> None:
        """(``turn`` held.) Every worker sleeps: move to the earliest end, wake its sleepers."""
        if not self.ends or len(self.ends) < self.workers:
            return
        end = min(self.ends.values())
        self.advance(max(0.0, end - self.monotonic()))
        for me in [me for me, at in self.ends.items() if at <= end]:
            del self.ends[me]
        self.turn.notify_all()


class JitteryServer(ThrottleServer):
    """A ThrottleServer that counts each request up to 4 ms of real time after it came
    (requests sent together overtake each other on their way, as on a network)."""

    def _next(self, seen: Seen) -> Reply:
        time.sleep(random.uniform(0.0, 0.004))
        return super()._next(seen)


def steady_quota_refusals(store: Any, threads: int, seconds: float) -> tuple[list[int], list[int]]:
    """``threads`` threads of one process on ``store`` send as fast as they are
    admitted to a server that takes 5 requests per 2 s in fixed windows (from its first
    request) and says nothing else (a 429's Retry-After: the seconds to the reset,
    rounded up), for ``seconds`` of a :class:`SteppedClock` started at the real time (a
    store's own clock expires its keys); each deferred call waits for its eligible
    time. The refused and the good answers per window."""
    clock = SteppedClock(datetime.now(timezone.utc))
    server = JitteryServer(clock).start()
    try:
        scenario = Scenario(fixed_window(lambda t: 5, 2.0), clock.now())
        server.responder = scenario
        retry = RetryAfterRetry(total=3, deadline=5.0, clock=clock, raise_on_status=False)
        adapter = RetryAfterAdapter(max_retries=retry, cooldown=store)
        start = clock.now()
        failures: list[BaseException] = []

        def work() -> None:
            clock.join()
            try:
                session = requests.Session()
                session.mount("http://", adapter)
                while (clock.now() - start).total_seconds() < seconds:
                    deferral = deferral_of(session.get(server.url, timeout=10))
                    if deferral is not None:
                        clock.sleep(max(0.001, (deferral.eligible_at - clock.now()).total_seconds()))
            except BaseException as exc:  # reported by the test
                failures.append(exc)
            finally:
                clock.leave()

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not failures and not any(worker.is_alive() for worker in workers), failures
    finally:
        server.stop()
    windows = int(seconds // 2.0)
    refused = [sum(1 for t in scenario.statuses(429) if i * 2.0 <= t < i * 2.0 + 2.0) for i in range(windows)]
    good = [scenario.good(i * 2.0, i * 2.0 + 2.0) for i in range(windows)]
    return refused, good


@pytest.mark.parametrize("threads", [4, 8])
@pytest.mark.parametrize("kind", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_steady_quota_costs_several_threads_one_refused_probe_every_third_window(
    kind: str, threads: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """5 per 2 s in fixed windows, nothing announced, 4 and 8 threads sharing one store:
    from the fifth window on, one refused attempt every third window (the probe that
    confirms the limit), and every other window the server's 5 taken. A new epoch's
    probe waits for the answers of its known sends: before, it raced them, the server
    took it in a known send's place, and its good answer let a second probe in
    (0.33-0.73 refused per window with real threads over 40 s; here, 80 s of the
    clock in about a second, most runs failed on every store)."""
    if kind == "memory":
        store: Any = MemoryCooldownStore()
    elif kind == "sqlite":
        store = SQLiteCooldownStore(str(tmp_path / "steady.db"))
    else:
        from retry_after_adapter import RedisCooldownStore

        store = RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="steady:")
    refused, good = steady_quota_refusals(store, threads, seconds=80.0)
    steady = refused[5:]  # windows 5-39 (the first five learn the quota)
    # One refused attempt in any three windows in a row at most: 0.33 per window.
    assert all(sum(steady[i : i + 3]) <= 1 for i in range(len(steady))), refused
    assert sum(steady) <= math.ceil(len(steady) / 3), refused
    assert sum(good[5:]) >= 0.9 * 5 * len(steady), good  # what the server allows
