"""The learned rate's pure rules (``cooldown/rate.py``), and that every store applies
them alike: the memory and SQLite stores here, Redis's Lua in the integration tests."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from retry_after_adapter import MemoryCooldownStore, SQLiteCooldownStore
from retry_after_adapter.cooldown import Ask, Learn
from retry_after_adapter.cooldown.base import Store
from retry_after_adapter.cooldown.rate import (
    BACKOFF,
    BETA,
    MAX_BACKOFF,
    OPEN_CAP,
    QUIET_HELD,
    QUIET_MOVED,
    SLOW_START_CAP,
    Rate,
    answer_rate,
    fresh_rate,
    rate_from_row,
    rate_row,
    roll_rate,
)

T0 = 1_800_000_000.0


def good(rate: Rate, times: int, epoch: int | None = None, at: float = T0 + 0.5) -> Rate:
    for _ in range(times):
        rate = answer_rate(rate, rate.epoch if epoch is None else epoch, None, at)
    return rate


def learned(ok: int = 50, until: float = T0 + 5.0, at: float = T0 + 0.3) -> Rate:
    """A cold scope that took ``ok`` good answers, then a throttle until ``until``."""
    return answer_rate(good(fresh_rate(T0), ok), 0, until, at)


def test_a_new_scope_starts_cold_with_one_probe_in_flight() -> None:
    rate = fresh_rate(T0)
    assert (rate.cap, rate.limit, rate.epoch, rate.start) == (1, 0, 0, T0)
    assert rate.probes and not rate.open
    assert rate_from_row(rate_row(rate)) == rate


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
    assert rate.open and rate.limit == 0
    assert answers == sum(range(SLOW_START_CAP, OPEN_CAP)) + SLOW_START_CAP - 1


def test_a_throttle_while_cold_learns_what_the_server_accepted_in_the_time_it_took() -> None:
    """50 good answers, then a 429 answered 1.7 s after the epoch began: 50 per 1.7 s,
    whatever the wait (5.2 s or an hour: a cooldown is not a rate); probes go on right
    a window after the cooldown (one throttle confirms nothing)."""
    rate = learned(50, until=T0 + 5.2, at=T0 + 1.7)
    assert (rate.limit, rate.cap, rate.quiet) == (50, 1, QUIET_MOVED)
    assert rate.window == pytest.approx(1.7)
    assert (rate.epoch, rate.start, rate.grace) == (1, T0 + 5.2, 0)
    assert not rate.probes and roll_rate(rate, T0 + 5.2 + 1.7).probes
    hour = learned(50, until=T0 + 3600.0, at=T0 + 1.7)
    assert hour.window == pytest.approx(1.7) and hour.start == T0 + 3600.0
    assert learned(50, until=T0 + 5.2, at=T0 + 0.3).window == 1.0  # MIN_WINDOW at least


def test_answers_of_the_throttled_epoch_that_arrive_late_still_count_once() -> None:
    rate = learned(47)
    late = good(rate, 3, epoch=0, at=T0 + 0.31)
    assert late.limit == 50
    # The other attempts of that epoch that were throttled too change nothing more.
    assert answer_rate(late, 0, T0 + 5.0, T0 + 0.32) == late


def test_a_throttle_before_any_good_answer_learns_nothing_and_counts_again() -> None:
    """The quota was spent before the scope's first attempt (by others): that says
    nothing of a rate; the next epoch counts again from one in flight."""
    throttled = answer_rate(fresh_rate(T0), 0, T0 + 30.0, T0 + 0.1)
    assert (throttled.cap, throttled.limit, throttled.start, throttled.epoch) == (1, 0, T0 + 30.0, 1)


def test_a_throttle_without_a_usable_wait_backs_off_doubling_never_zero_and_bounded() -> None:
    rate, at, waits = fresh_rate(T0), T0, []
    for _ in range(8):
        rate = answer_rate(rate, None, at, at)  # a 429 without Retry-After (or with 0)
        waits.append(rate.start - at)
        at = rate.start
    assert waits == [min(MAX_BACKOFF, BACKOFF * 2**n) for n in range(8)]
    assert all(wait > 0 for wait in waits)
    # A good answer ends the streak: the next throttle backs off from the start again.
    rate = answer_rate(good(rate, 1, at=at), None, at + 1, at + 1)
    assert rate.start - (at + 1) == BACKOFF


def test_windows_without_a_throttle_raise_the_limit_by_the_probes_accepted() -> None:
    rate = learned(40)
    rate = roll_rate(rate, rate.start + rate.window)  # a quiet window passes
    rate = roll_rate(rate, rate.start + rate.window)
    assert rate.quiet == 0 and rate.probes and rate.limit == 40
    probed = good(rate.probing(), 12, at=rate.start + 0.5)
    assert probed.ok == 12 and probed.cap > 1
    after = roll_rate(probed, probed.start + probed.window)
    assert (after.limit, after.ok, after.probed, after.epoch) == (52, 0, 0, probed.epoch + 1)
    assert after.cap == probed.cap  # the probes' slow start goes on


def test_a_throttle_of_a_learned_rate_changes_it_once_per_epoch_by_what_it_refused() -> None:
    rate = learned(50)
    # A known send refused: the quota fell (or the throttle was sporadic).
    fell = answer_rate(rate, rate.epoch, rate.start + 1.0, rate.start + 0.5)
    assert (fell.limit, fell.quiet, fell.cap) == (int(50 * BETA), QUIET_MOVED, 1)
    assert answer_rate(fell, rate.epoch, rate.start + 2.0, rate.start + 0.6) == fell  # once
    # The first probe refused: the limit is the server's, confirmed.
    held = answer_rate(rate.probing(), rate.epoch, rate.start + 1.0, rate.start + 0.5)
    assert (held.limit, held.quiet) == (50, QUIET_HELD)
    # Probes accepted, then one refused: the server's limit is that much higher.
    rose = answer_rate(good(rate.probing(), 7, at=rate.start + 0.2), rate.epoch, rate.start + 1.0, rate.start + 0.5)
    assert (rose.limit, rose.quiet) == (57, QUIET_MOVED)


def test_probes_accepted_across_the_server_s_reset_raise_the_limit_only_to_their_number() -> None:
    """The server's window began inside the epoch when its reset lies past the epoch's
    end by more than a Retry-After's rounding: the probes it accepted were all it took in
    that window, so the limit becomes their number, not the limit plus them."""
    rate = roll_rate(roll_rate(learned(20, until=T0 + 3.0, at=T0 + 2.0), T0 + 5.0), T0 + 7.0)
    assert rate.probes and rate.window == pytest.approx(2.0) and rate.start == pytest.approx(T0 + 7.0)
    probed = good(rate.probing(), 30, at=T0 + 7.5)
    within = answer_rate(probed, probed.epoch, probed.ends + 0.9, T0 + 8.5)  # rounding: same window
    assert within.limit == 50
    across = answer_rate(probed, probed.epoch, probed.ends + 1.5, T0 + 8.9)
    assert across.limit == 30


def test_a_refused_probe_measures_the_window_again_from_the_server_s_resets() -> None:
    """Learned 2.8 s for a 2 s window; a probe refused two epochs after the last
    throttle's end, whose reset lies 3 server windows (and a rounding) after it, moves
    the window half-way to what the resets say. A wait longer than a window (and its
    rounding) is no reset of it: the window stays."""
    rate = learned(80, until=T0 + 3.2, at=T0 + 2.8)
    assert rate.window == pytest.approx(2.8)
    rate = roll_rate(roll_rate(rate, rate.start + rate.window), rate.start + 2 * rate.window)
    assert rate.epoch == 3 and rate.probes
    until = rate.base + 3 * 2.0 + 0.4
    measured = answer_rate(rate.probing(), rate.epoch, until, rate.start + 0.5)
    assert measured.limit == 80 and measured.quiet == QUIET_HELD
    # The reading (6.4 s over 3 windows) is shorter than the window: shorter only as far
    # as the resets' rounding (a second) allows.
    reading = min(2800, (round((until - rate.base) * 1000) + 1000) / 3)
    assert measured.window == pytest.approx(math.floor((2800 + reading) / 2 + 0.5) / 1000)
    long_wait = answer_rate(rate.probing(), rate.epoch, rate.start + 0.5 + 3600.0, rate.start + 0.5)
    assert long_wait.limit == 80 and long_wait.window == pytest.approx(2.8)


def test_a_known_send_refused_while_probes_were_taken_keeps_the_limit_it_showed() -> None:
    """With several threads a probe may reach the server before a known send: the
    server takes the probe and refuses the known send. The limit is what it took (the
    known sends but one, and the probes answered well), confirmed; a probe answered
    well after the throttle adds one. (Read as a probe refused, the limit rose by one
    each time and the next window's known sends were refused: 0.42-1.0 refused a window
    with 4 and 8 threads against a quota of 5 per 2 s.)"""
    rate = roll_rate(roll_rate(learned(5, until=T0 + 3.0, at=T0 + 2.0), T0 + 5.0), T0 + 7.0)
    sent = rate
    for _ in range(5):
        sent = sent.sending()
    taken = good(sent.probing(), 1, at=T0 + 7.01)
    known = answer_rate(taken, taken.epoch, T0 + 9.0, T0 + 7.02, probe=False)
    assert (known.limit, known.quiet) == (5, QUIET_HELD)
    assert answer_rate(taken, taken.epoch, T0 + 9.0, T0 + 7.02, probe=True).limit == 6  # a probe refused
    # The probe still on its way when the known send was refused: one less, then its
    # good answer gives it back.
    on_its_way = answer_rate(sent.probing(), sent.epoch, T0 + 9.0, T0 + 7.02, probe=False)
    assert on_its_way.limit == 4
    assert good(on_its_way, 1, epoch=sent.epoch, at=T0 + 7.03).limit == 5


def test_a_window_learned_short_grows_when_a_known_send_is_refused_a_window_later() -> None:
    """The cold start took 1.04 s of a 2 s window: 1.04 s learned. The next epoch's
    known sends are accepted, the one after refused by the same server window, which
    ends 2 s after the last reset: the window grows to that, the limit stays. Further
    than two learned windows, the throttle is read as the quota falling."""
    rate = learned(20, until=T0 + 1.05, at=T0 + 1.04)
    assert rate.window == pytest.approx(1.04)
    rolled = roll_rate(rate, T0 + 2.1)
    assert rolled.epoch == 2
    short = answer_rate(rolled, 2, T0 + 3.05, T0 + 2.1)
    assert (short.limit, short.window) == (20, pytest.approx(2.0))
    far = answer_rate(roll_rate(rate, T0 + 4.2), 4, T0 + 5.25, T0 + 4.2)
    assert far.limit == int(20 * BETA) and far.window == pytest.approx(1.04)


def test_a_rate_pinned_low_by_sporadic_throttles_is_open_again_within_a_few_windows() -> None:
    """Four throttles that had nothing to do with the rate leave a low limit; once the
    server is healthy, probes find no limit within a few windows (120 good answers of
    probes per window, demand far above the limit) and the scope is open: no ceiling is
    kept."""
    rate, at = learned(24, until=T0 + 1.2, at=T0 + 0.2), T0 + 1.2
    for _ in range(3):  # three more sporadic throttles, each of a known send
        at = rate.start + rate.window * (rate.quiet + 0.5)
        rate = roll_rate(rate, at)
        rate = answer_rate(rate, rate.epoch, at + 3.0, at)
    assert rate.limit < 24
    windows = 0
    while not rate.open:
        at = max(at, rate.start) + rate.window
        rate = roll_rate(rate, at)
        if rate.probes:  # the window's known sends, then probes until the window ends
            rate = good(rate.probing(), 120, at=at)
        windows += 1
        assert windows < 10
    assert windows <= 1 + QUIET_MOVED + 3


def test_a_throttle_after_the_cap_was_lifted_counts_again_from_one_in_flight() -> None:
    rate = fresh_rate(T0)
    while rate.cap:
        rate = good(rate, 1)
    again = answer_rate(rate, None, T0 + 60.0, T0 + 30.0)
    assert (again.cap, again.limit, again.start, again.epoch) == (1, 0, T0 + 60.0, rate.epoch + 1)


NOW = datetime(2027, 1, 15, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Store:
    if request.param == "memory":
        return MemoryCooldownStore()
    return SQLiteCooldownStore(str(tmp_path) + "/rate.db")


def test_a_store_admits_a_cold_scope_one_probe_in_flight_and_learns_from_answers(store: Store) -> None:
    first = store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t1")))
    assert first.not_before is None and first.token == "t1"
    assert (first.rate_epoch, first.rate_report) == (0, True)
    second = store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t2")))
    assert second.slot_busy and second.not_before is not None and second.by_rate  # one in flight
    store.rate_answer("s", 0, None, NOW)
    store.release("s", "t1")
    assert store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t3"))).token == "t3"
    assert store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t4"))).token == "t4"  # two in flight now
    rate = store.rate_of("s")
    assert rate is not None and (rate.cap, rate.ok, rate.probed) == (2, 1, 1)


def _learn(store: Store, ok: int, answered: datetime, until: datetime) -> None:
    store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t0")))
    store.release("s", "t0")
    for _ in range(ok):
        store.rate_answer("s", 0, None, NOW)
    store.rate_answer("s", 0, until, answered)


def test_a_store_admits_the_limit_per_epoch_as_known_sends_then_probes(store: Store) -> None:
    """3 good answers in 2 s, then a 429 until 3 s: 3 per 2 s from the cooldown's end,
    probes a window later; a refused probe confirms the limit: quiet windows follow."""
    until = NOW + timedelta(seconds=3)
    _learn(store, 3, NOW + timedelta(seconds=2), until)
    rate = store.rate_of("s")
    assert rate is not None and (rate.limit, rate.window, rate.quiet) == (3, pytest.approx(2.0), QUIET_MOVED)
    granted = [store.admit(Ask(scope="s", now=until, learn=Learn(ttl=60.0, token=f"a{n}"))) for n in range(4)]
    assert [g.not_before is None for g in granted] == [True, True, True, False]
    assert all(g.token is None and g.rate_epoch == 1 and not g.rate_report for g in granted[:3])
    assert granted[3].by_rate and granted[3].not_before == until + timedelta(seconds=2)
    second = until + timedelta(seconds=2)
    granted = [store.admit(Ask(scope="s", now=second, learn=Learn(ttl=60.0, token=f"e{n}"))) for n in range(4)]
    assert [g.not_before is None for g in granted] == [True, True, True, False]
    # A window after the cooldown, probes follow: the known sends hold probe slots until
    # their answers, and the probe waits for them.
    assert [g.token for g in granted[:3]] == ["e0", "e1", "e2"] and granted[3].slot_busy
    for n in range(3):
        store.release("s", f"e{n}")
    granted[3] = store.admit(Ask(scope="s", now=second, learn=Learn(ttl=60.0, token="e3")))
    assert granted[3].rate_report and granted[3].token == "e3"  # a probe, a window after the cooldown
    # The probe refused (the server's reset 4 s, two windows, after the last): confirmed.
    store.rate_answer("s", 2, until + timedelta(seconds=4), second + timedelta(seconds=0.1))
    store.release("s", "e3")
    start = until + timedelta(seconds=4)
    granted = [store.admit(Ask(scope="s", now=start, learn=Learn(ttl=60.0, token=f"b{n}"))) for n in range(4)]
    assert [g.not_before is None for g in granted] == [True, True, True, False]
    # Quiet: no probe; refused by the rate until the next epoch begins, a window on.
    assert granted[3].by_rate and not granted[3].slot_busy
    assert granted[3].not_before == start + timedelta(seconds=2)
    assert store.admit(Ask(scope="s", now=start + timedelta(seconds=1.999), learn=Learn(ttl=60.0, token="c"))).not_before is not None
    assert store.admit(Ask(scope="s", now=start + timedelta(seconds=2.0), learn=Learn(ttl=60.0, token="d"))).not_before is None
    # Two quiet windows later, a send beyond the limit is a probe: one in flight.
    later = start + timedelta(seconds=3 * 2.0 + 0.1)
    known = [store.admit(Ask(scope="s", now=later, learn=Learn(ttl=60.0, token=f"k{n}"))) for n in range(3)]
    assert all(k.not_before is None and not k.rate_report for k in known)
    early = store.admit(Ask(scope="s", now=later, learn=Learn(ttl=60.0, token="p0")))
    assert early.by_rate and early.slot_busy  # the known sends are not answered yet
    for n in range(3):
        store.release("s", f"k{n}")
    probe = store.admit(Ask(scope="s", now=later, learn=Learn(ttl=60.0, token="p1")))
    assert probe.not_before is None and probe.rate_report and probe.token == "p1"
    busy = store.admit(Ask(scope="s", now=later, learn=Learn(ttl=60.0, token="p2")))
    assert busy.by_rate and busy.slot_busy
    assert busy.not_before is not None and busy.not_before <= later + timedelta(seconds=1)  # not the lease's 60 s


def test_no_epoch_begins_before_the_throttle_s_end_rounded_to_milliseconds(store: Store) -> None:
    """A throttle's end with a part of a millisecond (3.0004 s on): every store keeps it
    in whole milliseconds rounded up, the memory store too, so an epoch rolled a window
    on and on never begins before its time (the memory store kept 3.0004, and rolled
    epochs rounded to the millisecond began at 5.000, 7.000: 0.4 ms early)."""
    until = NOW + timedelta(seconds=3, microseconds=400)
    _learn(store, 3, NOW + timedelta(seconds=2), until)
    rate = store.rate_of("s")
    assert rate is not None and rate.window == pytest.approx(2.0)
    assert rate.start == math.ceil(until.timestamp() * 1000) / 1000
    store.admit(Ask(scope="s", now=until + timedelta(seconds=2, microseconds=100), learn=Learn(ttl=60.0, token="a")))
    store.admit(Ask(scope="s", now=until + timedelta(seconds=4, microseconds=-100), learn=Learn(ttl=60.0, token="b")))
    rate = store.rate_of("s")
    assert rate is not None  # still the epoch of 2 s on, not yet the one of 4 s on
    assert (until + timedelta(seconds=2)).timestamp() <= rate.start < (until + timedelta(seconds=3)).timestamp()


def test_a_store_holds_a_scope_back_for_a_throttle_without_a_usable_wait(store: Store) -> None:
    store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t0")))
    store.rate_answer("s", None, NOW, NOW)  # a 429 without Retry-After
    held = store.admit(Ask(scope="s", now=NOW + timedelta(seconds=0.5), learn=Learn(ttl=60.0, token="t1")))
    assert held.by_rate and held.not_before == NOW + timedelta(seconds=BACKOFF)
    store.release("s", "t0")
    assert store.admit(Ask(scope="s", now=NOW + timedelta(seconds=BACKOFF), learn=Learn(ttl=60.0, token="t2"))).not_before is None


def test_an_open_scope_is_admitted_without_the_rate(store: Store) -> None:
    store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t0")))
    store.release("s", "t0")
    for _ in range(600):
        store.rate_answer("s", 0, None, NOW)
    rate = store.rate_of("s")
    assert rate is not None and rate.open
    answer = store.admit(Ask(scope="s", now=NOW, learn=Learn(ttl=60.0, token="t1")))
    assert answer.not_before is None and answer.rate_epoch is None and answer.token is None


def test_a_store_keeps_no_rate_without_learn_and_none_once_an_allowance_is_announced(store: Store) -> None:
    assert store.admit(Ask(scope="plain", now=NOW)).not_before is None
    assert store.rate_of("plain") is None
    store.allow("quoted", 10, NOW + timedelta(seconds=30), NOW)
    answer = store.admit(Ask(scope="quoted", now=NOW, learn=Learn(ttl=60.0, token="t")))
    assert answer.rate_epoch is None and answer.token is None
    assert store.rate_of("quoted") is None
