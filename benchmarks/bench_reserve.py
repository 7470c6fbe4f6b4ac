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

Side by side with the field (``--field``, default on; ``--field-processes``, default
1,2,4,8,16, each of ``--threads`` threads, ``--field-duration`` seconds): the same
binding quota and server, each thread looping "wait for the limiter, then one GET"
with its own limiter on the same Redis: this package (a Session with the quota on a
``RedisCooldownStore``), throttled-py's GCRA (its ``RedisStore``, wait mode:
``Throttled(timeout=...)``) and pyrate-limiter's ``RedisBucket`` (a sliding log,
``try_acquire(blocking=True)``). Per admitted request: Redis round trips (counted at
the clients as above), Redis commands and CPU; the server's worst 1 s window; goodput;
and each request's wait before it went, p50 and p99, beyond the ideal wait of a fair
queue (threads / quota seconds, what a thread waits in turn with every thread busy).

Decisions per second (``--decisions``, default on; ``lib.decide``): each limiter's
admission alone, flat out, no HTTP in the way, against the same Redis: Redis ``INCRBY``
(the floor), this package's engine (the store's failure layer with its near copy, as
the engine calls it, each admitted permit settled as its answer would), its
``RedisCooldownStore.admit`` alone (one script a decision), throttled-py's GCRA
(``Throttled.limit``) and pyrate-limiter (``try_acquire(blocking=False)``), each with
``--decisions-threads`` threads (default 1,4,16) in ``--decisions-processes`` processes
(default 1,4), on a quota no decision reaches and on a binding ``Quota(40, per=1)``
(nearly all refused): decisions per second, Redis CPU, client CPU and round trips a
decision, the Redis script's microseconds a call; on the binding quota, the most admitted
in a second of any repetition (the quota held: 40), and how many of our processes' failure
layers held the store down at a phase's end (failing open: each process counting alone).
``--decisions-duration`` seconds measured a phase (default 1), medians of
``--decisions-reps`` (default 3), the limiters' phases alternating.

    python benchmarks/bench_reserve.py              # about 10 minutes: 4 x 16, the field, the decisions
    python benchmarks/bench_reserve.py --field "" --decisions ""  # this package alone, 15 s a repetition
    python benchmarks/bench_reserve.py --decisions-only  # decisions per second alone, about 6 minutes
    python benchmarks/bench_reserve.py --quick      # 2 processes x 8 threads, 3 s; the field at 1 x 8, 2 s;
                                                    # the decisions at 1 x 2, 0.3 s (about 45 s in all)
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import bench_scale
from lib import common as _common
from lib import decide, load
from lib.fleet import fetch_log

PER = 1.0


def binding_run(
    fleet: load.Fleet, spec: dict[str, Any], processes: int, kept: load.Stores, warm: float,
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


# -- the field: the same binding quota through other limiters ------------------------------

FIELD = ("retry_after_adapter", "throttled-py GCRA", "pyrate-limiter")


def _limiter(name: str, redis_url: str, limit: int, key: str) -> Any:
    """``acquire()``: wait for ``name``'s limiter, True when admitted (a session for
    this package: its GET waits itself)."""
    if name == "throttled-py GCRA":
        from throttled import RateLimiterType, RedisStore, Throttled, rate_limiter

        throttle = Throttled(
            key=key, using=RateLimiterType.GCRA.value, quota=rate_limiter.per_sec(limit),
            store=RedisStore(server=redis_url), timeout=30,
        )
        return lambda: not throttle.limit(key, timeout=30).limited
    if name == "pyrate-limiter":
        import redis
        from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

        bucket = RedisBucket.init([Rate(limit, Duration.SECOND)], redis.Redis.from_url(redis_url), key)
        limiter = Limiter(bucket)
        return lambda: bool(limiter.try_acquire(key, blocking=True, timeout=30))
    return None


def _field_process(
    name: str, redis_url: str, url: str, limit: int, threads: int, window: tuple[float, float], out: Any
) -> None:
    """One process of the field's fleet: ``threads`` threads until ``window`` ends
    (monotonic); reports admitted requests, their waits and Redis round trips."""
    import requests

    load._count_round_trips()
    load._WINDOW[:] = list(window)
    t0, t1 = window
    acquire = _limiter(name, redis_url, limit, "bench-reserve-field")
    store = None
    if acquire is None:
        from retry_after_adapter import Quota, RedisCooldownStore, RetryAfterAdapter, RetryAfterRetry

        store = RedisCooldownStore.from_url(redis_url, prefix="bench-reserve-field:")
    waits: list[float] = []
    counts = [0, 0]  # 200s in the window, others
    lock = threading.Lock()

    def run() -> None:
        session = requests.Session()
        if store is not None:
            retry = RetryAfterRetry(total=0, max_wait=30, deadline=40)
            session.mount("http://", RetryAfterAdapter(retry, cooldown=store, quota=Quota(limit, per=PER)))
        time.sleep(max(0.0, t0 - 1.0 - time.monotonic()))
        while time.monotonic() < t1:
            started = time.monotonic()
            if acquire is not None and not acquire():
                continue
            went = time.monotonic()
            try:
                ok = session.get(url, timeout=30).status_code == 200
            except Exception:
                ok = False
            done = time.monotonic()
            wait = (went if acquire is not None else done) - started
            with lock:
                if t0 <= done < t1:
                    counts[0 if ok else 1] += 1
                    if ok:
                        waits.append(wait)

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(t1 - time.monotonic() + 45)
    out.put({"ok": counts[0], "bad": counts[1], "waits": waits, "sent": load._SENT[0]})


def field_run(
    name: str, kept: load.Stores, processes: int, threads: int, limit: int, warm: float,
    duration: float,
) -> dict[str, Any]:
    """One library's fleet against a fresh server: what it measured."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    kept.empty("redis")
    with _common.ServerProcess("retry_after_adapter.demo", "--serve", str(limit), str(PER)) as server:
        start = time.monotonic() + 2.0 + 0.1 * processes  # the processes start meanwhile
        window = (start + warm, start + warm + duration)
        procs = [
            context.Process(
                target=_field_process,
                args=(name, kept.redis.url, server.url + "/", limit, threads, window, out),
                daemon=True,
            )
            for _ in range(processes)
        ]
        for proc in procs:
            proc.start()
        time.sleep(max(0.0, window[0] - time.monotonic()))
        kept.reset_stats("redis")
        cpu0 = kept.cpu("redis")
        time.sleep(max(0.0, window[1] - time.monotonic()))
        cpu1 = kept.cpu("redis")
        commands = kept.commands("redis")
        reports = [out.get(timeout=90) for _ in procs]
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        log = fetch_log(server.url)["log"]
    ok = sum(r["ok"] for r in reports)
    waits = sorted(w for r in reports for w in r["waits"])
    ideal = processes * threads / limit * PER
    arrivals = sorted(entry["arrival"] for entry in log)
    result: dict[str, Any] = {
        "requests_per_s": ok / duration,
        "goodput_vs_allowed": ok / duration / (limit / PER),
        "not_ok": sum(r["bad"] for r in reports),
        "throttled": sum(1 for entry in log if entry["status"] == 429),
        "worst_window": bench_scale.worst_window(arrivals, PER),
        "ideal_wait_s": ideal,
    }
    if ok:
        result["round_trips_per_request"] = sum(r["sent"] for r in reports) / ok
        result["commands_per_request"] = commands / ok
        busy = max(0.0, cpu1 - cpu0 - kept.idle["redis"] * duration)
        result["redis_cpu_us_per_request"] = busy / ok * 1e6
    if waits:
        result["wait_beyond_ideal_p50_s"] = waits[len(waits) // 2] - ideal
        result["wait_beyond_ideal_p99_s"] = waits[int(0.99 * (len(waits) - 1))] - ideal
    return result


FIELD_KEYS = (
    "round_trips_per_request", "commands_per_request", "redis_cpu_us_per_request", "worst_window",
    "goodput_vs_allowed", "wait_beyond_ideal_p50_s", "wait_beyond_ideal_p99_s",
)


def field_table(rows: dict[str, dict[int, dict[str, Any]]], limit: int, threads: int, duration: float) -> str:
    headers = [
        "limiter", "processes", "round trips/req", "Redis commands/req", "Redis CPU us/req",
        "worst 1 s window; 429s", "goodput / allowed", "wait beyond ideal p50; p99 (s)",
    ]
    lines = []
    for name, by_size in rows.items():
        for processes, r in sorted(by_size.items()):
            lines.append([
                name, f"{processes} x {threads}",
                bench_scale.cell(r.get("round_trips_per_request"), 2),
                bench_scale.cell(r.get("commands_per_request"), 1),
                bench_scale.cell(r.get("redis_cpu_us_per_request"), 0),
                f"{r.get('worst_window')}/{limit}; {r.get('throttled')}",
                bench_scale.cell(r.get("goodput_vs_allowed"), 2),
                f"{bench_scale.cell(r.get('wait_beyond_ideal_p50_s'), 2)}; "
                f"{bench_scale.cell(r.get('wait_beyond_ideal_p99_s'), 2)}",
            ])
    title = (
        f"The field on one Redis: Quota({limit}, per=1) shared, a server allowing {limit} per 1 s, "
        f"{duration:g} s each"
    )
    return _common.table(title, headers, lines)


# -- decisions per second: each limiter's admission alone, flat out ----------------------

DECISION_KEYS = (
    "decisions_per_s", "redis_cpu_us_per_decision", "client_cpu_us_per_decision",
    "round_trips_per_decision", "commands_per_decision", "script_usec_per_call", "admitted_share",
    "admitted_per_s",
)


def decisions(
    kept: load.Stores, names: list[str], sizes: list[int], threads: list[int], reps: int, duration: float,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each limiter's decisions per second and their cost (``lib.decide``), per mode
    and ``processes x threads``: medians over ``reps`` phases, each phase's figures
    kept ("runs"). The limiters' phases alternate (each repetition in another order),
    so that what else the machine runs weighs on each alike."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for processes in sizes if names else []:
        fleets: dict[str, decide.Fleet] = {}
        try:
            for name in names:
                fleets[name] = decide.Fleet(name, kept.redis.url, processes)
            for rep in range(reps):
                for mode, limit in decide.MODES.items():
                    for count in threads:
                        turn = rep % len(names)
                        for name in names[turn:] + names[:turn]:
                            key = f"bench-decide-{mode}-{processes}-{count}-{rep}"
                            setup = 0.3 + 0.05 * processes * count / 4
                            result = fleets[name].phase(kept, limit, count, key, setup, 0.3, duration)
                            cell = rows.setdefault(name, {}).setdefault(f"{mode} {processes} x {count}", {})
                            cell.setdefault("runs", []).append(result)
                            shown = ", ".join(
                                f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, (int, float))
                            )
                            where = f"{name}, {mode}, {processes} x {count}"
                            print(f"  {where}: {shown or result}", file=sys.stderr, flush=True)
        finally:
            for fleet in fleets.values():
                fleet.close()
    rows = {name: rows[name] for name in names if name in rows}
    for by_size in rows.values():
        for cell in by_size.values():
            good = [r for r in cell["runs"] if "error" not in r]
            for key in DECISION_KEYS:
                vals = [r[key] for r in good if r.get(key) is not None]
                cell[key] = statistics.median(vals) if vals else None
            cell["admitted_per_s_most"] = max((r["admitted_per_s"] for r in good), default=None)
            cell["store_down"] = sum(r["store_down"] for r in good)
            if len(good) < len(cell["runs"]):
                cell["errors"] = [r["error"] for r in cell["runs"] if "error" in r]
    return rows


def decisions_table(rows: dict[str, dict[str, dict[str, Any]]], duration: float, reps: int) -> str:
    cost = "Redis CPU us; client CPU us; round trips a decision"
    headers = [
        "limiter", "processes x threads", "open: decisions/s", cost, "binding: decisions/s", cost,
        "binding: admitted/s, most", "failing open",
    ]
    lines = []
    for name, by_size in rows.items():
        sizes = sorted(
            {size.split(" ", 1)[1] for size in by_size}, key=lambda s: tuple(int(x) for x in s.split(" x "))
        )
        for size in sizes:
            line = [name, size]
            for mode in decide.MODES:
                r = by_size.get(f"{mode} {size}", {})
                line.append(bench_scale.cell(r.get("decisions_per_s"), 0))
                line.append(
                    f"{bench_scale.cell(r.get('redis_cpu_us_per_decision'), 0)}; "
                    f"{bench_scale.cell(r.get('client_cpu_us_per_decision'), 0)}; "
                    f"{bench_scale.cell(r.get('round_trips_per_decision'), 2)}"
                )
            binding = by_size.get(f"binding {size}", {})
            line.append(bench_scale.cell(binding.get("admitted_per_s_most"), 0))
            line.append(sum(by_size.get(f"{mode} {size}", {}).get("store_down", 0) for mode in decide.MODES))
            lines.append(line)
    title = (
        f"Decisions per second on one Redis, flat out: open = Quota({decide.MODES['open']}, per=1), "
        f"binding = Quota({decide.MODES['binding']}, per=1); {duration:g} s each, median of {reps}"
    )
    return _common.table(title, headers, lines)


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
    p.add_argument("--field", default=",".join(FIELD), help="limiters side by side ('' for none)")
    p.add_argument("--field-processes", help="processes of the field's runs (default 1,2,4,8,16; quick 1)")
    p.add_argument("--field-duration", type=float, help="seconds measured per field run (default 6; quick 2)")
    p.add_argument(
        "--decisions", default=",".join(decide.LIMITERS),
        help="limiters whose decisions per second are measured ('' for none)",
    )
    p.add_argument("--decisions-only", action="store_true", help="measure decisions per second alone")
    p.add_argument("--decisions-processes", help="processes of the decisions' phases (default 1,4; quick 1)")
    p.add_argument("--decisions-threads", help="threads a process in those (default 1,4,16; quick 2)")
    p.add_argument("--decisions-duration", type=float, help="seconds measured a phase (default 1; quick 0.3)")
    p.add_argument("--decisions-reps", type=int, help="repetitions of each phase (default 3; quick 1)")
    args = p.parse_args()
    processes = args.processes or (2 if args.quick else 4)
    threads = args.threads or (8 if args.quick else 16)
    duration = args.duration or (3.0 if args.quick else 8.0)
    if min(processes, threads, args.reps, args.limit) < 1 or duration <= 0:
        p.error("counts must be at least 1, --duration positive")
    decided_names = [n.strip() for n in args.decisions.split(",") if n.strip()]
    for name in decided_names:
        if name not in decide.LIMITERS:
            p.error(f"--decisions: known limiters are {', '.join(decide.LIMITERS)}")
    decided_sizes = [int(x) for x in (args.decisions_processes or ("1" if args.quick else "1,4")).split(",")]
    thread_counts = args.decisions_threads or ("2" if args.quick else "1,4,16")
    decided_threads = [int(x) for x in thread_counts.split(",")]
    decided_duration = args.decisions_duration or (0.3 if args.quick else 1.0)
    decided_reps = args.decisions_reps or (1 if args.quick else 3)
    if min(decided_sizes + decided_threads + [decided_reps]) < 1 or decided_duration <= 0:
        p.error("the decisions' counts must be at least 1, --decisions-duration positive")
    runs: list[dict[str, Any]] = []
    field: dict[str, dict[int, dict[str, Any]]] = {}
    names = [] if args.decisions_only else [n.strip() for n in args.field.split(",") if n.strip()]
    for name in names:
        if name not in FIELD:
            p.error(f"--field: known limiters are {', '.join(FIELD)}")
    sizes = [int(x) for x in (args.field_processes or ("1" if args.quick else "1,2,4,8,16")).split(",")]
    field_duration = args.field_duration or (2.0 if args.quick else 6.0)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-reserve-") as workdir, load.stores(
        workdir, ["redis"]
    ) as kept:
        if kept is None or "redis" in kept.skipped:
            print("no Redis: nothing to measure", file=sys.stderr)
            return
        fleet = load.Fleet(processes, args.worker_nice) if not args.decisions_only else None
        try:
            for rep in range(0 if fleet is None else args.reps):
                spec = bench_scale.spec_for(
                    "redis", "", threads, kept.where("redis", workdir, rep), rep, args.store_timeout or None,
                    args.limit, 0.0,
                )
                spec["margin"] = args.margin
                assert fleet is not None
                result = binding_run(fleet, spec, processes, kept, args.warm, duration, args.limit)
                runs.append(result)
                shown = ", ".join(f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, (int, float)))
                print(f"  run {rep + 1}: {shown}", file=sys.stderr, flush=True)
        finally:
            if fleet is not None:
                fleet.close()
        for size in sizes if names else []:
            for name in names:
                result = field_run(name, kept, size, threads, args.limit, args.warm, field_duration)
                field.setdefault(name, {})[size] = result
                shown = ", ".join(f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, (int, float)))
                print(f"  {name}, {size} x {threads}: {shown}", file=sys.stderr, flush=True)
        decided = decisions(
            kept, decided_names, decided_sizes, decided_threads, decided_reps, decided_duration
        )
    tables = []
    row: dict[str, Any] = {}
    good = [r for r in runs if not r.get("stuck_workers")]
    if good:
        for key in KEYS:
            vals = [r[key] for r in good if r.get(key) is not None]
            row[key] = statistics.median(vals) if vals else None
        row["worst_window"] = max(r["worst_window"] for r in good)
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
        tables.append(_common.table(title, headers, [cells]))
    if field:
        tables.append(field_table(field, args.limit, threads, field_duration))
    if decided:
        tables.append(decisions_table(decided, decided_duration, decided_reps))
    payload = {
        "settings": {
            "processes": processes, "threads": threads, "limit": args.limit, "per_s": PER,
            "duration_s": duration, "warm_s": args.warm, "reps": args.reps,
            "decisions": {
                "processes": decided_sizes, "threads": decided_threads, "duration_s": decided_duration,
                "reps": decided_reps, "limits": decide.MODES,
            },
            "took_s": round(time.monotonic() - started),
        },
        "binding": row,
        "runs": runs,
        "field": {name: {str(size): r for size, r in by_size.items()} for name, by_size in field.items()},
        "decisions": decided,
    }
    _common.finish("reserve", payload, tables, args.out)


if __name__ == "__main__":
    main()
