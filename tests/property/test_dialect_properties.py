"""Properties of the LLM dialects' parsers over generated values (bounded, fast): Go
durations and RFC 3339 times are read exactly, anything else is None (never 0, never an
exception), and nothing read is negative or past its bound."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retry_after_adapter.dialects import (
    MAX_GO_DURATION,
    MAX_VALUE,
    go_duration,
    go_duration_latest,
    milliseconds,
    rfc3339_epoch,
)

UTC = timezone.utc
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NANOSECONDS = {"h": 3600 * 10**9, "m": 60 * 10**9, "s": 10**9, "ms": 10**6, "us": 10**3, "µs": 10**3, "ns": 1}
PART = st.tuples(
    st.integers(0, 10_000),
    st.one_of(st.none(), st.text("0123456789", min_size=1, max_size=4)),
    st.sampled_from(sorted(NANOSECONDS)),
)


def exact_seconds(parts: list[tuple[int, str | None, str]]) -> Fraction:
    """The duration of ``parts`` in seconds, fractions of a nanosecond rounded up."""
    total = 0
    for whole, fraction, unit in parts:
        scale = NANOSECONDS[unit]
        total += whole * scale
        if fraction:
            total += -(-int(fraction) * scale // 10 ** len(fraction))
    return Fraction(total, 10**9)


@SETTINGS
@given(st.lists(PART, min_size=1, max_size=4))
def test_every_go_duration_is_read_exactly(parts: list[tuple[int, str | None, str]]) -> None:
    text = "".join(f"{w}{'' if f is None else '.' + f}{u}" for w, f, u in parts)
    got = go_duration(text)
    if len(text) > MAX_VALUE:
        assert got is None
        return
    assert got is not None
    assert abs(Fraction(got) - exact_seconds(parts)) <= Fraction(1, 10**12) * max(1, exact_seconds(parts))


@SETTINGS
@given(st.lists(PART, min_size=1, max_size=4))
def test_a_go_duration_at_its_latest_is_one_unit_of_its_last_digit_later(
    parts: list[tuple[int, str | None, str]],
) -> None:
    """Never earlier than the text says, and later by exactly one unit of the last digit
    printed (the text may be rounded or truncated)."""
    text = "".join(f"{w}{'' if f is None else '.' + f}{u}" for w, f, u in parts)
    exact, latest = go_duration(text), go_duration_latest(text)
    if exact is None:
        assert latest is None
        return
    _, fraction, unit = parts[-1]
    unit_seconds = Fraction(NANOSECONDS[unit], 10**9) / 10 ** len(fraction or "")
    assert latest is not None and latest >= exact  # equal only where a float cannot tell
    assert abs(Fraction(latest) - Fraction(exact) - unit_seconds) <= Fraction(1, 10**12) * max(1, Fraction(exact))


@SETTINGS
@given(st.text(max_size=80))
def test_any_text_is_a_duration_or_none(text: str) -> None:
    got = go_duration(text)
    assert got is None or 0.0 <= got <= MAX_GO_DURATION
    if got == 0.0:
        assert not any(digit in text for digit in "123456789")  # only zeros make zero


@SETTINGS
@given(st.text(alphabet="0123456789.hmsun-+ eE", max_size=20))
def test_near_misses_never_raise_and_signs_never_pass(text: str) -> None:
    got = go_duration(text)
    if any(c in text for c in "-+eE") or " " in text.strip(" "):
        assert got is None


@SETTINGS
@given(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31)),
    st.integers(-23 * 60 - 59, 23 * 60 + 59),
    st.sampled_from(["T", "t"]),
)
def test_every_rfc3339_time_is_read_exactly(moment: datetime, offset: int, separator: str) -> None:
    aware = moment.replace(tzinfo=timezone(timedelta(minutes=offset)))
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset), 60)
    zone = "Z" if offset == 0 else f"{sign}{hours:02d}:{minutes:02d}"
    text = aware.strftime(f"%Y-%m-%d{separator}%H:%M:%S")
    if aware.microsecond:
        text += f".{aware.microsecond:06d}"
    got = rfc3339_epoch(text + zone)
    assert got is not None and abs(got - aware.timestamp()) < 1e-5
    assert rfc3339_epoch(text) is None  # no offset: no time


@SETTINGS
@given(st.text(max_size=80))
def test_any_text_is_a_time_or_none(text: str) -> None:
    got = rfc3339_epoch(text)
    assert got is None or isinstance(got, float)


@SETTINGS
@given(st.text(max_size=30))
def test_milliseconds_are_never_negative(text: str) -> None:
    got = milliseconds(text)
    assert got is None or 0.0 <= got <= 1e15
