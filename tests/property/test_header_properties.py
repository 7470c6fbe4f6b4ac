"""Properties of the Retry-After parser over generated values (bounded, fast)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from retry_after_adapter.errors import InvalidRetryAfter
from retry_after_adapter.header import MAX_LENGTH, format_http_date, parse_http_date, parse_retry_after

UTC = timezone.utc
FAR_FUTURE = datetime.max.replace(tzinfo=UTC)
RECEIVED_AT = datetime(2026, 3, 1, 12, tzinfo=UTC)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SHORT_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def imf_fixdate(t: datetime) -> str:
    return (
        f"{SHORT_DAYS[t.weekday()]}, {t.day:02d} {MONTHS[t.month - 1]} {t.year:04d} "
        f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} GMT"
    )


def rfc850_date(t: datetime) -> str:
    return (
        f"{LONG_DAYS[t.weekday()]}, {t.day:02d}-{MONTHS[t.month - 1]}-{t.year % 100:02d} "
        f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} GMT"
    )


def asctime_date(t: datetime) -> str:
    return (
        f"{SHORT_DAYS[t.weekday()]} {MONTHS[t.month - 1]} {t.day:2d} "
        f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} {t.year:04d}"
    )


# Aware instants to the second, 1970..9999.
instants = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)).map(
    lambda t: t.replace(microsecond=0, tzinfo=UTC)
)

receipt_times = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31)).map(
    lambda t: t.replace(tzinfo=UTC)
)

# Text that often comes close to a valid value: pieces of the grammar mixed with noise.
pieces = st.sampled_from(
    [*SHORT_DAYS, *LONG_DAYS, *MONTHS, "GMT", "UTC", ", ", ",", " ", "  ", "\t", "-", ":", "0", "1",
     "06", "60", "99", "1994", "2026", "9999", "10000", "+", ".", "e", "\r\n", "\x00", "\u0663",
     "\uff15", "\u00b2"]
)  # fmt: skip
grammar_soup = st.lists(pieces, max_size=14).map("".join)


@SETTINGS
@given(value=st.one_of(st.text(max_size=MAX_LENGTH + 20), grammar_soup), received_at=receipt_times)
@example(value="5" * 10_000, received_at=RECEIVED_AT)
@example(value="9" * 128, received_at=datetime(9999, 12, 31, tzinfo=UTC))
@example(value="Fri, 31 Dec 9999 23:59:59 GMT", received_at=datetime(1970, 1, 1, tzinfo=UTC))
def test_any_text_gives_a_delay_or_invalid(value: str, received_at: datetime) -> None:
    try:
        result = parse_retry_after(value, received_at=received_at)
    except InvalidRetryAfter:
        return
    assert result.delay >= 0
    assert result.eligible_at >= received_at
    assert result.eligible_at.tzinfo is UTC
    assert result.form in ("seconds", "date")
    assert result.clock_skew is None


@SETTINGS
@given(value=grammar_soup | st.text(max_size=40), date=grammar_soup | st.text(max_size=40))
def test_any_date_header_never_breaks_a_valid_value(value: str, date: str) -> None:
    """An invalid Date header is ignored; only InvalidRetryAfter ever escapes."""
    try:
        result = parse_retry_after(value, received_at=RECEIVED_AT, date=date)
    except InvalidRetryAfter:
        return
    assert result.delay >= 0
    plain = parse_retry_after(value, received_at=RECEIVED_AT)
    if result.clock_skew is None or result.form == "seconds":
        assert result.delay == plain.delay


@SETTINGS
@given(instant=instants, offset_days=st.integers(min_value=-49 * 365, max_value=49 * 365))
def test_every_form_parses_back_to_the_instant(instant: datetime, offset_days: int) -> None:
    # The reference is within 49 years of the instant, where a two-digit year is unambiguous.
    try:
        reference = instant + timedelta(days=offset_days)
    except OverflowError:
        reference = instant
    for text in (imf_fixdate(instant), rfc850_date(instant), asctime_date(instant)):
        assert parse_http_date(text, received_at=reference) == instant
        result = parse_retry_after(text, received_at=reference)
        assert result.form == "date"
        assert result.eligible_at == max(instant, reference)
        assert result.delay == max(0.0, (instant - reference).total_seconds())
    assert format_http_date(instant) == imf_fixdate(instant)


@SETTINGS
@given(
    seconds=st.one_of(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**60)),
    zeros=st.integers(min_value=0, max_value=3),
    left=st.sampled_from(["", " ", "\t", " \t "]),
    right=st.sampled_from(["", " ", "\t", "\t \t"]),
)
def test_any_ascii_integer_is_that_delay(seconds: int, zeros: int, left: str, right: str) -> None:
    value = f"{left}{'0' * zeros}{seconds}{right}"
    result = parse_retry_after(value, received_at=RECEIVED_AT)
    assert result.form == "seconds"
    assert result.delay == float(min(seconds, 10**15))


@SETTINGS
@given(
    whole=st.one_of(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**40)),
    fraction=st.text(alphabet="0123456789", min_size=1, max_size=20),
    left=st.sampled_from(["", " ", "\t"]),
    right=st.sampled_from(["", " ", "\t"]),
)
def test_a_plain_decimal_is_the_next_whole_second_up(whole: int, fraction: str, left: str, right: str) -> None:
    """Shopify's "2.0": never shorter than the value, at most one second longer."""
    result = parse_retry_after(f"{left}{whole}.{fraction}{right}", received_at=RECEIVED_AT)
    up = whole + (1 if fraction.strip("0") else 0)
    assert result.form == "seconds"
    assert result.delay == float(min(up, 10**15))
    if up <= 10**6:
        assert result.eligible_at == RECEIVED_AT + timedelta(seconds=up)


@SETTINGS
@given(
    number=st.floats(allow_nan=True, allow_infinity=True).map(repr),
    sign=st.sampled_from(["-", "+"]),
)
def test_signs_exponents_and_other_number_forms_stay_invalid(number: str, sign: str) -> None:
    signed = number if number.startswith("-") else sign + number
    for value in (signed, number.replace(".", "e") + "1", number + "e5", number + ",1"):
        try:
            parse_retry_after(value, received_at=RECEIVED_AT)
        except InvalidRetryAfter:
            continue
        raise AssertionError(f"{value!r} was read")


@SETTINGS
@given(
    seconds=st.integers(min_value=0, max_value=10**12),
    received_at=st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    ),
)
def test_eligible_at_is_received_at_plus_delay(seconds: int, received_at: datetime) -> None:
    result = parse_retry_after(str(seconds), received_at=received_at)
    try:
        expected = received_at + timedelta(seconds=seconds)
    except OverflowError:
        assert result.eligible_at == FAR_FUTURE
        return
    assert result.eligible_at == expected
    assert result.eligible_at - received_at == timedelta(seconds=result.delay)


@SETTINGS
@given(
    retry_at=instants,
    server_now=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)).map(
        lambda t: t.replace(microsecond=0, tzinfo=UTC)
    ),
    skew=st.integers(min_value=-(10**7), max_value=10**7),
)
def test_a_date_is_measured_against_the_server_clock(
    retry_at: datetime, server_now: datetime, skew: int
) -> None:
    received_at = server_now + timedelta(seconds=skew)
    result = parse_retry_after(imf_fixdate(retry_at), received_at=received_at, date=imf_fixdate(server_now))
    assert result.clock_skew == float(skew)
    wait = max(timedelta(0), retry_at - server_now)
    assert result.delay == wait.total_seconds()
    try:
        expected = received_at + wait
    except OverflowError:
        expected = FAR_FUTURE
    assert result.eligible_at == expected


def reference_imf(text: str) -> datetime | None:
    """A plain, slow reading of the IMF-fixdate grammar, to check the fast path against."""
    m = re.fullmatch(
        r"([A-Za-z]{3}), ([0-9]{2}) ([A-Za-z]{3}) ([0-9]{4}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT", text
    )
    if m is None or m[1] not in SHORT_DAYS or m[3] not in MONTHS:
        return None
    second = min(int(m[7]), 59) if int(m[7]) <= 60 else 99
    try:
        moment = datetime(
            int(m[4]), MONTHS.index(m[3]) + 1, int(m[2]), int(m[5]), int(m[6]), second, tzinfo=UTC
        )
    except ValueError:
        return None
    return moment if SHORT_DAYS[moment.weekday()] == m[1] else None


two_digits = st.integers(min_value=0, max_value=99).map(lambda n: f"{n:02d}")
imf_like = st.builds(
    "{}, {} {} {} {}:{}:{} GMT".format,
    st.sampled_from([*SHORT_DAYS, "sun", "SUN", "Foo"]),
    st.one_of(two_digits, st.integers(min_value=1, max_value=31).map(lambda n: f"{n:02d}")),
    st.sampled_from([*MONTHS, "jan", "Mrz"]),
    st.integers(min_value=0, max_value=9999).map(lambda n: f"{n:04d}"),
    st.one_of(two_digits, st.integers(min_value=0, max_value=23).map(lambda n: f"{n:02d}")),
    st.one_of(two_digits, st.integers(min_value=0, max_value=59).map(lambda n: f"{n:02d}")),
    st.one_of(two_digits, st.integers(min_value=58, max_value=61).map(lambda n: f"{n:02d}")),
)


@SETTINGS
@given(text=imf_like)
def test_imf_fast_path_agrees_with_the_grammar(text: str) -> None:
    expected = reference_imf(text)
    try:
        got = parse_http_date(text)
    except InvalidRetryAfter:
        got = None
    assert got == expected
    # A second reading (now from the remembered day) gives the same answer.
    try:
        again = parse_http_date(text)
    except InvalidRetryAfter:
        again = None
    assert again == expected
