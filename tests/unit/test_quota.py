"""The quota-header parser against the shared corpus (pure: no clock, no I/O)."""

from __future__ import annotations

import pytest

from retry_after_adapter.quota import MAX_COUNT, MAX_SECONDS, QuotaHint, bound_hint, read_quota

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
