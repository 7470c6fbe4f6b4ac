"""Every writer is seen, whatever its ``push`` setting: two real processes on one real
``redis-server`` and on one SQLite file, a loopback HTTP server.

Worker A (this process) keeps calling a scope it knows; worker B (a child process) is
answered 429 with ``Retry-After: 3`` on the same scope and stores the cooldown. From a
little after B's call returned (the documented staleness: what a push's delivery takes,
milliseconds on loopback; the bound here is far above it), A sends nothing until the
cooldown ends, for each of A's and B's ``push`` settings: a store made with
``push=False`` keeps no near copy of its own but still announces what it writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown.guard import guard_of

from ..servers import Reply, Seen, ThrottleServer
from . import edge_children
from .conftest import process_store_place

#: Stores and processes, not a urllib3 line: the README's test command runs them (see tox.ini).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: Seconds after B's call returned from which A must send nothing (the push's delivery
#: takes milliseconds on loopback; a Redis feed's worst case, a channel found stale, is
#: a round trip per attempt at once).
STALENESS = 0.5
#: Seconds A keeps calling after B's call returned (inside B's 3 s cooldown).
WATCH = 1.5


def run_child(what: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.edge_children", what, *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child reported nothing (exit {done.returncode}): {done.stderr[-2000:]}"
    found: dict[str, Any] = json.loads(lines[-1])
    return found


@pytest.fixture
def origin(real_server: ThrottleServer) -> ThrottleServer:
    """``/b`` is answered 429 ``Retry-After: 3``, everything else 200 (one scope: the
    origin)."""

    def respond(seen: Seen) -> Reply:
        return Reply(429, {"Retry-After": "3"}) if seen.path == "/b" else Reply(200)

    real_server.responder = respond
    return real_server


@pytest.mark.parametrize("a_push", [True, False], ids=["A-push", "A-nopush"])
@pytest.mark.parametrize("b_push", [False, True], ids=["B-nopush", "B-push"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_cooldown_any_worker_stores_holds_every_other_worker_back(
    kind: str, a_push: bool, b_push: bool, tmp_path: Path, request: pytest.FixtureRequest,
    origin: ThrottleServer,
) -> None:
    where = process_store_place(kind, tmp_path, request)
    prefix = "seen:"
    store = edge_children.open_store(kind, where, prefix, a_push)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=False))
    assert s.get(origin.url + "/a").status_code == 200
    near = guard_of(store).near
    if a_push:  # A trusts its near copy: the feed fresh, the scope known
        assert near is not None
        deadline = time.monotonic() + 3
        while not near.cooldowns.fresh() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert near.cooldowns.fresh(), "A's change feed did not become fresh"
        assert s.get(origin.url + "/a").status_code == 200
    else:
        assert near is None

    stop = threading.Event()
    statuses: list[int] = []

    def worker_a() -> None:
        while not stop.is_set():
            statuses.append(s.get(origin.url + "/a").status_code)
            time.sleep(0.005)

    a = threading.Thread(target=worker_a, daemon=True)
    a.start()
    try:
        learned = run_child("learn_429", kind, where, prefix, "1" if b_push else "0", origin.url + "/b")
        assert learned["status"] == 429, learned
        stop.wait(max(0.0, learned["done_at"] + WATCH - time.time()))
    finally:
        stop.set()
        a.join(5)
    edge = learned["done_at"] + STALENESS
    arrivals = [seen.at.timestamp() for seen in list(origin.seen) if seen.path == "/a"]
    late = [at for at in arrivals if at > edge]
    after = [at - learned["done_at"] for at in arrivals if at > learned["done_at"]]
    print(
        f"\n{kind} A push={a_push} B push={b_push}: {len(statuses)} calls by A, "
        f"{len(late)} sent more than {STALENESS} s into B's cooldown (the last "
        f"{max(after, default=0.0) * 1000:.1f} ms after B's call returned)"
    )
    assert not late, (
        f"{kind}: A (push={a_push}) sent {len(late)} requests inside the cooldown B (push={b_push}) stored"
    )
    assert statuses.count(429) > 0, "A was never held back"
    guard_of(store).close()
