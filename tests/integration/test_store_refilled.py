"""A store that comes back empty is refilled: a real ``redis-server`` without
persistence is restarted (same port) in the middle of a cooldown while two real
processes use it, and a loopback HTTP server counts what each sends.

Worker B (a child process) is answered 429 with ``Retry-After: 3``; half a second later
the server is killed and started again, empty. B never sends inside its own cooldown
(during the outage its local copy holds it; after, it writes back what it held, and the
store's empty answers never lower it), and worker A (this process) sends nothing inside
it from a second after the server is back (B's write-back, or A's own, reached the store).

A restart nobody noticed (no operation failed in between: the client reconnected at
once) is found out the first time the store answers a scope with less than a running
cooldown the process holds, and treated the same; an operator's ``clear`` is not.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, budget
from retry_after_adapter.cooldown.guard import guard_of

from ..conftest import RedisServer, written_back
from ..servers import Reply, Seen, ThrottleServer
from . import edge_children

REPO = Path(__file__).resolve().parents[2]
#: The cooldown B is told (seconds), and when (seconds into it) the server restarts.
COOLDOWN = 3.0
RESTART_AT = 0.5
#: From this long after the server is back, no worker sends inside the cooldown.
PEERS_WITHIN = 1.0
#: Seconds before the cooldown's end not counted (the end is B's receipt + 3 s; the
#: arrival of its 429 is a little earlier).
EDGE = 0.05

#: Stores and processes, not a urllib3 line: the README's test command runs them (see tox.ini).
pytestmark = [pytest.mark.redis, pytest.mark.slow]


class Origin:
    """``/b``: a 429 ``Retry-After: 3`` the first time, then 200; anything else 200.
    ``throttled_at``: when the 429 was answered (epoch seconds)."""

    def __init__(self, server: ThrottleServer) -> None:
        self.server = server
        self.throttled = threading.Event()
        self.throttled_at = 0.0
        server.responder = self.respond

    def respond(self, seen: Seen) -> Reply:
        if seen.path == "/b" and not self.throttled.is_set():
            self.throttled_at = time.time()
            self.throttled.set()
            return Reply(429, {"Retry-After": str(int(COOLDOWN))})
        return Reply(200)

    def arrivals(self, path: str, start: float, end: float) -> int:
        seen = list(self.server.seen)  # read once both workers stopped
        return sum(1 for one in seen if one.path == path and start < one.at.timestamp() < end)


def start_b(where: str, prefix: str, url: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.edge_children", "keep_calling", "redis", where, prefix,
         "1", url, str(seconds)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def reported(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    out, err = proc.communicate(timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"B reported nothing (exit {proc.returncode}): {err[-2000:]}"
    found: dict[str, Any] = json.loads(lines[-1])
    return found, err


def test_a_redis_restarted_empty_mid_cooldown_is_refilled_and_nobody_sends_inside_it(
    redis_factory: Callable[..., RedisServer], real_server: ThrottleServer
) -> None:
    server = redis_factory()
    origin = Origin(real_server)
    prefix = "refill:"
    store = edge_children.open_store("redis", server.url, prefix, True)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=False))
    assert s.get(real_server.url + "/a").status_code == 200

    stop = threading.Event()

    def worker_a() -> None:
        while not stop.is_set():
            s.get(real_server.url + "/a")
            time.sleep(0.005)

    a = threading.Thread(target=worker_a, daemon=True)
    a.start()
    b = start_b(server.url, prefix, real_server.url + "/b", 4.5)
    try:
        assert origin.throttled.wait(20), "B's 429 never came"
        t0 = origin.throttled_at
        time.sleep(max(0.0, t0 + RESTART_AT - time.time()))
        server.kill()
        server.restart()
        back = time.time()
        stop.wait(max(0.0, t0 + COOLDOWN + 0.2 - time.time()))
    finally:
        stop.set()
        a.join(5)
        found, err = reported(b)
    end = t0 + COOLDOWN - EDGE
    by_b = origin.arrivals("/b", t0, end)
    by_b_after = origin.arrivals("/b", back, end)
    by_a = origin.arrivals("/a", back + PEERS_WITHIN, end)
    guard = guard_of(store)
    print(
        f"\nrestart {back - t0:.2f} s into B's {COOLDOWN:.0f} s cooldown: B sent {by_b} inside it "
        f"({by_b_after} after the restart), A {by_a} from {PEERS_WITHIN} s after; B wrote back "
        f"{found['written_back']}, A {guard.writeback.written_back}"
    )
    assert found["outages"] >= 1 and guard.outages >= 1, "the outage went unnoticed"
    assert "cooldown store RedisCooldownStore failed" in err, err[-2000:]
    assert by_b == 0, f"B sent {by_b} requests inside its own cooldown ({by_b_after} after the restart)"
    assert by_a == 0, f"A sent {by_a} requests inside B's cooldown from {PEERS_WITHIN} s after Redis was back"
    assert found["written_back"] + guard.writeback.written_back >= 1
    guard.close()


def test_a_restart_nobody_noticed_is_detected_and_written_back(
    redis_factory: Callable[..., RedisServer], real_server: ThrottleServer, redis_module: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """This process learns a 429's cooldown (written to the store); the server is killed
    and started again, empty, with no operation of this process in between, so its
    client reconnects without an error. Its next call is not sent (the store's empty
    answer is found to be a loss, not an operator's clear), every cooldown it holds is
    written back (a second scope too), and a process that starts afterwards is held back
    by it. An operator's ``clear`` after that still lifts the scope here."""
    server = redis_factory()
    prefix = "unnoticed:"
    real_server.serve([Reply(429, {"Retry-After": "60"}), Reply(200)])
    store = edge_children.open_store("redis", server.url, prefix, True)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=False))
    scope = f"http://127.0.0.1:{real_server.port}"
    assert s.get(real_server.url).status_code == 429 and real_server.count() == 1
    guard = guard_of(store)
    other = datetime.now(timezone.utc) + timedelta(seconds=60)
    guard.extend("another-scope", other)
    assert store.get(scope) is not None and guard.pending == 0 and not guard.down

    server.kill()
    server.restart()
    assert store.get(scope) is None  # empty, and no error on the way
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        response = s.get(real_server.url)
    assert real_server.count() == 1, "a call was sent inside this process's own cooldown after a restart"
    assert response.status_code == 429 and response.headers.get("X-Local-Deferral")
    assert any("lost" in record.getMessage() for record in caplog.records), caplog.text
    written_back(guard)  # by the writer thread, at once (not on the call's thread)
    assert store.get(scope) is not None, "the cooldown was not written back"
    assert store.get("another-scope") is not None, "another cooldown this process held was not written back"
    peer = subprocess.run(
        [sys.executable, "-m", "tests.integration.edge_children", "keep_calling", "redis", server.url, prefix,
         "1", real_server.url, "0.2"],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert real_server.count() == 1, f"a peer sent inside the written-back cooldown: {peer.stdout[-500:]}"
    # An operator's clear is not a loss: it lifts the scope here too.
    edge_children.open_store("redis", server.url, prefix, False).delete(scope)
    assert s.get(real_server.url).status_code == 200 and real_server.count() == 2
    guard.close()


def test_writing_back_thousands_of_cooldowns_holds_no_call_past_its_deadline(
    redis_factory: Callable[..., RedisServer], real_server: ThrottleServer, redis_module: Any,
) -> None:
    """A process holds 3,000 running cooldowns when its Redis loses them all (FLUSHDB: a
    loss nobody noticed). The next call, under ``budget(deadline=0.05)``, finds the
    loss and is not sent (its own cooldown holds), and returns within its deadline: the
    write-back (a round trip a scope) is the writer thread's, which refills the store
    soon after."""
    server = redis_factory()
    real_server.serve([Reply(429, {"Retry-After": "120"})])
    store = edge_children.open_store("redis", server.url, "many:", True)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=0, raise_on_status=False),
                                         cooldown=store, learn_rate=False))
    assert s.get(real_server.url).status_code == 429 and real_server.count() == 1
    guard = guard_of(store)
    until = datetime.now(timezone.utc) + timedelta(seconds=120)
    for i in range(3000):
        guard.extend(f"scope-{i}", until)
    assert guard.pending == 0
    redis_module.Redis(port=server.port).flushdb()
    started = time.monotonic()
    with budget(deadline=0.05):
        response = s.get(real_server.url)
    took = time.monotonic() - started
    assert response.status_code == 429 and response.headers.get("X-Local-Deferral")
    assert real_server.count() == 1
    assert took < 0.05 + 0.3, f"the call took {took:.3f} s under a 0.05 s deadline"
    written_back(guard, within=30)
    assert guard.pending == 0 and store.get("scope-2999") is not None


def test_an_announced_allowance_held_when_the_store_failed_is_written_back(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """An allowance used up (``0`` left until a reset 30 s away) is in the store and the
    process's local copy; the server is killed (this process notices: an operation
    fails) and started again, empty. Without another call of this process, its writer
    thread writes the allowance back: a process that asks afterwards is held back until
    the reset."""
    from retry_after_adapter.cooldown import Ask

    server = redis_factory()
    prefix = "allowance:"
    store = edge_children.open_store("redis", server.url, prefix, True)
    guard = guard_of(store)
    now = datetime.now(timezone.utc)
    reset = now + timedelta(seconds=30)
    guard.allow("api", 0, reset, now)
    other = edge_children.open_store("redis", server.url, prefix, False)
    assert other.admit(Ask(scope="api")).not_before is not None
    server.kill()
    guard.get("api")  # fails: the outage is noticed
    assert guard.down
    server.restart()
    assert other.admit(Ask(scope="api")).not_before is None  # empty
    deadline = time.monotonic() + 3
    while other.admit(Ask(scope="api")).not_before is None and time.monotonic() < deadline:
        time.sleep(0.05)
    held = other.admit(Ask(scope="api")).not_before
    assert held is not None and abs((held - reset).total_seconds()) < 0.01, held
    assert guard.writeback.allowances_written_back == 1
    guard.close()
