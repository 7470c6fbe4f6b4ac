"""A fleet of workers under one shared quota: stock urllib3 Retry vs RetryAfterAdapter.

A throttling server on loopback (its own process) admits QUOTA requests per fixed
window of WINDOW seconds and answers 429 with ``Retry-After`` = seconds to the window's
reset, rounded up. Worker threads work through ITEMS items (one GET each); an item is
done on a 200. Shapes:

- (a) quota 50 per 5 s window, 200 items, deadline 3 s per call: every cooldown is longer
  than a call may take, so the adapter defers and the item is re-queued for its
  ``eligible_at``;
- (b) quota 100 per 1 s window, 400 items, deadline 10 s per call: cooldowns fit the
  deadline, so the adapter waits them out inside the call.

Fleets (50 worker threads in all, each with its own Session):

- stock: ``HTTPAdapter(max_retries=Retry(total=10, backoff_factor=0.5,
  status_forcelist=(429, 502, 503, 504), respect_retry_after_header=True))``; urllib3
  sleeps Retry-After inside the call. A call that still fails (retries exhausted) is
  re-queued at once.
- adapter: ``RetryAfterAdapter(max_retries=RetryAfterRetry(same, deadline=D,
  attempt_reserve=0.2), cooldown=store)``; a deferred item is re-queued for its
  ``eligible_at``.

each as 50 threads in one process (the adapter with one in-memory store), and as 4
processes (multiprocessing spawn, 13+13+12+12 threads, the items split evenly) sharing
a SQLiteCooldownStore file, or a RedisCooldownStore on a redis-server this script starts
on a free loopback port (skipped, with a message, when the binary or redis-py is
missing). Stock shares nothing, so it has one multi-process row.

Reported per run (see ``lib.fleet.analyse`` for the exact definitions): requests sent while
an announced cooldown was running ("early"; a request whose send started before the 429
was sent is "in flight" instead), calls that took longer than their deadline, 429s
provoked beyond the in-flight ones (allowance: one per window with 429s per process),
and wall time against the ideal (ceil(items / quota) - 1) x window. Targets for the
adapter: early 0, overruns 0, 429s within the allowance (these three in every run), and
a median wall <= 1.05 x ideal. The table quotes medians over ``--reps`` repetitions
with min-max.

``--headers express`` runs only the adapter against express-rate-limit's legacy headers
(first-hit windows, whole-second epoch resets, no window said): from the project's
emulation (``QuotaServer(quota_headers="express")``) and from express-rate-limit itself,
a Node script this benchmark writes to a temporary folder and starts with ``node`` as it
starts redis-server (``lib/express.py``; skipped with a message without ``node`` or the npm
packages, which ``--npm-install`` puts in a cache folder when asked). Its targets: at
most 2 429s, no request early, wall within 1.22 x ideal in every run.

    python benchmarks/bench_fleet.py             # full: 3 repetitions, about 6 minutes
    python benchmarks/bench_fleet.py --quick     # tiny shapes, about half a minute
    python benchmarks/bench_fleet.py --headers express --shapes a --modes threads --npm-install
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import statistics
import tempfile
from typing import Any

from lib import common as _common
from lib import express as _express
from lib import fleet as _fleet
from lib.common import cell

SHAPES = {
    "a": {"quota": 50, "window": 5.0, "items": 200, "deadline": 3.0},
    "b": {"quota": 100, "window": 1.0, "items": 400, "deadline": 10.0},
}
QUICK_SHAPES = {
    "a": {"quota": 10, "window": 1.0, "items": 20, "deadline": 0.5},
    "b": {"quota": 20, "window": 1.0, "items": 40, "deadline": 3.0},
}
WALL_TARGET = 1.05


# -- the report -------------------------------------------------------------------------------

NUMERIC = (
    "wall_s",
    "wall_over_ideal",
    "early",
    "early_after_store_knew",
    "in_flight",
    "429",
    "429_beyond_in_flight",
    "429_allowance",
    "overran_deadline",
    "max_overrun_s",
    "requests",
)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in NUMERIC:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = _common.summary(values) if values else None
    return out


def verdict(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """Targets: the counts must hold in every run; the wall ratio is judged by its median."""
    walls = [r["wall_over_ideal"] for r in runs]
    return {
        "early_zero": all(r["early"] == 0 for r in runs),
        "no_overrun": all(r["overran_deadline"] == 0 for r in runs),
        "429_within_allowance": all(r["429_within_target"] for r in runs),
        "wall_within_1.05_ideal": None not in walls and statistics.median(walls) <= WALL_TARGET,
        "all_items_done": all(r["items_done"] == r["items"] for r in runs),
    }


#: The wall target of the express rows: issue 21's information limit, up to a second
#: of rounding a window (each window starts at its first request, so it carries).
EXPRESS_WALL_TARGET = 1.22
#: The express servers: the emulation (``QuotaServer``) and express-rate-limit itself.
EXPRESS_SERVERS = {
    "emulation": ("express emulation", "express"),
    "real": ("express-rate-limit (node)", "express-real"),
}


def express_fleets(
    modes: list[str], processes: int, redis: bool, servers: list[str]
) -> list[tuple[str, str, str, str | None]]:
    """The adapter against express-rate-limit's legacy headers (``--headers express``),
    from the emulation and from the real server (``servers``): in threads with a memory
    store, and in processes sharing SQLite or Redis."""
    fleets: list[tuple[str, str, str, str | None]] = []
    for server in servers:
        label, headers = EXPRESS_SERVERS[server]
        if "threads" in modes:
            fleets.append((f"adapter, {label}, 1 process, memory", "adapter", "threads", headers))
        for mode, store in (("sqlite", "SQLite"), ("redis", "Redis")):
            if mode in modes and (mode != "redis" or redis):
                fleets.append((f"adapter, {label}, {processes} processes, {store}", "adapter", mode, headers))
    return fleets


def express_verdict(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """Issue 21's targets for the express rows, in every run: at most 2 429s, wall
    within 1.22 x ideal, no request early, every item done."""
    return {
        "at_most_2_429s": all(r["429"] <= 2 for r in runs),
        "wall_within_1.22_ideal_every_run": all(
            r["wall_over_ideal"] is not None and r["wall_over_ideal"] <= EXPRESS_WALL_TARGET for r in runs
        ),
        "early_zero": all(r["early"] == 0 for r in runs),
        "all_items_done": all(r["items_done"] == r["items"] for r in runs),
    }


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    p.add_argument("--threads", type=int, help="worker threads in all (default 50; quick 8)")
    p.add_argument("--processes", type=int, help="processes for the shared-store runs (default 4; quick 2)")
    p.add_argument("--shapes", default="a,b", help="comma-separated shapes to run (default a,b)")
    p.add_argument("--modes", default="threads,sqlite,redis", help="threads, sqlite, redis (default all)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated words: run only the fleets whose name holds one (e.g. 'stock,learned')",
    )
    p.add_argument(
        "--attempt-reserve", type=float, default=0.2, help="the adapter's attempt_reserve in seconds (0.2)"
    )
    p.add_argument(
        "--headers",
        choices=("express",),
        help="only the adapter against a server sending these quota headers: express = "
        "express-rate-limit's legacy X-RateLimit-* (first-hit windows, whole-second resets)",
    )
    p.add_argument(
        "--express",
        default="emulation,real",
        help="with --headers express: which servers, 'emulation' (QuotaServer) and/or 'real' "
        "(express-rate-limit run with node; skipped with a message without node or the packages)",
    )
    p.add_argument(
        "--express-modules",
        help="the node_modules folder holding express and express-rate-limit "
        f"(default {_express.CACHE_DIR}/node_modules)",
    )
    p.add_argument(
        "--npm-install",
        action="store_true",
        help="first run 'npm install express express-rate-limit' into the cache folder above",
    )
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    threads = args.threads or (8 if args.quick else 50)
    processes = args.processes or (2 if args.quick else 4)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    wanted_shapes = [s for s in args.shapes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    reserve = args.attempt_reserve
    load_at_start = _common.loadavg()

    skipped: dict[str, str] = {}
    redis_server: _common.RedisServer | None = None
    workdir = tempfile.mkdtemp(prefix="bench-fleet-")
    servers = contextlib.ExitStack()  # the redis-server, ended with the runs
    if "redis" in modes:
        redis_server, why = servers.enter_context(_common.redis_server(workdir))
        if redis_server is None:
            skipped["redis"] = why
            print(f"skipping the Redis runs: {why}", flush=True)

    express_servers = [x for x in args.express.split(",") if x] if args.headers else []
    unknown = [x for x in express_servers if x not in EXPRESS_SERVERS]
    if unknown:
        p.error(f"--express: unknown server(s) {', '.join(unknown)}")
    express_versions = None
    if "real" in express_servers:
        if args.npm_install:
            print(f"npm install {' '.join(_express.PACKAGES)} into {_express.CACHE_DIR}", flush=True)
            _express.npm_install()
        _fleet.EXPRESS_MODULES = _express.modules_dir(args.express_modules)
        why = _express.unavailable(_fleet.EXPRESS_MODULES)
        if why is None:
            express_versions = _express.versions(_fleet.EXPRESS_MODULES)
            print(f"the real express server: {express_versions}", flush=True)
        else:
            skipped["express-rate-limit"] = why
            express_servers.remove("real")
            print(f"skipping the real express-rate-limit runs: {why}", flush=True)

    # (name, variant, how, the quota headers the server sends)
    fleets: list[tuple[str, str, str, str | None]] = []
    if args.headers:
        fleets = express_fleets(modes, processes, redis_server is not None, express_servers)
    elif "threads" in modes:
        fleets += [
            ("stock, 1 process", "stock", "threads", None),
            ("adapter, nothing configured (learned rate), 1 process, memory", "adapter", "threads", None),
            ("adapter, learn_rate=False, 1 process, memory", "adapter+nolearn", "threads", None),
            ("adapter, IETF RateLimit headers, 1 process, memory", "adapter", "threads", "ietf"),
            ("adapter, X-RateLimit headers, 1 process, memory", "adapter", "threads", "x-ratelimit"),
            ("adapter + Quota, 1 process, memory", "adapter+quota", "threads", None),
            ("adapter, max_concurrency=8, 1 process, memory", "adapter+cap8", "threads", None),
        ]
    if not args.headers and ("sqlite" in modes or "redis" in modes):
        fleets.append((f"stock, {processes} processes", "stock", "processes", None))
    for mode, label in (("sqlite", "SQLite"), ("redis", "Redis")):
        if args.headers or mode not in modes or (mode == "redis" and redis_server is None):
            continue
        fleets += [
            (
                f"adapter, nothing configured (learned rate), {processes} processes, {label}",
                "adapter",
                mode,
                None,
            ),
            (f"adapter, IETF RateLimit headers, {processes} processes, {label}", "adapter", mode, "ietf"),
            (f"adapter + Quota, {processes} processes, {label}", "adapter+quota", mode, None),
            (f"adapter, max_concurrency=8, {processes} processes, {label}", "adapter+cap8", mode, None),
        ]

    wanted = [w for w in args.only.split(",") if w]
    if wanted:
        fleets = [f for f in fleets if any(w in f[0] for w in wanted)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for shape_name in wanted_shapes:
            shape = shapes[shape_name]
            runs[shape_name] = {name: [] for name, _v, _h, _q in fleets}
            for rep in range(reps):
                for n, (name, variant, how, headers) in enumerate(fleets):
                    if how == "threads":
                        result = _fleet.run_threads(shape, variant, threads, reserve, headers)
                    elif how == "processes":
                        result = _fleet.run_processes(
                            shape, variant, None, processes, threads, reserve, headers
                        )
                    elif how == "sqlite":
                        path = os.path.join(workdir, f"cooldown-{shape_name}-{rep}-{n}.db")
                        result = _fleet.run_processes(
                            shape, variant, ("sqlite", path), processes, threads, reserve, headers
                        )
                    else:
                        assert redis_server is not None
                        result = _fleet.run_processes(
                            shape, variant, ("redis", redis_server.url), processes, threads, reserve, headers
                        )
                    runs[shape_name][name].append(result)
                    print(
                        f"shape {shape_name} rep {rep + 1}/{reps} {name}: wall {result['wall_s']} s, "
                        f"early {result['early']}, in flight {result['in_flight']}, 429 {result['429']}, "
                        f"overran {result['overran_deadline']}, "
                        f"server open at most {result['server_most_open']}"
                        + (
                            f", connections {result['server_connections']}"
                            if result.get("server_connections") is not None
                            else ""
                        )
                        + (
                            f", next window after reset {result['late_after_reset_s']} s, "
                            f"before the announced reset {result['before_announced_reset']}"
                            if result.get("late_after_reset_s")
                            else ""
                        )
                        + (f"; learned rate {result['learned_rate']}" if result.get("rate_changes") else ""),
                        flush=True,
                    )
    finally:
        servers.close()
        shutil.rmtree(workdir, ignore_errors=True)

    report: dict[str, Any] = {}
    rows = []
    for shape_name, by_fleet in runs.items():
        shape = shapes[shape_name]
        stock_threads = by_fleet.get("stock, 1 process")
        stock_procs = by_fleet.get(f"stock, {processes} processes")
        report[shape_name] = {"shape": shape, "fleets": {}}
        for name, results in by_fleet.items():
            entry: dict[str, Any] = {"runs": results, "summary": summarise(results)}
            baseline = stock_threads if "1 process" in name else stock_procs
            if name.startswith("adapter") and baseline:
                walls = [(r["wall_s"], b["wall_s"]) for r, b in zip(results, baseline, strict=True)]
                entry["wall_vs_stock"] = _common.summary([a / b for a, b in walls if a and b])
                entry["targets_met"] = verdict(results)
            elif "express" in name:
                entry["targets_met"] = express_verdict(results)
            report[shape_name]["fleets"][name] = entry
            s = entry["summary"]
            early = cell(s["early"])
            if s["early_after_store_knew"] is not None:
                early += f" ({cell(s['early_after_store_knew'])} after store knew)"
            rows.append(
                [
                    shape_name,
                    name,
                    cell(s["wall_s"], 2),
                    cell(s["wall_over_ideal"], 3),
                    _common.fmt_summary(entry["wall_vs_stock"], 3) if "wall_vs_stock" in entry else "-",
                    early,
                    cell(s["in_flight"]),
                    f"{cell(s['429'])} / {cell(s['429_beyond_in_flight'])} / {cell(s['429_allowance'])}",
                    f"{cell(s['overran_deadline'])} (max {cell(s['max_overrun_s'], 2)} s)",
                    cell(s["requests"]),
                ]
            )
    shape_text = "; ".join(
        f"({k}) quota {v['quota']}/{v['window']:g} s, {v['items']} items, deadline {v['deadline']:g} s, "
        f"ideal {(math.ceil(v['items'] / v['quota']) - 1) * v['window']:g} s"
        for k, v in shapes.items()
        if k in runs
    )
    tables = [
        _common.table(
            f"Fleet under a shared quota, {threads} threads, {reps} repetition(s), "
            f"median [min-max]. {shape_text}",
            [
                "shape",
                "fleet",
                "wall s",
                "wall / ideal",
                "wall vs stock",
                "early",
                "in flight",
                "429s: all / beyond in-flight / allowance",
                "calls over deadline",
                "requests",
            ],
            rows,
        )
    ]
    for shape_name, shape_report in report.items():
        for name, entry in shape_report["fleets"].items():
            if "targets_met" in entry:
                missed = [k for k, ok in entry["targets_met"].items() if not ok]
                tables.append(
                    f"shape {shape_name}, {name}: "
                    + ("all targets met" if not missed else "MISSED " + ", ".join(missed))
                )
    tables.append("")
    payload = {
        "settings": {
            "reps": reps,
            "threads": threads,
            "processes": processes,
            "attempt_reserve": reserve,
            "retry_total": _fleet.TOTAL,
            "quick": args.quick,
            "wall_target": WALL_TARGET,
        },
        "loadavg_at_start": load_at_start,
        "express_versions": express_versions,
        "skipped": skipped,
        "shapes": report,
    }
    _common.finish("fleet", payload, tables, args.out)


if __name__ == "__main__":
    main()
