"""What a 429 means, read by the pure core: the answers whose provider documents them
as "not processed" (OpenAI's, Anthropic's 429), which a POST may be replayed after, and
the statuses the policy retries, its method set aside; and the option that turns the
replay on and off."""

from __future__ import annotations

import pytest

from retry_after_adapter import ConfigurationError, RetryAfterAdapter, RetryAfterPoolManager
from retry_after_adapter.dialects import UNPROCESSED_FIELDS, not_processed
from retry_after_adapter.httpx2 import RetryAfterTransport
from retry_after_adapter.policy import retried_status


def getter(headers: dict[str, str]):
    lowered = {k.lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())


@pytest.mark.parametrize(
    ("status", "fields", "expected"),
    [
        (429, {"x-ratelimit-remaining-tokens": "0"}, True),
        (429, {"X-RateLimit-Limit-Requests": "500"}, True),
        (429, {"x-ratelimit-remaining-requests": "12"}, True),  # Azure OpenAI: the remaining fields alone
        (429, {"openai-version": "2020-10-01"}, True),
        (429, {"anthropic-ratelimit-output-tokens-reset": "2026-12-05T00:00:00Z"}, True),
        (429, {"anthropic-organization-id": "o"}, True),
        (503, {"x-ratelimit-remaining-tokens": "0"}, False),  # overloaded: no promise
        (529, {"anthropic-ratelimit-requests-remaining": "3"}, False),
        (None, {"x-ratelimit-remaining-tokens": "0"}, False),
        # Generic fields every kind of API sends are no provider's mark.
        (429, {"x-ratelimit-remaining": "0", "request-id": "r", "x-request-id": "r", "x-should-retry": "true"}, False),
        (429, {"RateLimit": '"default";r=0;t=1'}, False),
        (429, {}, False),
    ],
)
def test_not_processed_reads_the_providers_own_fields(
    status: int | None, fields: dict[str, str], expected: bool
) -> None:
    assert not_processed(status, getter(fields)) is expected


def test_every_provider_field_is_lower_case_and_named_once() -> None:
    assert len(set(UNPROCESSED_FIELDS)) == len(UNPROCESSED_FIELDS)
    assert all(name == name.lower() for name in UNPROCESSED_FIELDS)


@pytest.mark.parametrize(
    ("status", "forcelist", "honours", "expected"),
    [
        (429, {429, 503}, False, True),  # listed
        (429, set(), True, True),  # a Retry-After status, obeyed
        (429, set(), False, False),  # no retries left, or Retry-After not respected
        (413, set(), True, True),
        (500, set(), True, False),
        (None, {429}, True, False),
    ],
)
def test_retried_status_is_urllib3s_rule_without_the_method(
    status: int | None, forcelist: set[int], honours: bool, expected: bool
) -> None:
    assert (
        retried_status(status, forcelist=forcelist, retry_after_statuses={413, 429, 503}, honours_retry_after=honours)
        is expected
    )


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_replay_unprocessed_takes_a_bool_or_none(value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"replay_unprocessed must be True, False or None, not {value!r}"):
        RetryAfterAdapter(replay_unprocessed=value)  # type: ignore[arg-type]


def test_each_front_end_has_its_default_and_the_option_wins() -> None:
    """The httpx transports replay (the SDKs run on them), requests and urllib3 keep
    urllib3's rule; the option, given, decides."""
    assert RetryAfterTransport()._plan.replays is True
    assert RetryAfterAdapter()._plan.replays is False
    assert RetryAfterPoolManager()._plan.replays is False
    assert RetryAfterTransport(replay_unprocessed=False)._plan.replays is False
    assert RetryAfterAdapter(replay_unprocessed=True)._plan.replays is True
    adapter = RetryAfterAdapter()
    adapter.replay_unprocessed = True  # set later: checked and applied as at construction
    assert adapter._plan.replays is True and adapter.replay_unprocessed is True
