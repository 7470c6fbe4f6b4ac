"""The other processes of ``test_every_writer_seen`` and ``test_store_refilled``: each
opens the shared store itself (a SQLite file or a Redis URL) with the ``push`` setting
it is given and does one thing the test process must then see.

Run as ``python -m tests.integration.edge_children WHAT ARGS...`` (from the
repository). Whatever a child reports it prints as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import requests

from retry_after_adapter import RedisCooldownStore, RetryAfterAdapter, RetryAfterRetry, SQLiteCooldownStore


def open_store(kind: str, where: str, prefix: str, push: bool) -> Any:
    """The shared store of ``kind`` at ``where`` (a path or a Redis URL)."""
    if kind == "sqlite":
        return SQLiteCooldownStore(where, push=push)
    return RedisCooldownStore.from_url(
        where, prefix=prefix, push=push, socket_timeout=2.0, socket_connect_timeout=2.0
    )


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def learn_429(kind: str, where: str, prefix: str, push: str, url: str) -> None:
    """One call to ``url`` (answered 429 with a Retry-After) through a store made with
    ``push`` ("1" or "0"): the cooldown is learned the way every worker learns one."""
    store = open_store(kind, where, prefix, push == "1")
    s = requests.Session()
    s.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(total=0, raise_on_status=False), cooldown=store, learn_rate=False),
    )
    status = s.get(url, timeout=10).status_code
    report(status=status, done_at=time.time())


def keep_calling(kind: str, where: str, prefix: str, push: str, url: str, seconds: str) -> None:
    """Call ``url`` every 5 ms for ``seconds`` seconds through a store made with ``push``,
    never waiting (a 429 or a deferral is returned at once), logging at INFO to stderr;
    report how many calls returned which status and what the failure layer wrote back."""
    import logging

    from retry_after_adapter.cooldown.guard import guard_of

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    store = open_store(kind, where, prefix, push == "1")
    s = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=0, raise_on_status=False)
    s.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=False))
    statuses: dict[int, int] = {}
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        status = s.get(url, timeout=10).status_code
        statuses[status] = statuses.get(status, 0) + 1
        time.sleep(0.005)
    guard = guard_of(store)
    report(statuses=statuses, written_back=guard.writeback.written_back, outages=guard.outages)


_COMMANDS = {"learn_429": learn_429, "keep_calling": keep_calling}

if __name__ == "__main__":
    _COMMANDS[sys.argv[1]](*sys.argv[2:])
