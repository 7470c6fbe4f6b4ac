"""A worker process for ``test_priorities``: ``python -m tests.integration.priority_children
KIND WHERE URL THREADS SECONDS PRIORITY`` sends GETs through ``Quota(20, per=1)`` on the
shared store for ``SECONDS`` (flat out, or with ``PRIORITY`` > 0 one call every 0.2 s
under ``budget(priority=PRIORITY)``) and prints one JSON line: each call's wait and
status."""

from __future__ import annotations

import json
import sys
import threading
import time

import requests

from retry_after_adapter import (
    Quota,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
    budget,
)


def main() -> None:
    kind, where, url, threads, seconds, priority = sys.argv[1:7]
    store = SQLiteCooldownStore(where) if kind == "sqlite" else RedisCooldownStore.from_url(where, prefix="prio:")
    quota = Quota(20, per=1.0, margin=0.05)
    rank = int(priority)
    until = time.monotonic() + float(seconds)
    calls: list[tuple[float, int]] = []
    lock = threading.Lock()

    def loop() -> None:
        session = requests.Session()
        session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=30), quota=quota, cooldown=store))
        while time.monotonic() < until:
            began = time.monotonic()
            with budget(priority=rank):
                status = session.get(url, timeout=60).status_code
            with lock:
                calls.append((time.monotonic() - began, status))
            if rank:
                time.sleep(0.2)

    workers = [threading.Thread(target=loop) for _ in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"calls": calls}), flush=True)


if __name__ == "__main__":
    main()
