"""Quota headers and cooldown statuses through the adapter, against a real loopback
server: what one worker learns holds every worker back before any 429.

Hostile quota headers are bounded (real SQLite files, a real ``redis-server`` and the
real command line besides): every time derived from ``RateLimit`` /
``RateLimit-Policy`` / ``X-RateLimit-*`` (windows, resets, allowances) is bounded by the
policy's ``max_retry_after`` (default 86400 s) before it is stored or obeyed; values
too large for a datetime never escape as an exception nor mark the store down;
``status --all`` shows every kind of stored block with its end and ``clear`` lifts it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
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
    deferral_of,
)
from retry_after_adapter.cooldown.guard import guard_of

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer
from ..unit.quota_corpus import CORPUS, DATE, RECEIVED_AT
from .conftest import AT_REAL_TIME, kind_of, never_waiting, run_cli

#: Every call runs on a FakeClock at the corpus's RECEIVED_AT (its Date headers say so),
#: but for the tests marked ``AT_REAL_TIME``.
pytestmark = pytest.mark.clock_start(RECEIVED_AT)


def session(clock: FakeClock, store: Any, **kw: Any) -> requests.Session:
    kw.setdefault("total", 2)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, max_wait=1, **kw), cooldown=store))
    return s


def travels(headers: dict[str, str]) -> bool:
    """Whether the corpus case can be sent as is by the test server (Latin-1, no
    control characters, and a Date equal to the server's own)."""
    text = "".join(headers.values())
    if any((ord(c) < 32 and c != "\t") or ord(c) > 255 for c in text):
        return False
    return headers.get("Date", DATE) == DATE


CASES = [pytest.param(headers, expected, id=name) for name, headers, expected in CORPUS if travels(headers)]


@pytest.mark.parametrize(("headers", "expected"), CASES)
def test_a_200_with_quota_headers_holds_back_the_next_worker_exactly_when_nothing_is_left(
    server: ThrottleServer, clock: FakeClock, headers: dict[str, str], expected: Any
) -> None:
    store = MemoryCooldownStore()
    sent = {k: v for k, v in headers.items() if k != "Date"}  # the server sends its own Date
    server.serve([Reply(200, sent)])
    assert session(clock, store).get(server.url).status_code == 200
    exhausted = expected is not None and expected[0] == 0 and expected[1] is not None and expected[1] > 0
    other = session(clock, store).get(server.url)
    if exhausted:
        deferral = local_deferral(other)  # nothing sent: the quota is spent until the reset
        assert deferral.reason == "cooldown"
        assert deferral.eligible_at == RECEIVED_AT + timedelta(seconds=expected[1])
        assert server.count() == 1
    else:
        # Remaining above 0, a reset already past, or a malformed field: never read as 0.
        assert other.status_code == 200 and server.count() == 2


def test_a_403_with_retry_after_sets_the_shared_cooldown(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(403, {"Retry-After": "60"}, b"secondary rate limit")])
    first = session(clock, store).get(server.url)
    assert first.status_code == 403  # not retried (not in status_forcelist)...
    deferral = local_deferral(session(clock, store).get(server.url))  # ...but shared
    assert deferral.reason == "cooldown" and deferral.eligible_at == RECEIVED_AT + timedelta(seconds=60)
    assert server.count() == 1


def test_cooldown_statuses_are_configurable(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(403, {"Retry-After": "60"})])
    assert session(clock, store, cooldown_statuses={429, 503}).get(server.url).status_code == 403
    assert session(clock, store, cooldown_statuses={429, 503}).get(server.url).status_code == 403
    assert server.count() == 2


def test_a_429_without_retry_after_waits_for_the_announced_reset(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"})])
    response = session(clock, store).get(server.url)
    assert response.deferral is not None and response.deferral.reason == "max_wait"
    assert response.deferral.eligible_at >= RECEIVED_AT + timedelta(seconds=30)
    assert server.count() == 1


def test_a_quota_header_never_shortens_a_retry_after(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "60", "RateLimit": '"d";r=0;t=5'})])
    response = session(clock, store).get(server.url)
    assert response.deferral.eligible_at == RECEIVED_AT + timedelta(seconds=60)
    assert local_deferral(session(clock, store).get(server.url)).eligible_at == RECEIVED_AT + timedelta(
        seconds=60
    )


def test_quota_headers_can_be_ignored(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(200, {"RateLimit": '"d";r=0;t=30'})])
    session(clock, store, quota_headers=False).get(server.url)
    assert session(clock, store, quota_headers=False).get(server.url).status_code == 200


def test_an_absurd_reset_is_not_stored(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(200, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "999999999"})])
    session(clock, store).get(server.url)
    assert store.entries() == {}


def test_nothing_left_cools_down_until_the_earliest_reset_announced_for_the_window(
    server: ThrottleServer, clock: FakeClock
) -> None:
    # The server rounds its seconds up: at 0.0 s "t=5" (the reset at 5.0 s), at 0.8 s
    # "t=5" again (really 4.2 s). The last answer alone says 5.8 s; the window's reset
    # is at 5.0 s at the latest, and that is the cooldown every worker keeps.
    store = MemoryCooldownStore()
    start = clock.now()
    server.serve([Reply(200, {"RateLimit": '"default";r=1;t=5'}), Reply(200, {"RateLimit": '"default";r=0;t=5'})])
    worker = session(clock, store)
    assert worker.get(server.url + "/a").status_code == 200
    clock.advance(0.8)
    assert worker.get(server.url + "/b").status_code == 200
    assert store.get(server.url) == start + timedelta(seconds=5)
    deferral = local_deferral(session(clock, store).get(server.url + "/c"))
    assert deferral.eligible_at == start + timedelta(seconds=5)


def test_a_new_windows_nothing_left_is_not_bound_by_the_last_windows_reset(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    start = clock.now()
    server.serve([Reply(200, {"RateLimit": '"default";r=1;t=5'}), Reply(200, {"RateLimit": '"default";r=0;t=5'})])
    worker = session(clock, store)
    assert worker.get(server.url + "/a").status_code == 200  # the window ends at 5 s
    clock.advance(5.5)  # the next window: its answer says its own reset, 10.5 s
    assert worker.get(server.url + "/b").status_code == 200
    assert store.get(server.url) == start + timedelta(seconds=10.5)


def test_the_earliest_reset_never_reaches_into_the_next_window() -> None:
    # One-second windows, resets rounded up to the second: an answer at 9.8 s says
    # "1" (10.8 s; the server resets at 10.0 s); the next window's nothing-left answer
    # at 10.3 s says "1" (11.3 s; the server resets at 11.0 s). 10.8 s would be early.
    from datetime import datetime

    from retry_after_adapter.cooldown.allowance import SAME_WINDOW
    from retry_after_adapter.engine.meters import Meter

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda seconds: t0 + timedelta(seconds=seconds)  # noqa: E731
    meter = Meter()
    assert meter.earliest_reset(at(10.8), at(9.8), SAME_WINDOW, 10) == at(10.8)
    assert meter.earliest_reset(at(11.3), at(10.3), SAME_WINDOW, 10) == at(11.3)
    # Another limit on the same scope is another window.
    assert meter.earliest_reset(at(11.9), at(10.4), SAME_WINDOW, 100) == at(11.9)


# -- hostile quota headers are bounded (windows, resets, allowances) --------------------------
UTC = timezone.utc
#: The policy's default bound on any wait a server can impose (one day).
MAX_RETRY_AFTER = 86400.0
#: What any stored time or TTL derived from headers may reach: the bound plus the
#: stores' own keep-times (an allowance outlives its reset by an hour), with room.
TWO_DAYS = 2 * 86400.0

#: A window of 100 years: parsed fine, but no wait derived from it may exceed a day.
HOSTILE = {"RateLimit-Policy": '"default";q=2;w=3153600000', "RateLimit": '"default";r=1;t=1'}


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


@AT_REAL_TIME
def test_a_hostile_announced_window_never_defers_past_max_retry_after(
    every_store: Any, clock: FakeClock, server: ThrottleServer, request: pytest.FixtureRequest
) -> None:
    """``q=2;w=3153600000`` (100 years) with ``r=1;t=1``: no deferral's delay, no stored
    time and no Redis TTL derived from it exceeds ``max_retry_after`` (plus the stores'
    own keep-time); a day later the scope is usable again."""
    store = every_store
    kind = kind_of(store)
    server.serve([Reply(200, HOSTILE)])
    s = never_waiting(clock, store)
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


@AT_REAL_TIME
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
    s = never_waiting(clock, store, store_failure="closed")
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


@AT_REAL_TIME
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
        s = never_waiting(clock, stores[0])
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
        after = never_waiting(clock, stores[-1]).get(server.url)
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
