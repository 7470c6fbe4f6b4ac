"""A Retry-After beyond ``max_retry_after`` (twenty nines, a date in 9999) through the
adapter, the pool manager and a stock urllib3 loop, with a real loopback server and a
real SQLite store: rejected like an invalid value, never obeyed, never shortened, never
stored."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import urllib3

from retry_after_adapter import (
    FakeClock,
    InvalidRetryAfter,
    Reason,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    SQLiteCooldownStore,
)

from ..servers import Reply, ThrottleServer

ABSURD = ["99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT", "86401"]


@pytest.mark.parametrize("value", ABSURD)
def test_an_absurd_retry_after_stops_with_its_own_reason_and_is_never_stored(
    server: ThrottleServer, clock: FakeClock, tmp_path: Path, value: str
) -> None:
    store = SQLiteCooldownStore(tmp_path / "c.db")
    server.serve([Reply(429, {"Retry-After": value}), Reply(200)])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=3, clock=clock), cooldown=store))
    response = s.get(server.url)
    assert response.status_code == 429  # the server's own response, returned as it is
    assert response.stop_reason == Reason.RETRY_AFTER_TOO_LONG == "retry_after_too_long"
    assert response.deferral is None
    assert store.entries() == {}  # no cooldown: the next call goes out normally
    assert s.get(server.url).status_code == 200
    assert server.count() == 2


def test_on_invalid_backoff_ignores_an_absurd_value_and_stores_nothing(
    server: ThrottleServer, clock: FakeClock, tmp_path: Path
) -> None:
    store = SQLiteCooldownStore(tmp_path / "c.db")
    server.serve([Reply(503, {"Retry-After": ABSURD[0]}), Reply(200)])
    retry = RetryAfterRetry(total=3, clock=clock, on_invalid="backoff", backoff_factor=0.5)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store))
    assert s.get(server.url).status_code == 200
    assert server.count() == 2
    assert store.entries() == {}


def test_the_bound_is_configurable_and_none_lifts_it(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([Reply(429, {"Retry-After": "7200"})])
    short = requests.Session()
    short.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=3, clock=clock, max_retry_after=3600)))
    assert short.get(server.url).stop_reason == "retry_after_too_long"
    unbounded = requests.Session()
    unbounded.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=3, clock=clock, max_retry_after=None)))
    response = unbounded.get(server.url + "/other")
    assert response.deferral is not None and response.deferral.reason == "max_wait"
    assert response.deferral.delay == pytest.approx(7200)


def test_the_pool_manager_and_a_stock_loop_reject_it_too(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([Reply(429, {"Retry-After": ABSURD[1]})])
    pool = RetryAfterPoolManager(retries=RetryAfterRetry(total=3, clock=clock))
    assert pool.request("GET", server.url).status == 429
    assert server.count() == 1
    stock = urllib3.PoolManager(retries=RetryAfterRetry(total=3, clock=clock, raise_on_status=False))
    assert stock.request("GET", server.url).status == 429
    assert server.count() == 2  # one attempt each: never obeyed, never retried early
    with pytest.raises(InvalidRetryAfter) as raised:
        RetryAfterRetry(clock=clock).parse_retry_after(ABSURD[0])
    assert raised.value.reason == "beyond_max"
