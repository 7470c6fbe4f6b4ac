"""What the learned rate's cold start costs an API that has no limit at all.

A loopback server (its own thread pool) answers every GET 200 after ``--latency``
seconds (default 20 ms, a remote API's round trip). THREADS worker threads, each with
its own Session on one adapter, send REQUESTS GETs in all to a scope the store has never
seen. Fleets, each on a fresh server (so a fresh scope):

- stock: ``HTTPAdapter`` with urllib3's ``Retry``;
- adapter, ``learn_rate=False``: nothing holds the burst back;
- adapter, defaults: the learned rate's cold start (one in flight, one more per good
  answer to 4, then one per round, lifted at 32 in flight).

Reported: wall time of the whole burst and of its first 100 answers, and the most
requests the server saw in flight, medians over ``--reps`` with min-max, as ratios to
stock in the same run.

    python benchmarks/bench_cold_start.py            # 5 repetitions, about half a minute
    python benchmarks/bench_cold_start.py --quick    # 1 repetition, 8 threads
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from lib import common as _common
from lib.servers import LatencyServer
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from retry_after_adapter import MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry


def adapter_for(fleet: str) -> HTTPAdapter:
    if fleet == "stock":
        return HTTPAdapter(max_retries=Retry(total=3), pool_maxsize=64)
    store = MemoryCooldownStore()
    learn = fleet != "adapter, learn_rate=False"
    return RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=3, deadline=30), cooldown=store, learn_rate=learn, pool_maxsize=64
    )


def burst(fleet: str, threads: int, requests_in_all: int, latency: float) -> dict[str, float]:
    server = LatencyServer(latency)
    adapter = adapter_for(fleet)
    left = [requests_in_all]
    answered: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        session = requests.Session()
        session.mount("http://", adapter)
        barrier.wait()
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            session.get(server.url, timeout=30).raise_for_status()
            with lock:
                answered.append(time.perf_counter())

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join(120)
    server.close()
    answered.sort()
    return {
        "wall_s": answered[-1] - start,
        "first_100_s": answered[min(99, len(answered) - 1)] - start,
        "most_in_flight": float(server.most),
    }


FLEETS = ("stock", "adapter, learn_rate=False", "adapter, defaults (learned rate)")


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--reps", type=int, help="repetitions (default 5; quick 1)")
    p.add_argument("--threads", type=int, help="worker threads (default 50; quick 8)")
    p.add_argument("--requests", type=int, help="GETs in all (default 1000; quick 100)")
    p.add_argument("--latency", type=float, default=0.02, help="the server's answer time, seconds (0.02)")
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 5)
    threads = args.threads or (8 if args.quick else 50)
    total = args.requests or (100 if args.quick else 1000)
    runs: dict[str, list[dict[str, float]]] = {fleet: [] for fleet in FLEETS}
    for _ in range(reps):
        for fleet in FLEETS:
            runs[fleet].append(burst(fleet, threads, total, args.latency))
    rows = []
    report: dict[str, Any] = {}
    for fleet in FLEETS:
        stock = runs["stock"]
        ratio = [r["wall_s"] / s["wall_s"] for r, s in zip(runs[fleet], stock, strict=True)]
        first = [r["first_100_s"] / s["first_100_s"] for r, s in zip(runs[fleet], stock, strict=True)]
        entry = {
            "wall_s": _common.summary([r["wall_s"] for r in runs[fleet]]),
            "wall_vs_stock": _common.summary(ratio),
            "first_100_vs_stock": _common.summary(first),
            "most_in_flight": _common.summary([r["most_in_flight"] for r in runs[fleet]]),
        }
        report[fleet] = entry
        rows.append(
            [
                fleet,
                _common.fmt_summary(entry["wall_s"], 3),
                _common.fmt_summary(entry["wall_vs_stock"], 3),
                _common.fmt_summary(entry["first_100_vs_stock"], 3),
                _common.fmt_summary(entry["most_in_flight"], 0),
            ]
        )
    tables = [
        _common.table(
            f"Cold start on an API without a limit: {threads} threads, {total} GETs, server latency "
            f"{args.latency * 1000:g} ms, {reps} repetition(s), median [min-max]",
            ["fleet", "wall s", "wall vs stock", "first 100 answers vs stock", "most in flight"],
            rows,
        ),
        "",
    ]
    payload = {"settings": {"reps": reps, "threads": threads, "requests": total, "latency": args.latency}}
    payload["fleets"] = report
    _common.finish("cold_start", payload, tables, args.out)


if __name__ == "__main__":
    main()
