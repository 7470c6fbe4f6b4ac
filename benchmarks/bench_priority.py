"""Priorities on a saturated shared quota: how long a priority call waits.

A fleet of ``--processes`` ordinary worker processes of ``--threads`` threads (default
4 x 12), each thread with its own Session, sends GETs flat out through one shared
``Quota(--limit, per=1)`` (default 20) to the project's ``QuotaServer`` allowing the
same ``--limit`` per fixed 1 s window: every ordinary call waits its turn, seconds.
Beside them one more process sends a GET of ``budget(priority=1)`` every
``--every`` seconds (default 0.2) on the same store. Stores: a SQLite file and a Redis
(the processes share them), and a memory store (the same fleet as threads of one
process).

Measured over ``--duration`` seconds (default 8) after ``--warm`` (default 2):

- the priority calls' wait (from the call to its answer): median, p99 and the
  longest, in seconds (the issue's targets: median <= 0.08 s, longest < 0.5 s);
- the ordinary calls' median wait, in seconds (seconds: they queue);
- the worst 1 s window at the server (the most arrivals in any 1 s) and its 429s;
- goodput: requests answered 200 per second against the quota.

    python benchmarks/bench_priority.py            # about 1 minute: memory, SQLite, Redis
    python benchmarks/bench_priority.py --quick    # 2 x 6 threads, 3 s, memory and SQLite
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lib import common as _common
from lib.fleet import fetch_log

PER = 1.0
KINDS = ("memory", "sqlite", "redis")


def _calls(
    kind: str, where: str, url: str, threads: int, limit: int, until: float, priority: int, every: float,
    store: Any = None,
) -> list[tuple[float, float, int]]:
    """(time.time() at the call, its wait in seconds, its status) of each call made by
    ``threads`` threads until ``until`` (time.time()): flat out, or with ``priority``
    one call every ``every`` seconds."""
    import requests

    from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry, budget

    store = store if store is not None else _common.open_store(kind, where)
    quota = Quota(limit, per=PER, margin=0.05)
    out: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def loop() -> None:
        session = requests.Session()
        adapter = RetryAfterAdapter(RetryAfterRetry(total=0, max_wait=30), quota=quota, cooldown=store)
        session.mount("http://", adapter)
        while time.time() < until:
            began = time.time()
            try:
                with budget(priority=priority):
                    status = session.get(url, timeout=60).status_code
            except Exception:  # a deferral raised (a 429 the server sent): counted, not fatal
                status = -1
            with lock:
                out.append((began, time.time() - began, status))
            if priority:
                time.sleep(max(0.0, every - (time.time() - began)))

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return out


def _process(kind: str, where: str, url: str, threads: int, limit: int, until: float, priority: int,
             every: float, queue: Any) -> None:
    queue.put(_calls(kind, where, url, threads, limit, until, priority, every))


def run(kind: str, where: str, processes: int, threads: int, limit: int, warm: float, duration: float,
        every: float) -> dict[str, Any]:
    """One run of ``kind`` against a fresh server; what the priority and ordinary calls saw."""
    with _common.ServerProcess("retry_after_adapter.demo", "--serve", str(limit), str(PER)) as server:
        url = server.url + "/"
        start, mono = time.time(), time.monotonic()  # (the server logs monotonic arrivals)
        until = start + warm + duration
        ordinary: list[tuple[float, float, int]] = []
        urgent: list[tuple[float, float, int]] = []
        if kind == "memory":
            store = _common.open_store("memory")
            results: dict[str, list[tuple[float, float, int]]] = {}
            jobs = [
                threading.Thread(target=lambda: results.__setitem__("o", _calls(
                    kind, where, url, processes * threads, limit, until, 0, every, store))),
                threading.Thread(target=lambda: results.__setitem__("p", _calls(
                    kind, where, url, 1, limit, until, 1, every, store))),
            ]
            for job in jobs:
                job.start()
            for job in jobs:
                job.join()
            ordinary, urgent = results["o"], results["p"]
        else:
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            procs = [
                ctx.Process(target=_process, args=(kind, where, url, threads, limit, until, 0, every, queue))
                for _ in range(processes)
            ]
            urgent_args = (kind, where, url, 1, limit, until, 1, every, queue)
            procs.append(ctx.Process(target=_process, args=urgent_args))
            for proc in procs:
                proc.start()
            reports = [queue.get(timeout=warm + duration + 120) for _ in procs]
            for proc in procs:
                proc.join(timeout=30)
            for report in reports:  # the priority process's one thread answers every ``every`` s
                (urgent if report and _is_priority(report, every) else ordinary).extend(report)
        log = fetch_log(server.url)["log"]
    arrivals = sorted(entry["arrival"] for entry in log)
    measured_from = start + warm

    def waits(calls: list[tuple[float, float, int]]) -> list[float]:
        return sorted(w for t, w, s in calls if t >= measured_from and s == 200)

    fast, slow = waits(urgent), waits(ordinary)
    mono_from = mono + warm
    answered = sum(1 for e in log if e["status"] == 200 and mono_from <= e["arrival"] < mono_from + duration)
    from bench_scale import worst_window

    return {
        "priority_calls": len(fast),
        "priority_median_s": statistics.median(fast) if fast else None,
        "priority_p99_s": fast[min(len(fast) - 1, int(len(fast) * 0.99))] if fast else None,
        "priority_max_s": fast[-1] if fast else None,
        "ordinary_median_s": statistics.median(slow) if slow else None,
        "worst_window": worst_window(arrivals, PER),
        "throttled": sum(1 for e in log if e["status"] == 429),
        "goodput_vs_allowed": answered / duration / (limit / PER),
        "local_refusals": sum(1 for _, _, s in ordinary + urgent if s != 200),
    }


def _is_priority(report: list[tuple[float, float, int]], every: float) -> bool:
    """Whether a process's calls are the priority caller's (one thread, about one
    call every ``every`` seconds: never two calls closer than half of it)."""
    times = sorted(t for t, _, _ in report)
    return all(b - a >= every / 2 for a, b in itertools.pairwise(times))


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--processes", type=int, help="ordinary processes (default 4; quick 2)")
    p.add_argument("--threads", type=int, help="threads per ordinary process (default 12; quick 6)")
    p.add_argument("--limit", type=int, default=20, help="quota and server limit per 1 s (default 20)")
    p.add_argument("--duration", type=float, help="measured seconds (default 8; quick 3)")
    p.add_argument("--warm", type=float, default=2.0, help="unmeasured seconds first (default 2)")
    p.add_argument("--every", type=float, default=0.2, help="seconds between priority calls (default 0.2)")
    p.add_argument("--stores", help="stores to run (default memory,sqlite,redis; quick memory,sqlite)")
    args = p.parse_args()
    processes = args.processes or (2 if args.quick else 4)
    threads = args.threads or (6 if args.quick else 12)
    duration = args.duration or (3.0 if args.quick else 8.0)
    kinds = (args.stores or ("memory,sqlite" if args.quick else ",".join(KINDS))).split(",")
    rows: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-priority-") as workdir:
        for kind in kinds:
            if kind == "redis":
                with _common.redis_url(workdir) as (url, why):
                    if url is None:
                        print(f"no Redis: {why}", file=sys.stderr)
                        continue
                    rows[kind] = run(
                        kind, url, processes, threads, args.limit, args.warm, duration, args.every
                    )
            else:
                where = str(Path(workdir) / "shared.db")
                rows[kind] = run(kind, where, processes, threads, args.limit, args.warm, duration, args.every)
            shown = ", ".join(f"{k} {v:.3g}" for k, v in rows[kind].items() if isinstance(v, (int, float)))
            print(f"  {kind}: {shown}", file=sys.stderr, flush=True)
    title = (
        f"Priority calls beside {processes} x {threads} ordinary workers flat out through "
        f"Quota({args.limit}, per=1), a server allowing {args.limit} per 1 s; one priority call every "
        f"{args.every:g} s; {duration:g} s"
    )
    headers = [
        "store", "priority wait median; p99; longest (s)", "ordinary wait median (s)",
        "worst 1 s window; 429s",
        "goodput / allowed",
    ]

    def num(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    table_rows = [
        [
            kind,
            f"{num(r['priority_median_s'], 3)}; {num(r['priority_p99_s'], 3)}; {num(r['priority_max_s'], 3)}",
            num(r["ordinary_median_s"], 2),
            f"{r['worst_window']}/{args.limit}; {r['throttled']}",
            num(r["goodput_vs_allowed"], 2),
        ]
        for kind, r in rows.items()
    ]
    payload = {
        "settings": {
            "processes": processes, "threads": threads, "limit": args.limit, "per_s": PER,
            "every_s": args.every,
            "duration_s": duration, "warm_s": args.warm, "took_s": round(time.monotonic() - started),
        },
        "rows": rows,
    }
    _common.finish("priority", payload, [_common.table(title, headers, table_rows)], args.out)


if __name__ == "__main__":
    main()
