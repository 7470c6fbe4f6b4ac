"""Two real processes, one loopback server, one shared store (SQLite file or Redis).

After one process gets a 429 with Retry-After, the other sends nothing until the
eligible time: it waits the rest of the cooldown out when that fits its budget, and
defers without sending when it does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta

from retry_after_adapter.cooldown import store_from_url

from ..servers import Reply, ThrottleServer

WORKER = r"""
import json, sys
import requests
from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, RetryDeferred
from retry_after_adapter.cooldown import store_from_url

url, store_url, max_wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
session = requests.Session()
retry = RetryAfterRetry(total=2, max_wait=max_wait)
session.mount("http://", RetryAfterAdapter(retry, cooldown=store_from_url(store_url)))
try:
    response = session.get(url, timeout=5)
except RetryDeferred as deferred:
    print(json.dumps({"deferred": deferred.deferral.to_dict()}))
else:
    deferral = response.deferral.to_dict() if response.deferral else None
    print(json.dumps({"status": response.status_code, "deferred": deferral}))
"""


def run_worker(url: str, store_url: str, max_wait: float) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, url, store_url, str(max_wait)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_other_process_waits_until_the_eligible_time(real_server: ThrottleServer, store_url: str):
    real_server.serve([Reply(429, {"Retry-After": "1"}, b"quota"), Reply(200, body=b"ok")])
    first = run_worker(real_server.url + "/a", store_url, max_wait=0.1)
    assert first["deferred"]["reason"] == "max_wait"
    # The shared eligible time is the server's: Retry-After measured from the 429's
    # receipt. The first call's deferral was decided a moment later, so its own
    # eligible_at is at least that (a few ms more under load), never earlier.
    shared = store_from_url(store_url).get(first["deferred"]["scope"])
    assert shared is not None
    assert datetime.fromisoformat(first["deferred"]["eligible_at"]) >= shared - timedelta(milliseconds=1)
    second = run_worker(real_server.url + "/b", store_url, max_wait=5)
    assert second == {"status": 200, "deferred": None}
    assert real_server.count() == 2
    # The second process's only request arrived at or after the shared eligible time.
    assert real_server.seen[1].at >= shared


def test_the_other_process_defers_without_sending(real_server: ThrottleServer, store_url: str):
    real_server.serve([Reply(429, {"Retry-After": "30"}, b"quota"), Reply(200, body=b"ok")])
    first = run_worker(real_server.url + "/a", store_url, max_wait=1)
    started = time.monotonic()
    second = run_worker(real_server.url + "/b", store_url, max_wait=1)
    assert time.monotonic() - started < 10  # a process start, not a 30 s wait
    assert second["deferred"]["reason"] == "cooldown"
    # The store holds the server's own eligible time (rounded up to the millisecond);
    # the first process's deferral is that plus the moments it spent deciding.
    shared = datetime.fromisoformat(second["deferred"]["eligible_at"])
    assert real_server.seen[0].at + timedelta(seconds=30) <= shared
    assert shared <= datetime.fromisoformat(first["deferred"]["eligible_at"])
    assert second["deferred"]["attempts"] == 0
    assert real_server.count() == 1
