"""The quota-header parser against the shared corpus (pure: no clock, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from retry_after_adapter import ConfigurationError, Quota
from retry_after_adapter.header import MAX_COUNT, MAX_SECONDS
from retry_after_adapter.quota import QuotaHint, bound_hint, read_quota

from .quota_corpus import CORPUS, RECEIVED_AT


def getter(headers: dict[str, str]):
    lowered = {k.lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())


def test_the_corpus_is_large_and_named_uniquely() -> None:
    assert len(CORPUS) >= 60
    assert len({name for name, _, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("name", "headers", "expected"), CORPUS, ids=[c[0] for c in CORPUS])
def test_quota_corpus(name: str, headers: dict[str, str], expected) -> None:
    hint = read_quota(getter(headers), received_at=RECEIVED_AT, date=headers.get("Date"))
    if expected is None:
        assert hint is None
        return
    assert hint is not None
    assert (hint.remaining, hint.reset) == expected
    assert hint.exhausted == (expected[0] == 0 and expected[1] is not None and expected[1] > 0)


def test_policy_and_limit_are_read() -> None:
    hint = read_quota(
        getter({"RateLimit": '"x";r=10;t=60', "RateLimit-Policy": '"x";q=100;w=60, "d";q=1000;w=86400'}),
        received_at=RECEIVED_AT,
    )
    assert hint == QuotaHint(10, 60.0, 100, 60.0, "ratelimit")
    x = read_quota(getter({"X-RateLimit-Remaining": "3", "X-RateLimit-Limit": "60"}), received_at=RECEIVED_AT)
    assert x == QuotaHint(3, None, 60, None, "x-ratelimit")


@pytest.mark.parametrize(
    ("hint", "bound", "expected"),
    [
        # Within the bound: unchanged (the same object).
        (QuotaHint(1, 30.0, 100, 60.0), 86400.0, QuotaHint(1, 30.0, 100, 60.0)),
        # A window or a reset past the bound is unknown, as if not sent.
        (QuotaHint(1, 1.0, 2, 3_153_600_000.0), 86400.0, QuotaHint(1, 1.0, 2, None)),
        (QuotaHint(0, 999_999_999_999_999.0, None, None), 86400.0, QuotaHint(0, None, None, None)),
        # No bound (max_retry_after=None) still stops at MAX_SECONDS: a datetime can add it.
        (QuotaHint(0, 1e15, 5, 1e15), None, QuotaHint(0, None, 5, None)),
        (QuotaHint(0, MAX_SECONDS, 5, MAX_SECONDS), None, QuotaHint(0, MAX_SECONDS, 5, MAX_SECONDS)),
        # Counts a store could not hold are read as MAX_COUNT: fewer allowed, never more.
        (QuotaHint(10**40, 5.0, 10**40, 60.0), 86400.0, QuotaHint(MAX_COUNT, 5.0, MAX_COUNT, 60.0)),
    ],
)
def test_every_value_a_header_gives_passes_one_bound(hint: QuotaHint, bound, expected: QuotaHint) -> None:
    bounded = bound_hint(hint, bound)
    assert bounded == expected
    if hint == expected:
        assert bounded is hint
    assert bound_hint(None, bound) is None


def test_an_epoch_reset_keeps_the_epoch_and_the_date_it_was_read_with() -> None:
    from .quota_corpus import DATE, EPOCH

    get = getter({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(EPOCH + 30), "Date": DATE})
    hint = read_quota(get, received_at=RECEIVED_AT, date=DATE)
    assert hint == QuotaHint(0, 30.0, None, None, "x-ratelimit", float(EPOCH + 30), float(EPOCH))
    # Milliseconds are read as seconds; without a valid Date, no date (receipt is used).
    ms = getter({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str((EPOCH + 30) * 1000)})
    hint = read_quota(ms, received_at=RECEIVED_AT, date="yesterday")
    assert hint is not None and (hint.reset, hint.reset_at, hint.date) == (30.0, float(EPOCH + 30), None)
    # Seconds from now, or Reset-After, are no epoch: nothing to read against a clock.
    for headers in ({"X-RateLimit-Reset": "30"}, {"X-RateLimit-Reset-After": "30", "X-RateLimit-Reset": str(EPOCH)}):
        hint = read_quota(getter({"X-RateLimit-Remaining": "0", **headers}), received_at=RECEIVED_AT, date=DATE)
        assert hint is not None and (hint.reset, hint.reset_at, hint.date) == (30.0, None, None)


def test_a_reset_dropped_by_the_bound_takes_its_epoch_along() -> None:
    hint = QuotaHint(0, 1e15, 5, None, "x-ratelimit", 1e15 + 1.0, 1.0)
    assert bound_hint(hint, 86400.0) == QuotaHint(0, None, 5, None, "x-ratelimit")
    kept = QuotaHint(10**40, 30.0, None, None, "x-ratelimit", 2e9, 2e9 - 30)
    assert bound_hint(kept, 86400.0) == QuotaHint(MAX_COUNT, 30.0, None, None, "x-ratelimit", 2e9, 2e9 - 30)


# -- the server's clock, learned from whole-second Dates (engine.meters.ServerClock) ---------------


def test_answers_narrow_the_server_clock_to_the_ticks_they_straddle() -> None:
    from retry_after_adapter.engine.meters import ServerClock

    # The server's clock is the monotonic clock + 1000.3 s; every answer takes 10 ms.
    offset = 1000.3

    def answer(clock: ServerClock, sent: float) -> None:
        made = sent + 0.005
        clock.observe(float(int(made + offset)), sent, sent + 0.01)

    clock = ServerClock()
    assert clock.latest(2000.0, 0.0) is None and clock.width() is None
    answer(clock, 10.0)  # made at server 1010.305: Date 1010, so the offset is in [999.99, 1001)
    low, _, high, _ = clock.bounds or (0, 0, 0, 0)
    assert (round(low, 6), round(high, 6)) == (999.99, 1001.0)
    answer(clock, 10.6)  # made at 1010.905, just before a tick: the offset is under 1000.4
    answer(clock, 10.7)  # made at 1011.005, just after it: the offset is above 1000.29
    low, _, high, _ = clock.bounds or (0, 0, 0, 0)
    assert (round(low, 6), round(high, 6)) == (1000.29, 1000.4)
    assert low <= offset < high
    # The reset at server 1016 comes at monotonic 15.7: read as 15.71 at the latest,
    # never before (the first answer alone said 16.01).
    latest = clock.latest(1016.0, 10.71)
    assert latest is not None and 15.7 < latest < 15.71 + 1e-5
    assert clock.restarts == 0


def test_a_bound_is_let_go_with_time_and_a_stepped_clock_starts_it_again() -> None:
    from retry_after_adapter.engine.meters import BOUND_KEPT, DRIFT, ServerClock

    clock = ServerClock()
    clock.observe(1000.0, 9.99, 10.0)  # offset in [990, 991.01)
    # 200 s on, the bound is looser by DRIFT per second: the reset comes later.
    latest = clock.latest(2000.0, 210.0)
    assert latest is not None and abs(latest - (1010.0 + DRIFT * 200)) < 1e-9
    # Past BOUND_KEPT it is not used at all (an answer's own Date says then).
    assert clock.latest(2000.0, 10.0 + BOUND_KEPT + 1) is None
    # The server's clock steps 5 s back: its next answer fits no kept bound.
    clock.observe(1000.0, 19.99, 20.0)  # offset in [980, 981.01): below 990
    assert clock.restarts == 1
    assert clock.bounds == (980.0, 20.0, 1000.0 + 1.0 - 19.99, 20.0)
    # Without a send time an answer bounds the offset from below only.
    other = ServerClock()
    other.observe(1000.0, None, 10.0)
    assert other.bounds == (990.0, 10.0, float("inf"), 10.0)


@pytest.mark.parametrize(
    ("given", "names"),
    [
        ({"limit": 0, "per": 1}, "Quota limit must be an int >= 1, not 0"),
        ({"limit": "40", "per": 1}, "Quota limit must be an int >= 1, not '40'"),
        ({"limit": 1, "per": float("inf")}, "Quota per must be a finite number of seconds > 0, not inf"),
        ({"limit": 1, "per": 1, "margin": -0.5}, "Quota margin must be a finite number of seconds >= 0, not -0.5"),
        ({"limit": 1, "per": 1, "unit": "x" * 80}, "Quota unit must be 'requests' or 'tokens', not 'xxx"),
        ({"limit": -(10**5000), "per": 1}, "Quota limit must be an int >= 1, not an int"),
        ({"limit": 1, "per": 10**400}, "Quota per must be a finite number of seconds > 0, not 1000"),
    ],
)
def test_a_bad_quota_is_refused_with_the_value_given(given: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Quota(**given)
    assert str(raised.value).startswith(names)
    assert len(str(raised.value)) < 120  # a long value is cut, not echoed whole
