"""MemoryCooldownStore at a million live scopes: extends per second, and get() latency
(p50, p99, max) while writer threads extend.

Three stores run the same workload in this process, one after the other:

- ``memory store``: the package's ``MemoryCooldownStore`` (heap expiry, lock-free get);
- ``0.2 store``: the expiry of version 0.2, kept here for the comparison: past 4,096
  scopes, every extend scanned the whole dict under the lock for expired entries;
- ``dict + lock``: the floor, a bare dict under a lock that never expires anything.

Each repetition fills ``--scopes`` live scopes (cooldowns a minute ahead), then times
``extend`` of new scopes with 1 s cooldowns (so entries expire while it runs) for
``--seconds``, then runs ``--writers`` threads extending while one reader times
``get`` of random live scopes. Ratios are per repetition against ``dict + lock`` in
the same run; the table shows medians with the min-max range over repetitions.

    python benchmarks/bench_memory_store.py            # 1,000,000 scopes, 3 repetitions
    python benchmarks/bench_memory_store.py --quick    # 50,000 scopes, a few seconds
"""

from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from lib import common as _common

from retry_after_adapter import MemoryCooldownStore


class Store(Protocol):
    def get(self, scope: str) -> datetime | None: ...

    def extend(self, scope: str, until: datetime) -> datetime: ...


class DictAndLock:
    """The floor: a dict under a lock, nothing expired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}

    def get(self, scope: str) -> datetime | None:
        with self._lock:
            return self._until.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        with self._lock:
            current = self._until.get(scope)
            if current is not None and current >= until:
                return current
            self._until[scope] = until
            return until


class Store02(DictAndLock):
    """Version 0.2's MemoryCooldownStore: the floor plus, past 4,096 scopes, a scan of
    the whole dict under the lock on every extend."""

    def extend(self, scope: str, until: datetime) -> datetime:
        with self._lock:
            current = self._until.get(scope)
            if current is not None and current >= until:
                return current
            if len(self._until) >= 4096:
                now = datetime.now(timezone.utc)
                for key in [key for key, value in self._until.items() if value <= now]:
                    del self._until[key]
            self._until[scope] = until
            return until


STORES: dict[str, Callable[[], Store]] = {
    "memory store": MemoryCooldownStore,
    "0.2 store": Store02,
    "dict + lock": DictAndLock,
}


def fill(store: Store, scopes: int) -> None:
    """``scopes`` live scopes: through ``extend`` for the package's store; straight into
    the dict for the others (filling the 0.2 store through extend is quadratic)."""
    ahead = datetime.now(timezone.utc) + timedelta(minutes=1)
    times = [ahead + timedelta(milliseconds=i) for i in range(1000)]  # shared objects
    if isinstance(store, MemoryCooldownStore):
        for i in range(scopes):
            store.extend(f"https://live-{i}.example:443", times[i % 1000])
        return
    entries: dict[str, datetime] = store._until  # type: ignore[attr-defined]
    for i in range(scopes):
        entries[f"https://live-{i}.example:443"] = times[i % 1000]


def extends_per_second(store: Store, seconds: float) -> float:
    """New scopes with 1 s cooldowns, for ``seconds``: extends per second."""
    done = 0
    start = time.perf_counter()
    end = start + seconds
    base = datetime.now(timezone.utc)
    while True:
        for _ in range(64):
            store.extend(f"https://new-{done}.example:443", base + timedelta(seconds=1, microseconds=done))
            done += 1
        now = time.perf_counter()
        if now >= end:
            return done / (now - start)


def get_latency(store: Store, scopes: int, writers: int, gets: int, seconds: float) -> dict[str, float]:
    """p50/p99/max of get() (microseconds) while ``writers`` threads extend."""
    stop = threading.Event()
    written = [0] * writers

    def writer(n: int) -> None:
        rng = random.Random(n)
        base = datetime.now(timezone.utc)
        i = 0
        while not stop.is_set():
            store.extend(f"https://w{n}-{i}.example:443", base + timedelta(seconds=1 + rng.random()))
            i += 1
        written[n] = i

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    try:
        for _ in range(gets):
            scope = f"https://live-{rng.randrange(scopes)}.example:443"
            t0 = time.perf_counter_ns()
            store.get(scope)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
            if time.perf_counter() > deadline:
                break
            time.sleep(0)  # let the writers run between reads, as a real reader would
    finally:
        stop.set()
        for t in threads:
            t.join()
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "p50_us": pct(0.5),
        "p99_us": pct(0.99),
        "max_us": latencies[-1],
        "gets": len(latencies),
        "extends_during": sum(written),
    }


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--scopes", type=int, help="live scopes (default 1,000,000; quick 50,000)")
    p.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    p.add_argument("--writers", type=int, default=4, help="writer threads during the get phase (default 4)")
    args = p.parse_args()
    scopes = args.scopes or (50_000 if args.quick else 1_000_000)
    reps = args.reps or (1 if args.quick else 3)
    seconds = 0.5 if args.quick else 3.0
    gets = 2_000 if args.quick else 20_000

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in STORES}
    for rep in range(reps):
        for name, make in STORES.items():
            store = make()
            started = time.perf_counter()
            fill(store, scopes)
            filled = time.perf_counter() - started
            eps = extends_per_second(store, seconds)
            latency = get_latency(store, scopes, args.writers, gets, seconds)
            runs[name].append({"rep": rep, "fill_s": filled, "extends_per_s": eps, **latency})
            del store
            gc.collect()

    floor = runs["dict + lock"]
    variants: dict[str, Any] = {}
    for name, entries in runs.items():
        variants[name] = {
            "runs": entries,
            "extends_per_s": _common.summary([e["extends_per_s"] for e in entries]),
            "get_p50_us": _common.summary([e["p50_us"] for e in entries]),
            "get_p99_us": _common.summary([e["p99_us"] for e in entries]),
            "get_max_us": _common.summary([e["max_us"] for e in entries]),
            "extends_ratio_vs_floor": _common.summary(
                _common.ratios([e["extends_per_s"] for e in entries], [f["extends_per_s"] for f in floor])
            ),
            "get_p99_ratio_vs_floor": _common.summary(
                _common.ratios([e["p99_us"] for e in entries], [f["p99_us"] for f in floor])
            ),
        }
    rows = [
        (
            name,
            _common.fmt_summary(v["extends_per_s"], 0),
            _common.fmt_summary(v["extends_ratio_vs_floor"]),
            _common.fmt_summary(v["get_p50_us"], 2),
            _common.fmt_summary(v["get_p99_us"], 2),
            _common.fmt_summary(v["get_max_us"], 0),
        )
        for name, v in variants.items()
    ]
    tables = [
        _common.table(
            f"MemoryCooldownStore at {scopes:,} live scopes ({reps} repetitions, {args.writers} writers)",
            ["store", "extends/s", "vs dict+lock", "get p50 us", "get p99 us", "get max us"],
            rows,
        )
    ]
    payload = {
        "scopes": scopes,
        "reps": reps,
        "writers": args.writers,
        "seconds_per_phase": seconds,
        "quick": args.quick,
        "variants": variants,
    }
    _common.finish("memory_store", payload, tables, args.out)


if __name__ == "__main__":
    main()
