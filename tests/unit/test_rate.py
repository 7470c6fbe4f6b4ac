"""The learned rate's pure rules (``cooldown/rate.py``), and that every store applies
them alike: the memory and SQLite stores here, Redis's Lua in the integration tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from retry_after_adapter import MemoryCooldownStore, SQLiteCooldownStore
from retry_after_adapter.cooldown.base import Store
from retry_after_adapter.cooldown.rate import (
    BETA,
    OPEN_CAP,
    RATE_KEPT,
    SLOW_START_CAP,
    Rate,
    answer_rate,
    fresh_rate,
    rate_terms,
    roll_rate,
)

T0 = 1_800_000_000.0


def good(rate: Rate, times: int, epoch: int | None = None, at: float = T0 + 0.5) -> Rate:
    for _ in range(times):
        rate = answer_rate(rate, rate.epoch if epoch is None else epoch, None, at)
    return rate


def test_a_new_scope_starts_with_one_attempt_in_flight_and_counts_good_answers() -> None:
    rate = fresh_rate(T0)
    assert (rate.cap, rate.limit, rate.epoch, rate.start) == (1, 0, 0, T0)
    assert rate.cold and rate.reports(0)
    assert rate_terms(rate, None, (60.0, "tok")) == (None, None, (1, 60.0, "tok"))


def test_the_cap_doubles_per_round_to_the_slow_start_cap_then_grows_one_per_round() -> None:
    rate = good(fresh_rate(T0), SLOW_START_CAP - 1)
    assert rate.cap == SLOW_START_CAP  # one per good answer: 1, 2, 4 in flight per round
    rate = good(rate, SLOW_START_CAP - 1)
    assert rate.cap == SLOW_START_CAP  # a whole round (cap answers) for one more
    rate = good(rate, 1)
    assert rate.cap == SLOW_START_CAP + 1
    assert rate.ok == 2 * SLOW_START_CAP - 1


def test_the_cap_is_lifted_when_no_limit_shows_up() -> None:
    rate = fresh_rate(T0)
    answers = 0
    while rate.cap:
        rate = good(rate, 1)
        answers += 1
        assert answers < 1000
    assert rate.limit == 0 and not rate.cold
    assert answers == sum(range(SLOW_START_CAP, OPEN_CAP)) + SLOW_START_CAP - 1
    assert rate_terms(rate, None, (60.0, "tok")) == (None, None, None)


def test_a_throttle_while_cold_learns_what_the_server_accepted_within_the_window() -> None:
    rate = good(fresh_rate(T0), 50)
    until = T0 + 5.2
    learned = answer_rate(rate, 0, until, T0 + 0.3)
    assert (learned.limit, learned.ceiling, learned.cap) == (50, 50, 0)
    assert learned.window == pytest.approx(5.2)
    assert (learned.epoch, learned.start, learned.grace) == (1, until, 0)
    assert rate_terms(learned, None, (60.0, "tok")) == (50, pytest.approx(5.2), None)


def test_answers_of_the_throttled_epoch_that_arrive_late_still_count_once() -> None:
    learned = answer_rate(good(fresh_rate(T0), 47), 0, T0 + 5.0, T0 + 0.3)
    assert learned.limit == 47
    assert learned.reports(0) and not learned.reports(1)
    late = good(learned, 3, epoch=0, at=T0 + 0.31)
    assert (late.limit, late.ceiling) == (50, 50)
    # The other attempts of that epoch that were throttled too change nothing more.
    assert answer_rate(late, 0, T0 + 5.0, T0 + 0.32) == late


def test_a_throttle_of_a_learned_rate_lowers_it_multiplicatively_once_per_epoch() -> None:
    learned = answer_rate(good(fresh_rate(T0), 50), 0, T0 + 5.0, T0 + 0.3)
    throttled = answer_rate(learned, 1, T0 + 7.0, T0 + 6.0)
    assert throttled.limit == int(50 * BETA)
    assert throttled.window == pytest.approx(5.0) and throttled.epoch == 2
    assert answer_rate(throttled, 1, T0 + 8.0, T0 + 6.1) == throttled  # same epoch: once


def test_a_learned_window_that_was_too_short_grows_instead_of_the_limit_falling() -> None:
    # The first epoch began inside the server's window: 3.2 s learned for a 5 s window.
    learned = answer_rate(good(fresh_rate(T0), 50), 0, T0 + 3.2, T0 + 1.0)
    assert learned.window == pytest.approx(3.2)
    # A window later (a roll, no throttle), the next batch is throttled until the reset
    # 5 s after the last one: the window was short, not the limit too high.
    rolled = roll_rate(learned, T0 + 6.5)
    assert rolled.epoch == 2
    throttled = answer_rate(rolled, 2, T0 + 3.2 + 5.0, T0 + 6.5)
    assert throttled.limit == 50 and throttled.window == pytest.approx(5.0)


def test_windows_without_a_throttle_raise_the_limit_back_toward_the_ceiling_never_above() -> None:
    learned = answer_rate(good(fresh_rate(T0), 40), 0, T0 + 5.0, T0 + 0.3)
    low = answer_rate(learned, 1, T0 + 9.0, T0 + 8.0)
    assert low.limit == 28
    one = roll_rate(low, low.start + low.window)
    assert one.limit == 34 and one.epoch == low.epoch + 1
    later = roll_rate(one, one.start + 10 * one.window)
    assert later.limit == 40 == later.ceiling
    assert roll_rate(later, later.start + 100 * later.window).limit == 40


def test_a_throttle_after_the_cap_was_lifted_counts_again_from_one_in_flight() -> None:
    rate = fresh_rate(T0)
    while rate.cap:
        rate = good(rate, 1)
    again = answer_rate(rate, None, T0 + 60.0, T0 + 30.0)
    assert (again.cap, again.limit, again.start, again.epoch) == (1, 0, T0 + 60.0, rate.epoch + 1)


def test_a_configured_cap_and_the_cold_cap_take_one_slot_under_the_smaller() -> None:
    rate = good(fresh_rate(T0), 3)
    assert rate_terms(rate, (2, 30.0, "a"), (60.0, "a"))[2] == (2, 30.0, "a")
    assert rate_terms(rate, (10, 30.0, "a"), (60.0, "a"))[2] == (rate.cap, 30.0, "a")


NOW = datetime(2027, 1, 15, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Store:
    if request.param == "memory":
        return MemoryCooldownStore()
    return SQLiteCooldownStore(str(tmp_path) + "/rate.db")


def test_a_store_admits_a_cold_scope_one_in_flight_and_learns_from_answers(store: Store) -> None:
    first = store.admit("s", NOW, learn=(60.0, "t1"))
    assert first.not_before is None and first.token == "t1"
    assert (first.rate_epoch, first.rate_report) == (0, True)
    second = store.admit("s", NOW, learn=(60.0, "t2"))
    assert second.slot_busy and second.not_before is not None  # one in flight
    store.rate_answer("s", 0, None, NOW)
    store.release("s", "t1")
    assert store.admit("s", NOW, learn=(60.0, "t3")).token == "t3"
    assert store.admit("s", NOW, learn=(60.0, "t4")).token == "t4"  # two in flight now
    rate = store.rate_of("s")
    assert rate is not None and (rate.cap, rate.ok) == (2, 1)


def test_a_store_admits_a_learned_rate_by_its_permits_across_its_window(store: Store) -> None:
    store.admit("s", NOW, learn=(60.0, "t0"))
    for _ in range(3):
        store.rate_answer("s", 0, None, NOW)
    until = NOW + timedelta(seconds=2)
    store.rate_answer("s", 0, until, NOW)
    rate = store.rate_of("s")
    assert rate is not None and (rate.limit, rate.window) == (3, pytest.approx(2.0))
    granted = [store.admit("s", until, learn=(60.0, f"a{n}")) for n in range(4)]
    assert [g.not_before is None for g in granted] == [True, True, True, False]
    assert all(g.token is None and g.rate_epoch == 1 and not g.rate_report for g in granted[:3])
    # The permits count the window and a margin: free again after it, not before.
    assert store.admit("s", until + timedelta(seconds=2.0), learn=(60.0, "b")).not_before is not None
    assert store.admit("s", until + timedelta(seconds=2.06), learn=(60.0, "c")).not_before is None


def test_a_store_keeps_no_rate_without_learn_and_none_once_an_allowance_is_announced(store: Store) -> None:
    assert store.admit("plain", NOW).not_before is None
    assert store.rate_of("plain") is None
    store.allow("quoted", 10, NOW + timedelta(seconds=30), NOW)
    answer = store.admit("quoted", NOW, learn=(60.0, "t"))
    assert answer.rate_epoch is None and answer.token is None
    assert store.rate_of("quoted") is None


def test_a_throttle_before_any_good_answer_learns_nothing_and_counts_again() -> None:
    """The quota was spent before the scope's first attempt (by others): that says
    nothing of a rate; the next epoch counts again from one in flight."""
    throttled = answer_rate(fresh_rate(T0), 0, T0 + 30.0, T0 + 0.1)
    assert (throttled.cap, throttled.limit, throttled.start, throttled.epoch) == (1, 0, T0 + 30.0, 1)
    assert throttled.cold


def test_a_learned_rate_is_learned_again_an_hour_after_its_last_throttle() -> None:
    learned = answer_rate(good(fresh_rate(T0), 3), 0, T0 + 5.0, T0 + 0.3)
    still = roll_rate(learned, learned.start + RATE_KEPT - 10.0)
    assert still.limit == 3 and not still.cold
    again = roll_rate(learned, learned.start + RATE_KEPT + 1.0)
    assert again.cold and again.cap == 1 and again.limit == 0 and again.ceiling == 3
