"""The other processes of ``test_reservations_faults``: a fleet on a shared store (a
memory store of its own, a SQLite file, a Redis server or a Redis Cluster) sending GETs
through a binding quota while the test breaks something around it, and a process that
keeps one core busy.

Run as ``python -m tests.integration.fault_children WHAT ARGS...`` (from the
repository). What a child reports it prints as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

import requests

from retry_after_adapter import MemoryCooldownStore, Quota, RetryAfterAdapter, RetryAfterRetry, deferral_of
from tests.integration.reserve_children import counting


def shared(kind: str, where: str, prefix: str) -> tuple[Any, list[int]]:
    """The store (a memory store of this process for ``memory``, else the shared one
    ``reserve_children.counting`` opens) and its ``[admissions, reservations]`` count
    (not counted for ``memory``)."""
    if kind == "memory":
        return MemoryCooldownStore(), [0, 0]
    return counting(kind, where, prefix)


def fleet(
    kind: str,
    where: str,
    prefix: str,
    url: str,
    threads: str,
    seconds: str,
    quota: str,
    failure: str,
    options: str = "{}",
) -> None:
    """``threads`` threads, each with its own Session on ``Quota(limit, per, margin)``
    (``quota``: "limit,per,margin"), ``store_failure=failure`` ("open" or "closed")
    and the adapter's other arguments that ``options`` (JSON) gives, GET ``url`` for
    ``seconds``, each call under a deadline of 10 s, from the line the test writes on
    stdin once each process has printed ``ready``. A deferred call's thread sleeps
    until the deferral is eligible (at least 0.01 s, at most 1 s), as a queue's worker
    would. One JSON line: each GET's ``[start, end, status, reason]`` (epoch seconds;
    ``reason`` the deferral's, or ""; status 0 for an exception, whose class
    ``reason`` names first), and the store's admissions and reservations."""
    limit, per, margin = quota.split(",")
    store, counts = shared(kind, where, prefix)
    calls: list[tuple[float, float, int, str]] = []
    lock = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()  # the test's go: every process starts together
    end = time.monotonic() + float(seconds)

    def run() -> None:
        s = requests.Session()
        retry = RetryAfterRetry(total=0, max_wait=30, deadline=10)
        adapter = RetryAfterAdapter(
            retry, cooldown=store, quota=Quota(int(limit), per=float(per), margin=float(margin)),
            learn_rate=False, store_failure=failure, **json.loads(options),
        )  # fmt: skip
        s.mount("http://", adapter)
        while time.monotonic() < end:
            started = time.time()
            reason = ""
            try:
                response = s.get(url, timeout=10)
                status = response.status_code
                deferral = deferral_of(response)
            except Exception as exc:  # an exception is recorded, not raised
                status, deferral = 0, deferral_of(exc)
                reason = type(exc).__name__
            if deferral is not None:
                reason = f"{reason}:{deferral.reason}" if reason else str(deferral.reason)
            with lock:
                calls.append((started, time.time(), status, reason))
            if deferral is not None:  # as a queue's worker: not before it is eligible
                left = (deferral.eligible_at - datetime.now(timezone.utc)).total_seconds()
                time.sleep(min(max(left, 0.01), 1.0, max(0.0, end - time.monotonic())))

    workers = [threading.Thread(target=run) for _ in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"calls": calls, "admits": counts[0], "reserved": counts[1]}), flush=True)


def burn(seconds: str) -> None:
    """Keep one core busy for ``seconds`` (a loop that only reads the clock)."""
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        pass


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
