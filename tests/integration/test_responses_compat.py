"""The adapter mounted in a Session that the `responses` library mocks.

`responses` patches HTTPAdapter.send on the base class and emulates retries by calling
only is_retry and increment (never sleep): our adapter calls super().send(), so it is
mocked too, and the decision made in increment still applies.
"""

from __future__ import annotations

import pytest
import requests
import responses

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    RetryDeferred,
)
from tests.conftest import local_deferral

URL = "https://api.example.test/items"


def session(clock: FakeClock, store: MemoryCooldownStore | None = None, **kw: object) -> requests.Session:
    s = requests.Session()
    retry = RetryAfterRetry(total=3, clock=clock, **kw)  # type: ignore[arg-type]
    s.mount(
        "https://", RetryAfterAdapter(retry, cooldown=store if store is not None else MemoryCooldownStore())
    )
    return s


@responses.activate
def test_retry_then_success_under_responses():
    responses.add(responses.GET, URL, status=429, headers={"Retry-After": "2"})
    responses.add(responses.GET, URL, status=200, body="ok")
    response = session(FakeClock()).get(URL)
    assert response.status_code == 200 and response.text == "ok"
    assert response.deferral is None
    assert len(responses.calls) == 2


@responses.activate
def test_long_wait_defers_under_responses():
    responses.add(responses.GET, URL, status=429, headers={"Retry-After": "300"}, body="later")
    response = session(FakeClock(), max_wait=30).get(URL)
    assert response.status_code == 429
    assert response.text == "later"
    assert response.deferral.reason == "max_wait"
    assert response.deferral.delay == 300
    assert len(responses.calls) == 1


@responses.activate
def test_invalid_header_stops_under_responses():
    responses.add(responses.GET, URL, status=503, headers={"Retry-After": "tomorrow"})
    response = session(FakeClock()).get(URL)
    assert response.status_code == 503
    assert response.stop_reason == "invalid_retry_after"
    assert len(responses.calls) == 1


@responses.activate
def test_shared_cooldown_under_responses():
    clock = FakeClock()
    store = MemoryCooldownStore()
    responses.add(responses.GET, URL, status=429, headers={"Retry-After": "120"})
    assert session(clock, store, max_wait=10).get(URL).deferral.reason == "max_wait"
    raised_deferral = local_deferral(session(clock, store, max_wait=10).get(URL))
    assert raised_deferral.reason == "cooldown"
    assert len(responses.calls) == 1


@responses.activate
def test_each_attempt_is_mocked_once_and_waits_run_on_the_injected_clock():
    # responses emulates retries from adapter.max_retries; the engine hands urllib3 (and
    # so responses) one attempt at a time, so there is one retry loop, not two.
    clock = FakeClock()
    responses.add(responses.GET, URL, status=503, headers={"Retry-After": "4"})
    responses.add(responses.GET, URL, status=503, headers={"Retry-After": "6"})
    responses.add(responses.GET, URL, status=200, body="ok")
    response = session(clock).get(URL)
    assert response.text == "ok" and len(responses.calls) == 3
    assert clock.sleeps == [4.0, 6.0]


@responses.activate
def test_exhaustion_under_responses_keeps_the_time():
    responses.add(responses.GET, URL, status=429, headers={"Retry-After": "30"})
    with pytest.raises(RetryDeferred) as raised:
        session(FakeClock(), max_wait=60).get(URL)
    assert raised.value.deferral.reason == "attempts" and raised.value.deferral.delay == 30
    assert len(responses.calls) == 4  # the first attempt and total=3 retries


@responses.activate
def test_an_unmatched_url_under_responses_is_not_retried():
    # responses raises ConnectionError("Connection refused by Responses ...") for a URL
    # it has no mock for: no urllib3 failure behind it, so nothing to retry.
    with pytest.raises(requests.exceptions.ConnectionError) as raised:
        session(FakeClock()).get(URL + "/unmatched")
    assert "Connection refused by Responses" in str(raised.value)
    assert len(responses.calls) == 1


@responses.activate
def test_out_of_retries_keeps_urllib3s_words_in_the_message():
    # responses' own test_max_retries_exceed_msg, with this package's policy mounted:
    # code that matches on urllib3's reason keeps working, the deferral follows it.
    responses.add(responses.GET, URL, status=500)
    s = session(FakeClock(), status_forcelist=[500])
    with pytest.raises(requests.exceptions.RetryError) as caught:
        s.get(URL)
    assert isinstance(caught.value, RetryDeferred)
    message = str(caught.value)
    assert "too many 500 error responses" in message
    assert message.index("too many 500") < message.index("deferred (attempts)")
    assert "?" not in message  # no query string, whatever urllib3 put in its own message
