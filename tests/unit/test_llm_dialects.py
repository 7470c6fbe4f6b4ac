"""The LLM providers' dialects, read by the pure core: Go durations (OpenAI's resets),
RFC 3339 times (Anthropic's), millisecond waits, ``x-should-retry``, and the quota hint
their per-kind allowances make."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from retry_after_adapter.dialects import (
    MAX_GO_DURATION,
    RESET_MARGIN,
    Allowance,
    go_duration,
    go_duration_latest,
    milliseconds,
    precise_wait,
    rfc3339_epoch,
    rfc3339_latest,
    should_retry,
)
from retry_after_adapter.header import MAX_COUNT, MAX_SECONDS
from retry_after_adapter.quota import QuotaHint, bound_hint, read_quota

from .quota_corpus import DATE, EPOCH, RECEIVED_AT

UTC = timezone.utc


def getter(headers: dict[str, str]):
    lowered = {k.lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())


def iso(seconds: float) -> str:
    """EPOCH + ``seconds`` as RFC 3339 in UTC."""
    return (datetime.fromtimestamp(EPOCH, UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- Go durations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("0", 0.0),  # Go's lone zero
        ("20ms", 0.02),
        ("1.2s", 1.2),
        ("1m30.5s", 90.5),
        ("2h", 7200.0),
        ("1us", 1e-6),
        ("1\u00b5s", 1e-6),  # MICRO SIGN
        ("1\u03bcs", 1e-6),  # GREEK SMALL LETTER MU
        ("1ns", 1e-9),
        ("0.5ns", 1e-9),  # a fraction of a nanosecond counts as one: never shorter
        ("5.s", 5.0),  # Go's own forms
        (".5s", 0.5),
        ("1s1s", 2.0),  # Go adds repeated units
        (" 6m0s\t", 360.0),  # optional whitespace around a field value
        ("2562047h47m16.854775807s", MAX_GO_DURATION),  # Go's largest
    ],
)
def test_go_duration_accepts(raw: str, seconds: float) -> None:
    assert go_duration(raw) == pytest.approx(seconds, rel=1e-12, abs=0)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "1",  # a bare number other than 0
        "00",
        "-1s",  # a reset is never negative
        "+1s",
        "1S",  # units are case-sensitive
        "1sec",
        "1d",
        "1 s",
        "1s 2m",
        "1.s2",
        ".s",
        "s",
        "1e3s",
        "0x10s",
        "\u0661s",  # ARABIC-INDIC DIGIT ONE
        "1s,1s",
        "2562047h47m16.854775808s",  # past Go's range
        "9999999999999999h",
        "1" * 63 + "s",  # 64 characters, past Go's range
        "1" * 70 + "s",  # past MAX_VALUE
        "inf",
        "NaNs",
    ],
)
def test_go_duration_rejects(raw: str | None) -> None:
    assert go_duration(raw) is None


# -- RFC 3339 ---------------------------------------------------------------------------------
T = datetime(2026, 12, 3, 20, 15, 30, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("raw", "epoch"),
    [
        ("2026-12-03T20:15:30Z", T),
        ("2026-12-03t20:15:30z", T),
        ("2026-12-03T21:15:30+01:00", T),
        ("2026-12-03T15:15:30-05:00", T),
        ("2026-12-03T20:15:30+00:00", T),
        ("2026-12-03T20:15:30-00:00", T),  # "offset unknown": the time is UTC
        ("2026-12-03T20:15:30.25Z", T + 0.25),
        ("2026-12-03T20:15:30.0000001Z", T + 1e-6),  # rounded up to the microsecond
        ("2026-12-03T20:15:29.999999999Z", T),
        ("2026-12-31T23:59:60Z", datetime(2027, 1, 1, tzinfo=UTC).timestamp()),  # leap second: the next
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC).timestamp()),
    ],
)
def test_rfc3339_accepts(raw: str, epoch: float) -> None:
    assert rfc3339_epoch(raw) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "2026-12-03T20:15:30",  # no offset: a local time says nothing of when
        "2026-12-03 20:15:30Z",
        "2026-12-03",
        "20:15:30Z",
        "2026-02-30T00:00:00Z",
        "2026-12-03T24:00:00Z",
        "2026-12-03T20:60:00Z",
        "2026-12-03T20:15:61Z",
        "2026-12-03T20:15:30+24:00",
        "2026-12-03T20:15:30+01:60",
        "2026-12-03T20:15:30+0100",
        "2026-12-03T20:15:30.Z",
        "2026-12-03T20:15:30,5Z",
        "2026-12-03T20:15:30UTC",
        "+2026-12-03T20:15:30Z",
        "26-12-03T20:15:30Z",
        "2026-12-03T20:15:30Z, 2026-12-03T20:15:31Z",
        "\u0662026-12-03T20:15:30Z",
        "1796328930",  # epoch seconds are not this dialect
        "2026-12-03T20:15:30." + "1" * 50 + "Z",  # past MAX_VALUE
    ],
)
def test_rfc3339_rejects(raw: str | None) -> None:
    assert rfc3339_epoch(raw) is None


# -- each reset at the latest time its text can mean ----------------------------------------------
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("5s", 6.0),  # 5 s printed: anything up to just under 6 s, rounded or truncated
        ("12ms", 0.013),
        ("1.5s", 1.6),
        ("1.50s", 1.51),
        ("6m0s", 361.0),
        ("1h2m3.5s", 3723.6),
        ("0s", 1.0),
        ("20.625s", 20.626),
        ("500us", 0.000501),
        ("7ns", 8e-9),
        ("2h", 7200.0 + 3600.0),
        ("0", 0.0),  # no digit of a unit: exactly nothing
    ],
)
def test_go_duration_latest_adds_one_unit_of_the_last_digit(raw: str, seconds: float) -> None:
    assert go_duration_latest(raw) == pytest.approx(seconds, rel=1e-12, abs=1e-15)
    assert go_duration_latest(raw) >= go_duration(raw)  # type: ignore[operator]


@pytest.mark.parametrize("raw", [None, "", "5", "-5s", "5 s", "soon"])
def test_go_duration_latest_rejects_what_go_duration_rejects(raw: str | None) -> None:
    assert go_duration_latest(raw) is None


@pytest.mark.parametrize(
    ("raw", "later"),
    [
        ("2026-12-03T20:15:30Z", 1.0),  # whole seconds, as Anthropic sends: one more
        ("2026-12-03T20:15:30.2Z", 0.1),
        ("2026-12-03T20:15:30.25Z", 0.01),
        ("2026-12-03T21:15:30.250+01:00", 0.001),
    ],
)
def test_rfc3339_latest_adds_one_unit_of_the_last_digit(raw: str, later: float) -> None:
    assert rfc3339_latest(raw) == pytest.approx(rfc3339_epoch(raw) + later, abs=1e-6)  # type: ignore[operator]
    assert rfc3339_latest("2026-12-03T20:15:30") is None


# -- milliseconds and how they meet Retry-After -----------------------------------------------
@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("1200", 1.2), ("0", 0.0), (" 250 ", 0.25), ("1500.5", 1.5005), ("9" * 18, 1e15 - 0.001)],
)
def test_milliseconds_accepts(raw: str, seconds: float) -> None:
    assert milliseconds(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", [None, "", "-1", "+5", "1e3", "1,2", "abc", "9" * 19, "1.", ".5", "\u0661"])
def test_milliseconds_rejects(raw: str | None) -> None:
    assert milliseconds(raw) is None


@pytest.mark.parametrize(
    ("retry_after", "whole", "waits", "expected"),
    [
        (2.0, True, (1.2,), 1.2),  # agrees with the whole seconds: read for precision
        (2.0, True, (2.0,), 2.0),
        (2.0, True, (1.0,), 2.0),  # disagrees (rounds up to 1): the longest
        (2.0, True, (3.5,), 3.5),  # disagrees: the longest
        (2.0, False, (1.2,), 2.0),  # a date is not whole seconds: the longest
        (None, True, (1.2,), 1.2),  # alone: the wait
        (None, True, (1.2, 1.7), 1.7),  # two millisecond fields: the longest
        (2.0, True, (1.2, 5.0), 5.0),
        (2.0, True, (), 2.0),
        (None, True, (), None),
    ],
)
def test_precise_wait(retry_after: float | None, whole: bool, waits: tuple[float, ...], expected: float | None) -> None:
    assert precise_wait(retry_after, whole, waits) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("false", False), (" FALSE ", False), ("True", True), ("0", None), ("no", None), (None, None)],
)
def test_should_retry(raw: str | None, expected: bool | None) -> None:
    assert should_retry(getter({} if raw is None else {"x-should-retry": raw})) is expected


# -- the hint the allowances make --------------------------------------------------------------
def openai(**kinds: tuple[str, str, str]) -> dict[str, str]:
    headers = {}
    for kind, (limit, remaining, reset) in kinds.items():
        headers |= {
            f"x-ratelimit-limit-{kind}": limit,
            f"x-ratelimit-remaining-{kind}": remaining,
            f"x-ratelimit-reset-{kind}": reset,
        }
    return headers


def anthropic(**kinds: tuple[str, str, str]) -> dict[str, str]:
    headers = {"Date": DATE}
    for kind, (limit, remaining, reset) in kinds.items():
        field = "anthropic-ratelimit-" + kind.replace("_", "-")
        headers |= {f"{field}-limit": limit, f"{field}-remaining": remaining, f"{field}-reset": reset}
    return headers


def read(headers: dict[str, str]) -> QuotaHint | None:
    return read_quota(getter(headers), received_at=RECEIVED_AT, date=headers.get("Date"))


def test_openai_requests_fill_the_hint_and_tokens_are_kept() -> None:
    """Each reset at its latest meaning (``1s``: up to 2 s; ``6ms``: 7 ms); the requests
    are a bucket: 59 left until the one missing comes back (2 s, and the margin)."""
    hint = read(openai(requests=("60", "59", "1s"), tokens=("150000", "149984", "6ms")))
    assert hint is not None and hint.source == "openai"
    assert (hint.remaining, hint.reset, hint.limit, hint.window) == (59, 2.0 + RESET_MARGIN, 60, None)
    assert hint.refill == 2.0
    assert hint.allowances == (
        Allowance("requests", 60, 59, 2.0),
        Allowance("tokens", 150000, 149984, pytest.approx(0.007)),  # type: ignore[arg-type]
    )


def test_openai_requests_spent_wait_for_their_next_unit_not_the_full_refill() -> None:
    """Nothing left of 60 and ``6m0s`` to the full refill (up to 361 s): the next request
    after 361 / 60 s (whole milliseconds, rounded up), not after six minutes."""
    hint = read(openai(requests=("60", "0", "6m0s"), tokens=("150000", "149984", "6ms")))
    assert hint is not None and hint.exhausted and (hint.remaining, hint.limit) == (0, 60)
    assert hint.refill == 6.017 and hint.reset == pytest.approx(6.017 + RESET_MARGIN)


def test_a_spent_token_kind_holds_everything_until_a_requests_share_refills() -> None:
    """No token left, 91 s to the full refill (``1m30s`` at its latest), 60 requests a
    minute: a request's share of the tokens is back in 91 / 60 s."""
    hint = read(openai(requests=("60", "59", "1s"), tokens=("150000", "0", "1m30s")))
    assert hint is not None and hint.exhausted
    assert (hint.remaining, hint.limit, hint.refill) == (0, None, None)  # a token window is not a requests one
    assert hint.reset == pytest.approx(91 / 60 + RESET_MARGIN)


def test_the_latest_spent_kind_wins() -> None:
    hint = read(openai(requests=("60", "0", "20s"), tokens=("150000", "0", "5s")))
    assert hint is not None and (hint.remaining, hint.limit, hint.refill) == (0, 60, 0.35)  # 21 s / 60
    assert hint.reset == pytest.approx(0.35 + RESET_MARGIN)  # the tokens' share: 6 s / 60


def test_without_a_limit_a_spent_kind_holds_until_its_reset() -> None:
    """No limit to tell the pace by: the reset (at its latest) is all there is."""
    hint = read({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"})
    assert hint is not None and (hint.remaining, hint.reset, hint.refill) == (0, 21.0, None)


def test_azure_sends_the_remaining_fields_alone() -> None:
    hint = read({"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "1000"})
    assert hint is not None and (hint.remaining, hint.reset, hint.exhausted) == (0, None, False)


def test_tokens_alone_positive_say_nothing_of_requests() -> None:
    hint = read(openai(tokens=("150000", "149984", "6ms")))
    assert hint is not None and (hint.remaining, hint.reset) == (None, None)
    assert hint.allowances[0].remaining == 149984


def test_an_unreadable_openai_field_says_nothing() -> None:
    hint = read(openai(requests=("60", "59", "soon"), tokens=("150000", "-1", "6ms")))
    assert hint is not None and (hint.remaining, hint.reset, hint.limit) == (59, None, 60)
    assert [a.kind for a in hint.allowances] == ["requests"]
    assert read({"x-ratelimit-remaining-requests": "0.5"}) is None


def test_x_ratelimit_remaining_wins_over_the_provider_fields() -> None:
    hint = read({"X-RateLimit-Remaining": "3", **openai(requests=("60", "0", "1s"))})
    assert hint is not None and hint.source == "x-ratelimit" and hint.remaining == 3


def test_anthropic_requests_spent_measured_against_the_date() -> None:
    """A reset in whole seconds, 30 s after the ``Date``: up to 31 s to the full refill
    of 50, so the next request after 31 / 50 s."""
    hint = read(anthropic(requests=("50", "0", iso(30)), tokens=("80000", "79000", iso(5))))
    assert hint is not None and hint.source == "anthropic"
    assert (hint.remaining, hint.limit, hint.refill) == (0, 50, 0.62)
    assert hint.reset == pytest.approx(0.62 + RESET_MARGIN)
    assert hint.allowances[0].reset_at == float(EPOCH + 31)


def test_anthropic_against_the_receipt_without_a_date() -> None:
    headers = anthropic(requests=("50", "0", iso(30)))
    del headers["Date"]
    hint = read_quota(getter(headers), received_at=RECEIVED_AT + timedelta(seconds=10))
    assert hint is not None and (hint.refill, hint.date) == (0.42, None)  # 21 s / 50


@pytest.mark.parametrize("kind", ["tokens", "input_tokens", "output_tokens"])
def test_anthropic_any_token_kind_spent_holds_everything(kind: str) -> None:
    """No token of a kind left, 46 s to its full refill, 50 requests: a request's share
    of it is back in 46 / 50 s."""
    hint = read(anthropic(requests=("50", "49", iso(1)), **{kind: ("80000", "0", iso(45))}))
    assert hint is not None and (hint.remaining, hint.limit) == (0, None)
    assert hint.reset == pytest.approx(46 / 50 + RESET_MARGIN)
    assert len(hint.allowances) == 2


def test_anthropic_a_past_reset_is_zero_and_not_a_cooldown() -> None:
    hint = read(anthropic(requests=("50", "0", iso(-30))))
    assert hint is not None and hint.reset == 0.0 and not hint.exhausted


def test_anthropic_a_local_time_is_no_reset() -> None:
    hint = read(anthropic(requests=("50", "0", "2026-03-01T12:00:30")))
    assert hint is not None and (hint.remaining, hint.reset, hint.exhausted) == (0, None, False)


# -- the bound every quota header passes ---------------------------------------------------------
def test_a_hostile_token_reset_is_dropped_and_the_other_kinds_still_count() -> None:
    hint = read(anthropic(requests=("50", "0", iso(30)), tokens=("1", "0", "9999-12-31T23:59:59Z")))
    assert hint is not None and hint.reset is not None and hint.reset > 86400  # as read
    bounded = bound_hint(hint, 86400.0)
    assert bounded is not None and (bounded.remaining, bounded.refill, bounded.limit) == (0, 0.62, 50)
    assert bounded.allowances[1].reset is None and bounded.allowances[1].reset_at is None


def test_a_reset_past_the_bound_is_unknown() -> None:
    hint = bound_hint(read(openai(requests=("60", "0", "25h"))), 86400.0)
    assert hint is not None and (hint.remaining, hint.reset, hint.exhausted) == (0, None, False)
    unbounded = bound_hint(read(openai(requests=("60", "0", "2562047h"))), None)
    assert unbounded is not None and unbounded.reset is None  # past MAX_SECONDS
    # 87599 h at its latest is MAX_SECONDS to the full refill: within the bound.
    kept = bound_hint(read(openai(requests=("60", "0", "87599h"))), None)
    assert kept is not None and kept.allowances[0].reset == MAX_SECONDS
    assert kept.refill == MAX_SECONDS / 60


def test_huge_counts_are_capped() -> None:
    hint = bound_hint(read(openai(requests=("9" * 18, "9" * 18, "1s"), tokens=("9" * 18, "5", "1s"))), 86400.0)
    assert hint is not None and (hint.remaining, hint.limit) == (MAX_COUNT, MAX_COUNT)
    assert hint.allowances[1].limit == MAX_COUNT
