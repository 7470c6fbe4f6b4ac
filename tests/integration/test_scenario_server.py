"""The scripted server (``retry_after_adapter.testing.ScenarioServer``): each phase type
answers as scripted over real sockets, phases follow each other on the injected clock,
and the server's own counts (early sends, overruns, goodput against what the script
allowed) are what their definitions say."""

from __future__ import annotations

import math
import time

import pytest
import requests

from retry_after_adapter import ConfigurationError, FakeClock, deferral_of
from retry_after_adapter.testing import ScenarioServer
from retry_after_adapter.testing.scenarios import (
    Phase,
    all_status,
    every_nth,
    fixed_window,
    healthy,
    sliding_window,
    storm,
)

from .conftest import make_session


def get(server: ScenarioServer, session: requests.Session | None = None, **headers: str) -> requests.Response:
    return (session or requests).get(server.url + "/x", headers=headers, timeout=5)


def statuses(server: ScenarioServer, n: int) -> list[int]:
    with requests.Session() as session:
        return [get(server, session).status_code for _ in range(n)]


def test_healthy_answers_200_and_sets_no_bound():
    with ScenarioServer([Phase(healthy())]) as server:
        assert statuses(server, 5) == [200] * 5
        assert server.goodput(0, 60).allowed is None
        assert server.goodput(0, 60).good == 5
        assert server.early() == server.overruns() == 0


def test_every_nth_throttles_every_nth_request_a_limited_number_of_times():
    with ScenarioServer([Phase(every_nth(3, retry_after="1", times=2))]) as server:
        assert statuses(server, 10) == [200, 200, 429, 200, 200, 429, 200, 200, 200, 200]
        told = [a.retry_after for a in server.seen() if a.status == 429]
        assert told == ["1", "1"]


def test_every_nth_without_retry_after_and_another_status():
    with ScenarioServer([Phase(every_nth(2, status=503, retry_after=None))]) as server:
        with requests.Session() as session:
            answers = [get(server, session) for _ in range(4)]
    assert [r.status_code for r in answers] == [200, 503, 200, 503]
    assert "Retry-After" not in answers[1].headers
    assert server.announcements == []  # nothing announced, nothing can be early


def test_all_status_and_storm():
    with ScenarioServer([Phase(all_status(503, retry_after="2"))]) as server:
        answer = get(server)
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "2"
        assert server.goodput(0, 10).allowed == 0.0
    for told in (None, "0"):
        with ScenarioServer([Phase(storm(retry_after=told))]) as server:
            answers = [get(server) for _ in range(3)]
            assert {r.status_code for r in answers} == {429}
            assert {r.headers.get("Retry-After") for r in answers} == {told}
            assert server.announcements == []  # neither is a usable cooldown


def test_phases_follow_each_other_on_the_clock():
    clock = FakeClock()
    script = [Phase(all_status(503, retry_after="2"), 3.0), Phase(healthy())]
    with ScenarioServer(script, clock=clock) as server:
        assert get(server).status_code == 503
        clock.advance(2.9)
        assert get(server).status_code == 503
        clock.advance(0.1)
        assert get(server).status_code == 200
    assert [a.phase for a in server.seen()] == [0, 0, 1]
    assert [a.t for a in server.seen()] == pytest.approx([0.0, 2.9, 3.0])
    assert server.transient_end == 3.0


def test_the_fixed_window_counts_from_its_phase_and_tells_the_reset_rounded_up():
    clock = FakeClock()
    script = [Phase(healthy(), 1.5), Phase(fixed_window(2, 5.0))]
    with ScenarioServer(script, clock=clock) as server:
        clock.advance(1.5)  # the window starts with the phase
        assert statuses(server, 2) == [200, 200]
        clock.advance(0.4)
        throttled = get(server)
        assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "5"  # 4.6 s up
        clock.advance(4.0)
        assert get(server).headers["Retry-After"] == "1"  # 0.6 s, rounded up
        clock.advance(0.6)  # the next window
        assert statuses(server, 3) == [200, 200, 429]
        # 3 requests arrived in each window of limit 2: both windows overran.
        assert server.overruns() == 2
        rate = server.goodput(1.5, 11.5)
        assert (rate.good, rate.allowed, rate.allowed_per_second) == (4, 4.0, 0.4)


@pytest.mark.parametrize("announce", ["ietf", "x-ratelimit"])
def test_the_fixed_window_announces_its_quota(announce):
    clock = FakeClock()
    epoch = clock.now().timestamp()
    with ScenarioServer([Phase(fixed_window(2, 2.5, announce=announce))], clock=clock) as server:
        clock.advance(1.0)
        first = get(server)
        clock.advance(0.25)
        second, third = get(server), get(server)
    assert [r.status_code for r in (first, second, third)] == [200, 200, 429]
    if announce == "ietf":
        assert first.headers["RateLimit-Policy"] == '"default";q=2;w=3'
        assert first.headers["RateLimit"] == '"default";r=1;t=2'
        assert second.headers["RateLimit"] == '"default";r=0;t=2'
    else:
        assert first.headers["X-RateLimit-Limit"] == "2"
        assert (first.headers["X-RateLimit-Remaining"], second.headers["X-RateLimit-Remaining"]) == ("1", "0")
        assert float(first.headers["X-RateLimit-Reset"]) == pytest.approx(epoch + 2.5)
        assert float(second.headers["X-RateLimit-Reset-After"]) == pytest.approx(1.25)
    assert third.headers["Retry-After"] == "2"


def test_the_fixed_window_may_throttle_without_retry_after():
    with ScenarioServer([Phase(fixed_window(1, 60.0, retry_after=False))]) as server:
        with requests.Session() as session:
            answers = [get(server, session) for _ in range(2)]
    assert [r.status_code for r in answers] == [200, 429]
    assert "Retry-After" not in answers[1].headers


def test_the_sliding_window_waits_for_the_oldest_to_leave():
    clock = FakeClock()
    with ScenarioServer([Phase(sliding_window(2, 3.0))], clock=clock) as server:
        assert get(server).status_code == 200  # t = 0
        clock.advance(1.0)
        assert get(server).status_code == 200  # t = 1
        clock.advance(0.6)
        throttled = get(server)  # t = 1.6: the one of t = 0 leaves at 3
        assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
        clock.advance(1.4)
        assert get(server).status_code == 200  # t = 3: it left
        assert get(server).headers["Retry-After"] == "1"  # t = 3: the one of t = 1 leaves at 4
        clock.advance(1.0)
        assert get(server).status_code == 200  # t = 4
        clock.advance(0.7)
        assert get(server).headers["Retry-After"] == "2"  # t = 4.7: the one of t = 3 leaves at 6
    # Arrivals 0, 1, 1.6, 3, 3, 4, 4.7: 1.6 is the third in 3 s and opens an overrun
    # window to 4.6 (4 is over too, inside it); 4.7 (the fourth since 1.7) opens another.
    assert server.overruns() == 2


def test_overruns_of_a_sliding_window_are_disjoint_windows():
    window = sliding_window(2, 1.0)
    assert window.overruns([0.0, 0.5, 0.9, 0.95, 1.2]) == 1  # 0.9 opens [0.9, 1.9)
    assert window.overruns([0.0, 0.5, 0.9, 2.0, 2.1, 2.2]) == 2  # 0.9, then 2.2
    assert window.overruns([0.0, 0.6, 1.2, 1.8]) == 0


def test_early_sends_are_judged_by_the_clients_stamp_with_the_in_flight_allowance():
    clock = FakeClock()
    with ScenarioServer([Phase(every_nth(1, retry_after="2"))], clock=clock) as server:
        at = clock.monotonic()
        get(server)  # announces a cooldown until at + 2
        clock.advance(0.5)
        get(server, **{"X-Sent-At": repr(at + 0.1)})  # sent while the 429 was on its way
        get(server, **{"X-Sent-At": repr(at + 0.3)})  # sent 0.3 s into the cooldown: early
        get(server)  # no stamp: judged by its arrival, 0.5 s into it: early
        clock.advance(1.6)
        get(server, **{"X-Sent-At": repr(at + 2.05)})  # after the first cooldown, in later ones
        clock.advance(2.1)
        get(server)  # at + 4.2: after every cooldown (the last one ran to at + 4.1)
    assert [a.early for a in server.seen()] == [False, False, True, True, True, False]
    assert server.early() == 3


def test_the_clients_stamps_are_kept():
    with ScenarioServer([Phase(healthy())]) as server:
        get(server, **{"X-Sent-At": "12.5", "X-Checked-At": "12.25"})
        get(server, **{"X-Sent-At": "nonsense"})
    first, second = server.seen()
    assert (first.sent_at, first.checked_at) == (12.5, 12.25)
    assert (second.sent_at, second.checked_at) == (None, None)


def test_the_adapter_waits_out_the_scripted_cooldown_on_a_fake_clock():
    """The package against a script, server and client on one clock: a deploy's 503s
    with Retry-After 2 for 3 s, then healthy; the call waits twice and gets the 200,
    and nothing is sent early."""
    clock = FakeClock()
    script = [Phase(all_status(503, retry_after="2"), 3.0), Phase(healthy())]
    with ScenarioServer(script, clock=clock) as server:
        with make_session(clock, deadline=10, status_forcelist=(503,)) as session:
            answer = session.get(server.url + "/x", timeout=5)
    assert answer.status_code == 200 and deferral_of(answer) is None
    assert [a.status for a in server.seen()] == [503, 503, 200]
    assert [a.t for a in server.seen()] == pytest.approx([0.0, 2.0, 4.0])
    assert server.early() == 0


def test_a_real_clock_run_stays_short():
    """On the real clock: a 0.3 s phase of 503s, then 200s; windows of its own phase."""
    script = [Phase(all_status(503), 0.3), Phase(fixed_window(3, 0.5))]
    with ScenarioServer(script) as server:
        first = statuses(server, 2)
        time.sleep(0.35)
        later = statuses(server, 4)
    assert first == [503, 503]
    assert later[:3] == [200, 200, 200] and later[3] in (200, 429)
    assert math.isclose(server.goodput(0.0, 0.3).allowed or 0.0, 0.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ScenarioServer([]),
        lambda: ScenarioServer([Phase(healthy()), Phase(healthy())]),
        lambda: ScenarioServer([Phase(healthy(), 0.0), Phase(healthy())]),
        lambda: fixed_window(0, 1.0),
        lambda: fixed_window(1, 0.0),
        lambda: fixed_window(1, 1.0, announce="express"),
        lambda: sliding_window(1, math.inf),
        lambda: every_nth(0),
    ],
)
def test_bad_scripts_are_configuration_errors(make):
    with pytest.raises(ConfigurationError):
        make()
