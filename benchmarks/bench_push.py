"""Staleness of the near copy: from the moment another process's cooldown is stored to
the moment this process stops admitting the scope, on SQLite and on Redis (loopback).

Method: this process (the worker) admits one scope in a tight loop through the store's
failure layer (``guard_of(store).admit``: what an adapter's attempt asks), answered by
its near copy while nothing changed. Another process (standing in for another host)
sleeps a random 20-60 ms, stores a cooldown for the scope (``store.extend``, as a 429's
Retry-After does) and reports the wall-clock time the store confirmed it. The worker
records the wall-clock time of its first refused admission; between two admissions it
yields the GIL once (``time.sleep(0)``), as a real attempt does while on the wire. The difference is the
staleness: how long after the cooldown was stored this worker could still have sent.
Both processes read the same clock (``time.time()`` on one host). Trials are repeated
with a fresh scope each; the table gives p50, p99 and the maximum (milliseconds), and
how many admissions the worker made per millisecond while waiting (the loop's rate: the
resolution of the measure). The target is at most 10 ms.

For contrast, the same with ``push=False`` (every admission reads the store) shows
the resolution of the method: the read itself.

    python benchmarks/bench_push.py            # 200 trials per store
    python benchmarks/bench_push.py --quick    # 20 trials per store
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lib import common as _common

from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown.guard import guard_of

_WRITER = r"""
import json, random, sys, time
from datetime import datetime, timedelta, timezone
sys.path[:0] = [sys.argv[3]]
from retry_after_adapter import RedisCooldownStore, SQLiteCooldownStore
kind, where = sys.argv[1], sys.argv[2]
store = SQLiteCooldownStore(where) if kind == "sqlite" else RedisCooldownStore.from_url(where, prefix="push:")
for line in sys.stdin:
    scope = line.strip()
    time.sleep(random.uniform(0.02, 0.06))
    store.extend(scope, datetime.now(timezone.utc) + timedelta(seconds=60))
    print(json.dumps({"stored": time.time()}), flush=True)
"""


def trials(kind: str, where: str, count: int, push: bool) -> dict[str, Any]:
    store = _common.open_store(kind, where, push=push, **({"prefix": "push:"} if kind == "redis" else {}))
    guard = guard_of(store)
    root = str(Path(__file__).resolve().parents[1])
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, kind, where, root],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert writer.stdin is not None and writer.stdout is not None
    stale: list[float] = []
    rates: list[float] = []
    missed = 0
    try:
        near = guard.near
        end = time.monotonic() + 2.0
        while near is not None and not near.cooldowns.fresh() and time.monotonic() < end:
            time.sleep(0.01)
        for i in range(count):
            scope = f"https://push-{os.getpid()}-{int(push)}-{i}.example:443"
            now = datetime.now(timezone.utc)
            if guard.admit(Ask(scope=scope, now=now)).not_before is not None:
                missed += 1
                continue
            writer.stdin.write(scope + "\n")
            writer.stdin.flush()
            admitted = 0
            started = time.perf_counter()
            refused_at = None
            give_up = time.monotonic() + 2.0
            while time.monotonic() < give_up:
                if guard.admit(Ask(scope=scope, now=datetime.now(timezone.utc))).not_before is not None:
                    refused_at = time.time()
                    break
                admitted += 1
                time.sleep(0)  # an attempt goes on the wire: other threads run meanwhile
            stored = json.loads(writer.stdout.readline())["stored"]
            if refused_at is None:
                missed += 1
                continue
            stale.append(max(0.0, (refused_at - stored) * 1000))
            rates.append(admitted / max(1e-9, (time.perf_counter() - started) * 1000))
    finally:
        writer.stdin.close()
        writer.wait(10)
        store.close()
    return {
        "store": kind,
        "push": push,
        "trials": len(stale),
        "missed": missed,
        "stale_ms": _common.summary(stale) if stale else {},
        "p99_ms": sorted(stale)[max(0, math.ceil(0.99 * len(stale)) - 1)] if stale else None,
        "admissions_per_ms": statistics.median(rates) if rates else None,
    }


def main() -> None:
    parser = _common.parser(__doc__ or "")
    args = parser.parse_args()
    count = 20 if args.quick else 200
    random.seed(1)
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "push.db")
        for push in (True, False):
            results.append(trials("sqlite", path, count, push))
        with _common.redis_url(workdir) as (url, why):
            if url is None:
                print(f"Redis skipped: {why}", file=sys.stderr)
            else:
                for push in (True, False):
                    results.append(trials("redis", url, count, push))
    rows = [
        (
            r["store"],
            "push" if r["push"] else "push=False",
            r["trials"],
            _common.fmt(r["stale_ms"].get("median")),
            _common.fmt(r["p99_ms"]),
            _common.fmt(r["stale_ms"].get("max")),
            _common.fmt(r["admissions_per_ms"], 1),
            r["missed"],
        )
        for r in results
    ]
    table = _common.table(
        "Staleness: a cooldown stored by another process -> this worker's first refused admission",
        ["store", "mode", "trials", "p50 ms", "p99 ms", "max ms", "admissions/ms", "missed"],
        rows,
    )
    _common.finish("bench_push", {"results": results}, [table], Path(args.out))


if __name__ == "__main__":
    main()
