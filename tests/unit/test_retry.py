"""RetryAfterRetry's own state across urllib3's new()/increment() on this urllib3."""

from __future__ import annotations

import pytest
from urllib3.util.retry import Retry

from retry_after_adapter import ConfigurationError, FakeClock, InvalidRetryAfter, RetryAfterRetry
from retry_after_adapter._compat import HAS_RETRY_AFTER_MAX, retry_arguments
from retry_after_adapter.adapter import as_retry_after_retry


def make() -> RetryAfterRetry:
    return RetryAfterRetry(
        total=4,
        deadline=30,
        max_wait=10,
        jitter=0.5,
        attempt_reserve=1.5,
        on_invalid="backoff",
        max_deferrals=3,
        max_lifetime=3600,
        clock=FakeClock(),
        backoff_factor=0.25,
    )


EXTRA = (
    "deadline",
    "max_wait",
    "jitter",
    "attempt_reserve",
    "on_invalid",
    "max_deferrals",
    "max_lifetime",
    "clock",
)


def test_new_carries_every_extra_setting():
    retry = make()
    copy = retry.new(total=2)
    assert isinstance(copy, RetryAfterRetry)
    assert copy.total == 2
    for name in EXTRA:
        assert getattr(copy, name) == getattr(retry, name), name
    assert copy.backoff_factor == 0.25


def test_increment_carries_every_extra_setting():
    retry = make()
    nxt = retry.increment(method="GET", url="/x?token=abc", error=None, response=None)
    assert nxt.total == 3
    for name in EXTRA:
        assert getattr(nxt, name) == getattr(retry, name), name
    # The query string never reaches urllib3's history (it may hold credentials).
    assert nxt.history[-1].url == "/x"


def test_defaults():
    retry = RetryAfterRetry()
    assert set(retry.status_forcelist) == {429, 502, 503, 504}
    assert retry.max_wait == 60 and retry.deadline is None and retry.on_invalid == "stop"
    assert "POST" not in retry.allowed_methods and "PATCH" not in retry.allowed_methods
    assert {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"} <= set(retry.allowed_methods)


@pytest.mark.skipif(not HAS_RETRY_AFTER_MAX, reason="this urllib3 has no retry_after_max")
def test_urllib3_retry_after_max_never_shortens_our_parse():
    retry = RetryAfterRetry(retry_after_max=10)
    assert retry.parse_retry_after("50000") == 50000
    assert Retry(retry_after_max=10).parse_retry_after("50000") == 10


def test_parse_retry_after_is_strict():
    with pytest.raises(InvalidRetryAfter):
        RetryAfterRetry().parse_retry_after("1.5e0")
    assert RetryAfterRetry().parse_retry_after("1.5") == 2  # a plain decimal: rounded up


@pytest.mark.parametrize(
    "kw",
    [
        {"deadline": -1},
        {"max_wait": "x"},
        {"jitter": -0.1},
        {"on_invalid": "retry"},
        {"max_deferrals": -1},
        {"max_deferrals": 1.5},
        {"clock": object()},
        {"on_decision": 5},
    ],
)
def test_bad_arguments_raise_configuration_error(kw):
    with pytest.raises(ConfigurationError):
        RetryAfterRetry(**kw)


def test_stock_retry_is_converted_with_its_settings():
    stock = Retry(total=7, backoff_factor=1.5, status_forcelist=[500], allowed_methods=["GET"])
    ours = as_retry_after_retry(stock)
    assert isinstance(ours, RetryAfterRetry)
    assert (ours.total, ours.backoff_factor, set(ours.status_forcelist)) == (7, 1.5, {500})
    assert retry_arguments(stock)["total"] == 7
    assert as_retry_after_retry(2).total == 2
    with pytest.raises(ConfigurationError):
        as_retry_after_retry("three")


def test_a_misspelled_keyword_is_named_with_the_one_it_looks_like() -> None:
    """A keyword neither RetryAfterRetry nor urllib3's Retry takes: the package's own
    error, naming it and the keyword it looks like (not urllib3's bare TypeError)."""
    with pytest.raises(ConfigurationError, match=r"unknown keyword 'max_wiat': did you mean 'max_wait'\?"):
        RetryAfterRetry(total=3, max_wiat=10)
    with pytest.raises(ConfigurationError, match=r"'status_forcelst': did you mean 'status_forcelist'\?"):
        RetryAfterRetry(status_forcelst=[503])
    with pytest.raises(ConfigurationError, match=r"'bogus' \(it takes: .*max_wait.*status_forcelist"):
        RetryAfterRetry(bogus=1)
    # urllib3's own keywords, and a copy through new(), still pass.
    retry = RetryAfterRetry(total=3, status_forcelist=[503], backoff_factor=0.5, respect_retry_after_header=True)
    assert retry.new(total=2).total == 2 and retry.new().backoff_factor == 0.5
