"""Latency and throughput of the cooldown stores: get() and extend().

Backends: memory (one process), SQLite (one process, and N processes on one file),
Redis on loopback (one process, and N processes). The script starts its own
``redis-server`` on a free loopback port, without persistence, and skips Redis with a
message when the binary (or the ``redis`` package) is missing.

Each repetition runs ``--ops`` extend() calls, then ``--ops`` get() calls, per process,
on 16 scopes with random times within the next minute (so some extends move the time
and some do not). Every call is timed; a repetition reports p50 and p99 latency and the
aggregate throughput (all processes' calls / wall time of the phase). The table shows
the median over repetitions with the min-max range; the JSON (printed, and written to
``benchmarks/results/stores.json``) holds every repetition.

    python benchmarks/bench_stores.py            # full run
    python benchmarks/bench_stores.py --quick    # a few seconds, smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

try:
    import retry_after_adapter  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib import common as _common

from retry_after_adapter.cooldown import (
    CooldownStore,
    MemoryCooldownStore,
    RedisCooldownStore,
    SQLiteCooldownStore,
)

SCOPES = [f"https://api-{n}.example:443" for n in range(16)]
RESULTS = Path(__file__).resolve().parent / "results" / "stores.json"


# -- the measured loop -----------------------------------------------------------------


def _phase(store: CooldownStore, op: str, ops: int, seed: int) -> list[int]:
    """Run ``ops`` calls of ``op``; return each call's latency in nanoseconds."""
    rng = random.Random(seed)
    latencies = [0] * ops
    clock = time.perf_counter_ns
    if op == "extend":
        now = datetime.now(timezone.utc)
        args = [(rng.choice(SCOPES), now + timedelta(milliseconds=rng.randrange(60_000))) for _ in range(ops)]
        extend = store.extend
        for i, (scope, until) in enumerate(args):
            start = clock()
            extend(scope, until)
            latencies[i] = clock() - start
    else:
        scopes = [rng.choice(SCOPES) for _ in range(ops)]
        get = store.get
        for i, scope in enumerate(scopes):
            start = clock()
            get(scope)
            latencies[i] = clock() - start
    return latencies


def _worker(store: CooldownStore, ops: int, seed: int, barrier: Any, results: Any) -> None:
    """One benchmark process: warm up, then extend and get phases in step with the parent."""
    _phase(store, "extend", 50, seed)
    _phase(store, "get", 50, seed)
    out: dict[str, list[int]] = {}
    for op in ("extend", "get"):
        barrier.wait()
        out[op] = _phase(store, op, ops, seed)
        barrier.wait()
    results.put(out)


def _percentile(sorted_ns: list[int], q: float) -> float:
    rank = max(1, math.ceil(q * len(sorted_ns)))
    return sorted_ns[rank - 1] / 1000.0  # microseconds


def _summary(latencies: list[int], calls: int, wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_us": round(_percentile(ordered, 0.50), 2),
        "p99_us": round(_percentile(ordered, 0.99), 2),
        "ops_per_s": round(calls / wall, 1),
    }


def run_in_process(store: CooldownStore, ops: int, seed: int) -> dict[str, dict[str, float]]:
    _phase(store, "extend", 50, seed)
    _phase(store, "get", 50, seed)
    out = {}
    for op in ("extend", "get"):
        start = time.perf_counter()
        latencies = _phase(store, op, ops, seed)
        out[op] = _summary(latencies, ops, time.perf_counter() - start)
    return out


def run_in_processes(
    store: CooldownStore, ops: int, processes: int, seed: int
) -> dict[str, dict[str, float]]:
    """``processes`` spawned workers share ``store`` (pickled into each)."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1, timeout=120)
    results = context.Queue()
    workers = [
        context.Process(target=_worker, args=(store, ops, seed + n, barrier, results), daemon=True)
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        walls = {}
        for op in ("extend", "get"):
            barrier.wait()
            start = time.perf_counter()
            barrier.wait()
            walls[op] = time.perf_counter() - start
        reports = [results.get(timeout=120) for _ in workers]
        for worker in workers:
            worker.join(timeout=30)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    out = {}
    for op in ("extend", "get"):
        merged = [ns for report in reports for ns in report[op]]
        out[op] = _summary(merged, len(merged), walls[op])
    return out


# -- the run -----------------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 2),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def measure(name: str, run: Callable[[int], dict[str, dict[str, float]]], reps: int) -> list[dict[str, Any]]:
    runs = [run(rep) for rep in range(reps)]
    rows = []
    for op in ("get", "extend"):
        row: dict[str, Any] = {"backend": name, "op": op}
        for metric in ("p50_us", "p99_us", "ops_per_s"):
            row[metric] = _stats([r[op][metric] for r in runs])
        rows.append(row)
    print(f"  {name}: done", file=sys.stderr, flush=True)
    return rows


def _cell(stats: dict[str, Any], digits: int) -> str:
    return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("backend", "op", "p50 us", "p99 us", "ops/s (all processes)")
    lines = [
        (
            row["backend"],
            row["op"],
            _cell(row["p50_us"], 1),
            _cell(row["p99_us"], 1),
            _cell(row["ops_per_s"], 0),
        )
        for row in rows
    ]
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *lines]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (1 repetition, few calls)")
    parser.add_argument("--reps", type=int, help="repetitions per backend (default 5; quick 1)")
    parser.add_argument("--ops", type=int, help="calls per phase per process (default 5000; quick 200)")
    parser.add_argument("--processes", type=int, help="processes for the shared runs (default 8; quick 2)")
    parser.add_argument(
        "--json", type=Path, default=RESULTS, help=f"where to write the JSON (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    ops = args.ops or (200 if args.quick else 5000)
    processes = args.processes or (2 if args.quick else 8)
    if min(reps, ops, processes) < 1:
        parser.error("--reps, --ops and --processes must be at least 1")

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    workdir = tempfile.mkdtemp(prefix="bench-stores-")
    try:
        print(f"reps={reps} ops={ops} processes={processes}", file=sys.stderr)
        rows += measure("memory", lambda rep: run_in_process(MemoryCooldownStore(), ops, rep), reps)

        sqlite_one = SQLiteCooldownStore(os.path.join(workdir, "one.db"))
        rows += measure("sqlite", lambda rep: run_in_process(sqlite_one, ops, rep), reps)
        sqlite_one.close()
        sqlite_many = SQLiteCooldownStore(os.path.join(workdir, "many.db"))
        rows += measure(
            f"sqlite x{processes} proc",
            lambda rep: run_in_processes(sqlite_many, ops, processes, 1000 * rep),
            reps,
        )
        sqlite_many.close()

        with _common.redis_url(workdir) as (url, redis_version):
            if url is None:
                notes.append(f"Redis skipped: {redis_version}")
                print(f"Redis skipped: {redis_version}", file=sys.stderr)
            else:
                redis_one = RedisCooldownStore.from_url(url)
                rows += measure("redis", lambda rep: run_in_process(redis_one, ops, rep), reps)
                rows += measure(
                    f"redis x{processes} proc",
                    lambda rep: run_in_processes(redis_one, ops, processes, 1000 * rep),
                    reps,
                )
                redis_one.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    report = {
        "benchmark": "cooldown stores: get/extend latency and throughput",
        "settings": {
            "reps": reps,
            "ops_per_phase_per_process": ops,
            "processes": processes,
            "quick": args.quick,
        },
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "sqlite": sqlite3.sqlite_version,
            "redis_server": None if notes else redis_version,
        },
        "notes": notes,
        "results": rows,
    }
    print()
    print("median over repetitions (min-max); latency per call in microseconds")
    print_table(rows)
    print()
    print(json.dumps(report, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
