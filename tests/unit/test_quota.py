"""The quota-header parser against the shared corpus (pure: no clock, no I/O)."""

from __future__ import annotations

import pytest

from retry_after_adapter.quota import QuotaHint, read_quota

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
