"""Shared stores under load: many processes of many threads on one store, a quota that
never binds, and what each store costs in throughput and in store operations.

A fleet of ``--processes`` worker processes (default 16, standing in for hosts) of
``--threads`` threads each (default 8), each thread with its own Session, sends GETs as
fast as it can to the benchmarks' ``200 ok`` keep-alive server on loopback (asyncio, in
its own process). Every adapter has ``quota=Quota(10000, per=1)``, which never binds
(the whole fleet sends a few thousand requests per second at most here), on one scope
(the server's origin) unless said otherwise. The stores:

- memory: each process its own ``MemoryCooldownStore`` (nothing shared: the floor the
  others are measured against; its quota is per process);
- SQLite: one ``SQLiteCooldownStore`` file shared by every process;
- Redis: one ``RedisCooldownStore`` on a ``redis-server`` the script starts on a free
  loopback port (without persistence), with its near copy (``push=True``, the default);
- Redis, push=False: the same without the near copy (a store round trip per attempt).

The Redis rows are skipped with a message when the binary or the ``redis`` package is
missing.

Method. The worker processes are started once and run every variant in turn (the order
rotated from one repetition to the next); a variant runs with a fresh store (a new file,
a new key prefix) for ``--warm`` seconds unmeasured (default 1.5: a near copy sizes its
quota batches to its process's rate over the last whole second, so batches form only
after one second) and then ``--duration`` seconds measured (default 5). Requests/s is
the number of GETs answered 200 within the measured window over its length; the ratio to
memory is taken against the memory run of the same repetition, and the tables quote the
median over repetitions with its min-max.

Store operations on Redis: ``INFO commandstats`` is reset at the window's start and read
at its end. It counts the commands a Lua script runs as well as the script's ``EVALSHA``,
so the commands a client sends (``EVALSHA``, ``ZREM``, the change feed's ``SUBSCRIBE``
and ``PING``...) are counted apart, on a ``MONITOR`` connection that tells a client's
commands from a script's (and each ``EVALSHA``'s script by its SHA1). Both views are
shown, per request, with and without the change feed's ``PING``/``SUBSCRIBE``; the
benchmark's own commands (``INFO``, ``CONFIG``, ``MONITOR``, ``FLUSHALL``) are left out.
A pipeline of many commands (the settles written together) is one round trip but many
commands in MONITOR: the round trips are counted at the clients, each write a worker
sends to Redis within the window (its change feed's included). Targets (16 processes x
8 threads, one scope): Redis round trips per request <= 0.1 and Redis throughput >= 0.9
x memory's.

Saturation. The worker processes stand in for hosts, and the servers they talk to (HTTP,
Redis) would run elsewhere; on a small machine 128 busy client threads share the cores
with them. So the workers run at a lower priority (``nice`` 5, ``--worker-nice``) and the
stores get a 1 s timeout (``--store-timeout``; the defaults, 0.1 s for a Redis reply and
0.25 s for a SQLite lock, are for a machine that is not saturated): otherwise replies
delayed by the scheduler, or 128 connections queueing for SQLite's one write lock, make
operations fail, the failure layer skips the store for a while, and the figures measure
that fallback instead of the store. "store failures" and "busy" in the table count what
happened anyway. With every core busy a request takes about ``threads x processes /
throughput`` (over 100 ms here), longer than a quota's ``margin`` (50 ms): a permit must
then be settled (one more operation) when its answer comes, which a less loaded fleet
rarely needs; the table of round trips by script shows it.

A worker that has not reported 45 s after the window closed (a call may take up to its
30 s deadline) is stuck: its threads' stacks are printed (``faulthandler``), it is
replaced by a new one, and the run is counted in the table ("runs stuck") but its figures
are not used. (Send ``SIGUSR1`` to a worker to see its stacks at any time.)

CPU: the client processes', the HTTP server's and Redis's CPU time over the window (from
``/proc``), per request, and how busy the machine's cores were (``/proc/stat``): what
the rest of the machine used besides this benchmark is shown, since other work on a
small machine moves every figure.

Then a scaling table, memory against Redis (with push): ``--scopes-list`` (default 1,
16 and 256 scopes, each thread going round-robin over them: a scope per path, given by
a plain scope function, so the 1-scope row there uses it too), also without a quota
(the near copy answering cooldowns alone). How the cost grows with processes and
threads, on Redis, a Redis Cluster and SQLite, is ``bench_scale.py``'s.

    python benchmarks/bench_load.py             # about 4 minutes
    python benchmarks/bench_load.py --quick     # about 40 s: 4 processes x 4 threads, short runs
    python benchmarks/bench_load.py --no-scaling --reps 3
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from typing import Any

from lib import common as _common
from lib.load import QUOTA_LIMIT, Fleet, prepare_sqlite, run_variant, services, summarise

TRIPS_TARGET = 0.1
THROUGHPUT_TARGET = 0.9
#: The main table's stores: --only's keys and the names shown.
MAIN_KEYS = {"memory": "memory", "sqlite": "SQLite", "redis": "Redis", "redis-nopush": "Redis, push=False"}


# -- the plan ------------------------------------------------------------------------------


def spec_of(
    name: str,
    url: str,
    threads: int,
    workdir: str,
    redis_url: str | None,
    run: int,
    timeout: float | None,
    scopes: int = 0,
    quota: bool = True,
) -> dict[str, Any] | None:
    """The spec of one run of variant ``name`` (None: skipped, no Redis)."""
    spec: dict[str, Any] = {
        "url": url,
        "threads": threads,
        "scopes": scopes,
        "quota": quota,
        "push": True,
        "timeout": timeout,
    }
    if name == "memory":
        spec["store"] = "memory"
    elif name == "SQLite":
        spec.update(store="sqlite", where=os.path.join(workdir, f"load-{run}.db"))
    elif name.startswith("Redis"):
        if redis_url is None:
            return None
        spec.update(
            store="redis", where=redis_url, prefix=f"bench-load-{run}:", push="push=False" not in name
        )
    else:
        raise ValueError(name)
    return spec


def fmt_or_dash(s: dict[str, Any] | None, digits: int) -> str:
    return "-" if not s or not s.get("n") else _common.fmt_summary(s, digits)


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--processes", type=int, help="worker processes of the main table (default 16; quick 4)")
    p.add_argument("--threads", type=int, help="threads per process (default 8; quick 4)")
    p.add_argument("--duration", type=float, help="measured seconds per run (default 5; quick 1)")
    p.add_argument(
        "--warm", type=float, help="unmeasured seconds before each run's window (default 1.5; quick 1.2)"
    )
    p.add_argument("--reps", type=int, help="repetitions of the main table (default 3; quick 1)")
    p.add_argument("--scaling-reps", type=int, help="repetitions of each scaling row (default 2; quick 1)")
    p.add_argument(
        "--scaling-duration", type=float, help="measured seconds per scaling run (default 3; quick 0.8)"
    )
    p.add_argument("--scopes-list", help="scopes of the scopes table (default 1,16,256; quick 1,16)")
    p.add_argument("--no-scaling", action="store_true", help="the main table only")
    p.add_argument(
        "--store-timeout",
        type=float,
        default=1.0,
        help="seconds: the Redis store's socket timeouts and the SQLite store's lock wait "
        "(default 1; 0: the stores' own defaults, 0.1 s and 0.25 s): see the docstring",
    )
    p.add_argument(
        "--worker-nice",
        type=int,
        default=5,
        help="niceness added to the worker processes (default 5; 0: none): see the docstring",
    )
    p.add_argument(
        "--only", help="the main table's stores, comma-separated (default: all): " + ", ".join(MAIN_KEYS)
    )
    args = p.parse_args()
    processes = args.processes or (4 if args.quick else 16)
    threads = args.threads or (4 if args.quick else 8)
    duration = args.duration or (1.0 if args.quick else 5.0)
    warm = args.warm if args.warm is not None else (1.2 if args.quick else 1.5)
    reps = args.reps or (1 if args.quick else 3)
    scaling_reps = args.scaling_reps or (1 if args.quick else 2)
    scaling_duration = args.scaling_duration or (0.8 if args.quick else 3.0)
    if args.scopes_list:
        scopes_list = [int(x) for x in args.scopes_list.split(",")]
    else:
        scopes_list = [1, 16] if args.quick else [1, 16, 256]
    if min(processes, threads, reps, scaling_reps, *scopes_list) < 1 or duration <= 0:
        p.error("counts must be at least 1 and --duration positive")
    store_timeout = args.store_timeout or None
    only = list(MAIN_KEYS) if not args.only else [k.strip() for k in args.only.split(",") if k.strip()]
    if "memory" not in only or set(only) - set(MAIN_KEYS):
        p.error(f"--only: known stores are {', '.join(MAIN_KEYS)}, and memory (the baseline) must be one")

    load_at_start = _common.loadavg()
    notes: list[str] = []
    main_names = [MAIN_KEYS[key] for key in only]
    main_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in main_names}
    scopes: dict[int, dict[str, list[dict[str, Any]]]] = {}
    redis_version = None
    run = 0
    with (
        tempfile.TemporaryDirectory(prefix="bench-load-") as workdir,
        services(workdir) as (server, redis, why),
    ):
        if redis is None:
            notes.append(f"Redis rows skipped: {why}")
            print(notes[-1], file=sys.stderr, flush=True)
        else:
            redis_version = redis["version"]
        pids = {"http server": server.proc.pid}
        if redis is not None:
            pids["redis"] = redis["pid"]
        redis_url = redis["url"] if redis is not None else None
        fleet = Fleet(processes, args.worker_nice)
        try:

            def one(name: str, n_processes: int, window: float, **kw: Any) -> dict[str, Any] | None:
                nonlocal run
                run += 1
                spec = spec_of(name, server.url, threads, workdir, redis_url, run, store_timeout, **kw)
                if spec is None:
                    return None
                prepare_sqlite(spec)
                result = run_variant(fleet, spec, n_processes, pids, redis, warm, window)
                if result["stuck_workers"]:
                    print(f"  {name}: {result['stuck_workers']} worker(s) stuck", file=sys.stderr, flush=True)
                    return result
                trips = result.get("client_round_trips_per_request")
                print(
                    f"  {name}, {n_processes} x {threads}, {kw or ''}: {result['requests_per_s']:.0f} req/s"
                    + (f", {trips:.3f} round trips/request" if trips is not None else ""),
                    file=sys.stderr,
                    flush=True,
                )
                return result

            for rep in range(reps):
                order = main_names[rep % len(main_names) :] + main_names[: rep % len(main_names)]
                for name in order:
                    result = one(name, processes, duration)
                    if result is not None:
                        main_runs[name].append({**result, "rep": rep})
            if not args.no_scaling:
                for rep in range(scaling_reps):
                    for n_scopes in scopes_list:
                        row = scopes.setdefault(n_scopes, {"memory": [], "Redis": [], "Redis, no quota": []})
                        names = ("memory", "Redis", "Redis, no quota")
                        for name in names if rep % 2 == 0 else names[::-1]:
                            result = one(
                                "Redis" if name.startswith("Redis") else name,
                                processes,
                                scaling_duration,
                                scopes=n_scopes,
                                quota=name != "Redis, no quota",
                            )
                            if result is not None:
                                row[name].append({**result, "rep": rep})
        finally:
            fleet.close()

    # -- the report ---------------------------------------------------------------------------
    memory_main = main_runs["memory"]
    main_summary = {
        name: summarise(runs, memory_main if name != "memory" else None)
        for name, runs in main_runs.items()
        if runs
    }
    scopes_summary = {
        n: {
            name: summarise(runs, row["memory"] if name != "memory" else None)
            for name, runs in row.items()
            if runs
        }
        for n, row in sorted(scopes.items())
    }

    def trips_cell(s: dict[str, Any]) -> str:
        if "round_trips_per_request" not in s:
            return "-"
        return (
            f"{fmt_or_dash(s['client_round_trips_per_request'], 3)}; "
            f"{_common.fmt(s['round_trips_per_request']['median'], 3)} "
            f"({_common.fmt(s['round_trips_per_request_without_feed']['median'], 3)})"
        )

    def commands_cell(s: dict[str, Any]) -> str:
        if "commands_per_request" not in s:
            return "-"
        return (
            f"{_common.fmt(s['commands_per_request']['median'], 3)} "
            f"({_common.fmt(s['commands_per_request_without_feed']['median'], 3)})"
        )

    def scripts_cell(s: dict[str, Any]) -> str:
        per = s.get("round_trips_per_request_by_command")
        if per is None:
            return "-"
        return " / ".join(f"{per.get('evalsha ' + script, 0):.3f}" for script in ("admit", "settle", "note"))

    rows = []
    for name, s in main_summary.items():
        rows.append(
            [
                name,
                fmt_or_dash(s["requests_per_s"], 0),
                fmt_or_dash(s.get("ratio_vs_memory"), 3) if name != "memory" else "1",
                trips_cell(s),
                commands_cell(s),
                fmt_or_dash(s["client_cpu_us_per_request"], 0),
                fmt_or_dash(s.get("redis_cpu_us_per_request"), 1),
                f"{s['not_ok']} / {s['store_failures']} / {s['store_busy']} / {s['stuck_runs']}",
            ]
        )
    tables = [
        _common.table(
            f"Load: {processes} processes x {threads} threads, one scope, Quota({QUOTA_LIMIT}, per=1) "
            f"that never binds; {reps} runs of {duration:g} s per store (median [min-max])",
            [
                "store",
                "requests/s",
                "ratio vs memory",
                "Redis round trips / request, counted at the clients; commands sent (MONITOR; without feed)",
                "Redis commands / request, scripts' included (without feed)",
                "client CPU us / request",
                "Redis CPU us / request",
                "not 200 / store failures / busy / runs stuck",
            ],
            rows,
        )
    ]
    if scopes_summary:
        rows = []
        for n, row in scopes_summary.items():
            m, r, nq = row.get("memory"), row.get("Redis"), row.get("Redis, no quota")
            rows.append(
                [
                    str(n),
                    fmt_or_dash(m["requests_per_s"], 0) if m else "-",
                    fmt_or_dash(r["requests_per_s"], 0) if r else "-",
                    fmt_or_dash(r.get("ratio_vs_memory"), 3) if r else "-",
                    trips_cell(r) if r else "-",
                    scripts_cell(r) if r else "-",
                    fmt_or_dash(nq["requests_per_s"], 0) if nq else "-",
                    fmt_or_dash(nq.get("ratio_vs_memory"), 3) if nq else "-",
                    trips_cell(nq) if nq else "-",
                    scripts_cell(nq) if nq else "-",
                ]
            )
        tables.append(
            _common.table(
                f"Scopes: {processes} x {threads}, each thread round-robin over the scopes (one per "
                "path); memory and Redis with the quota, and Redis without one",
                [
                    "scopes",
                    "memory req/s",
                    "Redis req/s",
                    "Redis / memory",
                    "round trips / request at the clients; commands sent (without feed)",
                    "of which admit / settle / note",
                    "Redis, no quota: req/s",
                    "/ memory",
                    "round trips / request at the clients; commands sent (without feed)",
                    "of which admit / settle / note",
                ],
                rows,
            )
        )
    by_command = {}
    for name, runs in main_runs.items():
        if runs and "redis" in runs[0]:
            commands = sorted({c for r in runs for c in r["redis"]["round_trips"]})
            by_command[name] = {
                c: statistics.median(r["redis"]["round_trips"].get(c, 0) / r["requests"] for r in runs)
                for c in commands
            }
    if by_command:
        commands = sorted({c for per in by_command.values() for c in per})
        tables.append(
            _common.table(
                "Redis round trips per request by command (EVALSHA by script), main table (median)",
                ["store", *commands],
                [[name, *(f"{per.get(c, 0):.4f}" for c in commands)] for name, per in by_command.items()],
            )
        )
    redis_main = main_summary.get("Redis")
    targets: dict[str, Any] = {}
    if redis_main is not None:
        trips = redis_main["client_round_trips_per_request"]["median"]
        ratio = redis_main["ratio_vs_memory"]["median"]
        targets = {
            "round_trips_per_request": {
                "target": TRIPS_TARGET,
                "median": trips,
                "meets": trips <= TRIPS_TARGET,
            },
            "ratio_vs_memory": {
                "target": THROUGHPUT_TARGET,
                "median": ratio,
                "meets": ratio >= THROUGHPUT_TARGET,
            },
        }
        without_feed = redis_main["round_trips_per_request_without_feed"]["median"]
        tables.append(
            f"Redis round trips per request {trips:.3f} (counted at the clients): "
            f"{'meets' if trips <= TRIPS_TARGET else 'MISSES'} the target <= {TRIPS_TARGET} "
            f"(commands sent, MONITOR: {redis_main['round_trips_per_request']['median']:.3f}; "
            f"without the feed's PING/SUBSCRIBE: {without_feed:.3f}; "
            f"commandstats, scripts' commands included: {redis_main['commands_per_request']['median']:.3f})\n"
        )
        tables.append(
            f"Redis throughput / memory {ratio:.3f}: "
            f"{'meets' if ratio >= THROUGHPUT_TARGET else 'MISSES'} the target >= {THROUGHPUT_TARGET}\n"
        )
    busy = [r["machine_busy_share"] for runs in main_runs.values() for r in runs if r["machine_busy_share"]]
    other = [
        r["other_cpu_share"] for runs in main_runs.values() for r in runs if r["other_cpu_share"] is not None
    ]
    if busy:
        tables.append(
            f"Machine: cores {statistics.median(busy):.0%} busy in the main runs (median); "
            f"work other than this benchmark's: {statistics.median(other):.1%} of the cores (median), "
            f"at most {max(other):.1%}\n"
        )
    tables += [f"{note}\n" for note in notes]
    payload = {
        "settings": {
            "processes": processes,
            "threads": threads,
            "duration_s": duration,
            "warm_s": warm,
            "reps": reps,
            "scaling_reps": scaling_reps,
            "scaling_duration_s": scaling_duration,
            "scopes_list": scopes_list,
            "quota": {"limit": QUOTA_LIMIT, "per": 1.0},
            "quick": args.quick,
            "no_scaling": args.no_scaling,
            "worker_nice": args.worker_nice,
            "store_timeout_s": store_timeout,
        },
        "loadavg_at_start": load_at_start,
        "redis_server": redis_version,
        "skipped": notes,
        "targets": targets,
        "main": main_summary,
        "main_round_trips_per_request_by_command": by_command,
        "scopes": {str(n): row for n, row in scopes_summary.items()},
    }
    _common.finish("load", payload, tables, args.out)


if __name__ == "__main__":
    main()
