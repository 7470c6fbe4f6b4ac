"""The project's one quota server (``retry_after_adapter.testing.QuotaServer``): the demo,
the benchmarks' fleets and the README run on it, so its rules are pinned here."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
)
from retry_after_adapter.clock import SystemClock
from retry_after_adapter.testing import QuotaServer
from retry_after_adapter.testing.server import LOG_FIELDS


def test_epoch_windows_on_the_injected_clock():
    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 55, tzinfo=timezone.utc))
    with QuotaServer(2, 60, clock=clock) as server:
        statuses = [requests.get(server.url + f"/{n}", timeout=5) for n in range(3)]
        assert [r.status_code for r in statuses] == [200, 200, 429]
        assert statuses[2].headers["Retry-After"] == "5"  # the window ends at 00:01:00
        clock.advance(5)
        assert requests.get(server.url + "/next", timeout=5).status_code == 200
        stats = server.stats()
        assert (stats.requests, stats.ok, stats.throttled) == (4, 3, 1)


def test_date_form_announces_the_window_end_as_an_http_date():
    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 55, tzinfo=timezone.utc))
    with QuotaServer(1, 60, clock=clock, form="date") as server:
        requests.get(server.url, timeout=5)
        throttled = requests.get(server.url, timeout=5)
        assert throttled.headers["Retry-After"] == "Thu, 01 Jan 2026 00:01:00 GMT"


def test_windows_from_the_first_request_and_the_log():
    with QuotaServer(1, 120, align="first") as server:
        requests.get(
            server.url + "/a", headers={"X-Sent-At": "12.5", "X-Client": "p1", "X-Item": "7"}, timeout=5
        )
        second = requests.get(server.url + "/b", timeout=5)
        assert second.status_code == 429 and 119 <= int(second.headers["Retry-After"]) <= 120
        data = requests.get(server.url + "/__log", timeout=5).json()
    assert data["fields"] == list(LOG_FIELDS) and data["quota"] == 1 and data["window"] == 120
    first, throttled = (dict(zip(data["fields"], entry)) for entry in data["log"])
    assert (first["sent_at"], first["client"], first["item"], first["status"]) == (12.5, "p1", 7, 200)
    assert throttled["status"] == 429 and throttled["retry_after"] == int(second.headers["Retry-After"])
    assert first["window"] == throttled["window"] == 0 and first["arrival"] <= first["reply_at"]


def test_windows_from_the_first_request_run_on_the_server_clock():
    """A window counted from the first request ends when the server's clock says so (as
    a real server's does), not its monotonic one: here only the injected clock moves."""
    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 0, 400000, tzinfo=timezone.utc))
    with QuotaServer(1, 10, align="first", clock=clock) as server:
        assert [requests.get(server.url, timeout=5).status_code for _ in range(2)] == [200, 429]
        clock.advance(9.9)
        assert requests.get(server.url, timeout=5).status_code == 429
        clock.advance(0.1)
        assert requests.get(server.url, timeout=5).status_code == 200
        clock.set_now(clock.now() - timedelta(seconds=30))  # a step back starts no window again
        assert requests.get(server.url, timeout=5).status_code == 429


class AheadClock(SystemClock):
    """A wall clock that gains 8% on the monotonic one, as a virtual machine's does when
    its host steps it forward again and again."""

    def __init__(self) -> None:
        super().__init__()
        self._start = time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=(time.monotonic() - self._start) * 0.08)


def test_a_fleet_and_the_server_agree_where_the_wall_clock_gains_on_the_monotonic_one():
    """Eight threads, 3 requests per 1 s announced as OpenAI does (resets as durations),
    client and server on one wall clock gaining 8% on the monotonic clock: the client
    reads each reset on that clock and the server counts its windows on it, so no
    request lands before a reset (with the windows counted on the monotonic clock, most
    such runs saw two 429s, as CI's machine once did)."""
    clock = AheadClock()
    with QuotaServer(3, 1, align="first", quota_headers="openai", clock=clock) as server:
        adapter = RetryAfterAdapter(RetryAfterRetry(total=5, max_wait=10, clock=clock), cooldown=MemoryCooldownStore())
        with requests.Session() as session:
            session.mount("http://", adapter)
            threads = [
                threading.Thread(target=session.get, args=(server.url + "/v1/models",), kwargs={"timeout": 10})
                for _ in range(8)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20)
        stats = server.stats()
    assert stats.ok == 8 and stats.early == 0
    assert stats.throttled <= 1, stats


def test_the_llm_stand_ins_refill_continuously_and_announce_the_time_to_full():
    """``quota_headers="openai"``: a bucket of 10 refilled at 2 a second (as OpenAI
    documents its limits), each answer saying what is left, whole, and the time until
    it is full; past it a 429 whose wait is the next request's."""
    clock = FakeClock(start=datetime(2026, 1, 1, tzinfo=timezone.utc))
    with QuotaServer(10, 5, align="first", quota_headers="openai", clock=clock) as server:
        said = [requests.post(server.url + "/v1/chat/completions", timeout=5) for _ in range(11)]
        assert [r.status_code for r in said] == [200] * 10 + [429]
        assert [said[i].headers["x-ratelimit-remaining-requests"] for i in (0, 9)] == ["9", "0"]
        assert [said[i].headers["x-ratelimit-reset-requests"] for i in (0, 9)] == ["500ms", "5s"]
        assert said[10].headers["retry-after-ms"] == "500" and said[10].headers["retry-after"] == "1"
        clock.advance(0.75)  # one and a half back: one goes, half of the next is there
        assert requests.get(server.url + "/v1/models", timeout=5).headers["x-ratelimit-reset-requests"] == "4.75s"
        assert requests.get(server.url + "/v1/models", timeout=5).status_code == 429
    assert server.stats().throttled == 2


def test_an_llm_stand_in_in_whole_seconds_and_its_options():
    clock = FakeClock(start=datetime(2026, 1, 1, tzinfo=timezone.utc))
    with QuotaServer(180, 360, quota_headers="anthropic", clock=clock, reset_precision=1, filled=1) as server:
        answer = requests.get(server.url + "/v1/models", timeout=5)
        assert answer.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert answer.headers["anthropic-ratelimit-requests-reset"] == "2026-01-01T00:06:00Z"
        assert requests.get(server.url + "/v1/models", timeout=5).status_code == 429
    with QuotaServer(3, 1, quota_headers="openai", refill="window", clock=clock) as window:
        assert [requests.get(window.url, timeout=5).status_code for _ in range(4)] == [200, 200, 200, 429]
    for bad in ({"refill": "bucket"}, {"reset_precision": 2}, {"filled": 4}, {"filled": True}):
        with pytest.raises(ConfigurationError):
            QuotaServer(3, 1, quota_headers="openai", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="continuous"):
        QuotaServer(3, 1, quota_headers="ietf", refill="continuous")


def test_it_runs_in_its_own_process_for_the_benchmarks():
    proc = subprocess.Popen(
        [sys.executable, "-m", "retry_after_adapter.demo", "--serve", "1", "60"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT ")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        assert [requests.get(url, timeout=5).status_code for _ in range(2)] == [200, 429]
        assert len(json.loads(requests.get(url + "/__log", timeout=5).text)["log"]) == 2
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0  # SIGTERM ends it cleanly


@pytest.mark.parametrize(
    "kwargs",
    [{"quota": 0}, {"window": 0}, {"form": "weeks"}, {"align": "noon"}, {"align": "first", "form": "date"}],
)
def test_bad_settings_are_configuration_errors(kwargs):
    args = {"quota": 1, "window": 1.0, **kwargs}
    with pytest.raises(ConfigurationError):
        QuotaServer(**args)


def test_a_cooldown_announced_is_running_for_later_senders():
    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 0, tzinfo=timezone.utc))
    with QuotaServer(1, 60, clock=clock) as server:
        requests.get(server.url, timeout=5)
        requests.get(server.url, timeout=5)
        assert server.cooldown_running(clock.now() + timedelta(seconds=1))
        assert not server.cooldown_running(clock.now() + timedelta(seconds=61))


def test_the_demo_still_exports_the_server():
    # Its home was the demo module: code that imports it from there keeps working.
    from retry_after_adapter import demo

    assert demo.QuotaServer is QuotaServer and demo.LOG_FIELDS is LOG_FIELDS


def test_the_express_mode_is_express_rate_limit_v7():
    """source/memory-store.ts (increment: the window restarts at the first hit at or
    after its reset; every hit counts), source/headers.ts (setLegacyHeaders, which sets
    Date itself, and setRetryAfterHeader) and source/lib.ts (429 once totalHits >
    limit); the same in v8 (8.7.5)."""
    import math

    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 0, 300000, tzinfo=timezone.utc))
    server = QuotaServer(2, 5.0, clock=clock, quota_headers="express")
    try:
        epoch = clock.now().timestamp()
        status, told, _, date = server._decide("/a")
        assert status == 200 and date == "Thu, 01 Jan 2026 00:00:00 GMT"
        assert list(told.items()) == [
            ("X-RateLimit-Limit", "2"),
            ("X-RateLimit-Remaining", "1"),
            ("Date", "Thu, 01 Jan 2026 00:00:00 GMT"),  # the decision's second, truncated
            ("X-RateLimit-Reset", str(math.ceil(epoch + 5))),
        ]
        clock.advance(1.0)
        assert server._decide("/a")[1]["X-RateLimit-Remaining"] == "0"
        clock.advance(1.0)
        status, told, _, _ = server._decide("/a")
        assert status == 429 and told["Retry-After"] == "3"  # ceil(5.3 - 2.3)
        assert told["X-RateLimit-Remaining"] == "0"
        clock.advance(3.5)  # past the reset (5.3 s): the next hit starts a new window
        status, told, _, _ = server._decide("/a")
        assert status == 200 and told["X-RateLimit-Remaining"] == "1"
        assert told["X-RateLimit-Reset"] == str(math.ceil(epoch + 5.5 + 5))
        # Another client has its own window.
        assert server._decide("/a", client="10.0.0.2")[1]["X-RateLimit-Remaining"] == "1"
    finally:
        server.stop()


def test_the_adapter_against_express_legacy_headers_sends_nothing_before_a_reset():
    """express-rate-limit's legacy headers (whole-second resets, no window said), the
    server and the client on one FakeClock: 12 items, 3 per 5 s, one after another.
    Each window's nothing-left answer holds the scope until its reset, read against
    the server's clock as the answers' Dates bound it; nothing is sent before it, and
    each window costs at most the reset's rounding (a second) and the answer that
    finds it open (a tenth)."""
    from retry_after_adapter import MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry

    clock = FakeClock(start=datetime(2026, 1, 1, 0, 0, 0, 300000, tzinfo=timezone.utc))
    with QuotaServer(3, 5.0, clock=clock, quota_headers="express") as server:
        session = requests.Session()
        retry = RetryAfterRetry(total=3, max_wait=10, clock=clock)
        session.mount("http://", RetryAfterAdapter(retry, cooldown=MemoryCooldownStore()))
        start = clock.monotonic()
        for n in range(12):
            clock.advance(0.1)  # each answer takes a tenth of a second
            assert session.get(f"{server.url}/item/{n}", timeout=10).status_code == 200
        took = clock.monotonic() - start
        stats = server.stats()
    assert stats.requests == 12 and stats.throttled == 0 and stats.early == 0
    assert 15 <= took <= 15 + 3 * (1.0 + 0.1) + 1e-6, took


def _express_worker(clock: FakeClock, store: object) -> requests.Session:
    """A session whose calls defer at once (max_wait 0) instead of waiting."""
    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry

    session = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0, clock=clock)
    session.mount("http://", RetryAfterAdapter(retry, cooldown=store))  # type: ignore[arg-type]
    return session


def test_express_resets_are_read_against_the_server_clock_learned_across_windows():
    """Whole-second Dates: an answer made just after a tick tells the server's clock
    within its round trip, and that holds for later windows, whose own answers come
    late in their second. Nothing is sent before the server's reset."""
    from retry_after_adapter import MemoryCooldownStore

    from ..conftest import local_deferral

    day = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda seconds: day + timedelta(seconds=seconds)  # noqa: E731
    clock = FakeClock(start=at(0.95))
    store = MemoryCooldownStore()
    with QuotaServer(2, 5.0, clock=clock, quota_headers="express") as server:
        worker = _express_worker(clock, store)
        # Window 1 starts at 0.95 (its reset 5.95, said "6"); the answer at 1.05 (Date
        # 1) places the server's clock within the answer's round trip (none here).
        assert worker.get(server.url + "/a", timeout=5).status_code == 200
        clock.advance(0.1)
        assert worker.get(server.url + "/b", timeout=5).headers["X-RateLimit-Remaining"] == "0"
        deferral = local_deferral(worker.get(server.url + "/c", timeout=5))
        assert deferral.reason == "cooldown" and deferral.eligible_at == at(6.05)
        # Window 2 starts at 6.7 (its reset 11.7, said "12"): its answers, at 6.7 and
        # 6.8 with Date 6, say 12.7 and 12.8 each. The server's clock learned in window
        # 1 says 12.05 (and 0.1 ms of drift allowed since).
        clock.advance(5.65)
        assert worker.get(server.url + "/d", timeout=5).status_code == 200
        clock.advance(0.1)
        assert worker.get(server.url + "/e", timeout=5).headers["X-RateLimit-Remaining"] == "0"
        deferral = local_deferral(worker.get(server.url + "/f", timeout=5))
        assert at(12.05) <= deferral.eligible_at <= at(12.051)
        # At that time the server has reset: the next request is a 200, nothing early.
        clock.advance((deferral.eligible_at - clock.now()).total_seconds())
        assert worker.get(server.url + "/g", timeout=5).status_code == 200
        stats = server.stats()
    assert (stats.requests, stats.throttled, stats.early) == (5, 0, 0)


def test_a_server_clock_stepped_back_is_noticed_and_nothing_is_sent_early():
    """What the answers taught of the server's clock no longer fits once it steps back
    3 s: the bounds start again from the newest answer, and the reset the server
    announced on its new clock is waited for in full."""
    from retry_after_adapter import MemoryCooldownStore

    from ..conftest import local_deferral

    day = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda seconds: day + timedelta(seconds=seconds)  # noqa: E731
    clock = FakeClock(start=at(0.95))
    server_clock = FakeClock(start=at(0.95))
    store = MemoryCooldownStore()

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        server_clock.advance(seconds)

    with QuotaServer(2, 5.0, clock=server_clock, quota_headers="express") as server:
        worker = _express_worker(clock, store)
        assert worker.get(server.url + "/a", timeout=5).status_code == 200
        advance(0.1)
        assert worker.get(server.url + "/b", timeout=5).status_code == 200  # learned: within 0
        advance(6.0)
        assert worker.get(server.url + "/c", timeout=5).status_code == 200  # window 2 (7.05 to 12.05)
        server_clock.set_now(server_clock.now() - timedelta(seconds=3))  # the server's clock steps back
        advance(0.1)
        answer = worker.get(server.url + "/d", timeout=5)
        assert answer.headers["X-RateLimit-Remaining"] == "0" and answer.headers["Date"].endswith("00:00:04 GMT")
        # The server resets at its 12.05, our 15.05, said "13" (our 16): read against its
        # new clock, not the 3 s earlier one learned before the step.
        deferral = local_deferral(worker.get(server.url + "/e", timeout=5))
        assert deferral.eligible_at >= at(15.05)
        advance((deferral.eligible_at - clock.now()).total_seconds())
        assert worker.get(server.url + "/f", timeout=5).status_code == 200
        assert server.stats().throttled == 0


def test_the_express_mode_sends_what_node_sends_and_closes_idle_connections(monkeypatch):
    """express 5 on Node 20 with express-rate-limit 8.7.5, as recorded: its fields in
    its order, and a connection closed 6 s (here shortened) after its last answer, as
    Node's keepAliveTimeout (5 s, announced) plus its 1 s buffer do."""
    import socket

    from retry_after_adapter.testing import server as module

    monkeypatch.setattr(module, "NODE_IDLE_CLOSE", 0.3)
    with QuotaServer(1, 5.0, quota_headers="express") as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            reader = sock.makefile("rb")
            names = []
            for path in ("/a", "/b"):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                status = reader.readline()
                fields = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    fields[name] = value.strip()
                reader.read(int(fields["Content-Length"]))
                names.append((status.split()[1], list(fields)))
            assert names[0] == (
                b"200",
                ["X-Powered-By", "X-RateLimit-Limit", "X-RateLimit-Remaining", "Date", "X-RateLimit-Reset",
                 "Content-Type", "Content-Length", "ETag", "Connection", "Keep-Alive"],
            )  # fmt: skip
            assert names[1][0] == b"429" and "Retry-After" in names[1][1]
            sock.settimeout(2)
            assert reader.read(1) == b""  # closed by the server once idle
