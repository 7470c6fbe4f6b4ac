"""Worker programs under a configured ``Quota``, written as users write them, against the
project's ``QuotaServer`` in the same process (windows counted from the first request).

- queue: THREADS worker threads (each its own Session, one adapter each, one shared
  store) work through ITEMS items: an item is done on a 200; a deferred item goes back
  into a priority queue at its ``eligible_at`` and is resumed from its deferral
  (``budget(resume=...)``); idle workers look at the queue every 50 ms. Full run:
  50 threads, ``Quota(50, per=5)``, 200 items, ``RetryAfterRetry(total=10,
  backoff_factor=0.5, deadline=3, attempt_reserve=0.2)``: every wait for the next window
  is longer than the deadline, so refused items are deferred.
- jobs: THREADS threads share one adapter and a FIFO of JOBS jobs; a deferred job goes
  back to the end of the queue with its deferral, and the thread that takes it sleeps
  until its ``eligible_at`` and resumes it. Full run: 16 threads, 120 jobs,
  ``Quota(30, per=3)``, ``RetryAfterRetry(total=5, max_wait=10, deadline=10)``: a call
  waits for its permit inside the call while that fits.

Each run reports its wall time (from the start to the last 200) against the ideal
(ceil(items / quota) - 1) x per (the earliest the last window needed opens), the most
requests the server let in within one of its windows (never above the quota), its 429s,
and for the jobs whether a window was lost (a wall over 1 + 1 / windows - 1/3 window,
i.e. the last job went a window late). Medians [min-max] over ``--runs`` runs.

    python benchmarks/bench_workers.py                 # both, memory and SQLite: about 6 minutes
    python benchmarks/bench_workers.py --only jobs --runs 30
    python benchmarks/bench_workers.py --quick         # a few seconds
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import queue
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
from lib import common as _common

from retry_after_adapter import (
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    budget,
    deferral_of,
)
from retry_after_adapter.testing.server import QuotaServer

SHAPES = {
    "queue": {"threads": 50, "limit": 50, "per": 5.0, "items": 200},
    "jobs": {"threads": 16, "limit": 30, "per": 3.0, "items": 120},
}
QUICK_SHAPES = {
    "queue": {"threads": 10, "limit": 10, "per": 1.0, "items": 30},
    "jobs": {"threads": 6, "limit": 10, "per": 1.0, "items": 30},
}
#: Seconds an idle queue worker waits before it looks at the queue again.
POLL = 0.05
#: Seconds after which a run stops, whatever is left (bounds every run).
TIME_LIMIT = 90.0


def ideal(shape: dict[str, Any]) -> float:
    return (math.ceil(shape["items"] / shape["limit"]) - 1) * shape["per"]


def _queue_work(shape: dict[str, Any], url: str, store: Any, quick: bool) -> list[float]:
    """The queue program (see the module): the end of each 200, from the start."""
    quota = Quota(shape["limit"], per=shape["per"])
    deadline = 0.5 if quick else 3.0
    lock = threading.Lock()
    heap: list[tuple[float, int, int, Any]] = [(0.0, n, n, None) for n in range(shape["items"])]
    seq = [shape["items"]]
    ends: list[float] = []
    start = time.monotonic()

    def worker() -> None:
        retry = RetryAfterRetry(total=10, backoff_factor=0.5, deadline=deadline, attempt_reserve=0.2)
        with requests.Session() as session:
            session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=store, quota=quota))
            while time.monotonic() - start < TIME_LIMIT:
                with lock:
                    if len(ends) >= shape["items"]:
                        return
                    now = time.monotonic() - start
                    job = heapq.heappop(heap) if heap and heap[0][0] <= now else None
                if job is None:
                    time.sleep(POLL)
                    continue
                _, _, item, resume = job
                with budget(resume=resume) if resume is not None else contextlib.nullcontext():
                    response = session.get(f"{url}/item/{item}")
                end = time.monotonic() - start
                deferral = deferral_of(response)
                with lock:
                    if response.status_code == 200:
                        ends.append(end)
                        continue
                    eligible = end
                    if deferral is not None:
                        eligible += (deferral.eligible_at - datetime.now(timezone.utc)).total_seconds()
                    seq[0] += 1
                    heapq.heappush(heap, (eligible, seq[0], item, deferral))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(shape["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIME_LIMIT + 30)
    return ends


def _jobs_work(shape: dict[str, Any], url: str, store: Any, quick: bool) -> list[float]:
    """The job worker (see the module): the end of each 200, from the start."""
    quota = Quota(shape["limit"], per=shape["per"])
    retry = RetryAfterRetry(total=5, max_wait=10, deadline=3.0 if quick else 10.0)
    adapter = RetryAfterAdapter(max_retries=retry, cooldown=store, quota=quota)
    jobs: queue.Queue[tuple[int, Any]] = queue.Queue()
    for n in range(shape["items"]):
        jobs.put((n, None))
    ends: list[float] = []
    start = time.monotonic()

    def worker() -> None:
        with requests.Session() as session:
            session.mount("http://", adapter)
            while len(ends) < shape["items"] and time.monotonic() - start < TIME_LIMIT:
                try:
                    job, resume = jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                if resume is not None:
                    wait = (resume.eligible_at - datetime.now(timezone.utc)).total_seconds()
                    if wait > 0:
                        time.sleep(wait)
                with budget(resume=resume) if resume is not None else contextlib.nullcontext():
                    response = session.get(f"{url}/job/{job}")
                if response.status_code == 200:
                    ends.append(time.monotonic() - start)
                else:
                    jobs.put((job, deferral_of(response)))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(shape["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIME_LIMIT + 30)
    return ends


def run(program: str, shape: dict[str, Any], kind: str, workdir: str, quick: bool) -> dict[str, Any]:
    """One run of ``program`` on a fresh server and store."""
    where = str(Path(tempfile.mkdtemp(dir=workdir)) / "quota.db") if kind == "sqlite" else ""
    store = _common.open_store(kind, where)
    work = _queue_work if program == "queue" else _jobs_work
    try:
        with QuotaServer(shape["limit"], shape["per"], align="first") as server:
            ends = work(shape, server.url, store, quick)
            log = json.loads(server.log_json())
    finally:
        store.close()  # what waits written while its file is still there
    entries = [dict(zip(log["fields"], entry, strict=True)) for entry in log["log"]]
    per_window: dict[int, int] = {}
    for e in entries:
        if e["status"] == 200:
            per_window[e["window"]] = per_window.get(e["window"], 0) + 1
    windows = math.ceil(shape["items"] / shape["limit"])
    done = len(ends) == shape["items"]
    wall = max(ends) if done else None
    ratio = None if wall is None else wall / ideal(shape)
    return {
        "done": len(ends),
        "wall_s": wall,
        "wall_over_ideal": ratio,
        # The last job a window late: past the ideal by two thirds of a window or more.
        "lost_window": ratio is None or ratio >= 1 + (2 / 3) / (windows - 1),
        "most_in_a_window": max(per_window.values(), default=0),
        "429": sum(1 for e in entries if e["status"] == 429),
        "requests": len(entries),
    }


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--runs", type=int, help="runs of each program and store (default 5; quick 1)")
    p.add_argument("--only", default="queue,jobs", help="programs to run: queue, jobs (default both)")
    p.add_argument("--stores", default="memory,sqlite", help="memory, sqlite (default both)")
    args = p.parse_args()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    runs = args.runs or (1 if args.quick else 5)
    programs = [x for x in args.only.split(",") if x]
    stores = [x for x in args.stores.split(",") if x]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as workdir:
        for program in programs:
            shape = shapes[program]
            results[program] = {}
            for kind in stores:
                done = results[program][kind] = []
                for n in range(runs):
                    result = run(program, shape, kind, workdir, args.quick)
                    done.append(result)
                    print(
                        f"{program} {kind} run {n + 1}/{runs}: wall/ideal {result['wall_over_ideal']}, "
                        f"most in a window {result['most_in_a_window']}, 429 {result['429']}",
                        flush=True,
                    )
                walls = [r["wall_over_ideal"] for r in done if r["wall_over_ideal"] is not None]
                rows.append(
                    [
                        program,
                        kind,
                        f"{shape['threads']} threads, Quota({shape['limit']}, per={shape['per']:g}), "
                        f"{shape['items']} items",
                        _common.fmt_summary(_common.summary(walls), 3) if walls else "-",
                        f"{sum(r['lost_window'] for r in done)} of {len(done)}",
                        str(max(r["most_in_a_window"] for r in done)),
                        str(sum(r["429"] for r in done)),
                    ]
                )
    table = _common.table(
        f"Worker programs under a configured Quota, {runs} run(s) each, median [min-max]",
        ["program", "store", "shape", "wall / ideal", "runs with a window lost", "most in a window", "429s"],
        rows,
    )
    payload = {
        "settings": {"runs": runs, "quick": args.quick, "shapes": shapes, "poll_s": POLL},
        "loadavg_at_start": _common.loadavg(),
        "results": results,
    }
    _common.finish("workers", payload, [table], args.out)


if __name__ == "__main__":
    main()
