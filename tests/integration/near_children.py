"""The other processes of ``test_near_copy``: each opens the shared store itself (a
SQLite file, the session's Redis, or the 3-node Redis Cluster) and does one thing the
test process must then see through its own near copy.

Run as ``python -m tests.integration.near_children WHAT ARGS...`` (from the repository),
or, for the fleets, as ``spawn`` targets. Whatever a child reports it prints as one
JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import requests

from retry_after_adapter import (
    Quota,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)
from retry_after_adapter.cooldown import Ask, Lease
from retry_after_adapter.cooldown._ms import to_epoch_ms
from retry_after_adapter.cooldown.guard import guard_of


def open_store(kind: str, where: str, prefix: str, cls: Any = None) -> Any:
    """The shared store of ``kind`` at ``where`` (a path, a Redis URL, or the
    ``host:port`` of a cluster node), of class ``cls`` when given (a subclass)."""
    if kind == "sqlite":
        return (cls or SQLiteCooldownStore)(where)
    if kind == "cluster":
        from redis.cluster import RedisCluster

        host, port = where.rsplit(":", 1)
        client = RedisCluster(host=host, port=int(port), socket_timeout=2.0, socket_connect_timeout=2.0)
        return (cls or RedisCooldownStore)(client, prefix=prefix, timeout=4.0)
    return (cls or RedisCooldownStore).from_url(
        where, prefix=prefix, socket_timeout=2.0, socket_connect_timeout=2.0
    )


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def learn_429(kind: str, where: str, prefix: str, url: str) -> None:
    """One call to ``url`` (answered 429 with a Retry-After): the cooldown is learned
    the way every worker learns one, and written to the shared store."""
    store = open_store(kind, where, prefix)
    s = requests.Session()
    s.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(total=0, raise_on_status=False), cooldown=store, learn_rate=False),
    )
    status = s.get(url, timeout=10).status_code
    report(status=status, done_at=time.time())


def extend(kind: str, where: str, prefix: str, scope: str, seconds: str) -> None:
    """Learn a cooldown of ``seconds`` on ``scope`` with the store's own ``extend``."""
    from datetime import datetime, timedelta, timezone

    store = open_store(kind, where, prefix)
    until = datetime.now(timezone.utc) + timedelta(seconds=float(seconds))
    before = time.time()
    store.extend(scope, until)
    report(before=before, done_at=time.time())


def hold_then_die(
    kind: str, where: str, prefix: str, scope: str, limit: str, per: str, hold: str, ttl: str
) -> None:
    """Take two concurrency slots through this process's near copy (one in use, one
    given back and held idle by the process), and a batch of 8 quota permits (``hold``
    seconds to spend the extra ones), then SIGKILL this process: nothing is given back."""
    store = open_store(kind, where, prefix)
    guard = guard_of(store)
    # The store operation a near copy makes for a batch (its size is the copy's choice:
    # the failure layer's admit picks it from the process's rate, so it is asked here).
    batch = store.admit(Ask(scope=scope, limit=int(limit), per=float(per), batch=8, hold=float(hold)))
    assert batch.not_before is None, batch
    before = time.time()
    for token in ("child-in-use", "child-idle"):
        answer = guard.admit(Ask(scope=scope, lease=Lease(slots=2, ttl=float(ttl), token=token)))
        assert answer.not_before is None, answer
    guard.release(scope, "child-idle")  # kept by the process for its next attempt (IDLE s)
    report(before=before, after=time.time(), permit_ms=to_epoch_ms(batch.permit), extra=batch.extra)
    os.kill(os.getpid(), signal.SIGKILL)


def call_then_exit(kind: str, where: str, prefix: str, url: str, how: str) -> None:
    """One call with a concurrency cap and a long lease (its slot is then held idle by
    the process), then exit: normally (``how`` "normal": the exit hooks run) or, as a
    forked child does (a multiprocessing or Celery prefork worker), with ``os._exit``
    ("abrupt": no hook runs; this process forks a child that makes the call and leaves
    so, and waits for it)."""
    store = open_store(kind, where, prefix)
    s = requests.Session()
    adapter = RetryAfterAdapter(
        RetryAfterRetry(total=0), cooldown=store, max_concurrency=2, lease_ttl=30, learn_rate=False
    )
    s.mount("http://", adapter)
    if how == "abrupt":
        pid = os.fork()
        if pid == 0:
            ok = s.get(url, timeout=10).status_code == 200
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status))
    assert s.get(url, timeout=10).status_code == 200


def busy_until_killed(
    kind: str, where: str, prefix: str, url: str, threads: str, limit: str = "", ttl: str = ""
) -> None:
    """``threads`` threads GET ``url`` in a loop (one Session, ``max_concurrency`` =
    ``threads``, ``lease_ttl`` = ``ttl`` seconds, else the default; with ``limit``,
    ``Quota(limit, per=1)``), until this process is killed: it holds slots in use and
    parked for reuse (and open permits) throughout."""
    store = open_store(kind, where, prefix)
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=10)
    quota = Quota(int(limit), per=1) if limit else None
    lease = {"lease_ttl": float(ttl)} if ttl else {}
    s.mount("http://", RetryAfterAdapter(
        retry, cooldown=store, max_concurrency=int(threads), quota=quota, learn_rate=False, **lease
    ))  # fmt: skip

    def run() -> None:
        while True:
            s.get(url, timeout=10)

    for _ in range(int(threads)):
        threading.Thread(target=run, daemon=True).start()
    time.sleep(60)


def call_in_worker(kind: str, where: str, prefix: str, url: str) -> None:
    """A multiprocessing worker's body: one capped call with a long lease, then return
    (the worker ends through multiprocessing's exit function, without ``atexit``)."""
    call_then_exit(kind, where, prefix, url, "normal")


# ------------------------------------------------------------------------- fleets
def slots_worker(url: str, kind: str, where: str, prefix: str, threads: int, calls: int) -> None:
    """``threads`` threads, each with its own Session capped at 3 concurrent requests
    across every process, ``calls`` GETs each."""
    store = open_store(kind, where, prefix)

    def run() -> None:
        s = requests.Session()
        retry = RetryAfterRetry(total=0, max_wait=10)
        s.mount("http://", RetryAfterAdapter(retry, cooldown=store, max_concurrency=3, learn_rate=False))
        for _ in range(calls):
            assert s.get(url, timeout=10).status_code == 200

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


class _Counted:
    """Counts this process's admit operations on the store that granted a permit, and
    the extra permits they took (a store subclass: every operation still goes to the
    real store)."""

    def _init_counts(self) -> None:
        self.counts_lock = threading.Lock()
        self.grants = 0
        self.batches = 0
        self.extras = 0

    def admit(self, *args: Any, **kwargs: Any) -> Any:
        answer = super().admit(*args, **kwargs)  # type: ignore[misc]
        if answer.permit is not None and answer.not_before is None:
            with self.counts_lock:
                self.grants += 1
                if answer.extra:
                    self.batches += 1
                    self.extras += answer.extra
        return answer


class CountedSQLite(_Counted, SQLiteCooldownStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._init_counts()


class CountedRedis(_Counted, RedisCooldownStore):
    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._init_counts()


def quota_worker(
    url: str,
    kind: str,
    where: str,
    prefix: str,
    quota: tuple[int, float],
    threads: int,
    paced: tuple[float, float],
    seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    """``threads`` threads GET ``url`` under ``Quota(*quota)`` after every process is
    ready: for ``paced[0]`` seconds each at most one request every ``paced[1]``
    seconds, then as fast as the quota lets them, until ``seconds`` have passed.
    Reports what was sent and the store operations that granted permits."""
    store = open_store(kind, where, prefix, CountedSQLite if kind == "sqlite" else CountedRedis)
    sessions = []
    for _ in range(threads):
        s = requests.Session()
        s.mount("http://", RetryAfterAdapter(
            RetryAfterRetry(total=0, max_wait=0.5), cooldown=store, quota=Quota(quota[0], per=quota[1]),
            store_failure="closed",
        ))  # fmt: skip
        sessions.append(s)
    counts = [0, 0, 0]
    lock = threading.Lock()
    barrier.wait(60)
    start = time.monotonic()
    fast, stop = start + paced[0], start + seconds

    def run(s: requests.Session) -> None:
        sent = deferred = errors = 0
        next_at = time.monotonic()
        while (now := time.monotonic()) < stop:
            if now < fast:
                if now < next_at:
                    time.sleep(min(next_at, fast) - now)
                    continue
                next_at += paced[1]
            try:
                response = s.get(url, timeout=5)
            except requests.RequestException:
                errors += 1
                continue
            if getattr(response, "local", False):
                deferred += 1
            else:
                sent += 1
        with lock:
            counts[0] += sent
            counts[1] += deferred
            counts[2] += errors

    pool = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for t in pool:
        t.start()
    for t in pool:
        t.join(30)
    results.put(
        {
            "sent": counts[0], "deferred": counts[1], "errors": counts[2],
            "grants": store.grants, "batches": store.batches, "extras": store.extras,
        }
    )  # fmt: skip


_COMMANDS = {
    "learn_429": learn_429,
    "extend": extend,
    "hold_then_die": hold_then_die,
    "call_then_exit": call_then_exit,
    "busy_until_killed": busy_until_killed,
}

if __name__ == "__main__":
    _COMMANDS[sys.argv[1]](*sys.argv[2:])
