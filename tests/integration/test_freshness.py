"""Freshness per scope (seed 003: "record last successful retrieval, next eligible
attempt and the integration error class"): kept in every store, written by the engine
after attempts, read by the adapter, ``Counters`` and ``retry-after-adapter status``.
Real parts: every store, a real loopback server, the command line in its own process."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    Counters,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)
from retry_after_adapter.cooldown.freshness import SUCCESS_EVERY

from ..servers import Reply, ThrottleServer
from .conftest import AHEAD

UTC = timezone.utc
NOW = AHEAD
#: Every call runs on a FakeClock at NOW: a day ahead, so Redis keeps what it writes.
pytestmark = pytest.mark.clock_start(NOW)


def test_a_store_keeps_the_last_success_and_the_last_error_class(store: Any) -> None:
    assert store.freshness("s") is None
    store.note("s", "success", NOW)
    store.note("s", "throttled", NOW + timedelta(seconds=1))
    store.note("s", "success", NOW - timedelta(seconds=5))  # older news changes nothing
    store.note("s", "transport", NOW + timedelta(seconds=2))
    store.extend("s", NOW + timedelta(seconds=30))
    record = store.freshness("s")
    assert record.last_success == NOW
    assert (record.last_error, record.last_error_at) == ("transport", NOW + timedelta(seconds=2))
    assert record.next_eligible == NOW + timedelta(seconds=30)
    store.extend("only-cooling", NOW + timedelta(seconds=9))
    entries = store.freshness_entries()
    assert entries["s"] == record
    assert entries["only-cooling"].last_success is None
    assert entries["only-cooling"].next_eligible == NOW + timedelta(seconds=9)


def test_a_note_of_an_unknown_class_is_refused(store: Any) -> None:
    with pytest.raises(ConfigurationError):
        store.note("s", "bad-gateway", NOW)


def adapter(clock: FakeClock, store: Any, **kw: Any) -> tuple[requests.Session, RetryAfterAdapter]:
    mounted = RetryAfterAdapter(
        RetryAfterRetry(clock=clock, total=0, max_wait=0.0, raise_on_status=False, **kw), cooldown=store
    )
    s = requests.Session()
    s.mount("http://", mounted)
    return s, mounted


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(429, {"Retry-After": "30"}), "throttled"),
        (Reply(403, {"Retry-After": "30"}), "throttled"),
        (Reply(503, {"Retry-After": "30"}), "throttled"),
        (Reply(503), "server_error"),
        (Reply(500), "server_error"),
        (Reply(429, {"Retry-After": "soon"}), "invalid_header"),
    ],
)
def test_each_attempt_notes_its_error_class(
    server: ThrottleServer, clock: FakeClock, reply: Reply, expected: str
) -> None:
    store = MemoryCooldownStore()
    session, mounted = adapter(clock, store)
    server.serve([Reply(200), reply])
    assert session.get(server.url).status_code == 200
    clock.advance(2)
    session.get(server.url)
    record = mounted.freshness(server.url)
    assert record is not None
    assert record.last_success == NOW
    assert (record.last_error, record.last_error_at) == (expected, NOW + timedelta(seconds=2))
    if expected == "throttled":
        assert record.next_eligible == NOW + timedelta(seconds=32)
    assert mounted.freshness(mounted.scope_for(requests.Request("GET", server.url).prepare())) == record


def test_a_transport_error_is_noted(clock: FakeClock, closed_port: int) -> None:
    store = MemoryCooldownStore()
    session, mounted = adapter(clock, store)
    with pytest.raises(requests.ConnectionError):
        session.get(f"http://127.0.0.1:{closed_port}/")
    record = mounted.freshness(f"http://127.0.0.1:{closed_port}/x")
    assert record is not None and record.last_error == "transport" and record.last_success is None


def test_a_client_error_says_nothing_of_the_integration(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    session, mounted = adapter(clock, store)
    server.serve([Reply(404)])
    assert session.get(server.url).status_code == 404
    assert mounted.freshness(server.url) is None


def test_successes_are_written_at_most_once_per_success_every(server: ThrottleServer, clock: FakeClock) -> None:
    """A success is written at most once per ``SUCCESS_EVERY`` seconds (5) per scope
    and process: one within it is not written again, the first after it is."""
    store = MemoryCooldownStore()
    session, mounted = adapter(clock, store)
    server.serve([Reply(200)])
    session.get(server.url)
    clock.advance(SUCCESS_EVERY - 0.1)
    session.get(server.url)  # within SUCCESS_EVERY: not written again
    assert mounted.freshness(server.url).last_success == NOW
    clock.advance(0.2)
    session.get(server.url)
    assert mounted.freshness(server.url).last_success == NOW + timedelta(seconds=SUCCESS_EVERY + 0.1)


def test_a_success_after_an_error_is_written_at_once(server: ThrottleServer, clock: FakeClock) -> None:
    """An error noted makes the next success news at once, whatever ``SUCCESS_EVERY``
    says: the record shows the recovery, not the error, a second later."""
    store = MemoryCooldownStore()
    session, mounted = adapter(clock, store)
    server.serve([Reply(200), Reply(500), Reply(200)])
    session.get(server.url)
    clock.advance(0.5)
    session.get(server.url)
    assert mounted.freshness(server.url).last_error == "server_error"
    clock.advance(0.5)
    session.get(server.url)  # within SUCCESS_EVERY of the first success: written all the same
    assert mounted.freshness(server.url).last_success == NOW + timedelta(seconds=1)


def test_counters_export_seconds_since_success_with_bounded_labels(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    for n in range(5):
        store.note(f"https://api{n}.example:443", "success", datetime.now(UTC) - timedelta(seconds=10 * n))
    counters = Counters(freshness=store, max_scopes=3)
    since = counters.snapshot()["seconds_since_success"]
    assert list(since) == ["https://api0.example:443", "https://api1.example:443", "https://api2.example:443"]
    assert 19 <= since["https://api2.example:443"] <= 21
    with pytest.raises(ConfigurationError):
        Counters(freshness=object())


def test_status_prints_freshness_from_another_process(real_server: ThrottleServer, tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SQLiteCooldownStore(path)
    s = requests.Session()
    s.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=0.0, raise_on_status=False), cooldown=store),
    )
    real_server.serve([Reply(200), Reply(429, {"Retry-After": "120"})])
    assert s.get(real_server.url).status_code == 200
    s.get(real_server.url)
    done = subprocess.run(
        [sys.executable, "-m", "retry_after_adapter", "status", "--cooldown", f"sqlite:///{path}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    line = next(row for row in done.stdout.splitlines() if row.startswith("http://127.0.0.1"))
    assert "throttled" in line and "ago" in line
    assert "never" not in line
