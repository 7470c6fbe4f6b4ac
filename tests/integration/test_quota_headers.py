"""Quota headers and cooldown statuses through the adapter, against a real loopback
server: what one worker learns holds every worker back before any 429."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import requests

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer
from ..unit.quota_corpus import CORPUS, DATE, RECEIVED_AT

#: Every call runs on a FakeClock at the corpus's RECEIVED_AT (its Date headers say so).
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
    from datetime import datetime, timezone

    from retry_after_adapter.cooldown.allowance import SAME_WINDOW
    from retry_after_adapter.engine.meters import Meter

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda seconds: t0 + timedelta(seconds=seconds)  # noqa: E731
    meter = Meter()
    assert meter.earliest_reset(at(10.8), at(9.8), SAME_WINDOW, 10) == at(10.8)
    assert meter.earliest_reset(at(11.3), at(10.3), SAME_WINDOW, 10) == at(11.3)
    # Another limit on the same scope is another window.
    assert meter.earliest_reset(at(11.9), at(10.4), SAME_WINDOW, 100) == at(11.9)
