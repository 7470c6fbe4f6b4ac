"""Retry-After and HTTP-date parsing: every form and rule of RFC 9110 section 10.2.3."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone

import pytest

from retry_after_adapter.errors import InvalidRetryAfter
from retry_after_adapter.header import (
    MAX_LENGTH,
    RetryAfter,
    format_http_date,
    parse_http_date,
    parse_retry_after,
)

from .retry_after_corpus import CORPUS, HEADER_SAFE, INVALID, RECEIVED_AT

UTC = timezone.utc
FAR_FUTURE = datetime.max.replace(tzinfo=UTC)
T = RECEIVED_AT  # 2026-03-01 12:00:00 UTC, a Sunday


def reason_of(value: object, **kwargs: object) -> str:
    kwargs.setdefault("received_at", T)
    with pytest.raises(InvalidRetryAfter) as info:
        parse_retry_after(value, **kwargs)  # type: ignore[arg-type]
    return info.value.reason


def _id(entry: tuple[str, float | str]) -> str:
    value = entry[0]
    shown = value if len(value) <= 40 else f"{value[:20]}...({len(value)} chars)"
    return shown.encode("unicode_escape").decode("ascii")


# --- the corpus --------------------------------------------------------------------


def test_corpus_shape() -> None:
    assert len(CORPUS) >= 90
    assert all(isinstance(v, str) and (w == INVALID or isinstance(w, float)) for v, w in CORPUS)
    assert len({v for v, _ in CORPUS}) == len(CORPUS), "duplicate values"
    assert HEADER_SAFE and set(HEADER_SAFE) <= set(CORPUS)


@pytest.mark.parametrize("entry", CORPUS, ids=[_id(e) for e in CORPUS])
def test_corpus(entry: tuple[str, float | str]) -> None:
    value, verdict = entry
    if verdict == INVALID:
        with pytest.raises(InvalidRetryAfter):
            parse_retry_after(value, received_at=RECEIVED_AT)
        return
    result = parse_retry_after(value, received_at=RECEIVED_AT)
    assert result.delay == verdict
    assert isinstance(result.delay, float)
    assert result.clock_skew is None
    assert result.eligible_at.tzinfo is UTC
    try:
        expected_at = RECEIVED_AT + timedelta(seconds=result.delay)
    except OverflowError:
        expected_at = FAR_FUTURE
    if result.delay < 1e15:
        assert result.eligible_at == expected_at
    else:
        assert result.eligible_at == FAR_FUTURE


@pytest.mark.parametrize(
    "entry", [e for e in CORPUS if e[1] != INVALID], ids=[_id(e) for e in CORPUS if e[1] != INVALID]
)
def test_corpus_against_a_matching_date_header(entry: tuple[str, float | str]) -> None:
    """A Date header equal to the receipt time gives the same delays and zero skew."""
    value, verdict = entry
    result = parse_retry_after(value, received_at=RECEIVED_AT, date=format_http_date(RECEIVED_AT))
    assert result.delay == verdict
    assert result.clock_skew == 0.0


# --- delay-seconds -----------------------------------------------------------------


def test_seconds() -> None:
    result = parse_retry_after("120", received_at=T)
    assert result == RetryAfter(120.0, T + timedelta(seconds=120), "seconds", None)
    assert type(result.delay) is float


@pytest.mark.parametrize(
    ("value", "delay"),
    [("  7\t", 7.0), ("0", 0.0), ("007", 7.0), ("\t\t0\t", 0.0), ("000120", 120.0)],
)
def test_seconds_trimmed_and_leading_zeros(value: str, delay: float) -> None:
    result = parse_retry_after(value, received_at=T)
    assert result.delay == delay
    assert result.eligible_at == T + timedelta(seconds=delay)
    assert result.form == "seconds"


def test_zero_is_eligible_at_receipt() -> None:
    assert parse_retry_after("0", received_at=T).eligible_at == T


def test_forty_digit_number_is_valid_and_far_future() -> None:
    result = parse_retry_after("1234567890" * 4, received_at=T)
    assert result.form == "seconds"
    assert result.delay == 1e15
    assert result.eligible_at == FAR_FUTURE


def test_largest_delay_that_fits_is_exact() -> None:
    limit = (FAR_FUTURE - T) // timedelta(seconds=1)
    fits = parse_retry_after(str(limit), received_at=T)
    assert fits.eligible_at == T + timedelta(seconds=limit)
    assert fits.delay == float(limit)
    beyond = parse_retry_after(str(limit + 1), received_at=T)
    assert beyond.eligible_at == FAR_FUTURE
    assert beyond.delay == float(limit + 1)


def test_seconds_near_the_end_of_time_never_overflow() -> None:
    late = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert parse_retry_after("5", received_at=late).eligible_at == FAR_FUTURE
    assert parse_retry_after("0", received_at=late).eligible_at == late


def test_the_same_value_at_different_receipt_times() -> None:
    """Results do not carry state from one call to the next."""
    first = parse_retry_after("30", received_at=T)
    later = T + timedelta(hours=5, microseconds=123)
    second = parse_retry_after("30", received_at=later)
    assert first.eligible_at == T + timedelta(seconds=30)
    assert second.eligible_at == later + timedelta(seconds=30)
    assert parse_retry_after(" 30", received_at=later) == second


@pytest.mark.parametrize(
    "value",
    ["+5", "-5", "-1.5", ".5", "5.", "1e3", "\u0663", "\u00b2", "\uff15", "\U0001d7d3", "\u2460", "\u0969"],
)
def test_seconds_ascii_digits_only(value: str) -> None:
    assert reason_of(value) == "malformed"


def test_seconds_with_a_valid_date_header_records_skew_only() -> None:
    result = parse_retry_after("60", received_at=T, date=format_http_date(T - timedelta(seconds=90)))
    assert result.delay == 60.0
    assert result.eligible_at == T + timedelta(seconds=60)
    assert result.clock_skew == 90.0


def test_seconds_with_an_invalid_date_header() -> None:
    result = parse_retry_after("60", received_at=T, date="yesterday")
    assert result == RetryAfter(60.0, T + timedelta(seconds=60), "seconds", None)


# --- reasons -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        (" \t ", "empty"),
        ("5" * (MAX_LENGTH + 1), "too_long"),
        ("\r\n" * 5000, "too_long"),  # the length is checked before anything else
        ("5\r\n", "control"),
        ("5\x00", "control"),
        ("\x7f", "control"),
        ("5\t5", "control"),
        ("5, 5", "repeated"),
        ("5,5", "repeated"),
        (",", "repeated"),
        ("Sun, 01 Mar 2026 12:00:10 GMT, Sun, 01 Mar 2026 12:00:10 GMT", "repeated"),
        ("Sun Mar  1 12:00:10 2026, 5", "repeated"),
        ("Sun, 01 Mar 2026 12:02:00 UTC", "zone"),
        ("Sun, 01 Mar 2026 12:02:00 +0000", "zone"),
        ("Sun, 01 Mar 2026 12:02:00 -0500", "zone"),
        ("Sun, 01 Mar 2026 12:02:00 Z", "zone"),
        ("Sun, 01 Mar 2026 12:02:00", "zone"),
        ("Sunday, 01-Mar-26 12:02:00 EST", "zone"),
        ("Sun Mar  1 12:02:00 2026 GMT", "zone"),
        ("Sat, 01 Jan 10000 00:00:00 GMT", "out_of_range"),
        ("Mon, 01 Jan 0000 00:00:00 GMT", "out_of_range"),
        ("Mon, 29 Feb 2027 12:00:00 GMT", "out_of_range"),
        ("Mon, 02 Mar 2026 24:00:00 GMT", "out_of_range"),
        ("Sun, 01 Mar 2026 12:00:61 GMT", "out_of_range"),
        ("Mon Feb 29 12:00:00 2027", "out_of_range"),
        ("Mon, 01 Mar 2026 12:02:00 GMT", "weekday"),
        ("Monday, 01-Mar-26 12:02:00 GMT", "weekday"),
        ("Mon Mar  1 12:02:00 2026", "weekday"),
        ("sun, 01 Mar 2026 12:02:00 GMT", "malformed"),
        ("Sun, 1 Mar 2026 12:02:00 GMT", "malformed"),
        ("Sun, 01 Mar 2026 12:02 GMT", "malformed"),
        ("Sun , 01 Mar 2026 12:02:00 GMT", "malformed"),
        ("soon", "malformed"),
    ],
)
def test_reasons(value: str, reason: str) -> None:
    assert reason_of(value) == reason


@pytest.mark.parametrize("value", [None, 120, 1.5, b"120", ["120"]])
def test_non_str_value(value: object) -> None:
    assert reason_of(value) == "type"


def test_invalid_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="repeated"):
        parse_retry_after("5, 5", received_at=T)


def test_huge_values_are_rejected_cheaply() -> None:
    huge = "1" * 10_000_000
    started = time.perf_counter()
    for _ in range(50):
        assert reason_of(huge) == "too_long"
    # Scanning or copying 10 MB fifty times would take far longer than this.
    assert time.perf_counter() - started < 0.25


# --- received_at -------------------------------------------------------------------


def test_naive_received_at_is_refused() -> None:
    assert reason_of("120", received_at=datetime(2026, 3, 1, 12)) == "naive_received_at"
    assert reason_of("Sun, 01 Mar 2026 12:02:00 GMT", received_at=datetime(2026, 3, 1)) == (
        "naive_received_at"
    )


@pytest.mark.parametrize("received_at", [None, 1772366400.0, "2026-03-01T12:00:00Z"])
def test_received_at_must_be_a_datetime(received_at: object) -> None:
    assert reason_of("120", received_at=received_at) == "naive_received_at"


def test_received_at_in_another_zone_gives_utc() -> None:
    local = T.astimezone(timezone(timedelta(hours=-5)))
    result = parse_retry_after("120", received_at=local)
    assert result.eligible_at == T + timedelta(seconds=120)
    assert result.eligible_at.tzinfo is UTC
    past = parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", received_at=local)
    assert past.delay == 0.0
    assert past.eligible_at == T and past.eligible_at.tzinfo is UTC


# --- HTTP-date: measured against the Date header -------------------------------------


def test_future_date_measured_against_server_date() -> None:
    server_now = T
    retry_at = format_http_date(server_now + timedelta(seconds=300))
    result = parse_retry_after(retry_at, received_at=T, date=format_http_date(server_now))
    assert result == RetryAfter(300.0, T + timedelta(seconds=300), "date", 0.0)


@pytest.mark.parametrize("local_error", [3600, -3600, 7, -86400 * 3])
def test_date_is_immune_to_local_clock_skew(local_error: int) -> None:
    server_now = T
    received_at = server_now + timedelta(seconds=local_error)  # the local clock is wrong
    result = parse_retry_after(
        format_http_date(server_now + timedelta(seconds=300)),
        received_at=received_at,
        date=format_http_date(server_now),
    )
    assert result.delay == 300.0
    assert result.clock_skew == float(local_error)
    assert result.eligible_at == received_at + timedelta(seconds=300)
    assert result.form == "date"


def test_skew_keeps_fractions_of_a_second() -> None:
    received_at = T + timedelta(seconds=3600, microseconds=250_000)
    result = parse_retry_after(
        "Sun, 01 Mar 2026 12:05:00 GMT", received_at=received_at, date="Sun, 01 Mar 2026 12:00:00 GMT"
    )
    assert result.clock_skew == 3600.25
    assert result.delay == 300.0


def test_date_without_date_header_uses_received_at() -> None:
    received_at = T + timedelta(microseconds=500_000)
    result = parse_retry_after("Sun, 01 Mar 2026 12:02:00 GMT", received_at=received_at)
    assert result.delay == 119.5
    assert result.eligible_at == T + timedelta(seconds=120)
    assert result.clock_skew is None


@pytest.mark.parametrize(
    "bad_date",
    [
        "not a date",
        "",
        "Sun, 01 Mar 2026 11:00:00 UTC",
        "Mon, 01 Mar 2026 11:00:00 GMT",  # wrong weekday
        "Sun, 01 Mar 2026 11:00:00 GMT, Sun, 01 Mar 2026 11:00:00 GMT",
        "Sun, 01 Mar 2026 11:00:00 GMT" + " " * 200,  # too long
        "120",
        b"Sun, 01 Mar 2026 11:00:00 GMT",
        None,
    ],
)
def test_invalid_date_header_falls_back_to_received_at(bad_date: object) -> None:
    result = parse_retry_after("Sun, 01 Mar 2026 12:02:00 GMT", received_at=T, date=bad_date)  # type: ignore[arg-type]
    assert result == RetryAfter(120.0, T + timedelta(seconds=120), "date", None)


@pytest.mark.parametrize(
    "server_date",
    ["Sun, 01 Mar 2026 11:00:00 GMT", "Sunday, 01-Mar-26 11:00:00 GMT", "Sun Mar  1 11:00:00 2026"],
)
def test_date_header_in_every_form(server_date: str) -> None:
    result = parse_retry_after("Sun, 01 Mar 2026 11:02:00 GMT", received_at=T, date=server_date)
    assert result.delay == 120.0
    assert result.clock_skew == 3600.0
    assert result.eligible_at == T + timedelta(seconds=120)


def test_past_date_means_zero() -> None:
    result = parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", received_at=T)
    assert result == RetryAfter(0.0, T, "date", None)
    with_header = parse_retry_after(
        "Sun, 01 Mar 2026 11:59:00 GMT", received_at=T, date="Sun, 01 Mar 2026 12:00:00 GMT"
    )
    assert with_header == RetryAfter(0.0, T, "date", 0.0)


def test_date_equal_to_server_date_means_zero() -> None:
    result = parse_retry_after(
        "Sun, 01 Mar 2026 12:00:00 GMT", received_at=T + timedelta(seconds=5), date=format_http_date(T)
    )
    assert result.delay == 0.0
    assert result.eligible_at == T + timedelta(seconds=5)


def test_far_future_date_against_an_old_server_date_does_not_overflow() -> None:
    result = parse_retry_after(
        "Fri, 31 Dec 9999 23:59:59 GMT", received_at=T, date="Thu, 01 Jan 1970 00:00:00 GMT"
    )
    assert result.eligible_at == FAR_FUTURE
    expected = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    assert result.delay == expected.total_seconds()
    assert result.clock_skew == (T - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()


def test_leap_second_reads_as_second_59() -> None:
    result = parse_retry_after("Sun, 01 Mar 2026 12:00:60 GMT", received_at=T)
    assert result.delay == 59.0
    assert parse_http_date("Sat, 31 Dec 2016 23:59:60 GMT") == datetime(2016, 12, 31, 23, 59, 59, tzinfo=UTC)


# --- the three forms ---------------------------------------------------------------


def test_three_forms_of_one_instant() -> None:
    forms = ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"]
    expected = datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)
    for text in forms:
        assert parse_http_date(text, received_at=T) == expected


@pytest.mark.parametrize(
    "value",
    ["Sun, 01 Mar 2026 12:02:00 GMT", "Sunday, 01-Mar-26 12:02:00 GMT", "Sun Mar  1 12:02:00 2026"],
)
def test_future_date_in_each_form(value: str) -> None:
    assert parse_retry_after(value, received_at=T) == RetryAfter(
        120.0, T + timedelta(seconds=120), "date", None
    )


def test_asctime_two_digit_day() -> None:
    assert parse_http_date("Tue Nov 16 08:49:37 1993") == datetime(1993, 11, 16, 8, 49, 37, tzinfo=UTC)
    assert parse_http_date("Sun Nov 06 08:49:37 1994") == datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)


# --- RFC 850 two-digit years ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "year"),
    [
        # received_at 2026-03-01 12:00:00: the horizon is 2076-03-01 12:00:00.
        ("Sunday, 01-Mar-76 12:00:00 GMT", 2076),  # exactly 50 years ahead: not more
        ("Monday, 01-Mar-76 12:00:01 GMT", 1976),  # one second more than 50 years
        ("Friday, 28-Feb-76 23:59:59 GMT", 2076),
        ("Sunday, 01-Mar-76 00:00:00 GMT", 2076),  # earlier on the horizon's day
        ("Saturday, 06-Nov-76 08:49:37 GMT", 1976),
        ("Tuesday, 31-Dec-75 23:59:59 GMT", 2075),
        ("Saturday, 01-Jan-77 00:00:00 GMT", 1977),
        ("Sunday, 01-Mar-26 12:00:00 GMT", 2026),
        ("Saturday, 01-Jan-00 00:00:00 GMT", 2000),
        ("Friday, 31-Dec-99 23:59:59 GMT", 1999),
    ],
)
def test_rfc850_century(text: str, year: int) -> None:
    assert parse_http_date(text, received_at=T).year == year


def test_rfc850_century_follows_received_at() -> None:
    monday_1976 = "Monday, 01-Mar-76 12:00:01 GMT"
    sunday_2076 = "Sunday, 01-Mar-76 12:00:01 GMT"
    assert parse_http_date(monday_1976, received_at=T).year == 1976
    # One second later the horizon reaches 2076-03-01 12:00:01, so "76" there is 2076.
    later = T + timedelta(seconds=1)
    assert parse_http_date(sunday_2076, received_at=later).year == 2076
    assert reason_of(monday_1976, received_at=later) == "weekday"
    # Seen from 1990 "76" is 1976; seen from 2100 it is 2076 (both in the past).
    assert parse_http_date(monday_1976, received_at=datetime(1990, 1, 1, tzinfo=UTC)).year == 1976
    assert parse_http_date(sunday_2076, received_at=datetime(2100, 1, 1, tzinfo=UTC)).year == 2076


def test_rfc850_boundary_with_fractional_received_at() -> None:
    received_at = T + timedelta(microseconds=1)  # horizon 2076-03-01 12:00:00.000001
    assert parse_http_date("Sunday, 01-Mar-76 12:00:00 GMT", received_at=received_at).year == 2076
    assert parse_http_date("Monday, 01-Mar-76 12:00:01 GMT", received_at=received_at).year == 1976


def test_rfc850_boundary_from_a_leap_day() -> None:
    received_at = datetime(2028, 2, 29, 12, tzinfo=UTC)  # 2078 has no 29 February
    assert parse_http_date("Monday, 28-Feb-78 23:59:59 GMT", received_at=received_at).year == 2078
    assert parse_http_date("Wednesday, 01-Mar-78 00:00:00 GMT", received_at=received_at).year == 1978


def test_rfc850_retry_after_uses_received_at_for_the_century() -> None:
    result = parse_retry_after("Sunday, 01-Mar-76 12:00:00 GMT", received_at=T)
    assert result.eligible_at == datetime(2076, 3, 1, 12, tzinfo=UTC)
    assert parse_retry_after("Monday, 01-Mar-76 12:00:01 GMT", received_at=T).delay == 0.0


def test_rfc850_needs_a_reference_in_parse_http_date() -> None:
    with pytest.raises(InvalidRetryAfter) as info:
        parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT")
    assert info.value.reason == "needs_reference"


# --- parse_http_date and format_http_date -------------------------------------------


def test_parse_http_date_is_strict_and_aware() -> None:
    moment = parse_http_date(" Sun, 06 Nov 1994 08:49:37 GMT ")
    assert moment == datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)
    assert moment.utcoffset() == timedelta(0)
    for bad in ["120", "", "Sun, 06 Nov 1994 08:49:37 +0000", "x" * 500]:
        with pytest.raises(InvalidRetryAfter):
            parse_http_date(bad)
    with pytest.raises(InvalidRetryAfter) as info:
        parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT")  # type: ignore[arg-type]
    assert info.value.reason == "type"
    with pytest.raises(InvalidRetryAfter) as info:
        parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", received_at=datetime(2026, 1, 1))
    assert info.value.reason == "naive_received_at"


def test_format_http_date() -> None:
    assert format_http_date(datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)) == "Sun, 06 Nov 1994 08:49:37 GMT"
    eastern = timezone(timedelta(hours=-5))
    assert format_http_date(datetime(2026, 3, 1, 7, 0, 0, 999_999, tzinfo=eastern)) == (
        "Sun, 01 Mar 2026 12:00:00 GMT"
    )
    assert format_http_date(datetime(1, 1, 1, tzinfo=UTC)) == "Mon, 01 Jan 0001 00:00:00 GMT"
    with pytest.raises(InvalidRetryAfter):
        format_http_date(datetime(2026, 3, 1))


def test_format_then_parse_round_trip() -> None:
    for moment in [T, datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)]:
        assert parse_http_date(format_http_date(moment)) == moment


# --- the result type ---------------------------------------------------------------


def test_result_is_a_frozen_retry_after() -> None:
    result = parse_retry_after("5", received_at=T)
    assert type(result) is RetryAfter
    assert result == RetryAfter(5.0, T + timedelta(seconds=5), "seconds")
    assert hash(result) == hash(RetryAfter(5.0, T + timedelta(seconds=5), "seconds"))
    assert repr(result).startswith("RetryAfter(delay=5.0, ")
    assert dataclasses.asdict(result)["form"] == "seconds"
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.delay = 1.0  # type: ignore[misc]


# --- the memo tables behind the fast paths -------------------------------------------


def test_many_distinct_values_stay_correct_and_bounded() -> None:
    from retry_after_adapter import header

    for n in range(3 * header._SECONDS_CACHED):
        value = f" {n:05d}" if n % 2 else str(n)
        assert parse_retry_after(value, received_at=T).eligible_at == T + timedelta(seconds=n)
    assert len(header._SECONDS) <= header._SECONDS_CACHED
    for days in range(3 * header._IMF_DAYS_CACHED):
        moment = T + timedelta(days=days, seconds=days)
        assert parse_http_date(format_http_date(moment)) == moment
    assert len(header._IMF_DAYS) <= header._IMF_DAYS_CACHED


def test_a_remembered_day_still_checks_the_time() -> None:
    assert parse_http_date("Sun, 01 Mar 2026 23:59:59 GMT") == datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
    for bad, reason in [
        ("Sun, 01 Mar 2026 24:00:00 GMT", "out_of_range"),
        ("Sun, 01 Mar 2026 23:60:00 GMT", "out_of_range"),
        ("Sun, 01 Mar 2026 23:59:61 GMT", "out_of_range"),
        ("Sun, 01 Mar 2026 99:99:99 GMT", "out_of_range"),
    ]:
        with pytest.raises(InvalidRetryAfter) as info:
            parse_http_date(bad)
        assert info.value.reason == reason
    assert parse_http_date("Sun, 01 Mar 2026 23:59:60 GMT") == datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
