"""A dead process costs the others a second, not a lease: real forked children that
leave with ``os._exit``, a real ``multiprocessing`` pool whose workers each run one
task, and a real worker process SIGKILLed while its threads hold concurrency slots (in
use and parked for reuse), on a real SQLite file and the session's real Redis, against
a loopback server that counts what it holds at once.

A slot a process keeps for reuse (parked between its threads' attempts) is stored
with a short life that the process renews while it keeps it (``_near.LIFE``), so the
capacity a process that dies kept for reuse comes back within about a second, not
``lease_ttl`` (60 s by default); a slot an attempt uses counts its ``lease_ttl``
whatever the renewals do (a slow store, a starved process: the cap holds at the server).
A forked child starts with none of its parent's slots, nor its parent's kept-alive
connections. The cap still holds at the server throughout.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown import Ask, Lease, _near
from retry_after_adapter.cooldown.guard import guard_of
from tests.integration import near_children
from tests.servers import HoldingServer

KINDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis)]
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
FIGURES: dict[str, Any] = {}


def where_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return str(tmp_path / "shared.db")
    request.getfixturevalue("redis_client")  # emptied before and after
    return str(request.getfixturevalue("redis_url"))


def capped_session(store: Any, cap: int, **retry_kw: Any) -> requests.Session:
    """A Session with ``max_concurrency=cap`` and the default ``lease_ttl`` (60 s)."""
    retry_kw.setdefault("total", 2)
    s = requests.Session()
    adapter = RetryAfterAdapter(RetryAfterRetry(**retry_kw), cooldown=store, max_concurrency=cap, learn_rate=False)
    s.mount("http://", adapter)
    return s


@pytest.fixture
def holding() -> Any:
    server = HoldingServer(hold=0.005)
    yield server
    server.close()


# =================================================== 1. forked children and os._exit
CHILDREN, WAVE, CAP = 120, 8, 64


def _getter(client: str, store: Any, url: str) -> Any:
    """One GET of ``url`` through ``client`` (requests, httpx, or httpx's async
    transport run in a loop of its own) on ``store`` with ``max_concurrency=64``: a
    callable answering ``(status, deferred)``."""
    retry = RetryAfterRetry(total=2, max_wait=5, deadline=10)
    if client == "requests":
        s = capped_session(store, CAP, max_wait=5, deadline=10)
        return lambda: (lambda r: (r.status_code, r.deferral is not None))(s.get(url, timeout=10))
    import httpx

    from retry_after_adapter import deferral_of
    from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport

    if client == "httpx":
        c = httpx.Client(transport=RetryAfterTransport(retry, cooldown=store, max_concurrency=CAP, learn_rate=False))
        return lambda: (lambda r: (r.status_code, deferral_of(r) is not None))(c.get(url, timeout=10))

    # Made once: a forked child's makes its own connections (see _httpx_family).
    transport = AsyncRetryAfterTransport(retry, cooldown=store, max_concurrency=CAP, learn_rate=False)

    async def one() -> tuple[int, bool]:
        async with httpx.AsyncClient(transport=transport) as c:
            r = await c.get(url, timeout=10)
            return r.status_code, deferral_of(r) is not None

    import asyncio

    return lambda: asyncio.run(one())


@needs_fork
@pytest.mark.parametrize("client", ["requests", "httpx", "httpx-async"])
@pytest.mark.parametrize("kind", KINDS)
def test_forked_children_that_leave_with_os_exit_all_get_their_call(
    kind: str, client: str, tmp_path: Path, request: pytest.FixtureRequest, holding: HoldingServer
) -> None:
    """A process with ``max_concurrency=64`` (one call made: its slot parked for reuse)
    forks 120 children, 8 at a time; each makes one GET (requests, httpx, httpx's
    async transport) and leaves with ``os._exit`` (no exit hook runs: its parked slot
    is never given back). Every child's GET goes (a dead child's slot stops counting
    within about a second; none waits as long as ``max_wait`` 5 s), never more than 64
    at the server, and no child used its parent's parked slot (the parent's slot is
    still the parent's)."""
    store = near_children.open_store(kind, where_for(kind, tmp_path, request), "forked:")
    get = _getter(client, store, holding.url)
    assert get() == (200, False)
    near = guard_of(store).near
    assert near is not None
    parking = time.monotonic() + 1.0  # the async transport gives the slot back on the store's thread
    while not near.slots._idle and time.monotonic() < parking:
        time.sleep(0.001)
    assert near.slots._idle, "the parent's slot was not parked for reuse"
    parked = [slot.token for slots in near.slots._idle.values() for slot in slots]
    served = deferred = 0
    waits: list[float] = []
    started = time.monotonic()
    read, write = os.pipe()
    for first in range(0, CHILDREN, WAVE):
        pids = []
        for _ in range(min(WAVE, CHILDREN - first)):
            pid = os.fork()
            if pid == 0:  # the child: one GET, then os._exit
                code = 1
                try:
                    os.close(read)
                    t0 = time.monotonic()
                    status, deferred_here = get()
                    os.write(write, json.dumps({"wait": time.monotonic() - t0}).encode() + b"\n")
                    code = 0 if status == 200 and not deferred_here else 3
                finally:
                    os._exit(code)
            pids.append(pid)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            served += code == 0
            deferred += code == 3
    os.close(write)
    with os.fdopen(read) as lines:
        waits = [json.loads(line)["wait"] for line in lines]
    wall = time.monotonic() - started
    FIGURES[f"forked children, {kind}, {client}"] = (served, deferred, max(waits, default=0), wall)
    print(f"\n{kind}, {client}: {served} of {CHILDREN} children served, {deferred} deferred, "
          f"longest call {max(waits, default=0):.3f} s, wall {wall:.2f} s, most at the server {holding.most}")
    assert served == CHILDREN, f"{served} of {CHILDREN} forked children served ({deferred} deferred)"
    assert holding.most <= CAP
    # The parent's parked slot was nobody else's: still its own (or given back by it).
    assert all(token not in near.slots._held or near.slots._held[token].scope for token in parked)


# ============================================ 2. a multiprocessing pool, one task each
POOL, TASKS = 4, 48
_POOL_SESSION: list[requests.Session] = []


def _pool_task(url: str) -> float:
    """A pool worker's task: one GET through the Session made before the pool forked
    (its store's guard and near copy inherited, emptied in the child): its wall time."""
    t0 = time.monotonic()
    response = _POOL_SESSION[0].get(url, timeout=10)
    assert response.status_code == 200, response.status_code
    return time.monotonic() - t0


@needs_fork
@pytest.mark.parametrize("quota", [None, 30], ids=["cap", "cap+quota"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_pool_with_one_task_per_worker_never_waits_for_a_lease(
    kind: str, quota: int | None, tmp_path: Path, request: pytest.FixtureRequest, holding: HoldingServer
) -> None:
    """``multiprocessing.Pool(4, maxtasksperchild=1)`` runs 48 tasks, each one GET
    through a Session with ``max_concurrency=4`` (and ``Quota(30, per=1)``: open
    permits, each settled by its answer) made (and used) in the parent before the pool
    forks: no task waits over 2.5 s (a worker ends through multiprocessing's exit
    function, not ``atexit``: what it parked and the settles it has waiting are written
    then), and the server never holds more than 4."""
    store = near_children.open_store(kind, where_for(kind, tmp_path, request), "pool:")
    s = capped_session(store, POOL, max_wait=10, deadline=20)
    if quota is not None:
        s.mount("http://", RetryAfterAdapter(
            RetryAfterRetry(total=2, max_wait=10, deadline=20), cooldown=store, max_concurrency=POOL,
            quota=Quota(quota, per=1), learn_rate=False,
        ))  # fmt: skip
    assert s.get(holding.url, timeout=10).status_code == 200  # the parent parks a slot
    _POOL_SESSION[:] = [s]
    started = time.monotonic()
    try:
        with multiprocessing.get_context("fork").Pool(POOL, maxtasksperchild=1) as pool:
            waits = pool.map(_pool_task, [holding.url] * TASKS, chunksize=1)
    finally:
        _POOL_SESSION.clear()
    wall = time.monotonic() - started
    FIGURES[f"pool, {kind}, quota {quota}"] = (max(waits), wall)
    print(f"\n{kind}, quota {quota}: {TASKS} tasks, longest {max(waits):.3f} s, wall {wall:.2f} s, most at the server {holding.most}")
    assert max(waits) <= 2.5, f"a task waited {max(waits):.2f} s (waits: {sorted(waits)[-5:]})"
    assert holding.most <= POOL


# ====================================== 3. a SIGKILLed worker holding slots in use and parked
THREADS = 8
#: The killed worker's ``lease_ttl`` (seconds): what its slots in use at the kill count.
KILLED_TTL = 3.0


@pytest.mark.parametrize("kind", KINDS)
def test_a_sigkilled_worker_s_slots_come_back_by_their_attempts_lease(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker process runs 8 threads of GETs (``max_concurrency=8``, ``lease_ttl``
    3 s) against a server that holds each 20 ms, so at any moment it holds slots in
    use and parked; it is SIGKILLed. This process then measures how long until it can
    take all 8 slots itself: those in use at the kill count their attempts'
    ``lease_ttl`` (a slot on the wire never depends on a renewal), those parked about a
    second: all back within 3 s + 1.5 s, none of them kept for the renewed life alone."""
    where = where_for(kind, tmp_path, request)
    server = HoldingServer(hold=0.02)
    prefix = "sigkill:"
    scope = server.url.rsplit("/", 1)[0]
    store = near_children.open_store(kind, where, prefix)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.near_children", "busy_until_killed",
             kind, where, prefix, server.url, str(THREADS), "", str(KILLED_TTL)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while server.total < 50 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            assert server.total >= 50, f"the worker did not get going ({proc.poll()})"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        busy = store.lease(scope, THREADS, 5.0, None, "probe-busy")
        held_at_kill = busy is not None
        if busy is None:
            store.release(scope, "probe-busy")
        taken: list[str] = []
        limit = time.monotonic() + KILLED_TTL + 3.0
        while len(taken) < THREADS and time.monotonic() < limit:
            token = f"mine-{len(taken)}"
            if store.lease(scope, THREADS, 5.0, None, token) is None:
                taken.append(token)
            else:
                time.sleep(0.005)
        back = time.monotonic() - killed
    finally:
        server.close()
    FIGURES[f"sigkill, {kind}"] = (back, held_at_kill)
    print(f"\n{kind}: the killed worker's slots all back {back:.3f} s after the kill "
          f"(all 8 held right after: {held_at_kill}), {server.total} requests, most at the server {server.most}")
    assert len(taken) == THREADS, f"only {len(taken)} of {THREADS} slots came back within {KILLED_TTL + 3} s"
    assert back <= KILLED_TTL + 1.5, f"the killed worker's slots came back {back:.2f} s after the kill"
    assert server.most <= THREADS


# ================================ 4. renewal: what keeps a live process's slots counted
def test_renew_moves_held_leases_later_and_never_takes_a_lapsed_one_again(store: Any) -> None:
    """``LeaseRenewal.renew`` on every store, at explicit times: a lease held is moved
    later (a probe is refused until its new end), one that expired or was given back
    is answered as not held and not taken again."""
    t0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
    second = timedelta(seconds=1)
    for token in ("a", "b", "c"):
        assert store.admit(Ask(scope="renewed", now=t0, lease=Lease(slots=3, ttl=1.0, token=token))).not_before is None
    store.release("renewed", "c")
    lost = store.renew([("renewed", "a", t0 + 5 * second), ("renewed", "c", t0 + 5 * second)], t0 + second / 2)
    assert lost == {"c"}
    # At t0 + 2 s: "b" lapsed (1 s), "a" holds until t0 + 5 s, "c" was not taken again.
    at = t0 + 2 * second
    assert store.admit(Ask(scope="renewed", now=at, lease=Lease(slots=2, ttl=10.0, token="x"))).not_before is None
    refused = store.admit(Ask(scope="renewed", now=at, lease=Lease(slots=2, ttl=1.0, token="y")))
    assert refused.not_before == t0 + 5 * second, refused
    assert store.renew([("renewed", "b", t0 + 9 * second)], at) == {"b"}
    assert store.admit(Ask(scope="renewed", now=at, lease=Lease(slots=3, ttl=1.0, token="z"))).not_before is None


@pytest.mark.parametrize("kind", KINDS)
def test_an_attempt_longer_than_a_slot_s_life_keeps_its_slot(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An attempt the server holds 1.5 s (``max_concurrency=1``, ``lease_ttl`` 60 s):
    its slot, taken with a life of ``LIFE`` (1 s), is renewed while the attempt runs,
    so another process asking for the slot 1.2 s in is refused; once it is answered
    and its slot idle long enough to go back, the slot is free."""
    where = where_for(kind, tmp_path, request)
    server = HoldingServer(hold=1.5)
    scope = server.url.rsplit("/", 1)[0]
    store = near_children.open_store(kind, where, "long:")
    other = near_children.open_store(kind, where, "long:")  # plain store operations
    s = capped_session(store, 1, total=0)
    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(s.get(server.url, timeout=10).status_code))
    try:
        thread.start()
        deadline = time.monotonic() + 5
        while server.total < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        sent = time.monotonic()
        time.sleep(max(0.0, sent + 1.2 - time.monotonic()))
        assert _near.LIFE < 1.2
        refused = other.lease(scope, 1, 5.0, None, "other")
        assert refused is not None, "the slot of an attempt still on the wire stopped counting past its life"
        thread.join(10)
    finally:
        server.close()
    assert results == [200]
    deadline = time.monotonic() + 2
    while other.lease(scope, 1, 5.0, None, "other") is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert time.monotonic() < deadline, "the slot did not go back after its attempt"


# ========================== 5. a forked child's connections are its own, not its parent's
@needs_fork
def test_forked_children_do_not_read_from_their_parent_s_kept_alive_connection(holding: HoldingServer) -> None:
    """A Session (``RetryAfterAdapter``) and a ``RetryAfterPoolManager`` each keep a
    connection alive from the parent's call; 8 children forked at once each make one
    call through each: every call is answered (a child reading from its parent's socket
    took another's answer or waited for it until its read timeout)."""
    from retry_after_adapter import RetryAfterPoolManager

    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=None))
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=0), cooldown=None)
    assert s.get(holding.url, timeout=5).status_code == 200
    assert manager.request("GET", holding.url, timeout=5).status == 200
    pids = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ok = s.get(holding.url, timeout=3).status_code == 200
                ok = manager.request("GET", holding.url, timeout=3).status == 200 and ok
                code = 0 if ok else 3
            finally:
                os._exit(code)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert codes == [0] * 8, f"children's exit codes {codes} (1: a call raised, a read timeout)"
    assert s.get(holding.url, timeout=5).status_code == 200  # the parent's still serve it
    assert manager.request("GET", holding.url, timeout=5).status == 200


# ====================================== 6. a SIGKILLed worker's open permits
@pytest.mark.parametrize("kind", KINDS)
def test_a_sigkilled_worker_s_open_permits_stop_counting_within_about_a_second(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker process runs 8 threads of GETs under ``Quota(40, per=1)`` (open
    permits: each counts until its answer settles it, a batch of them held by the
    process) and ``max_concurrency=8``, and is SIGKILLed. Read in the store right after
    (nothing renews them any more): its permits still count at the kill, and of those
    its batches held (renewed), none counts ``per + margin``, the batch's hold (up to
    ``OPEN_HOLD_SHARE`` of per) and ``OPEN_LIFE`` (2.55 s) after it, plus 0.3 s (an
    open permit counted ``OPEN_FOR``, 10 s, longer before); a permit
    taken alone for an attempt in flight at the kill counts its full open time (never
    cut short by a renewal missed), so at most one per thread counts then."""
    where = where_for(kind, tmp_path, request)
    server = HoldingServer(hold=0.02)
    prefix = "open:"
    scope = server.url.rsplit("/", 1)[0]
    store = near_children.open_store(kind, where, prefix)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.near_children", "busy_until_killed",
             kind, where, prefix, server.url, str(THREADS), "40"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while server.total < 60 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            assert server.total >= 60, f"the worker did not get going ({proc.poll()})"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = datetime.now(timezone.utc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    finally:
        server.close()

    def counting(at: datetime) -> int:
        ms = int(at.timestamp() * 1000)
        if kind == "sqlite":
            import sqlite3

            with sqlite3.connect(where, timeout=5) as db:
                row = db.execute(
                    "SELECT count(*) FROM permit_log WHERE scope = ? AND expires_ms > ?", (scope, ms)
                ).fetchone()
            return int(row[0])
        client = request.getfixturevalue("redis_client")
        return int(client.zcount(store.quota_key(scope, 40, 1.0), f"({ms}", "+inf"))

    at_kill = counting(killed)
    # per + margin, a batch's hold (its extras count that much longer: up to half of
    # per for open permits), the life renewals give, and 0.3 s.
    after = round(1.0 + 0.05 + _near.OPEN_HOLD_SHARE * 1.0 + _near.OPEN_LIFE + 0.3, 3)
    late = counting(killed + timedelta(seconds=after))
    ten = counting(killed + timedelta(seconds=5))
    FIGURES[f"open permits, {kind}"] = (at_kill, late, ten)
    print(f"\n{kind}: the killed worker's permits counting at the kill {at_kill}, {after} s after {late}, 5 s after {ten}")
    assert at_kill > 0, "the worker held no permit at its kill: nothing to show"
    assert late <= THREADS and late < at_kill, f"{late} of the killed worker's permits still count {after} s after the kill"
