"""Promises on quotas, with real parts only: a real loopback HTTP server, real SQLite
files, a real ``redis-server`` (the tests' own fixtures), the real command line and
real processes.

1. Hostile quota headers are bounded: every time derived from ``RateLimit`` /
   ``RateLimit-Policy`` / ``X-RateLimit-*`` (windows, resets, allowances) is bounded by
   the policy's ``max_retry_after`` (default 86400 s) before it is stored or obeyed;
   values too large for a datetime never escape as an exception nor mark the store
   down; ``status --all`` shows every kind of stored block with its end and ``clear``
   lifts it.
2. Permits are stamped when granted: 8 processes x 8 threads on one store, the server
   counting arrivals by their time of arrival at it (stamped by its kernel), never see
   more than the quota in any sliding window (default margin; and with mixed margins
   on one store). A permit counts until its answer whenever that comes: a worker
   stalled past its permit, or a busy server that counts a request late right after
   fast answers, still holds the others back.
3. Two quotas on one scope each hold (or the configuration is refused with a
   ``ConfigurationError``).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    FakeClock,
    Quota,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
    deferral_of,
)
from retry_after_adapter.cooldown.guard import guard_of

from ..servers import ArrivalServer, BusyServer, Reply, ThrottleServer
from .conftest import process_store, process_store_place, release_and_gather, run_cli

UTC = timezone.utc
#: The policy's default bound on any wait a server can impose (one day).
MAX_RETRY_AFTER = 86400.0
#: What any stored time or TTL derived from headers may reach: the bound plus the
#: stores' own keep-times (an allowance outlives its reset by an hour), with room.
TWO_DAYS = 2 * 86400.0

#: A window of 100 years: parsed fine, but no wait derived from it may exceed a day.
HOSTILE = {"RateLimit-Policy": '"default";q=2;w=3153600000', "RateLimit": '"default";r=1;t=1'}


def real_now() -> datetime:
    """The real time, whole milliseconds: a FakeClock starting here makes Redis's own
    expiry clock (the real one) agree with the fake one at the start."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


#: The ``clock`` fixture (and with it ``server``, whose arrivals and Date headers follow
#: it) starts at the real time.
pytestmark = pytest.mark.clock_start.with_args(real_now)


def kind_of(store: Any) -> str:
    if isinstance(store, SQLiteCooldownStore):
        return "sqlite"
    if isinstance(store, RedisCooldownStore):
        return "redis"
    return "memory"


def session(clock: Any, store: Any, *, who: str | None = None, **adapter_kw: Any) -> requests.Session:
    """A Session whose adapter never waits (``max_wait=0``: every wait is a deferral, so
    the FakeClock moves only when the test moves it) and sends each attempt once."""
    s = requests.Session()
    retry = RetryAfterRetry(clock=clock, total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, **adapter_kw))
    if who is not None:
        s.headers["X-Who"] = who
    return s


def redis_ttls(client: Any) -> dict[str, float]:
    """Seconds left of every key in the Redis server (-1: no TTL), freshness records
    excepted: those are kept 30 days after their last note by design, whatever a
    server announces (they hold news of the scope, not a wait)."""
    ttls = {}
    for raw in client.keys("*"):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        if name.endswith("fresh") or "}fresh:" in name:
            continue
        pttl = client.pttl(raw)
        if pttl == -2:
            continue  # expired between KEYS and PTTL
        ttls[name] = pttl / 1000.0 if pttl >= 0 else -1.0
    return ttls


def sqlite_times_beyond(path: str, limit: datetime) -> list[str]:
    """Every integer stored in the SQLite file that is an epoch-ms time (>= 10**12,
    2001 on) later than ``limit``: a time the store would keep or obey past it."""
    limit_ms = int(limit.timestamp() * 1000)
    found = []
    conn = sqlite3.connect(path, timeout=5)
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in cursor.description]
            for row in cursor:
                for column, value in zip(columns, row, strict=True):
                    if isinstance(value, int) and value >= 10**12 and value > limit_ms:
                        found.append(f"{table}.{column} = {value}")
    finally:
        conn.close()
    return found


# ============================================================ 1. hostile quota headers
def test_a_hostile_announced_window_never_defers_past_max_retry_after(
    every_store: Any, clock: FakeClock, server: ThrottleServer, request: pytest.FixtureRequest
) -> None:
    """``q=2;w=3153600000`` (100 years) with ``r=1;t=1``: no deferral's delay, no stored
    time and no Redis TTL derived from it exceeds ``max_retry_after`` (plus the stores'
    own keep-time); a day later the scope is usable again."""
    store = every_store
    kind = kind_of(store)
    server.serve([Reply(200, HOSTILE)])
    s = session(clock, store)
    start = clock.now()
    problems: list[str] = []
    for i in range(12):  # 6 s of fake time in 0.5 s steps: well past the reset t=1
        deferral = deferral_of(s.get(server.url))
        if deferral is not None:
            left = (deferral.eligible_at - clock.now()).total_seconds()
            if deferral.delay > MAX_RETRY_AFTER or left > MAX_RETRY_AFTER + 1:
                problems.append(f"call {i}: deferred ({deferral.reason}) for {deferral.delay:.0f} s")
        clock.advance(0.5)
    assert server.count() >= 1
    if kind == "redis":
        ttls = redis_ttls(request.getfixturevalue("redis_client"))
        assert ttls, "the Redis store wrote no key"
        # Keys are written at fake times at most 6 s ahead of the real clock.
        problems += [
            f"Redis key {name} expires in {ttl:.0f} s" if ttl >= 0 else f"Redis key {name} has no TTL"
            for name, ttl in sorted(ttls.items())
            if ttl < 0 or ttl > TWO_DAYS
        ]
    if kind == "sqlite":
        problems += [
            f"SQLite keeps {row}"
            for row in sqlite_times_beyond(store.path, start + timedelta(seconds=TWO_DAYS))
        ]
    # A day (the bound) later, the scope is usable again: the call is sent.
    clock.advance(MAX_RETRY_AFTER + 1)
    before = server.count()
    response = s.get(server.url)
    if not (response.status_code == 200 and server.count() == before + 1):
        deferral = deferral_of(response)
        problems.append(
            f"a day later the call is not sent: status {response.status_code}, deferral "
            f"{deferral and (str(deferral.reason), round(deferral.delay))}"
        )
    assert problems == [], (
        f"{kind}: times derived from the announced window w=3153600000 exceed max_retry_after "
        f"({MAX_RETRY_AFTER:.0f} s) + keep-time:\n  " + "\n  ".join(problems[:4] + problems[-3:])
    )


HUGE = "999999999999999"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"RateLimit-Policy": f'"default";q=2;w={HUGE}', "RateLimit": '"default";r=1;t=1'}, id="w"),
        pytest.param({"RateLimit-Policy": f'"default";q=2;w={HUGE}', "RateLimit": f'"default";r=1;t={HUGE}'},
                     id="w-and-t"),
        pytest.param({"RateLimit-Policy": '"default";q=2;w=60', "RateLimit": f'"default";r=1;t={HUGE}'}, id="t"),
        pytest.param({"RateLimit": f'"default";r=0;t={HUGE}'}, id="r0-t"),
        pytest.param({"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": HUGE}, id="x-reset"),
        pytest.param({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": HUGE}, id="x-reset-after"),
    ],
)  # fmt: skip
def test_values_too_large_for_a_datetime_neither_escape_nor_take_the_store_down(
    every_store: Any,
    clock: FakeClock,
    server: ThrottleServer,
    other_server: ThrottleServer,
    headers: dict[str, str],
) -> None:
    """No exception escapes ``session.get``, the store is not marked down, and with
    ``store_failure="closed"`` a healthy origin on the same store is still sent."""
    store = every_store
    kind = kind_of(store)
    server.serve([Reply(200, headers)])
    other_server.serve([Reply(200)])
    s = session(clock, store, store_failure="closed")
    problems: list[str] = []
    for i in range(8):  # 4 s of fake time: past the reset t=1, where a window rolls
        try:
            response = s.get(server.url)
        except Exception as exc:
            problems.append(f"call {i} raised {type(exc).__name__}: {exc}")
        else:
            deferral = deferral_of(response)
            # Sent and answered, or deferred locally for a bounded while: never a store
            # that stopped answering (cooldown-unknown).
            if i == 0 and response.status_code != 200:
                problems.append(f"call 0: status {response.status_code}")
            if deferral is not None and (
                deferral.reason not in ("quota", "cooldown") or deferral.delay > MAX_RETRY_AFTER
            ):
                problems.append(f"call {i}: deferred ({deferral.reason}) for {deferral.delay:.0f} s")
        clock.advance(0.5)
    if guard_of(store).down:
        problems.append("the store is marked down")
    response = s.get(other_server.url)
    if not (response.status_code == 200 and other_server.count() == 1):
        deferral = deferral_of(response)
        problems.append(
            f"a healthy origin on the same store is not sent: status {response.status_code}, "
            f"deferral {deferral and (str(deferral.reason), deferral.delay)}"
        )
    assert problems == [], f"{kind}, {headers}:\n  " + "\n  ".join(problems)


# -------------------------------------------------------------- status and clear (CLI)


def times_for_scope(doc: Any, scope: str) -> list[datetime]:
    """Every ISO time the ``status --json`` document gives ``scope``: in any object
    whose ``"scope"`` is it, or under a key that is the scope, at any depth. Today's
    shape is ``{"now", "cooldowns": [{"scope", "eligible_at", "seconds_left",
    "last_success", ...}]}``; a scope blocked only by an announced allowance is
    expected to appear with its end as a non-null time there (``eligible_at``) or in
    any new field or list, under any name."""
    found: list[datetime] = []

    def times(node: Any) -> Iterator[datetime]:
        if isinstance(node, dict):
            for value in node.values():
                yield from times(value)
        elif isinstance(node, list):
            for value in node:
                yield from times(value)
        elif isinstance(node, str):
            try:
                when = datetime.fromisoformat(node.replace("Z", "+00:00"))
            except ValueError:
                return
            if when.tzinfo is not None:
                yield when

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("scope") == scope:
                found.extend(times(node))
            for key, value in node.items():
                if key == scope:
                    found.extend(times(value))
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def cli_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """(the ``--cooldown`` URL, a factory of in-process store objects on it)."""
    if request.param == "sqlite":
        path = tmp_path / "cli.db"
        return f"sqlite:///{path}", lambda: SQLiteCooldownStore(path)
    request.getfixturevalue("redis_client")  # emptied before and after
    url = request.getfixturevalue("redis_url")
    return url, lambda: RedisCooldownStore.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


@pytest.mark.parametrize(
    ("headers", "must_block"),
    [
        # One left for 600 s, then spent: held back by the allowance alone (no cooldown).
        pytest.param({"RateLimit": '"default";r=1;t=600'}, True, id="allowance-used-up"),
        # Nothing left for 600 s: a cooldown and an allowance; clearing one is not enough.
        pytest.param({"RateLimit": '"default";r=0;t=600'}, True, id="r0-with-reset"),
        # The 100-year window: held back (today for 100 years, bounded: at most a day),
        # unless the fix leaves the scope usable within a minute.
        pytest.param(HOSTILE, False, id="hostile-window"),
    ],
)
def test_status_shows_an_announced_block_with_its_end_and_clear_lifts_it(
    cli_store: tuple[str, Any],
    clock: FakeClock,
    server: ThrottleServer,
    headers: dict[str, str],
    must_block: bool,
) -> None:
    """A scope held back by what the server announced (not only by a stored cooldown)
    is listed by ``status --all --json`` with a non-null end, and ``clear SCOPE`` lifts
    it: the next call, by a new worker, is sent."""
    url, open_store = cli_store
    scope = f"http://127.0.0.1:{server.port}"
    server.serve([Reply(200, headers)])
    stores = [open_store()]
    try:
        s = session(clock, stores[0])
        blocked = None
        for _ in range(8):  # until the scope is held back, in 0.5 s steps of (near-real) time
            blocked = deferral_of(s.get(server.url))
            if blocked is not None:
                break
            clock.advance(0.5)
        if must_block:
            assert blocked is not None and blocked.delay > 500, (blocked, server.count())
        elif blocked is None or blocked.delay < 60:
            return  # usable again within a minute: nothing for an operator to see or lift
        sent = server.count()

        listed = run_cli("status", "--cooldown", url, "--all", "--json")
        assert listed.returncode == 0, listed.stderr
        now = datetime.now(UTC)
        ends = [
            t for t in times_for_scope(json.loads(listed.stdout), scope) if t > now + timedelta(seconds=30)
        ]
        assert ends, (
            f"status --all --json shows no end for {scope}, held back ({blocked.reason}) for "
            f"{blocked.delay:.0f} s more: {listed.stdout.strip()}"
        )
        assert min(ends) <= now + timedelta(seconds=TWO_DAYS), (
            f"status --all --json gives {scope} an end past max_retry_after: {sorted(ends)}"
        )

        cleared = run_cli("clear", scope, "--cooldown", url)
        stores.append(open_store())  # a new worker: no local copy of anything
        after = session(clock, stores[-1]).get(server.url)
        deferral = deferral_of(after)
        assert server.count() == sent + 1 and after.status_code == 200, (
            f"after `clear {scope}` (exit {cleared.returncode}: "
            f"{(cleared.stdout + cleared.stderr).strip()!r}) the next call is still held back: "
            f"status {after.status_code}, deferral {deferral and (str(deferral.reason), round(deferral.delay))}"
        )
        assert cleared.returncode == 0, cleared.stderr
    finally:
        for store in stores:
            store.close()


# ============================================================ 2. permits stamped when granted
PROCESSES = 8
THREADS = 8
RUN_SECONDS = 2.5
LIMIT = 20


def _fleet_worker(url: str, kind: str, where: str, margin: float | None, barrier: Any, results: Any) -> None:
    """One process: THREADS threads, each with its own Session, GET ``url`` in a loop for
    RUN_SECONDS after every process is ready; reports (sent, deferred, errors)."""
    quota = Quota(LIMIT, per=1) if margin is None else Quota(LIMIT, per=1, margin=margin)
    store = process_store(kind, where, "promise8x8:")
    sessions = []
    for _ in range(THREADS):
        s = requests.Session()
        # Failing closed, as the existing 8x8 test: an operation the store does not
        # answer in time defers instead of admitting on this process's own count.
        s.mount("http://", RetryAfterAdapter(
            RetryAfterRetry(total=0, max_wait=0.5), cooldown=store, quota=quota, store_failure="closed",
        ))  # fmt: skip
        sessions.append(s)
    counts = [0, 0, 0]
    lock = threading.Lock()
    barrier.wait(60)
    stop = time.monotonic() + RUN_SECONDS

    def run(s: requests.Session) -> None:
        sent = deferred = errors = 0
        while time.monotonic() < stop:
            try:
                response = s.get(url, timeout=5)
            except requests.RequestException:
                errors += 1
                continue
            if getattr(response, "local", False):
                deferred += 1
            else:
                sent += 1
        with lock:
            counts[0] += sent
            counts[1] += deferred
            counts[2] += errors

    threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    results.put(tuple(counts))


def run_fleet(
    server: ArrivalServer, kind: str, where: str, margins: list[float | None]
) -> list[tuple[int, int, int]]:
    """One worker process per margin (fork where there is one: the children start in
    milliseconds instead of importing everything again), all released at once with the
    server running; their reports."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx: Any = multiprocessing.get_context(method)
    barrier = ctx.Barrier(len(margins) + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_fleet_worker, args=(server.url, kind, where, margin, barrier, results), daemon=True
        )
        for margin in margins
    ]
    return release_and_gather(procs, server, barrier, results, 90)


@pytest.mark.slow
@pytest.mark.parametrize(
    "margins",
    [
        pytest.param([None] * PROCESSES, id="default-margin"),
        pytest.param([0.5] * (PROCESSES // 2) + [0.0] * (PROCESSES // 2), id="mixed-margins"),
    ],
)
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_eight_processes_of_eight_threads_stay_within_quota_20_at_the_server(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, margins: list[float | None]
) -> None:
    """``Quota(20, per=1)`` in 8 processes x 8 threads on one store: the server, counting
    arrivals by their time of arrival at it, sees at most 20 in every 1-second window.
    (The window is stamped when the permit is granted, not before the store operation
    that grants it; with mixed margins one process's clean-up must not delete permits
    another still counts.)"""
    where = process_store_place(kind, tmp_path, request)
    server = ArrivalServer()
    reports = run_fleet(server, kind, where, margins)
    arrivals = sorted(server.arrivals)
    assert len(arrivals) >= 2 * LIMIT, (len(arrivals), reports)  # the quota was the limit, not the machine
    worst = server.worst_window(1.0)
    per_second = [sum(1 for t in arrivals if arrivals[0] + k <= t < arrivals[0] + k + 1) for k in range(5)]
    assert worst <= LIMIT, (
        f"{kind}, margins {sorted(set(margins), key=str)}: the server saw {worst} requests in one "
        f"1-second window (quota {LIMIT} per 1 s); {len(arrivals)} arrivals, per second from the first "
        f"{per_second}; per process (sent, deferred, errors) {reports}; kernel-stamped: "
        f"{server.kernel_stamps > 0}"
    )


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_a_worker_stalled_past_its_permit_still_holds_the_others_back(
    every_store: Any, clock: FakeClock, server: ThrottleServer, monkeypatch: pytest.MonkeyPatch,
    margin: float,
) -> None:
    """``Quota(1, per=1)``: worker A is granted its permit at 0 s, is descheduled 0.5 s
    before its request goes out (it arrives at 0.5 s), and its answer comes at 1.1 s,
    past the ``per + margin`` its permit counts from its grant. Worker B asking at
    1.1 s (before A's answer could move the permit) must be held back: A's arrival
    counts at the server until 1.5 s. Once A's answer is in, its permit counts until
    that answer + per (2.1 s) and no longer: B goes at 2.1 s."""
    store = every_store
    kind = kind_of(store)
    quota = Quota(1, per=1, margin=margin)
    gate = threading.Event()
    server.responder = lambda seen: Reply(200, gate=gate if seen.headers.get("X-Who") == "A" else None)
    import http.client

    send = http.client.HTTPConnection.send
    stalled: list[bool] = []

    def stalling_send(conn: Any, data: Any) -> None:
        if threading.current_thread().name == "A" and not stalled:
            stalled.append(True)
            clock.advance(0.5)  # descheduled between its grant and its send
        send(conn, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", stalling_send)
    a = session(clock, store, who="A", quota=quota)
    b = session(clock, store, who="B", quota=quota)
    start = clock.now()
    answers: list[Any] = []
    worker = threading.Thread(target=lambda: answers.append(a.get(server.url)), name="A")
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while server.count() < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert server.count() == 1, "A's request never arrived"
        clock.advance(0.6)  # 1.1 s: A's answer has not come yet
        during = b.get(server.url)
    finally:
        gate.set()  # A is answered at 1.1 s
        worker.join(10)
    assert answers and answers[0].status_code == 200
    arrivals = [(seen.at - start).total_seconds() for seen in server.seen]
    assert deferral_of(during) is not None and len(arrivals) == 1, (
        f"{kind}, margin {margin}: B was sent at 1.1 s while A's request (arrived at 0.5 s, "
        f"answered at 1.1 s) still counted at the server; arrivals at {arrivals}"
    )
    clock.advance(0.95)  # 2.05 s: A's arrival no longer counts, its answer's permit still does
    assert deferral_of(b.get(server.url)) is not None, (kind, margin)
    clock.advance(0.1)  # 2.15 s: past A's answer + per
    after = b.get(server.url)
    assert deferral_of(after) is None and server.count() == 2, (
        f"{kind}, margin {margin}: B is still held back at 2.15 s, past A's answer (1.1 s) + "
        f"per: {deferral_of(after)}"
    )


#: ``Quota(1, per=LATE_PER, margin=LATE_MARGIN)``: A's first answer comes within the
#: margin on a loaded machine too; a busy server gets to A's second request
#: LATE_BUSY seconds after it came, past ``per + margin`` from its grant.
LATE_PER, LATE_MARGIN, LATE_BUSY = 0.4, 0.25, 0.9


def _fast_then_counted_late(url: str, kind: str, where: str, go: Any, results: Any) -> None:
    """Worker A, a process of its own: one request answered at once, then (once the
    quota lets it) one that the busy server counts LATE_BUSY seconds after it came."""
    quota = Quota(1, per=LATE_PER, margin=LATE_MARGIN)
    store = process_store(kind, where, "late-count:")
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(
        RetryAfterRetry(total=0, max_wait=5), cooldown=store, quota=quota, store_failure="closed",
    ))  # fmt: skip
    go.wait(60)
    start = time.monotonic()
    first = s.get(url + "/a-first", timeout=30)
    took = time.monotonic() - start
    second = s.get(url + "/a-second", headers={"X-Busy": str(LATE_BUSY)}, timeout=30)
    results.put((first.status_code, took, second.status_code))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_request_a_busy_server_counts_late_holds_the_others_back_after_fast_answers(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """``Quota(1, per=0.4, margin=0.25)`` on one store, two processes. Worker A's first
    request is answered at once (within the margin); its second (granted once the first
    permit ends) reaches a busy server that counts it 0.9 s later, past the ``per +
    margin`` its permit would count from its grant. Worker B asks from just after that
    until A's request is counted: it must be held back every time, since A's request
    counts at the server until it is answered + per. (A fast answer says nothing of the
    next one: the permit must count until its answer, however the last one came.)"""
    where = process_store_place(kind, tmp_path, request)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx: Any = multiprocessing.get_context(method)
    go, results = ctx.Event(), ctx.Queue()
    b = requests.Session()
    b.mount("http://", RetryAfterAdapter(
        RetryAfterRetry(total=0, max_wait=0), cooldown=process_store(kind, where, "late-count:"),
        quota=Quota(1, per=LATE_PER, margin=LATE_MARGIN), store_failure="closed",
    ))  # fmt: skip
    server = BusyServer()
    worker = ctx.Process(
        target=_fast_then_counted_late, args=(server.url, kind, where, go, results), daemon=True
    )
    worker.start()  # before the server's thread: nothing of it is forked
    asked: list[tuple[float, bool]] = []
    try:
        with server:
            go.set()
            assert server.queued.wait(60), "A's second request never came"
            # From just after A's permit would end (its grant is before the request came)
            # until the server counts A's request: B is asked, as many times as it can.
            time.sleep(max(0.0, server.queued_at + LATE_PER + LATE_MARGIN + 0.02 - time.monotonic()))
            while not server.counting.is_set() and len(asked) < 1000:
                answer = b.get(server.url + "/b", timeout=30)
                asked.append((time.monotonic() - server.queued_at, deferral_of(answer) is None))
                if deferral_of(answer) is None:
                    break
                time.sleep(0.01)
            first, took, second = results.get(timeout=60)
        worker.join(30)
        assert worker.exitcode == 0
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join(5)
    assert first == second == 200, (first, second)
    assert asked, "B was never asked while A's request waited to be counted"
    counted = sorted(server.counted)
    pairs = [
        (round(t2 - t1, 3), p1, p2)
        for (t1, p1), (t2, p2) in itertools.pairwise(counted)
        if t2 - t1 < LATE_PER
    ]
    assert not pairs, (
        f"{kind}: the server counted two requests less than per = {LATE_PER} s apart (quota 1): {pairs}; "
        f"A's first answer took {took:.3f} s (margin {LATE_MARGIN}); B was asked at (s after A's "
        f"request came, sent) {asked[:5]}"
    )


# ============================================================ 3. two quotas on one scope
def test_two_quotas_on_one_scope_each_hold(
    every_store: Any, clock: FakeClock, server: ThrottleServer
) -> None:
    """Adapter A with ``Quota(10, per=5)`` and adapter B with ``Quota(10, per=1)`` on one
    store and one origin, calls interleaved: A's own requests are at most 10 in any
    5-second window. Refusing the configuration (``ConfigurationError``) keeps the
    promise too."""
    store = every_store
    kind = kind_of(store)
    server.serve([Reply(200)])
    a = session(clock, store, who="A", quota=Quota(10, per=5))
    try:
        b = session(clock, store, who="B", quota=Quota(10, per=1))
        for _ in range(120):  # 30 s of fake time in 0.25 s steps
            a.get(server.url)
            b.get(server.url)
            clock.advance(0.25)
    except ConfigurationError as exc:
        assert "quota" in str(exc).lower(), f"refused without saying why: {exc!r}"
        return
    sent_by_a = sorted(seen.at for seen in server.seen if seen.headers.get("X-Who") == "A")
    sent_by_b = [seen.at for seen in server.seen if seen.headers.get("X-Who") == "B"]
    assert len(sent_by_a) >= 10 and sent_by_b, (len(sent_by_a), len(sent_by_b))
    worst = max(
        sum(1 for t in sent_by_a[i:] if t < start + timedelta(seconds=5)) for i, start in enumerate(sent_by_a)
    )
    assert worst <= 10, (
        f"{kind}: A (Quota(10, per=5)) sent {worst} requests in one 5-second window while B "
        f"(Quota(10, per=1)) shared the scope; A sent {len(sent_by_a)} in 30 s, B {len(sent_by_b)}"
    )
