"""The pure decision, with plain values (seconds)."""

from __future__ import annotations

import pytest

from retry_after_adapter.errors import ConfigurationError
from retry_after_adapter.policy import DEFER, RETRY, Decision, admit, decide


def d(**kw: float | None) -> Decision:
    args: dict[str, float | None] = dict(
        server_delay=None,
        backoff=0.0,
        cooldown_left=0.0,
        jitter=0.0,
        elapsed=0.0,
        deadline=None,
        max_wait=None,
        attempt_reserve=0.0,
    )
    args.update(kw)
    return decide(**args)  # type: ignore[arg-type]


def test_seed_server_wait_beyond_remaining_time_defers_to_the_server_time():
    # The server asks 30 s, local backoff is 8 s, the job has 12 s left.
    decision = d(server_delay=30, backoff=8, elapsed=0, deadline=12)
    assert decision == Decision(DEFER, 30.0, "deadline")


def test_seed_helper_examples_from_the_shared_budget_article():
    # server 20 s + jitter 1 fits 60 s with a 5 s request reserve; 120 s does not.
    assert d(server_delay=20, backoff=1, jitter=1, deadline=60, attempt_reserve=5) == Decision(RETRY, 21.0)
    assert d(server_delay=120, backoff=1, jitter=1, deadline=60, attempt_reserve=5).action == DEFER


def test_seed_fallback_equality_is_permitted():
    # waited 100 ms, fallback 200 ms, budget 300 ms: equality is allowed.
    assert d(backoff=0.2, elapsed=0.1, deadline=0.3) == Decision(RETRY, 0.2)
    assert d(backoff=0.2, elapsed=0.1000001, deadline=0.3).action == DEFER


def test_wait_is_the_largest_of_server_backoff_and_cooldown():
    assert d(server_delay=3, backoff=5, cooldown_left=4).wait == 5
    assert d(server_delay=7, backoff=5, cooldown_left=4).wait == 7
    assert d(server_delay=None, backoff=1, cooldown_left=9).wait == 9


def test_server_delay_is_never_shortened_by_max_wait():
    decision = d(server_delay=120, max_wait=60)
    assert decision == Decision(DEFER, 120.0, "max_wait")


@pytest.mark.parametrize("limit", ["max_wait", "deadline"])
def test_equality_at_each_limit_is_taken(limit):
    assert d(server_delay=10, **{limit: 10}) == Decision(RETRY, 10.0)
    assert d(server_delay=10.5, **{limit: 10}).action == DEFER


def test_attempt_reserve_counts_against_the_deadline():
    assert d(server_delay=10, elapsed=2, deadline=15, attempt_reserve=3) == Decision(RETRY, 10.0)
    assert d(server_delay=10, elapsed=2, deadline=15, attempt_reserve=3.5).reason == "deadline"


def test_jitter_only_adds():
    assert d(server_delay=10, jitter=0.75).wait == 10.75
    assert d(server_delay=10, jitter=0.75, max_wait=10.5).reason == "max_wait"


def test_max_wait_is_checked_before_deadline():
    assert d(server_delay=100, max_wait=10, deadline=5).reason == "max_wait"


def test_past_date_means_zero_wait():
    assert d(server_delay=0, deadline=1) == Decision(RETRY, 0.0)


@pytest.mark.parametrize(
    "kw",
    [
        {"server_delay": -1},
        {"backoff": -0.1},
        {"jitter": -1},
        {"elapsed": float("nan")},
        {"deadline": -5},
        {"max_wait": "10"},
        {"cooldown_left": True},
    ],
)
def test_bad_input_is_a_configuration_error(kw):
    with pytest.raises(ConfigurationError):
        d(**kw)


def test_admission_without_cooldown_admits_at_once():
    assert admit(cooldown_left=0, elapsed=0, deadline=1, max_wait=1) == Decision(RETRY, 0.0)


def test_admission_waits_out_a_fitting_cooldown_and_defers_one_that_does_not():
    assert admit(cooldown_left=4, elapsed=0, deadline=5, max_wait=None) == Decision(RETRY, 4.0)
    assert admit(cooldown_left=6, elapsed=0, deadline=5, max_wait=None) == Decision(DEFER, 6.0, "cooldown")
    assert admit(cooldown_left=6, elapsed=0, deadline=None, max_wait=5) == Decision(DEFER, 6.0, "cooldown")
    assert admit(cooldown_left=5, elapsed=0, deadline=None, max_wait=5) == Decision(RETRY, 5.0)


def test_admission_after_the_deadline_defers():
    assert admit(cooldown_left=0, elapsed=5.01, deadline=5, max_wait=None).reason == "deadline"
