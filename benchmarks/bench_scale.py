"""Scaling: what a request costs a fleet on one shared store, from 8 workers to 512.

A fleet of 1, 2, 4, 8 and 16 worker processes (``--processes-list``; each stands in for
a host) of 8 and 32 threads each (``--threads-list``), each thread with its own Session,
sends GETs to a loopback server, every adapter on one scope (the server's origin) and
one of these stores:

- memory: each process its own ``MemoryCooldownStore`` (nothing shared: the floor the
  shared stores are measured against);
- Redis: one ``RedisCooldownStore`` on one ``redis-server`` (without persistence);
- Redis Cluster: one ``RedisCooldownStore`` on a ``redis.cluster.RedisCluster`` client
  of a 3-master cluster on loopback (a scope's keys live in one slot, so on one node);
- SQLite: one ``SQLiteCooldownStore`` file shared by every process.

Three loads:

- flat out, a quota that never binds: ``Quota(10000, per=1)``, every thread sending as
  fast as it can to the benchmarks' fast ``200 ok`` server (asyncio, its own process).
  Requests/s against the memory store at the same size in the same repetition. On one
  machine the fleet's throughput is the machine's: the more processes, the fewer
  requests each sends, and a cost paid per process and second (a batch taken, settles
  written together, the change feed's ping) is spread over fewer requests.
- paced, the same quota: each process sends ``--pace`` GETs a second (default 50,
  spread over its threads), as hosts of a fleet each with their own cores would: the
  cost per request as the fleet grows at a constant demand per host. The issue's
  flatness target (cost per request within 1.2x from 8 to 256 workers) is judged here.
- one Session (``--session-reps`` runs, default 3): one process of 8 threads on one
  Session with ``Quota(10**6, per=1)`` and ``max_concurrency=1000``, about 1,000 GETs a
  second: Redis round trips per request (the issue's target: 0.05 at most) in its
  first second (its connections opened, each with the client's handshake, its first
  batches sized from its first 20 ms; the scripts stay loaded from earlier runs) and in
  the one after.
- binds: ``Quota(250, per=1)`` shared by the fleet against the project's
  ``QuotaServer``, which allows 250 requests per fixed 1 s window and answers 429 past
  it (a new server each run, in its own process, logging every arrival): requests
  answered 200 per second against the 250 allowed, the 429s, and the most arrivals in
  any 1 s window (sliding over the server's log of the whole run, warm-up included)
  against the limit. The memory store is not run here: unshared, each process would
  spend the whole quota.

Costs: Redis round trips per request (each write a worker's Redis client sends within
the window, counted at the clients: a pipeline is one), Redis commands per request
(``INFO commandstats``: the commands the scripts run included; every node's, on the
cluster), Redis CPU time per request (the servers', ``INFO cpu``, less what they use
idle, measured once before the runs), and the store operations that failed
("failures": a failing store is skipped, fail open, and a quota is then counted in
each process alone).

Method. The worker processes (``bench_load``'s, started once, ``nice`` 5: the servers
would run elsewhere) run every variant in turn with a fresh store (a new file, a new key
prefix, an emptied Redis), ``--warm`` seconds unmeasured (default 1.5) and then
``--duration`` seconds measured (default 3). The stores get 3 s socket and connect
timeouts, and SQLite a 3 s lock wait (``--store-timeout``): with 512 threads on two
cores a reply waits for its thread to be scheduled, and a shorter timeout measures the
failure layer instead of the store (see ``bench_load``). Figures are medians over ``--reps`` repetitions.

The plot (``--plot``, default ``<out>/scale.svg``; needs matplotlib, ``pip install -e
'.[bench]'``): Redis round trips and Redis CPU time per request against workers.

    python benchmarks/bench_scale.py            # about 12 minutes a repetition
    python benchmarks/bench_scale.py --quick    # about a minute: 1 and 2 processes x 4 threads
"""

from __future__ import annotations

import bisect
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lib import common as _common
from lib import load
from lib.common import cpu_seconds
from lib.fleet import fetch_log

NEVER_LIMIT = load.QUOTA_LIMIT
BINDING_LIMIT = 250
PER = 1.0
FLAT_TARGET = 1.2
#: Workers (processes x threads) over which the flatness target is judged.
FLAT_RANGE = (8, 256)
SHARED = {"redis": "Redis", "cluster": "Redis Cluster", "sqlite": "SQLite"}


# -- one run ---------------------------------------------------------------------------------


def worst_window(arrivals: list[float], per: float) -> int:
    """The most arrivals in any window of ``per`` seconds (``arrivals`` sorted)."""
    return max((bisect.bisect_left(arrivals, t + per) - i for i, t in enumerate(arrivals)), default=0)


def run(
    fleet: load.Fleet,
    spec: dict[str, Any],
    processes: int,
    kept: load.Stores | None,
    warm: float,
    duration: float,
) -> dict[str, Any]:
    """One variant on the first ``processes`` workers: what it measured."""
    kind = spec["store"]
    redis_kind = kind in ("redis", "cluster") and kept is not None
    stuck_at_start = load.ready(fleet, spec, processes)
    if stuck_at_start:
        return {"stuck_workers": stuck_at_start}
    if redis_kind:
        kept.empty(kind)
    t0, t1 = load.start(fleet, processes, warm, duration)
    workers = [proc.pid for proc in fleet.procs[:processes]]
    time.sleep(max(0.0, t0 - time.monotonic()))
    if redis_kind:
        kept.reset_stats(kind)
    cpu0 = kept.cpu(kind) if redis_kind else 0.0
    clients0 = sum(cpu_seconds(pid) for pid in workers)
    time.sleep(max(0.0, t1 - time.monotonic()))
    cpu1 = kept.cpu(kind) if redis_kind else 0.0
    clients1 = sum(cpu_seconds(pid) for pid in workers)
    commands = kept.commands_by_name(kind) if redis_kind else {}
    done, stuck = load.reports(fleet, processes, t1)
    ok = sum(d["ok"] for d in done)
    result: dict[str, Any] = {
        "stuck_workers": stuck,
        "requests_per_s": ok / duration,
        "not_ok": sum(d["bad"] for d in done),
        "store_failures": sum(d["failures"] for d in done),
        "log_first": [line for d in done for line in d["log_first"]][:3],
    }
    if ok:
        # The worker processes' CPU (every thread's), per request answered in the window.
        result["client_cpu_us_per_request"] = (clients1 - clients0) / ok * 1e6
    if redis_kind and ok:
        result["round_trips_per_request"] = sum(d["sent"] for d in done) / ok
        result["commands_per_request"] = sum(commands.values()) / ok
        sent_by: Counter[str] = sum((Counter(d.get("sent_by", {})) for d in done), Counter())
        result["round_trips_per_request_by_kind"] = {k: n / ok for k, n in sorted(sent_by.items())}
        result["commands_per_request_by_name"] = {k: n / ok for k, n in sorted(commands.items())}
        # Less what the servers use with no client at all (their timers), over the window.
        busy = max(0.0, cpu1 - cpu0 - kept.idle[kind] * duration)
        result["redis_cpu_us_per_request"] = busy / ok * 1e6
    return result


def spec_for(
    kind: str, url: str, threads: int, where: Any, run_no: int, timeout: float | None, limit: int, pace: float
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "url": url,
        "threads": threads,
        "scopes": 0,
        "quota": True,
        "limit": limit,
        "per": PER,
        "pace": pace,
        "push": True,
        "timeout": timeout,
        "store": kind,
        "where": where,
        "prefix": f"bench-scale-{run_no}:",
    }
    load.prepare_sqlite(spec)
    return spec


def binding_run(
    fleet: load.Fleet,
    spec: dict[str, Any],
    processes: int,
    kept: load.Stores | None,
    warm: float,
    duration: float,
) -> dict[str, Any]:
    """:func:`run` against a fresh ``QuotaServer``, and what that server saw."""
    with _common.ServerProcess("retry_after_adapter.demo", "--serve", str(BINDING_LIMIT), str(PER)) as server:
        result = run(fleet, {**spec, "url": server.url}, processes, kept, warm, duration)
        log = fetch_log(server.url)["log"]
    arrivals = sorted(entry["arrival"] for entry in log)
    result["throttled"] = sum(1 for entry in log if entry["status"] == 429)
    result["worst_window"] = worst_window(arrivals, PER)
    result["goodput_vs_allowed"] = result.get("requests_per_s", 0.0) / (BINDING_LIMIT / PER)
    return result


# -- the report --------------------------------------------------------------------------------

SESSION_TARGET = 0.05


#: One Session's two measured seconds: from its first request (its connections opened,
#: its first batches sized), and the one after.
SECONDS = {"first": 0.0, "second": 1.0}


def one_session(
    fleet: load.Fleet, kind: str, url: str, kept: load.Stores, run_no: int, timeout: float | None, warm: float
) -> dict[str, Any]:
    """One Session of 8 threads, a quota and a cap that never bind, measured for one
    second from ``warm`` seconds after its first request."""
    spec = spec_for(kind, url, 8, kept.where(kind, "", run_no), run_no, timeout, 10**6, 0.0)
    spec.update(one_session=True, max_concurrency=1000)
    return run(fleet, spec, 1, kept, warm, 1.0)


#: The loads, as the tables and the JSON name them.
LOADS = {"flat": "flat out, never binds", "paced": "paced, never binds", "binding": "binds"}
Rows = dict[tuple[int, int], dict[str, Any]]


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if not r.get("stuck_workers") and r.get(key) is not None]
    return statistics.median(values) if values else None


def cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def flatness(rows: Rows, kind: str, key: str) -> float | None:
    """Largest over smallest median ``key`` of ``kind`` at 8 to 256 workers."""
    lo, hi = FLAT_RANGE
    values = [
        row[kind][key]
        for (p, t), row in rows.items()
        if lo <= p * t <= hi and kind in row and row[kind].get(key)
    ]
    return max(values) / min(values) if len(values) > 1 else None


def plot(path: Path, loads: dict[str, Rows]) -> str:
    """The cost per request against workers, as an SVG at ``path`` ("" or why not)."""
    try:
        import matplotlib

        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    matplotlib.rcParams["svg.hashsalt"] = "bench-scale"  # the same picture gives the same file
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    colours = {"flat": "tab:blue", "paced": "tab:green", "binding": "tab:red"}
    lines = {"redis": "-", "cluster": "--"}
    for key, ax, label in (
        ("round_trips_per_request", axes[0], "Redis round trips per request"),
        ("redis_cpu_us_per_request", axes[1], "Redis CPU µs per request"),
    ):
        for load_name, rows in loads.items():
            for kind in ("redis", "cluster"):
                for threads in sorted({t for _, t in rows}):
                    points = sorted(
                        (p * t, row[kind][key])
                        for (p, t), row in rows.items()
                        if t == threads and kind in row and row[kind].get(key) is not None
                    )
                    if points:
                        ax.plot(
                            *zip(*points, strict=True),
                            lines[kind],
                            color=colours[load_name],
                            marker="o" if threads == min(t for _, t in rows) else "s",
                            label=f"{LOADS[load_name]}; {SHARED[kind]}, {threads} threads/process",
                        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers (processes x threads)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, 0.2, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)
    return ""


def _by_size(rows: Rows) -> list[tuple[tuple[int, int], dict[str, Any]]]:
    return sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))


def _cost(s: dict[str, Any], kind: str) -> list[str]:
    if kind == "sqlite":
        return [cell(s.get("store_failures"), 0)]
    return [
        cell(s.get("round_trips_per_request"), 3),
        cell(s.get("redis_cpu_us_per_request"), 0),
        cell(s.get("store_failures"), 0),
    ]


def _cost_headers(kind: str) -> list[str]:
    name = SHARED[kind].replace("Redis Cluster", "Cluster")
    if kind == "sqlite":
        return [f"{name} failures"]
    return [f"{name} round trips/req", f"{name} CPU us/req", f"{name} failures"]


def ranged(s: dict[str, Any], key: str, digits: int) -> str:
    """A median with its range over the repetitions: ``0.036 [0.034-0.041]``."""
    span = s.get("ranges", {}).get(key)
    if s.get(key) is None or span is None or span[0] == span[1]:
        return cell(s.get(key), digits)
    return f"{cell(s[key], digits)} [{cell(span[0], digits)}-{cell(span[1], digits)}]"


def shares(per: dict[str, float], shown: int = 8) -> str:
    """``name 0.012, ...``: the largest ``shown`` of a breakdown per request, the rest added up."""
    ranked = sorted(per.items(), key=lambda kv: -kv[1])
    parts = [f"{name} {value:.3g}" for name, value in ranked[:shown] if value]
    rest = sum(value for _, value in ranked[shown:])
    return ", ".join(parts + ([f"others {rest:.3g}"] if rest else [])) or "-"


def breakdown(flat: Rows, kinds: list[str], reps: int) -> list[str]:
    """Flat out on Redis and the cluster: each cost with its range, and what the round
    trips carried and which commands Redis ran, per request."""
    out = []
    for kind in [k for k in kinds if k != "sqlite"]:
        rows, what = [], []
        for (p, t), row in _by_size(flat):
            s, memory = row.get(kind), row.get("memory", {})
            if not s:
                continue
            size = f"{p} x {t} = {p * t}"
            rows.append(
                [
                    size,
                    ranged(s, "ratio_vs_memory", 2),
                    ranged(s, "round_trips_per_request", 3),
                    ranged(s, "commands_per_request", 2),
                    f"{ranged(s, 'client_cpu_us_per_request', 0)} "
                    f"({cell(memory.get('client_cpu_us_per_request'), 0)})",
                    ranged(s, "redis_cpu_us_per_request", 0),
                ]
            )
            what.append(
                [
                    size,
                    shares(s.get("round_trips_per_request_by_kind", {})),
                    shares(s.get("commands_per_request_by_name", {})),
                ]
            )
        if not rows:
            continue
        name = SHARED[kind]
        out.append(
            _common.table(
                f"Flat out, {name}: median [min-max] of {reps}",
                [
                    "processes x threads = workers",
                    f"{name} / memory",
                    "round trips/req (at the clients)",
                    "commands/req (commandstats, the scripts' own included)",
                    "client CPU us/req (memory's)",
                    "Redis CPU us/req",
                ],
                rows,
            )
        )
        out.append(
            _common.table(
                f"Flat out, {name}, per request (medians): what the round trips carried (a write's "
                "first command, an EVALSHA by its script; + a pipeline) and the commands Redis ran",
                ["processes x threads = workers", "round trips by what", "commands by name"],
                what,
            )
        )
    return out


def tables(loads: dict[str, Rows], kinds: list[str], reps: int, pace: float) -> list[str]:
    out = []
    flat, paced, binding = loads.get("flat", {}), loads.get("paced", {}), loads.get("binding", {})
    if flat:
        rows = [
            [f"{p} x {t} = {p * t}", cell(row.get("memory", {}).get("requests_per_s"), 0)]
            + [
                x
                for kind in kinds
                for x in [cell(row.get(kind, {}).get("ratio_vs_memory"), 2), *_cost(row.get(kind, {}), kind)]
            ]
            for (p, t), row in _by_size(flat)
        ]
        headers = ["processes x threads = workers", "memory req/s"]
        headers += [h for kind in kinds for h in [f"{SHARED[kind]} / memory", *_cost_headers(kind)]]
        out.append(
            _common.table(
                f"Flat out: Quota({NEVER_LIMIT}, per=1) never binds; median of {reps}", headers, rows
            )
        )
    out += breakdown(flat, kinds, reps)
    if paced:
        rows = [
            [f"{p} x {t} = {p * t}"]
            + [
                x
                for kind in kinds
                for x in [cell(row.get(kind, {}).get("requests_per_s"), 0), *_cost(row.get(kind, {}), kind)]
            ]
            for (p, t), row in _by_size(paced)
        ]
        headers = ["processes x threads = workers"]
        headers += [h for kind in kinds for h in [f"{SHARED[kind]} req/s", *_cost_headers(kind)]]
        out.append(
            _common.table(
                f"Paced: {pace:g} GETs/s per process, Quota({NEVER_LIMIT}, per=1); median of {reps}",
                headers,
                rows,
            )
        )
    if binding:
        rows = []
        for (p, t), row in _by_size(binding):
            line = [f"{p} x {t} = {p * t}"]
            for kind in kinds:
                s = row.get(kind, {})
                line += [
                    cell(s.get("goodput_vs_allowed"), 2),
                    f"{cell(s.get('worst_window'), 0)}/{BINDING_LIMIT}; {cell(s.get('throttled'), 0)}",
                    *_cost(s, kind),
                ]
            rows.append(line)
        headers = ["processes x threads = workers"]
        headers += [
            h
            for kind in kinds
            for h in [f"{SHARED[kind]} goodput / allowed", "worst 1 s window; 429s", *_cost_headers(kind)]
        ]
        title = f"Binds: Quota({BINDING_LIMIT}, per=1) shared, a server allowing {BINDING_LIMIT} per 1 s"
        out.append(_common.table(title, headers, rows))
    for kind in kinds:
        if kind == "sqlite":
            continue
        for load_name in ("paced", "flat"):
            spans = [(key, flatness(loads.get(load_name, {}), kind, key)) for key in COST_KEYS]
            shown = [f"{key.replace('_', ' ')} {v:.2f}" for key, v in spans if v is not None]
            if shown:
                out.append(
                    f"{SHARED[kind]}, 8 to 256 workers, {LOADS[load_name]}: largest / smallest "
                    + ", ".join(shown)
                    + f" (target <= {FLAT_TARGET})\n"
                )
    return out


COST_KEYS = ("round_trips_per_request", "redis_cpu_us_per_request")
#: The figures whose range over the repetitions is kept beside their median.
RANGED = (
    "requests_per_s",
    "round_trips_per_request",
    "commands_per_request",
    "redis_cpu_us_per_request",
    "client_cpu_us_per_request",
)
#: A run's breakdowns, kept as medians per name: round trips by what they carried
#: (counted at the clients), and Redis commands by command (``INFO commandstats``).
BY = ("round_trips_per_request_by_kind", "commands_per_request_by_name")


def range_of(runs: list[dict[str, Any]], key: str) -> list[float] | None:
    values = [r[key] for r in runs if not r.get("stuck_workers") and r.get(key) is not None]
    return [min(values), max(values)] if values else None


def summarise(runs: dict[tuple[int, int, str], list[dict[str, Any]]]) -> Rows:
    """Medians per (processes, threads) and store; ratios to memory per repetition."""
    keys = (
        "requests_per_s",
        "round_trips_per_request",
        "commands_per_request",
        "redis_cpu_us_per_request",
        "client_cpu_us_per_request",
        "goodput_vs_allowed",
        "not_ok",
        "store_failures",
    )
    out: Rows = {}
    for (p, t, kind), every in runs.items():
        s: dict[str, Any] = {key: median_of(every, key) for key in keys}
        s["stuck_runs"] = sum(1 for r in every if r.get("stuck_workers"))
        #: Each figure's min and max over the repetitions (the medians above).
        s["ranges"] = {key: range_of(every, key) for key in RANGED if range_of(every, key)}
        for by in BY:
            names = sorted({name for r in every if not r.get("stuck_workers") for name in r.get(by, {})})
            if names:
                s[by] = {
                    name: statistics.median(
                        r.get(by, {}).get(name, 0.0) for r in every if not r.get("stuck_workers")
                    )
                    for name in names
                }
        if kind != "memory" and (p, t, "memory") in runs:
            base = {
                r["rep"]: r["requests_per_s"] for r in runs[(p, t, "memory")] if not r.get("stuck_workers")
            }
            ratios = [
                r["requests_per_s"] / base[r["rep"]]
                for r in every
                if r["rep"] in base and not r.get("stuck_workers")
            ]
            s["ratio_vs_memory"] = statistics.median(ratios) if ratios else None
            if ratios:
                s["ranges"]["ratio_vs_memory"] = [min(ratios), max(ratios)]
        if "worst_window" in every[0]:  # the worst of every run: the bound is for each
            s["worst_window"] = max(r["worst_window"] for r in every if "worst_window" in r)
            s["throttled"] = sum(r["throttled"] for r in every if "throttled" in r)
        out.setdefault((p, t), {})[kind] = s
    return out


def plan(
    reps: int, threads_list: list[int], processes_list: list[int], kinds: list[str], loads: list[str]
) -> Iterator[tuple[int, int, int, str, str]]:
    """(repetition, threads, processes, load, store) of every run, in order: the stores'
    order rotated from one repetition to the next."""
    for rep in range(reps):
        for threads in threads_list:
            for processes in processes_list:
                for load_name in loads:
                    order = (["memory"] if load_name == "flat" else []) + kinds
                    shift = rep % len(order)
                    for kind in order[shift:] + order[:shift]:
                        yield rep, threads, processes, load_name, kind


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--processes-list", help="worker processes (default 1,2,4,8,16; quick 1,2)")
    p.add_argument("--threads-list", help="threads per process (default 8,32; quick 4)")
    p.add_argument("--duration", type=float, help="measured seconds per run (default 3; quick 1)")
    p.add_argument("--warm", type=float, help="unmeasured seconds before each run (default 1.5; quick 1.2)")
    p.add_argument("--reps", type=int, help="repetitions (default 1)")
    p.add_argument("--stores", default="redis,cluster,sqlite", help="shared stores (default: all three)")
    p.add_argument("--loads", default="flat,paced,binding", help="loads (default flat,paced,binding)")
    p.add_argument("--session-reps", type=int, default=3, help="runs of one Session (default 3; 0: none)")
    p.add_argument("--pace", type=float, default=50.0, help="GETs a second per process, paced (default 50)")
    p.add_argument("--store-timeout", type=float, default=3.0, help="seconds (default 3): see the docstring")
    p.add_argument("--worker-nice", type=int, default=5, help="niceness of the worker processes (default 5)")
    p.add_argument("--plot", type=Path, help="the SVG plot's path (default <out>/scale.svg)")
    args = p.parse_args()
    processes_list = [
        int(x) for x in (args.processes_list or ("1,2" if args.quick else "1,2,4,8,16")).split(",")
    ]
    threads_list = [int(x) for x in (args.threads_list or ("4" if args.quick else "8,32")).split(",")]
    duration = args.duration or (1.0 if args.quick else 3.0)
    warm = args.warm if args.warm is not None else (1.2 if args.quick else 1.5)
    reps = args.reps or 1
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    load_names = [k.strip() for k in args.loads.split(",") if k.strip()]
    if set(kinds) - set(SHARED) or set(load_names) - set(LOADS):
        p.error(f"--stores: known stores are {', '.join(SHARED)}; --loads: {', '.join(LOADS)}")
    if min(*processes_list, *threads_list, reps) < 1 or duration <= 0 or args.pace <= 0:
        p.error("counts must be at least 1, --duration and --pace positive")
    runs: dict[str, dict[tuple[int, int, str], list[dict[str, Any]]]] = {name: {} for name in load_names}
    notes: list[str] = []
    sessions: dict[str, list[dict[str, Any]]] = {}
    run_no = 0
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir,
        _common.ok_server() as server,
        load.stores(workdir, kinds) as kept,
    ):
        for kind in ("redis", "cluster"):
            if kind in kinds and (kept is None or kind in kept.skipped):
                notes.append(f"{SHARED[kind]} skipped: {'no Redis' if kept is None else kept.skipped[kind]}")
                kinds.remove(kind)
        versions = kept.versions if kept else {}
        fleet = load.Fleet(max(processes_list), args.worker_nice)
        try:
            for rep, threads, processes, load_name, kind in plan(
                reps, threads_list, processes_list, kinds, load_names
            ):
                run_no += 1
                where = kept.where(kind, workdir, run_no) if kept else str(Path(workdir) / f"s-{run_no}.db")
                limit = BINDING_LIMIT if load_name == "binding" else NEVER_LIMIT
                pace = args.pace if load_name == "paced" else 0.0
                spec = spec_for(
                    kind, server.url, threads, where, run_no, args.store_timeout or None, limit, pace
                )
                go = binding_run if load_name == "binding" else run
                result = go(fleet, spec, processes, kept, warm, duration)
                runs[load_name].setdefault((processes, threads, kind), []).append({**result, "rep": rep})
                shown = ", ".join(f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, float))
                print(f"  {load_name}, {kind}, {processes} x {threads}: {shown}", file=sys.stderr, flush=True)
                for line in result.get("log_first", []) if result.get("store_failures") else []:
                    print(f"    first logged: {line}", file=sys.stderr, flush=True)
            for rep in range(args.session_reps if kept else 0):
                for kind in [k for k in kinds if k != "sqlite"]:
                    for second, warm_s in SECONDS.items():
                        run_no += 1
                        timeout = args.store_timeout or None
                        result = one_session(fleet, kind, server.url, kept, run_no, timeout, warm_s)
                        sessions.setdefault(f"{kind}, {second} second", []).append(result)
        finally:
            fleet.close()
    session_rows = {
        kind: {
            key: median_of(every, key)
            for key in ("requests_per_s", "round_trips_per_request", "store_failures")
        }
        for kind, every in sessions.items()
    }
    loads = {name: summarise(every) for name, every in runs.items()}
    texts = tables(loads, kinds, reps, args.pace)
    for name, row in session_rows.items():
        kind, second = name.split(", ", 1)
        trips = row["round_trips_per_request"]
        texts.append(
            f"One Session, 8 threads, Quota(10**6, per=1) + max_concurrency=1000, {SHARED[kind]}, its "
            f"{second}: {cell(trips, 3)} round trips per request (target <= {SESSION_TARGET}; "
            f"{cell(row['requests_per_s'], 0)} requests/s; median of {len(sessions[name])})\n"
        )
    picture = args.plot or args.out / "scale.svg"
    why = plot(picture, loads)
    notes.append(why or f"plot: {picture}")
    texts += [f"{note}\n" for note in notes]
    flat = {
        load_name: {
            kind: {key: flatness(loads[load_name], kind, key) for key in COST_KEYS}
            for kind in kinds
            if kind != "sqlite"
        }
        for load_name in loads
    }
    payload = {
        "settings": {
            "processes_list": processes_list,
            "threads_list": threads_list,
            "duration_s": duration,
            "warm_s": warm,
            "reps": reps,
            "stores": kinds,
            "loads": load_names,
            "pace_per_process": args.pace,
            "never_limit": NEVER_LIMIT,
            "binding_limit": BINDING_LIMIT,
            "per_s": PER,
            "store_timeout_s": args.store_timeout,
            "worker_nice": args.worker_nice,
            "took_s": round(time.monotonic() - started),
        },
        **{name: {f"{p}x{t}": row for (p, t), row in rows.items()} for name, rows in loads.items()},
        "flatness_8_to_256_workers": flat,
        "one_session": session_rows,
        "redis_server": versions,
        "notes": notes,
    }
    _common.finish("scale", payload, texts, args.out)


if __name__ == "__main__":
    main()
