"""The other processes of ``test_reservations``: each opens the shared store itself (a
SQLite file or the session's Redis) and sends GETs through a shared binding quota.

Run as ``python -m tests.integration.reserve_children WHAT ARGS...`` (from the
repository). What a child reports it prints as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import requests

from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown import Admission, Ask
from tests.integration.near_children import open_store


def counting(kind: str, where: str, prefix: str) -> tuple[Any, list[int]]:
    """The shared store, its ``admit`` counted (each one store operation): the store
    and ``[admissions, reservations]``."""
    store = open_store(kind, where, prefix)
    counts = [0, 0]
    admit = store.admit
    lock = threading.Lock()

    def counted(ask: Ask) -> Admission:
        answer: Admission = admit(ask)
        with lock:
            counts[0] += 1
            counts[1] += answer.reserved is not None
        return answer

    store.admit = counted  # this handle only: the engine calls it through the failure layer
    return store, counts


def session(store: Any, limit: int, per: float, margin: float) -> requests.Session:
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=30, deadline=40)
    s.mount("http://", RetryAfterAdapter(
        retry, cooldown=store, quota=Quota(limit, per=per, margin=margin), learn_rate=False
    ))  # fmt: skip
    return s


def fleet(kind: str, where: str, prefix: str, url: str, threads: str, seconds: str, quota: str) -> None:
    """``threads`` threads, each with its own Session on ``Quota(limit, per, margin)``
    (``quota``: "limit,per,margin"), GET ``url`` until ``seconds`` have passed: one
    JSON line with each GET's wait (seconds from its start to its answer) and status,
    and the store's admissions and reservations."""
    limit, per, margin = quota.split(",")
    store, counts = counting(kind, where, prefix)
    waits: list[tuple[float, int]] = []
    lock = threading.Lock()
    end = time.monotonic() + float(seconds)

    def run() -> None:
        s = session(store, int(limit), float(per), float(margin))
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                status = s.get(url, timeout=30).status_code
            except Exception:  # a deferral counts as no answer
                status = 0
            with lock:
                waits.append((time.monotonic() - started, status))

    workers = [threading.Thread(target=run) for _ in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"waits": waits, "admits": counts[0], "reserved": counts[1]}), flush=True)


def hold_until_killed(kind: str, where: str, prefix: str, url: str, threads: str, quota: str) -> None:
    """``threads`` threads GET ``url`` through the quota in a loop until this process is
    killed; each time one of them holds a reservation it prints ``reserved``."""
    limit, per, margin = quota.split(",")
    store, counts = counting(kind, where, prefix)

    def run() -> None:
        s = session(store, int(limit), float(per), float(margin))
        while True:
            s.get(url, timeout=30)

    for _ in range(int(threads)):
        threading.Thread(target=run, daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if counts[1]:
            print("reserved", flush=True)
            counts[1] = 0
        time.sleep(0.01)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
