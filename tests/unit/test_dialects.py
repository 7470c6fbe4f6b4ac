"""Providers' dialects, read by the pure core (no clock, no I/O): the recorded
exchanges and the edges of each dialect."""

from __future__ import annotations

from datetime import timedelta

import pytest

from retry_after_adapter.dialects import (
    EPOCH_MS_THRESHOLD,
    EPOCH_THRESHOLD,
    SECONDARY_MAX,
    SECONDARY_MIN,
    bucket_key,
    bucket_of,
    github_secondary,
    ietf_item,
    is_global,
    limit_field,
    major_parameter,
    reset_seconds,
    secondary_wait,
    wants_body,
)
from retry_after_adapter.header import parse_retry_after
from retry_after_adapter.quota import read_quota

from .dialect_corpus import DATE, EDGES, EPOCH, EXCHANGES, RECEIVED_AT, Exchange, exchange


def getter(headers: dict[str, str]):
    lowered = {k.lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())


def test_the_exchanges_are_named_uniquely_and_cover_every_provider() -> None:
    names = [e.name for e in EXCHANGES]
    assert len(set(names)) == len(names)
    for provider in ("github", "discord", "cloudflare", "shopify", "envoy", "ietf", "x-reset"):
        assert any(name.startswith(provider) for name in names), provider
    assert len({name for name, _, _ in EDGES}) == len(EDGES)


@pytest.mark.parametrize("case", EXCHANGES, ids=[e.name for e in EXCHANGES])
def test_recorded_exchange_quota(case: Exchange) -> None:
    hint = read_quota(getter(case.headers), received_at=RECEIVED_AT, date=DATE)
    if case.expected is None:
        assert hint is None
        return
    assert hint is not None
    assert (hint.remaining, hint.reset, hint.limit, hint.window) == case.expected


@pytest.mark.parametrize(("name", "headers", "expected"), EDGES, ids=[c[0] for c in EDGES])
def test_dialect_edges(name: str, headers: dict[str, str], expected) -> None:
    hint = read_quota(getter(headers), received_at=RECEIVED_AT, date=headers.get("Date"))
    if expected is None:
        assert hint is None
        return
    assert hint is not None
    assert (hint.remaining, hint.reset, hint.limit, hint.window) == expected


# -- X-RateLimit-Reset: told apart by magnitude, measured against the Date ------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, 0.0),
        (30.0, 30.0),  # seconds from now
        (EPOCH_THRESHOLD - 1.0, EPOCH_THRESHOLD - 1.0),  # still seconds from now (31 years)
        (float(EPOCH + 30), 30.0),  # epoch seconds
        (float(EPOCH - 30), 0.0),  # a past epoch: 0
        (EPOCH_MS_THRESHOLD - 1.0, EPOCH_MS_THRESHOLD - 1.0 - EPOCH),  # epoch seconds, year 5138
        (float((EPOCH + 30) * 1000), 30.0),  # epoch milliseconds
        (float((EPOCH + 30) * 1000 + 250), 30.25),
    ],
)
def test_reset_seconds(value: float, expected: float) -> None:
    # An absurd one (year 5138) is still read, and dropped later by bound_hint.
    assert reset_seconds(value, float(EPOCH)) == pytest.approx(expected)


# -- Envoy ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('10, 10;w=1;name="per-ip"', (10, 1.0)),
        ("10", (10, None)),
        ("10, 100;w=60", (10, 60.0)),
        ("10, 100;w=60, 10;w=1", (10, 1.0)),
        ("10;w=1", (10, 1.0)),
        ("-10, 10;w=1", (None, None)),
        ("?1, 1;w=1", (None, None)),
        ("10, 10;w=0", (10, None)),
        ("10, 10;w=1.5", (10, None)),
        ("", (None, None)),
        (None, (None, None)),
        ("10, " + ", ".join("10;w=1" for _ in range(60)), (None, None)),  # over 256 characters
        ("10,\u0661", (None, None)),
    ],
)
def test_envoy_limit_field(raw: str | None, expected: tuple[int | None, float | None]) -> None:
    assert limit_field(raw) == expected


# -- IETF generations ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"r": 0, "t": 30}, (0, 30)),
        ({"a": 0, "w": 30}, (0, 30)),
        ({"r": 5, "t": 10, "a": 0, "w": 3600}, (5, 10)),  # the published drafts win
        ({"r": -1, "a": 0, "w": 30}, (None, None)),  # a bad r is never replaced by a
        ({"a": 0, "t": 30}, (0, None)),
        ({"r": 0, "w": 30}, (0, None)),
        ({"a": True, "w": 30}, (None, 30)),
        ({"c": 1}, (None, None)),
        ({}, (None, None)),
    ],
)
def test_ietf_item_reads_one_generation(params: dict[str, object], expected) -> None:
    assert ietf_item(params) == expected


# -- Discord -------------------------------------------------------------------------------
def test_discord_bucket_and_global() -> None:
    assert bucket_of(getter(exchange("discord-200").headers)) == "abcd1234"
    assert bucket_of(getter({"X-RateLimit-Bucket": " 41f9cd5d28af77da04563bcb1d67fdfd "})) == (
        "41f9cd5d28af77da04563bcb1d67fdfd"
    )
    for bad in ("", "a b", "x" * 65, "abc\u0663", "a,b", "a;b"):
        assert bucket_of(getter({"X-RateLimit-Bucket": bad})) is None, bad
    assert bucket_of(getter({})) is None
    assert is_global(getter(exchange("discord-429-global").headers))
    assert is_global(getter({"X-RateLimit-Global": "True"}))
    assert is_global(getter({"X-RateLimit-Scope": "global"}))
    assert not is_global(getter(exchange("discord-429-user").headers))
    assert not is_global(getter({"X-RateLimit-Scope": "shared"}))
    assert not is_global(getter({"X-RateLimit-Global": "false"}))
    assert not is_global(getter({}))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/v10/channels/1001/messages", "channels/1001"),
        ("/api/v10/channels/1001/messages/55?limit=5", "channels/1001"),
        ("/channels/1001", "channels/1001"),
        ("/api/guilds/7/members", "guilds/7"),
        ("/api/v10/webhooks/9/s3cr3t-t0ken", "webhooks/9/s3cr3t-t0ken"),
        ("/api/v10/users/@me", ""),
        ("/api/v10/channels", ""),
        ("/", ""),
        ("", ""),
    ],
)
def test_discord_major_parameter(path: str, expected: str) -> None:
    assert major_parameter(path) == expected


def test_a_bucket_key_is_a_hash_that_keeps_no_webhook_token() -> None:
    key = bucket_key("abcd1234", "webhooks/9/s3cr3t-t0ken")
    assert key.startswith("bucket:") and "s3cr3t" not in key and "abcd" not in key
    assert key == bucket_key("abcd1234", "webhooks/9/s3cr3t-t0ken")
    assert key != bucket_key("abcd1234", "webhooks/9/other")
    assert bucket_key("abcd1234", "channels/1") != bucket_key("abcd1234", "channels/2")


# -- GitHub -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "secondary", "body_needed"),
    [
        ("github-secondary-no-wait-403", True, True),  # the body says so
        ("github-secondary-no-wait-429", True, False),  # a 429 always
        ("github-permission-denied-403", False, True),  # the same headers, another body
        ("github-secondary-retry-after", False, False),  # it names its wait: Retry-After is obeyed
        ("github-secondary-reset", False, False),  # it names its wait: the reset is obeyed
        ("github-primary-403", False, False),  # the primary limit: until the reset
        ("github-primary-200-left", False, False),
    ],
)
def test_github_secondary_limit_is_told_apart(name: str, secondary: bool, body_needed: bool) -> None:
    case = exchange(name)
    get = getter(case.headers)
    assert github_secondary(case.status, get, case.body) is secondary
    assert wants_body(case.status, get) is body_needed


def test_github_secondary_needs_github_and_a_body() -> None:
    case = exchange("github-secondary-no-wait-403")
    headers = {k: v for k, v in case.headers.items() if k != "x-github-request-id"}
    assert not github_secondary(403, getter(headers), case.body)  # not GitHub: a plain 403
    assert not github_secondary(429, getter(headers), case.body)  # a plain 429: backoff as before
    assert not github_secondary(403, getter(case.headers), None)
    assert not github_secondary(403, getter(case.headers), b"")
    legacy = b'{"message": "You have triggered an abuse detection mechanism."}'
    assert github_secondary(403, getter(case.headers), legacy)
    assert not github_secondary(404, getter(case.headers), case.body)
    assert not github_secondary(None, getter(case.headers), case.body)


def test_secondary_wait_doubles_from_a_minute_to_an_hour() -> None:
    waits = [secondary_wait(n) for n in range(0, 9)]
    assert waits == [60.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 3600.0, 3600.0]
    assert secondary_wait(10**9) == SECONDARY_MAX and SECONDARY_MIN == 60.0


# -- Shopify -----------------------------------------------------------------------------------
def test_shopify_retry_after_decimal_is_the_next_whole_second_up() -> None:
    case = exchange("shopify-429")
    parsed = parse_retry_after(case.headers["Retry-After"], received_at=RECEIVED_AT, date=DATE)
    assert parsed.delay == 2.0 and parsed.eligible_at == RECEIVED_AT + timedelta(seconds=2)
    assert parse_retry_after("2.1", received_at=RECEIVED_AT).delay == 3.0
