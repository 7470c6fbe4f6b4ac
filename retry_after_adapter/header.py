"""Retry-After and HTTP-date parsing (RFC 9110 section 10.2.3). Pure: no I/O, no clock.

``parse_retry_after`` takes exactly one field value and is strict: anything RFC 9110
does not allow raises :class:`~retry_after_adapter.errors.InvalidRetryAfter` (a
``ValueError``) with a short ``reason``; nothing else escapes for any input.

Reasons: ``type`` (not a str), ``too_long`` (over ``MAX_LENGTH`` characters before
trimming), ``empty``, ``control`` (a control character, or a tab inside the value),
``repeated`` (a comma list or repeated value), ``malformed``, ``zone`` (a date not in
GMT), ``out_of_range`` (no such date or time), ``weekday`` (day name does not match the
date), ``naive_received_at`` (``received_at`` without a UTC offset, or not a datetime),
``needs_reference`` (an RFC 850 date given to :func:`parse_http_date` without
``received_at``).

Decisions where RFC 9110 leaves room:

- delay-seconds is ASCII ``[0-9]+``, leading zeros allowed. Very large numbers are
  valid: ``delay`` is capped at 10**15 seconds and ``eligible_at`` at the largest
  representable UTC datetime.
- A plain non-negative decimal, ASCII ``[0-9]+ "." [0-9]+`` (``2.0``, as Shopify sends),
  is not delay-seconds but is read as the next whole second up: ``2.0`` is 2 s, ``2.1``
  is 3 s (waiting longer is allowed, shorter never). Every other number form stays
  invalid: a sign, an exponent, ``.5``, ``5.``, Unicode digits, a list.
- Day and month names are case-sensitive, as in the grammar.
- A day name that does not match the date's actual weekday is invalid (``weekday``).
- Second 60 (a leap second) is accepted and read as second 59.
- Years 1 to 9999 are representable; a date before now is simply in the past (delay 0).
- RFC 850 two-digit years: the year with those last two digits that is not more than
  50 years after ``received_at`` (compared to the second); a date more than 50 years
  ahead is read as the most recent past year with those digits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NoReturn

from .errors import InvalidRetryAfter

__all__ = [
    "MAX_LENGTH",
    "RetryAfter",
    "format_http_date",
    "parse_http_date",
    "parse_retry_after",
]

MAX_LENGTH = 128

#: Largest delay reported, in seconds (about 31.7 million years).
MAX_DELAY = 10**15
#: The largest count (``remaining``, a limit) taken from a quota header: more is read as
#: this (fewer allowed, never more), so no store ever meets a number it cannot hold.
MAX_COUNT = 2**31 - 1
#: The longest duration (seconds) taken from a quota header even when
#: ``max_retry_after`` is None (no bound): ten years, far inside what a datetime can add.
MAX_SECONDS = 10 * 365 * 86400.0

_UTC = timezone.utc
_FAR_FUTURE = datetime.max.replace(tzinfo=_UTC)
_ONE_SECOND = timedelta(seconds=1)
_MAX_DELAY_F = float(MAX_DELAY)
_new_object = object.__new__

# Delay-seconds values seen before, exactly as received (untrimmed), mapped to their
# (delay, timedelta) pair: a handful of distinct values (1, 30, 60, 120, ...) make up
# nearly all traffic, and validating the digits and building a timedelta cost more than
# the rest of the seconds path. Only valid values are stored; emptied when full.
_SECONDS: dict[str, tuple[float, timedelta | None]] = {}
_SECONDS_CACHED = 1024

_SHORT_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SHORT_DAY_NUMBER = {name: i for i, name in enumerate(_SHORT_DAYS)}
_LONG_DAY_NUMBER = {name: i for i, name in enumerate(_LONG_DAYS)}
_MONTH_NUMBER = {name: i for i, name in enumerate(_MONTHS, start=1)}

# The shape of an IMF-fixdate, the form nearly every server sends (re.ASCII makes \d
# exactly [0-9]). The fast path checks this shape, looks the "Sun, 06 Nov 1994" part up
# in _IMF_DAYS and lets datetime.fromisoformat check the time of day. Anything else,
# including a value the fast path turns down, goes through the full parser, which also
# names the reason.
_IMF_SHAPE = re.compile(r"\w\w\w, \d\d \w\w\w \d\d\d\d \d\d:\d\d:\d\d GMT", re.ASCII).fullmatch
# delay-seconds (ASCII digits, group 1, with an optional ASCII fraction, group 2, read as
# the next whole second up) or the IMF-fixdate shape, told apart in one match.
_COMMON = re.compile(
    r"([0-9]+)(?:\.([0-9]+))?|\w\w\w, \d\d \w\w\w \d\d\d\d \d\d:\d\d:\d\d GMT", re.ASCII
).fullmatch
_from_iso = datetime.fromisoformat
# "Sun, 06 Nov 1994" -> "1994-11-06T" for days already checked (names, day of month,
# weekday). Retry-After dates cluster around today, so this stays small; emptied when
# full, like _SECONDS.
_IMF_DAYS: dict[str, str] = {}
_IMF_DAYS_CACHED = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]").search
_LETTERS = re.compile(r"[A-Za-z]+").fullmatch
# The patterns are deliberately a little looser than the grammar (any run of letters
# or digits, an optional trailing zone) so that a near miss gets a precise reason; the
# exact widths, names and zone are checked in Python right after the match.
_IMF = re.compile(
    r"([A-Za-z]+), ([0-9]+) ([A-Za-z]+) ([0-9]+) ([0-9]+):([0-9]+):([0-9]+)(?: ([^ ]*))?"
).fullmatch
_RFC850 = re.compile(
    r"([A-Za-z]+), ([0-9]+)-([A-Za-z]+)-([0-9]+) ([0-9]+):([0-9]+):([0-9]+)(?: ([^ ]*))?"
).fullmatch
_ASCTIME = re.compile(
    r"([A-Za-z]+) ([A-Za-z]+) ( ?[0-9]+) ([0-9]+):([0-9]+):([0-9]+) ([0-9]+)(?: ([^ ]*))?"
).fullmatch


@dataclass(frozen=True)
class RetryAfter:
    """A parsed Retry-After value.

    - ``delay``: seconds to wait from the receipt of the response (float, >= 0).
    - ``eligible_at``: aware UTC time before which no retry may be sent.
    - ``form``: ``"seconds"`` or ``"date"``.
    - ``clock_skew``: seconds, local receipt time minus the server's ``Date`` header,
      or None when no valid Date was given.
    """

    delay: float
    eligible_at: datetime
    form: str
    clock_skew: float | None = None


def parse_retry_after(value: str, *, received_at: datetime, date: str | None = None) -> RetryAfter:
    """Parse one Retry-After field value received at ``received_at`` (aware).

    ``value`` is either delay-seconds (ASCII digits; a plain ASCII decimal such as
    ``2.0`` is read as the next whole second up) or an HTTP-date in any of the three
    RFC 9110 forms. ``date`` is the same response's ``Date`` header, if any: a valid one
    is the reference a Retry-After date is measured against (so local clock skew does
    not change the delay) and gives ``clock_skew``; an invalid or absent one is ignored
    (the date is then measured against ``received_at``). The result's ``delay`` is in
    seconds (never negative; a past date gives 0) and ``eligible_at`` is
    ``received_at`` (in UTC) plus ``delay``, capped at the largest representable time.

    Raises :class:`InvalidRetryAfter`, and nothing else, for a value that is not one
    valid field value, or for a ``received_at`` that is not an aware datetime.
    """
    if not isinstance(received_at, datetime):
        raise InvalidRetryAfter("naive_received_at", received_at)
    if received_at.tzinfo is not _UTC:
        received_at = _as_utc(received_at)
    if not isinstance(value, str):
        raise InvalidRetryAfter("type", value)
    if len(value) > MAX_LENGTH:
        raise InvalidRetryAfter("too_long", value)
    known = _SECONDS.get(value)
    if known is None:
        v = value.strip(" \t")
        m = _COMMON(v)
        if m is None:
            return _date_result(value, v, received_at, date, None)
        if m.lastindex is None:  # the IMF-fixdate alternative
            return _date_result(value, v, received_at, date, _imf_fast(v))
        known = _seconds(value, *m.group(1, 2))
    delay, step = known
    if step is None:
        eligible_at = _FAR_FUTURE
    else:
        try:
            eligible_at = received_at + step
        except OverflowError:
            eligible_at = _FAR_FUTURE
    result: RetryAfter = _new_object(RetryAfter)  # as in _result, inlined on the hottest path
    fields = result.__dict__
    fields["delay"] = delay
    fields["eligible_at"] = eligible_at
    fields["form"] = "seconds"
    fields["clock_skew"] = None if date is None else _clock_skew(date, received_at)
    return result


def _seconds(value: str, digits: str, fraction: str | None) -> tuple[float, timedelta | None]:
    """``(delay, step)`` of a delay-seconds ``value`` (its ``digits``, and a decimal's
    ``fraction``), remembered for the next answer that says the same; ``step`` None:
    more days than a timedelta holds."""
    seconds = int(digits)  # at most MAX_LENGTH digits, far below int()'s digit limit
    if fraction is not None and fraction.strip("0"):
        seconds += 1  # 2.1 s: the next whole second up, never shorter
    delay = float(seconds) if seconds <= MAX_DELAY else _MAX_DELAY_F
    known: tuple[float, timedelta | None]
    try:
        known = (delay, _ONE_SECOND * seconds)
    except OverflowError:
        known = (delay, None)
    if len(_SECONDS) >= _SECONDS_CACHED:
        _SECONDS.clear()
    _SECONDS[value] = known
    return known


def _imf_fast(v: str) -> datetime | None:
    """The instant of ``v``, which has the shape of an IMF-fixdate, or None when the
    full parser must decide (unknown names, no such day, wrong weekday, hour 24 and
    over, second 60)."""
    day = v[:16]
    iso_day = _IMF_DAYS.get(day)
    if iso_day is None:
        month = _MONTH_NUMBER.get(v[8:11])
        weekday = _SHORT_DAY_NUMBER.get(v[:3])
        if month is None or weekday is None:
            return None
        iso_day = f"{v[12:16]}-{month:02d}-{v[5:7]}T"
        try:
            if _from_iso(iso_day + "00:00:00").weekday() != weekday:
                return None
        except ValueError:
            return None
        if len(_IMF_DAYS) >= _IMF_DAYS_CACHED:
            _IMF_DAYS.clear()
        _IMF_DAYS[day] = iso_day
    if v[17:19] >= "24":
        return None
    try:
        # "YYYY-MM-DDTHH:MM:SS+00:00" is read the same by fromisoformat on every Python
        # this package supports; minute or second over 59 raises.
        return _from_iso(f"{iso_day}{v[17:25]}+00:00")
    except ValueError:
        return None


def _date_result(
    raw: str, v: str, received_at: datetime, date: str | None, retry_date: datetime | None
) -> RetryAfter:
    """The result for an HTTP-date Retry-After ``v`` (trimmed ``raw``); ``retry_date`` is
    its instant when the fast path already read it."""
    if retry_date is None:
        retry_date = _parse_date_value(raw, v, received_at)
    server_date = None if date is None else _optional_date(date, received_at)
    if server_date is None:
        if retry_date <= received_at:
            return _result(0.0, received_at, "date", None)
        result: RetryAfter = _new_object(RetryAfter)  # as in _result, inlined: the common case
        fields = result.__dict__
        fields["delay"] = (retry_date - received_at).total_seconds()
        fields["eligible_at"] = retry_date
        fields["form"] = "date"
        fields["clock_skew"] = None
        return result
    skew = (received_at - server_date).total_seconds()
    if retry_date <= server_date:
        return _result(0.0, received_at, "date", skew)
    wait = retry_date - server_date
    try:
        eligible_at = received_at + wait
    except OverflowError:
        eligible_at = _FAR_FUTURE
    return _result(wait.total_seconds(), eligible_at, "date", skew)


def _result(delay: float, eligible_at: datetime, form: str, clock_skew: float | None) -> RetryAfter:
    """Build a :class:`RetryAfter` without the frozen dataclass's ``__init__``.

    Equal in every way to ``RetryAfter(delay, eligible_at, form, clock_skew)`` (same
    class, fields, equality and hash); it only skips the four guarded attribute writes,
    which dominate the cost of parsing a delay-seconds value.
    """
    result: RetryAfter = _new_object(RetryAfter)
    fields = result.__dict__
    fields["delay"] = delay
    fields["eligible_at"] = eligible_at
    fields["form"] = form
    fields["clock_skew"] = clock_skew
    return result


def parse_http_date(text: str, *, received_at: datetime | None = None) -> datetime:
    """Parse an HTTP-date (IMF-fixdate, RFC 850 or asctime) into an aware UTC datetime.

    The same strict rules as for a Retry-After date apply (length, control characters,
    GMT only, case-sensitive names, matching weekday; surrounding spaces and tabs are
    trimmed). ``received_at`` (aware) is the reference for an RFC 850 two-digit year;
    without it that form raises ``InvalidRetryAfter("needs_reference")``.
    Raises :class:`InvalidRetryAfter` and nothing else.
    """
    reference: datetime | None = None
    if received_at is not None:
        if not isinstance(received_at, datetime):
            raise InvalidRetryAfter("naive_received_at", received_at)
        reference = _as_utc(received_at)
    if not isinstance(text, str):
        raise InvalidRetryAfter("type", text)
    if len(text) > MAX_LENGTH:
        raise InvalidRetryAfter("too_long", text)
    return _parse_date_value(text, text.strip(" \t"), reference)


def format_http_date(dt: datetime) -> str:
    """Format an aware datetime as an IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``).

    The time is converted to UTC and fractions of a second are dropped.
    Raises :class:`InvalidRetryAfter` (``naive_received_at``) for a naive datetime.
    """
    if not isinstance(dt, datetime):
        raise InvalidRetryAfter("naive_received_at", dt)
    u = _as_utc(dt)
    return (
        f"{_SHORT_DAYS[u.weekday()]}, {u.day:02d} {_MONTHS[u.month - 1]} {u.year:04d} "
        f"{u.hour:02d}:{u.minute:02d}:{u.second:02d} GMT"
    )


def _as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; InvalidRetryAfter when it is naive or cannot be converted."""
    try:
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidRetryAfter("naive_received_at")
        return moment.astimezone(_UTC)
    except (OverflowError, ValueError, TypeError) as exc:
        if isinstance(exc, InvalidRetryAfter):
            raise
        raise InvalidRetryAfter("out_of_range", moment) from None


def _optional_date(text: str, reference: datetime) -> datetime | None:
    """A response's Date header as UTC, or None when it is not a valid HTTP-date."""
    if not isinstance(text, str) or len(text) > MAX_LENGTH:
        return None
    try:
        return _parse_date_value(text, text.strip(" \t"), reference)
    except InvalidRetryAfter:
        return None


def _clock_skew(date: str, received_at: datetime) -> float | None:
    """Seconds, ``received_at`` minus a valid Date header; None when Date is invalid."""
    server_date = _optional_date(date, received_at)
    return None if server_date is None else (received_at - server_date).total_seconds()


def _parse_date_value(raw: str, v: str, reference: datetime | None) -> datetime:
    """Classify and parse a trimmed value ``v`` (``raw`` is kept for the error message).

    The length has already been checked. Returns an aware UTC datetime.
    """
    if _IMF_SHAPE(v) is not None:
        moment = _imf_fast(v)
        if moment is not None:
            return moment
    if not v:
        raise InvalidRetryAfter("empty", raw)
    if _CONTROL(v) is not None:
        raise InvalidRetryAfter("control", raw)
    commas = v.count(",")
    if commas == 0:
        return _parse_asctime(raw, v)
    # Exactly one comma, right after a day name, is part of the IMF-fixdate and RFC 850
    # forms; any other comma makes a list (or a repeated field joined by the recipient).
    if commas > 1 or _LETTERS(v[: v.index(",")].rstrip(" \t")) is None:
        raise InvalidRetryAfter("repeated", raw)
    m = _IMF(v)
    if m is not None:
        return _parse_imf(raw, m)
    return _parse_rfc850(raw, v, reference)


def _parse_asctime(raw: str, v: str) -> datetime:
    """An asctime date (``Sun Nov  6 08:49:37 1994``), which has no zone and no comma."""
    m = _ASCTIME(v)
    if m is None:
        raise InvalidRetryAfter("malformed", raw)
    wkday, mon, day, hh, mm, ss, year, zone = m.groups()
    if len(day) != 2 or len(year) != 4:
        _bad_width(year, 4, raw)
    if zone is not None:
        raise InvalidRetryAfter("zone", raw)
    return _build(raw, _SHORT_DAY_NUMBER, wkday, day, mon, int(year), hh, mm, ss)


def _parse_imf(raw: str, m: re.Match[str]) -> datetime:
    """A date of the IMF-fixdate form, matched loosely as ``m`` so that a near miss gets
    a precise reason (the fast path already took the well-formed ones it could)."""
    wkday, day, mon, year, hh, mm, ss, zone = m.groups()
    if len(year) != 4:
        _bad_width(year, 4, raw)
    if zone != "GMT":
        raise InvalidRetryAfter("zone", raw)
    return _build(raw, _SHORT_DAY_NUMBER, wkday, day, mon, int(year), hh, mm, ss)


def _parse_rfc850(raw: str, v: str, reference: datetime | None) -> datetime:
    """An RFC 850 date (``Sunday, 06-Nov-94 08:49:37 GMT``): its two-digit year is read
    against ``reference``, without which it cannot be read (``needs_reference``)."""
    m = _RFC850(v)
    if m is None:
        raise InvalidRetryAfter("malformed", raw)
    wkday, day, mon, yy, hh, mm, ss, zone = m.groups()
    if len(yy) != 2:
        raise InvalidRetryAfter("malformed", raw)
    if zone != "GMT":
        raise InvalidRetryAfter("zone", raw)
    if reference is None:
        raise InvalidRetryAfter("needs_reference", raw)
    month = _MONTH_NUMBER.get(mon)
    if month is None or len(day) != 2 or len(hh) != 2 or len(mm) != 2 or len(ss) != 2:
        raise InvalidRetryAfter("malformed", raw)
    year = _rfc850_year(int(yy), (month, int(day), int(hh), int(mm), min(int(ss), 59)), reference)
    return _build(raw, _LONG_DAY_NUMBER, wkday, day, mon, year, hh, mm, ss)


def _bad_width(year: str, width: int, raw: str) -> NoReturn:
    """Raise for a year of the wrong width: ``out_of_range`` past 9999, else ``malformed``."""
    if len(year) > width and int(year) > 9999:
        raise InvalidRetryAfter("out_of_range", raw)
    raise InvalidRetryAfter("malformed", raw)


def _build(
    raw: str,
    day_numbers: dict[str, int],
    wkday: str,
    day: str,
    mon: str,
    year: int,
    hh: str,
    mm: str,
    ss: str,
) -> datetime:
    """Check names, widths and ranges, then build the aware UTC datetime."""
    expected_weekday = day_numbers.get(wkday)
    month = _MONTH_NUMBER.get(mon)
    if (
        expected_weekday is None
        or month is None
        or len(day) != 2
        or len(hh) != 2
        or len(mm) != 2
        or len(ss) != 2
    ):
        raise InvalidRetryAfter("malformed", raw)
    second = int(ss)
    if second == 60:
        second = 59  # a leap second: the instant just before the next minute
    try:
        # datetime rejects hour > 23, minute or second > 59, day 0, a day the month
        # does not have (29 Feb outside leap years) and year 0.
        moment = datetime(year, month, int(day), int(hh), int(mm), second, 0, _UTC)
    except ValueError:
        raise InvalidRetryAfter("out_of_range", raw) from None
    if moment.weekday() != expected_weekday:
        raise InvalidRetryAfter("weekday", raw)
    return moment


def _rfc850_year(yy: int, rest: tuple[int, int, int, int, int], reference: datetime) -> int:
    """The full year of an RFC 850 date with two-digit year ``yy`` (RFC 9110 5.6.7).

    The latest year ending in ``yy`` that is not more than 50 years after ``reference``:
    ``rest`` is (month, day, hour, minute, second) of the date, compared to the second
    with ``reference`` moved 50 years ahead. The result is kept within 1..9999 where
    possible (a year that would pass 9999 is read a century earlier).
    """
    horizon = reference.year + 50
    year = horizon - (horizon - yy) % 100
    if year == horizon and rest > (
        reference.month,
        reference.day,
        reference.hour,
        reference.minute,
        reference.second,
    ):
        year -= 100
    while year > 9999:
        year -= 100
    return year
