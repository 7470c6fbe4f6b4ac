"""urllib3's own ``Retry`` unit-test cases, run against ``RetryAfterRetry``.

Each case of urllib3's ``test/test_retry.py`` that a subclass must pass is restated
here and run against stock ``Retry`` and ``RetryAfterRetry`` alike: the stock run proves
the case is stated right, ours that the subclass is a drop-in. Where ``RetryAfterRetry``
differs on purpose, a test below pins the difference (and docs/behaviour.md lists it):

1. ``status_forcelist`` defaults to 429, 502, 503, 504 (stock: none), so cases that rely
   on the stock default pass ``status_forcelist`` explicitly;
2. ``repr`` adds ``deadline`` and ``max_wait``;
3. ``parse_retry_after`` is RFC 9110 strict (stock also reads non-GMT zones and
   one-digit days) and never capped by ``retry_after_max``; the one leniency is a plain
   decimal (``2.0``, as Shopify sends), read as the next whole second up, an int (stock
   raises ``InvalidHeader``);
4. waits run on the policy's clock, and one longer than ``max_wait`` is not shortened:
   it raises ``MaxRetryDeferred`` (a ``MaxRetryError``);
5. ``history`` URLs lose their query string (it may hold credentials).
"""

from __future__ import annotations

from typing import Any

import pytest
from urllib3.exceptions import (
    ConnectTimeoutError,
    InvalidHeader,
    MaxRetryError,
    ReadTimeoutError,
    ResponseError,
    SSLError,
)
from urllib3.response import HTTPResponse
from urllib3.util.retry import RequestHistory, Retry

from retry_after_adapter import FakeClock, InvalidRetryAfter, MaxRetryDeferred, RetryAfterRetry
from retry_after_adapter._compat import IS_URLLIB3_V1

POOL: Any = None  # urllib3's tests use a dummy pool; the errors below never read it


def ours(*args: Any, **kwargs: Any) -> RetryAfterRetry:
    # Stock's defaults where ours differ on purpose (difference 1), a fake clock so
    # nothing really sleeps, and no max_wait so no wait is deferred.
    kwargs.setdefault("status_forcelist", None)
    kwargs.setdefault("clock", FakeClock())
    kwargs.setdefault("max_wait", None)
    return RetryAfterRetry(*args, **kwargs)


@pytest.fixture(params=[Retry, ours], ids=["stock", "RetryAfterRetry"])
def make(request: pytest.FixtureRequest) -> Any:
    return request.param


def read_timeout(path: str = "/") -> ReadTimeoutError:
    return ReadTimeoutError(POOL, path, "read timed out")


# -- counters -------------------------------------------------------------------------------


def test_total_wins_when_lower_than_connect(make):
    error = ConnectTimeoutError()
    retry = make(connect=3, total=2).increment(error=error).increment(error=error)
    with pytest.raises(MaxRetryError) as raised:
        retry.increment(error=error)
    assert raised.value.reason is error


def test_a_lower_connect_than_total_is_honoured(make):
    error = ConnectTimeoutError()
    retry = make(connect=2, total=3).increment(error=error).increment(error=error)
    with pytest.raises(MaxRetryError):
        retry.increment(error=error)


def test_a_lower_read_than_total_is_honoured(make):
    retry = make(read=2, total=3)
    retry = retry.increment(method="GET", error=read_timeout()).increment(method="GET", error=read_timeout())
    with pytest.raises(MaxRetryError):
        retry.increment(method="GET", error=read_timeout())


def test_total_none_leaves_connect_in_charge(make):
    error = ConnectTimeoutError()
    retry = make(connect=2, total=None).increment(error=error).increment(error=error)
    with pytest.raises(MaxRetryError) as raised:
        retry.increment(error=error)
    assert raised.value.reason is error
    retry = make(connect=2, total=None)
    for _ in range(3):
        retry = retry.increment(method="GET", error=read_timeout())
    assert not retry.is_exhausted()


def test_defaults(make):
    retry = make()
    assert retry.total == 10
    assert (retry.connect, retry.read, retry.redirect, retry.other) == (None, None, None, None)
    error = ConnectTimeoutError()
    retry = make(connect=1).increment(error=error)
    assert not retry.is_exhausted()
    with pytest.raises(MaxRetryError):
        retry.increment(error=error)
    assert make(0).raise_on_redirect
    assert not make(False).raise_on_redirect


def test_other_errors_count_against_other(make):
    error = SSLError()
    retry = make(connect=1).increment(error=error).increment(error=error)
    assert not retry.is_exhausted()
    retry = make(other=1).increment(error=error)
    with pytest.raises(MaxRetryError) as raised:
        retry.increment(error=error)
    assert raised.value.reason is error


def test_read_zero_gives_no_second_chance(make):
    error = read_timeout()
    with pytest.raises(MaxRetryError) as raised:
        make(read=0).increment(method="GET", error=error)
    assert raised.value.reason is error


def test_the_status_counter(make):
    response = HTTPResponse(status=400)
    retry = make(status=2).increment(response=response).increment(response=response)
    with pytest.raises(MaxRetryError, match=ResponseError.SPECIFIC_ERROR.format(status_code=400)):
        retry.increment(response=response)


def test_exhausted(make):
    assert not make(0).is_exhausted()
    assert make(-1).is_exhausted()
    assert make(1).increment(method="GET").total == 0


@pytest.mark.parametrize("total", [-1, 0])
def test_disabled(make, total):
    with pytest.raises(MaxRetryError):
        make(total).increment(method="GET")


# -- backoff -----------------------------------------------------------------------------------


def test_backoff(make):
    retry = make(total=100, backoff_factor=0.2)
    assert retry.get_backoff_time() == 0
    retry = retry.increment(method="GET")
    assert retry.get_backoff_time() == 0
    retry = retry.increment(method="GET")
    assert (retry.backoff_factor, retry.total, retry.get_backoff_time()) == (0.2, 98, 0.4)
    retry = retry.increment(method="GET")
    assert retry.get_backoff_time() == 0.8
    retry = retry.increment(method="GET")
    assert retry.get_backoff_time() == 1.6
    for _ in range(10):
        retry = retry.increment(method="GET")
    assert retry.get_backoff_time() == Retry.DEFAULT_BACKOFF_MAX


@pytest.mark.skipif(IS_URLLIB3_V1, reason="backoff_max and backoff_jitter are urllib3 2.x arguments")
def test_configurable_backoff_max_and_jitter(make):
    retry = make(total=100, backoff_factor=0.2, backoff_max=1, backoff_jitter=0.4)
    for _ in range(2):
        retry = retry.increment(method="GET")
    assert 0.4 <= retry.get_backoff_time() <= 0.8
    for _ in range(3):
        retry = retry.increment(method="GET")
    assert retry.get_backoff_time() == 1


def test_zero_backoff(make):
    retry = make().increment(method="GET").increment(method="GET")
    assert retry.get_backoff_time() == 0


def test_backoff_resets_after_a_redirect(make):
    retry = make(total=100, redirect=5, backoff_factor=0.2)
    retry = retry.increment(method="GET").increment(method="GET")
    assert retry.get_backoff_time() == 0.4
    retry = retry.increment(method="GET", response=HTTPResponse(status=302, headers={"location": "test"}))
    assert retry.get_backoff_time() == 0
    retry = retry.increment(method="GET").increment(method="GET")
    assert retry.get_backoff_time() == 0.4


def test_sleep_with_a_tiny_backoff_returns(make):
    retry = make(backoff_factor=0.0001).increment(method="GET").increment(method="GET")
    retry.sleep()


# -- what is retried --------------------------------------------------------------------------


def test_status_forcelist(make):
    retry = make(status_forcelist=range(500, 600))
    assert not retry.is_retry("GET", status_code=200)
    assert not retry.is_retry("GET", status_code=400)
    assert retry.is_retry("GET", status_code=500)
    retry = make(total=1, status_forcelist=[418])
    assert not retry.is_retry("GET", status_code=400)
    assert retry.is_retry("GET", status_code=418)
    assert not make(total=1, status_forcelist=["418"]).is_retry("GET", status_code=418)


def test_allowed_methods_with_status_forcelist(make):
    retry = make(status_forcelist=[500], allowed_methods=None)
    assert retry.is_retry("GET", status_code=500) and retry.is_retry("POST", status_code=500)
    retry = make(status_forcelist=[500], allowed_methods=["POST"])
    assert not retry.is_retry("GET", status_code=500) and retry.is_retry("POST", status_code=500)


def test_a_read_error_on_a_method_not_allowed_is_raised_as_itself(make):
    with pytest.raises(ReadTimeoutError):
        make().increment(method="POST", error=read_timeout())


def test_remove_headers_on_redirect(make):
    # As this urllib3 has it (2.2.2 and 1.26.19 added Proxy-Authorization).
    expected = {name.lower() for name in Retry.DEFAULT_REMOVE_HEADERS_ON_REDIRECT}
    assert {"authorization", "cookie"} <= make().remove_headers_on_redirect == expected
    assert make(remove_headers_on_redirect=["X-API-Secret"]).remove_headers_on_redirect == {"x-api-secret"}


# -- errors and history ----------------------------------------------------------------------


def test_error_messages(make):
    with pytest.raises(MaxRetryError, match="read timed out") as raised:
        make(total=0).increment(method="GET", error=read_timeout())
    assert "Caused by redirect" not in str(raised.value)
    retry = make(total=1).increment("POST", "/")
    with pytest.raises(MaxRetryError, match=ResponseError.GENERIC_ERROR) as raised:
        retry.increment("POST", "/")
    assert isinstance(raised.value.reason, ResponseError)
    response = HTTPResponse(status=500)
    retry = make(total=1).increment("POST", "/", response=response)
    with pytest.raises(MaxRetryError, match=ResponseError.SPECIFIC_ERROR.format(status_code=500)):
        retry.increment("POST", "/", response=response)
    retry = make(connect=1).increment(error=ConnectTimeoutError("conntimeout"))
    with pytest.raises(MaxRetryError, match="conntimeout"):
        retry.increment(error=ConnectTimeoutError("conntimeout"))


def test_history(make):
    retry = make(total=10, allowed_methods=frozenset(["GET", "POST"]))
    assert retry.history == ()
    connect_error = ConnectTimeoutError("conntimeout")
    retry = retry.increment("GET", "/test1", None, connect_error)
    read_error = read_timeout("/test2")
    retry = retry.increment("POST", "/test2", None, read_error)
    retry = retry.increment("GET", "/test3", HTTPResponse(status=500), None)
    assert retry.history == (
        RequestHistory("GET", "/test1", connect_error, None, None),
        RequestHistory("POST", "/test2", read_error, None, None),
        RequestHistory("GET", "/test3", None, 500, None),
    )


# -- Retry-After ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "+1", "1e0", "\xb2"])
def test_parse_retry_after_invalid_raises_invalid_header(make, value):
    with pytest.raises(InvalidHeader):
        make().parse_retry_after(value)


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("1000", 1000), ("\t42 ", 42)])
def test_parse_retry_after_seconds_is_an_int(make, value, expected):
    parsed = make().parse_retry_after(value)
    assert parsed == expected and type(parsed) is int


@pytest.mark.parametrize("respect", [True, False])
def test_respect_retry_after_header_is_kept_by_new(make, respect):
    assert make(respect_retry_after_header=respect).new().respect_retry_after_header == respect


def test_get_retry_after_and_sleep_for_retry_without_a_header(make):
    retry = make()
    response = HTTPResponse(status=503)
    assert retry.get_retry_after(response) is None
    assert retry.sleep_for_retry(response) is False


def test_get_retry_after_with_a_header(make):
    response = HTTPResponse(status=503, headers={"Retry-After": "7"})
    assert make().get_retry_after(response) == 7
    assert type(make().get_retry_after(response)) is int


# -- the differences, on purpose -------------------------------------------------------------------


def test_difference_1_status_forcelist_default():
    assert not Retry().status_forcelist
    assert set(RetryAfterRetry().status_forcelist) == {429, 502, 503, 504}


def test_difference_2_repr_adds_deadline_and_max_wait():
    assert repr(Retry()) == "Retry(total=10, connect=None, read=None, redirect=None, status=None)"
    assert repr(RetryAfterRetry()) == (
        "RetryAfterRetry(total=10, connect=None, read=None, redirect=None, status=None, "
        "deadline=None, max_wait=60.0)"
    )


@pytest.mark.parametrize("value", ["Mon, 3 Jun 2019 12:00:00 UTC", "Mon, 03 Jun 2019 12:00:00 +0100"])
def test_difference_3_dates_are_rfc_9110_strict(value):
    Retry().parse_retry_after(value)  # stock reads these
    with pytest.raises(InvalidRetryAfter) as raised:
        RetryAfterRetry().parse_retry_after(value)
    assert isinstance(raised.value, InvalidHeader) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize(("value", "expected"), [("2.0", 2), ("2.1", 3), (" 0.5 ", 1)])
def test_difference_3_a_plain_decimal_is_the_next_whole_second_up(value, expected):
    with pytest.raises(InvalidHeader):
        Retry().parse_retry_after(value)  # stock: digits only
    parsed = RetryAfterRetry().parse_retry_after(value)
    assert parsed == expected and type(parsed) is int


def test_difference_4_sleep_waits_at_least_the_retry_after_on_the_clock():
    clock = FakeClock()
    response = HTTPResponse(status=503, headers={"Retry-After": "30"})
    RetryAfterRetry(clock=clock, max_wait=60).sleep(response)
    assert clock.sleeps == [30.0]
    assert RetryAfterRetry(clock=clock, max_wait=60).sleep_for_retry(response) is True
    assert clock.sleeps == [30.0, 30.0]
    with pytest.raises(MaxRetryError) as raised:  # never shortened to max_wait: deferred
        RetryAfterRetry(clock=clock, max_wait=10).sleep(response)
    assert isinstance(raised.value, MaxRetryDeferred) and raised.value.deferral.delay == 30.0
    assert clock.sleeps == [30.0, 30.0]
    RetryAfterRetry(clock=clock, backoff_factor=1).increment(method="GET").increment(method="GET").sleep()
    assert clock.sleeps[-1] == 2.0  # no Retry-After: the backoff, as stock


def test_difference_5_history_drops_the_query_string():
    retry = RetryAfterRetry().increment("GET", "/items?token=s3cr3t", None, ConnectTimeoutError())
    assert retry.history[-1].url == "/items"
