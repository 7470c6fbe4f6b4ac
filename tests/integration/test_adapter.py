"""The adapter against a real loopback server: urllib3's real retry loop runs."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta

import pytest
import requests
import urllib3

from retry_after_adapter import (
    Deferral,
    FakeClock,
    MaxRetryDeferred,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterResponse,
    RetryAfterRetry,
    RetryDeferred,
    budget,
    deferral_of,
)
from retry_after_adapter.adapter import LOCAL_HEADER

from ..servers import Reply, ThrottleServer, format_http_date
from .conftest import make_session


def gaps(server: ThrottleServer) -> list[float]:
    times = [s.at for s in server.seen]
    return [(b - a).total_seconds() for a, b in itertools.pairwise(times)]


def test_seconds_form_waits_exactly_the_server_delay(server, clock):
    server.serve([Reply(429, {"Retry-After": "7"}, b"slow down"), Reply(200, body=b"done")])
    response = make_session(clock).get(server.url + "/a")
    assert response.status_code == 200
    assert response.text == "done"
    assert response.deferral is None
    assert gaps(server) == [7.0]
    assert clock.sleeps == [7.0]


def test_date_form_is_measured_against_the_server_date(server, clock):
    # The local clock is an hour fast; the server's Date header says otherwise.
    eligible = clock.now() + timedelta(seconds=9)
    clock.advance(0)
    server.serve([Reply(503, {"Retry-After": format_http_date(eligible)}), Reply(200)])
    response = make_session(clock).get(server.url + "/d")
    assert response.status_code == 200
    assert gaps(server) == [9.0]
    assert server.seen[1].at >= eligible


def test_long_wait_defers_at_once_and_sends_nothing_early(server, clock):
    server.serve([Reply(429, {"Retry-After": "120"}, b"quota"), Reply(200)])
    started = time.monotonic()
    response = make_session(clock, max_wait=10).get(server.url + "/long")
    assert time.monotonic() - started < 1.0
    assert response.status_code == 429
    assert response.text == "quota"  # the body of the last response is intact
    deferral = response.deferral
    assert deferral.reason == "max_wait"
    assert deferral.delay == 120.0
    assert deferral.eligible_at == clock.now() + timedelta(seconds=120)
    assert deferral.attempts == 1 and deferral.deferrals == 1
    assert deferral.status == 429 and deferral.retry_after == "120"
    assert server.count() == 1
    assert clock.sleeps == []


def test_seed_example_server_wait_beyond_deadline_defers_to_server_time(server, clock):
    # 30 s server wait, local backoff would be shorter, 12 s left: defer to +30 s.
    server.serve([Reply(429, {"Retry-After": "30"}), Reply(200)])
    response = make_session(clock, deadline=12, max_wait=None).get(server.url + "/seed")
    assert response.deferral.reason == "deadline"
    assert response.deferral.delay == 30.0
    assert server.count() == 1


def test_wait_exactly_at_the_limits_is_taken(server, clock):
    server.serve([Reply(429, {"Retry-After": "10"}), Reply(200)])
    session = make_session(clock, deadline=12, max_wait=10, attempt_reserve=2)
    response = session.get(server.url + "/edge")
    assert response.status_code == 200 and response.deferral is None
    assert gaps(server) == [10.0]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_post_and_patch_are_never_replayed(server, clock, method):
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    response = make_session(clock).request(method, server.url + "/write", data=b"x")
    assert response.status_code == 503
    assert server.count(method) == 1


def test_post_is_never_replayed_after_a_read_error(real_server):
    real_server.serve([Reply(action="reset"), Reply(200)])
    session = make_session(None)
    with pytest.raises(requests.exceptions.ConnectionError):
        session.post(real_server.url + "/write", data=b"x", timeout=2)
    assert real_server.count("POST") == 1
    # A reset in the middle of the body surfaces while reading it (urllib3 2.x raises,
    # 1.26 returns the short body); either way nothing is re-sent.
    real_server.serve([Reply(action="reset_body", body=b"partial body here"), Reply(200)])
    try:
        session.post(real_server.url + "/write", data=b"x", timeout=2)
    except requests.exceptions.RequestException:
        pass
    assert real_server.count("POST") == 1


def test_get_is_retried_after_a_reset(real_server):
    real_server.serve([Reply(action="reset"), Reply(200, body=b"again")])
    response = make_session(None, backoff_factor=0).get(real_server.url + "/r", timeout=2)
    assert response.text == "again"
    assert real_server.count() == 2


def test_invalid_retry_after_stops_without_a_retry(server, clock):
    server.serve([Reply(429, {"Retry-After": "soon"}, b"body"), Reply(200)])
    response = make_session(clock).get(server.url + "/bad")
    assert response.status_code == 429
    assert response.text == "body"
    assert response.deferral is None
    assert response.stop_reason == "invalid_retry_after"
    assert server.count() == 1


def test_invalid_retry_after_with_backoff_uses_local_backoff(server, clock):
    server.serve([Reply(503, {"Retry-After": "-1"}), Reply(503, {"Retry-After": "1.5"}), Reply(200)])
    response = make_session(clock, on_invalid="backoff", backoff_factor=2).get(server.url + "/bad")
    assert response.status_code == 200
    assert server.count() == 3
    assert clock.sleeps == [4.0]  # urllib3's backoff: 0 after the first error, then 2*2


def test_two_sessions_sharing_a_store_the_second_defers_without_sending(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "100"}), Reply(200)])
    first = make_session(clock, store, max_wait=10).get(server.url + "/q")
    assert first.deferral.reason == "max_wait"
    second = make_session(clock, store, max_wait=10).get(server.url + "/other-path")
    # Deferred before sending: a local 429, shaped like the server's, nothing sent.
    assert isinstance(second, RetryAfterResponse) and second.local
    assert second.status_code == 429 and second.headers["Retry-After"] == "100"
    assert second.headers[LOCAL_HEADER] == "cooldown"
    assert second.deferral.reason == "cooldown"
    assert second.deferral.eligible_at == first.deferral.eligible_at
    assert Deferral.from_dict(second.json()) == second.deferral
    with pytest.raises(requests.exceptions.HTTPError):
        second.raise_for_status()
    assert server.count() == 1
    # raise_on_defer=True raises instead, with no response: nothing was received.
    session = requests.Session()
    session.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(clock=clock, max_wait=10), cooldown=store, raise_on_defer=True),
    )
    with pytest.raises(RetryDeferred) as raised:
        session.get(server.url + "/third")
    assert raised.value.response is None and raised.value.deferral.reason == "cooldown"
    assert server.count() == 1


def test_a_cooldown_that_fits_is_waited_out_before_the_first_attempt(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "5"}), Reply(200)])
    store.extend(f"http://127.0.0.1:{server.port}", clock.now() + timedelta(seconds=20))
    response = make_session(clock, store).get(server.url + "/x")
    assert response.status_code == 200
    assert server.seen[0].at == clock.now() - timedelta(seconds=5)
    # The first attempt waited the 20 s cooldown, the retry the server's 5 s.
    assert clock.sleeps == [20.0, 5.0]


def test_raise_on_defer(server, clock):
    server.serve([Reply(429, {"Retry-After": "600"}, b"later")])
    session = requests.Session()
    retry = RetryAfterRetry(total=3, clock=clock, max_wait=5)
    session.mount("http://", RetryAfterAdapter(retry, cooldown=None, raise_on_defer=True))
    with pytest.raises(RetryDeferred) as raised:
        session.get(server.url + "/r")
    assert isinstance(raised.value, requests.exceptions.RetryError)
    assert raised.value.response.status_code == 429
    assert raised.value.response.text == "later"
    assert raised.value.deferral.delay == 600


def test_budget_overrides_per_call(server, clock):
    server.serve([Reply(429, {"Retry-After": "8"}), Reply(200)])
    session = make_session(clock, max_wait=60)
    with budget(max_wait=5):
        assert session.get(server.url + "/b").deferral.reason == "max_wait"
    clock.advance(8)  # let the cooldown the first call recorded run out
    server.serve([Reply(429, {"Retry-After": "8"}), Reply(200)])
    with budget(deadline=3, max_wait=None):
        assert session.get(server.url + "/b").deferral.reason == "deadline"


def test_cancel_interrupts_a_real_wait_at_once(real_server):
    real_server.serve([Reply(429, {"Retry-After": "30"}), Reply(200)])
    session = make_session(None, max_wait=60)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with budget(cancel=stop):
        response = session.get(real_server.url + "/c")
    assert time.monotonic() - started < 1.5
    assert response.deferral.reason == "cancelled"
    assert 28 < response.deferral.delay <= 30
    assert real_server.count() == 1


def test_real_clock_no_request_before_the_eligible_time(real_server):
    real_server.serve([Reply(429, {"Retry-After": "1"}), Reply(200)])
    response = make_session(None).get(real_server.url + "/t")
    assert response.status_code == 200
    assert gaps(real_server)[0] >= 1.0


def test_deadline_clamps_the_attempt_timeout(real_server):
    real_server.serve([Reply(action="hang")])
    session = make_session(None, deadline=0.5)
    started = time.monotonic()
    with pytest.raises((RetryDeferred, requests.exceptions.ConnectionError)):
        session.get(real_server.url + "/hang", timeout=10)
    # The 0.5 s deadline (0.51 s with both cores busy) with three times over of slack;
    # a kept 10 s timeout would take 10 s.
    assert time.monotonic() - started < 2.0


def test_a_stock_pool_manager_with_our_retry_defers_with_a_max_retry_error(server, clock):
    server.serve([Reply(429, {"Retry-After": "90"}), Reply(200)])
    http = urllib3.PoolManager(retries=RetryAfterRetry(total=3, clock=clock, max_wait=30))
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        http.request("GET", server.url + "/u")
    assert isinstance(raised.value, MaxRetryDeferred)
    assert raised.value.deferral.reason == "max_wait" and deferral_of(raised.value) is raised.value.deferral
    assert raised.value.response.status == 429
    assert server.count() == 1
    assert clock.sleeps == []


def test_plain_urllib3_retries_with_the_server_delay(server, clock):
    server.serve([Reply(503, {"Retry-After": "3"}), Reply(200, body=b"fine")])
    http = urllib3.PoolManager(retries=RetryAfterRetry(total=3, clock=clock))
    response = http.request("GET", server.url + "/u")
    assert response.status == 200 and response.data == b"fine"
    assert gaps(server) == [3.0]


def test_attempts_exhausted_keep_the_eligible_time_and_follow_raise_on_status(server, clock):
    server.serve([Reply(429, {"Retry-After": "30"}, b"busy")])
    with pytest.raises(requests.exceptions.RetryError) as raised:
        make_session(clock, total=1).get(server.url + "/x")
    assert isinstance(raised.value, RetryDeferred)
    assert server.count() == 2
    deferral = raised.value.deferral
    assert deferral.reason == "attempts" and deferral.delay == 30.0 and deferral.attempts == 2
    assert deferral.eligible_at == clock.now() + timedelta(seconds=30)
    assert raised.value.response.status_code == 429 and raised.value.response.text == "busy"
    clock.advance(30)
    server.serve([Reply(503, {"Retry-After": "1"})])
    response = make_session(clock, total=2, raise_on_status=False).get(server.url + "/x")
    assert response.status_code == 503 and response.deferral.reason == "attempts"
    assert response.deferral.delay == 1.0 and server.count() == 3


def test_fake_clock_is_injectable_in_users_tests():
    clock = FakeClock()
    before = clock.monotonic()
    assert clock.sleep(3.5)
    assert clock.monotonic() - before == 3.5


def test_out_of_retries_on_a_real_server_says_urllib3s_reason_then_the_deferral(server, clock):
    from retry_after_adapter import RetryDeferred

    server.serve([Reply(503, {"Retry-After": "1"})] * 3)
    session = make_session(clock, total=2)
    with pytest.raises(RetryDeferred) as caught:
        session.get(server.url + "/items?token=secret")
    message = str(caught.value)
    assert message.startswith("too many 503 error responses; deferred (attempts): retry eligible at")
    assert "secret" not in message and len(server.seen) == 3
