"""A binding shared quota on one Redis: what each admitted request costs the store.

A fleet of ``--processes`` worker processes of ``--threads`` threads (default 4 x 16),
each thread with its own Session, shares ``Quota(--limit, per=1)`` (default 40) on one
``RedisCooldownStore`` and sends GETs flat out to the project's ``QuotaServer``
allowing the same 40 requests per fixed 1 s window (a new server each run, in its own
process, logging every arrival). The quota binds the whole run: most calls wait.

Measured over ``--duration`` seconds (default 8) after ``--warm`` (default 1.5):

- round trips per request that reached the server: each write a worker's Redis
  client sends within the window, counted at the clients (a pipeline is one), over the
  requests answered 200 in it (bench_scale's counting, ``lib.load``);
- Redis commands per request (``INFO commandstats``, the scripts' own included);
- Redis CPU per request (``INFO cpu``, less what the server uses idle);
- the worst 1 s window at the server (the most arrivals in any 1 s, sliding over the
  server's log of the whole run) and the 429s;
- goodput: requests answered 200 per second against the quota.

Figures are medians over ``--reps`` runs (the worst window: the worst of them).

    python benchmarks/bench_reserve.py              # about 12 s a repetition
    python benchmarks/bench_reserve.py --quick      # 2 processes x 8 threads, 3 s
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

import bench_scale
from lib import common as _common
from lib import load
from lib.fleet import fetch_log

PER = 1.0


def binding_run(
    fleet: load.Fleet, spec: dict[str, Any], processes: int, kept: bench_scale.Stores, warm: float,
    duration: float, limit: int,
) -> dict[str, Any]:
    """One run against a fresh ``QuotaServer`` allowing ``limit`` per second, and what it saw."""
    with _common.ServerProcess("retry_after_adapter.demo", "--serve", str(limit), str(PER)) as server:
        result = bench_scale.run(fleet, {**spec, "url": server.url}, processes, kept, warm, duration)
        log = fetch_log(server.url)["log"]
    arrivals = sorted(entry["arrival"] for entry in log)
    result["throttled"] = sum(1 for entry in log if entry["status"] == 429)
    result["worst_window"] = bench_scale.worst_window(arrivals, PER)
    result["goodput_vs_allowed"] = result.get("requests_per_s", 0.0) / (limit / PER)
    # How far apart the arrivals ``limit`` apart are (per at best): its quartiles.
    spacing = sorted(b - a for a, b in zip(arrivals, arrivals[limit:], strict=False))
    if spacing:
        result["spacing_s"] = [spacing[len(spacing) * q // 4] for q in (1, 2, 3)]
    return result


KEYS = (
    "round_trips_per_request", "commands_per_request", "redis_cpu_us_per_request",
    "goodput_vs_allowed", "requests_per_s", "not_ok", "store_failures",
)


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--processes", type=int, help="worker processes (default 4; quick 2)")
    p.add_argument("--threads", type=int, help="threads per process (default 16; quick 8)")
    p.add_argument("--limit", type=int, default=40, help="quota and server limit per 1 s (default 40)")
    p.add_argument("--duration", type=float, help="measured seconds (default 8; quick 3)")
    p.add_argument("--warm", type=float, default=1.5, help="unmeasured seconds first (default 1.5)")
    p.add_argument("--margin", type=float, help="the quota's margin, s (default: Quota's)")
    p.add_argument("--reps", type=int, default=1, help="repetitions (default 1)")
    p.add_argument("--store-timeout", type=float, default=3.0, help="store timeouts, s (default 3)")
    p.add_argument("--worker-nice", type=int, default=5, help="niceness of the worker processes (default 5)")
    args = p.parse_args()
    processes = args.processes or (2 if args.quick else 4)
    threads = args.threads or (8 if args.quick else 16)
    duration = args.duration or (3.0 if args.quick else 8.0)
    if min(processes, threads, args.reps, args.limit) < 1 or duration <= 0:
        p.error("counts must be at least 1, --duration positive")
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-reserve-") as workdir, bench_scale.stores(
        workdir, ["redis"]
    ) as kept:
        if kept is None or "redis" in kept.skipped:
            print("no Redis: nothing to measure", file=sys.stderr)
            return
        fleet = load.Fleet(processes, args.worker_nice)
        try:
            for rep in range(args.reps):
                spec = bench_scale.spec_for(
                    "redis", "", threads, kept.where("redis", workdir, rep), rep, args.store_timeout or None,
                    args.limit, 0.0,
                )
                spec["margin"] = args.margin
                result = binding_run(fleet, spec, processes, kept, args.warm, duration, args.limit)
                runs.append(result)
                shown = ", ".join(f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, (int, float)))
                print(f"  run {rep + 1}: {shown}", file=sys.stderr, flush=True)
        finally:
            fleet.close()
    good = [r for r in runs if not r.get("stuck_workers")]
    row: dict[str, Any] = {
        key: statistics.median(vals) if (vals := [r[key] for r in good if r.get(key) is not None]) else None
        for key in KEYS
    }
    row["worst_window"] = max((r["worst_window"] for r in good), default=None)
    row["throttled"] = sum(r["throttled"] for r in good)
    title = (
        f"Binds: Quota({args.limit}, per=1) shared by {processes} x {threads} on one Redis, a server "
        f"allowing {args.limit} per 1 s; {duration:g} s, median of {len(good)}"
    )
    headers = [
        "round trips/req", "Redis commands/req", "Redis CPU us/req", "worst 1 s window; 429s",
        "goodput / allowed",
    ]
    cells = [
        bench_scale.cell(row["round_trips_per_request"], 2),
        bench_scale.cell(row["commands_per_request"], 1),
        bench_scale.cell(row["redis_cpu_us_per_request"], 0),
        f"{bench_scale.cell(row['worst_window'], 0)}/{args.limit}; {row['throttled']}",
        bench_scale.cell(row["goodput_vs_allowed"], 2),
    ]
    payload = {
        "settings": {
            "processes": processes, "threads": threads, "limit": args.limit, "per_s": PER,
            "duration_s": duration, "warm_s": args.warm, "reps": args.reps,
            "took_s": round(time.monotonic() - started),
        },
        "binding": row,
        "runs": runs,
    }
    _common.finish("reserve", payload, [_common.table(title, headers, [cells])], args.out)


if __name__ == "__main__":
    main()
