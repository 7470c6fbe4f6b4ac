"""Per-call cost and memory against the number of scopes, a new scope on every call.

A multi-tenant service scopes by credential and meets tens of thousands of scopes. This
runs one ``RetryAfterAdapter`` (``Quota(100, per=1)``, ``max_concurrency=8``, ``scope=``
a function that returns a new string for every request) against the project's
``QuotaServer`` in its own process, which announces IETF ``RateLimit`` fields on every
response (and never runs out), on each store: memory, SQLite (a file of its own) and
Redis (a ``redis-server`` started here on a free loopback port, without persistence;
skipped with a message when the binary or the ``redis`` package is missing). Every call
leaves records of its scope: quota permits, a concurrency lease, the announced
allowance, freshness, the engine's meter.

Two modes, each store in a fresh interpreter of its own (RSS is per process):

- ``adapter``: ``session.get()`` through the adapter, timed per call: what a service sees;
- ``store``: the store operations such a call makes, without HTTP (``admit`` taking a
  permit and a slot, ``release``, ``allow``, ``note``), through the object the adapter
  talks to (the memory store itself; the failure layer around SQLite and Redis), timed
  per call: the store's own cost, where growth with the number of scopes shows first.

At each checkpoint (scopes seen so far) it reports the median time of the calls just
before it and its ratio to the first checkpoint's (wall time, and this thread's CPU
time, which other work on the machine disturbs less), RSS, and the records kept. Then an
expiry phase writes new scopes at a time past every keep period (a permit's window, a
lease's ttl, an allowance an hour past its reset, freshness 30 days: explicit ``now=``,
no waiting) and counts the records the run's scopes still hold, which is 0 when every
record expires. Redis expires keys by its own clock, so there it reports instead the
keys without a TTL (must be 0) and how long the others live.

    python benchmarks/bench_scopes.py            # 200,000 scopes per store and mode (about 25 minutes)
    python benchmarks/bench_scopes.py --quick    # a smoke run of well under 30 s
    python benchmarks/bench_scopes.py --stores memory --modes store --checkpoints 1000,200000
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from lib import common as _common

from retry_after_adapter.cooldown import Ask, Lease

STORES = ("memory", "sqlite", "redis")
MODES = ("adapter", "store")
#: Scopes seen at each checkpoint (full run).
CHECKPOINTS = [1_000, 10_000, 50_000, 100_000, 200_000]
QUICK_CHECKPOINTS = {
    ("adapter", "memory"): [500, 2_000],
    ("adapter", "sqlite"): [500, 1_000],
    ("adapter", "redis"): [500, 1_000],
    ("store", "memory"): [1_000, 10_000],
    ("store", "sqlite"): [1_000, 2_000],
    ("store", "redis"): [1_000, 2_000],
}
#: Calls timed before each checkpoint (their median is its figure).
WINDOW = 1_000
QUICK_WINDOW = 250
#: The server's quota: far more than the run sends, so it only announces.
SERVER_QUOTA = 1_000_000_000
SERVER_WINDOW = 60
#: The expiry phase writes at this time past the run: past every keep period.
FAR_AHEAD = timedelta(days=31, hours=2)
#: Prefix of the expiry phase's own scopes (not counted as the run's).
PROBE = "probe-"


# -- the child: one mode on one store -------------------------------------------------------


def open_store(kind: str, where: str) -> Any:
    if kind != "redis":
        return _common.open_store(kind, where)
    # Timeouts for a loaded machine: the 0.1 s default is for outages, which this does not stage.
    store = _common.open_store(kind, where, prefix="scopes:", socket_timeout=2.0, socket_connect_timeout=2.0)
    store.client.flushdb()
    return store


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one mode on one store; return the figures (printed as JSON by ``--child``)."""
    from retry_after_adapter.cooldown.guard import shared

    store = open_store(spec["store"], spec["where"])
    view = shared(store)  # what the adapter talks to: the memory store, or the failure layer
    assert view is not None
    checkpoints: list[int] = spec["checkpoints"]
    window: int = spec["window"]
    if spec["mode"] == "adapter":
        call, close = adapter_calls(store, spec["url"])
    else:
        call, close = store_calls(view)
    call(-1)  # warm up (a scope of its own)
    rss0 = _common.rss_kib()
    rows = []
    done = 0
    started = time.perf_counter()
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    for target in checkpoints:
        timed: list[int] = []
        used: list[int] = []
        while done < target:
            if done >= target - window:
                t0, c0 = wall(), cpu()
                call(done)
                timed.append(wall() - t0)
                used.append(cpu() - c0)
            else:
                call(done)
            done += 1
        timed.sort()
        used.sort()
        rows.append(
            {
                "scopes": target,
                "p50_us": timed[len(timed) // 2] / 1000,
                "p90_us": timed[int(len(timed) * 0.9)] / 1000,
                "cpu_p50_us": used[len(used) // 2] / 1000,
                "timed_calls": len(timed),
                "rss_kib": _common.rss_kib(),
                "records": records(spec["store"], store, view),
            }
        )
    seconds = time.perf_counter() - started
    close()
    first, first_cpu = rows[0]["p50_us"], rows[0]["cpu_p50_us"]
    for row in rows:
        row["ratio_vs_first"] = row["p50_us"] / first
        row["cpu_ratio_vs_first"] = row["cpu_p50_us"] / first_cpu
    result: dict[str, Any] = {
        "checkpoints": rows,
        "seconds": seconds,
        "rss_kib_at_start": rss0,
    }
    if spec["store"] == "redis":
        result["redis_keys"] = redis_keys(store)
    else:
        result["expiry"] = expire(spec["store"], store, view, checkpoints[-1], spec["expiry_rounds"])
    store.close()
    return result


def adapter_calls(store: Any, url: str) -> tuple[Any, Any]:
    """``call(n)``: one GET through the adapter, on the ``n``-th new scope."""
    import requests

    from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry

    counter = itertools.count()

    def new_scope(request: Any) -> str:
        return f"tenant-{next(counter)}"  # a fresh scope per request (hashed by the adapter)

    session = requests.Session()
    adapter = RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=2, deadline=30),
        cooldown=store,
        quota=Quota(100, per=1),
        max_concurrency=8,
        scope=new_scope,
    )
    session.mount("http://", adapter)

    def call(n: int) -> None:
        response = session.get(f"{url}/t/{n}", timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"unexpected status {response.status_code}: {response.headers}")

    return call, session.close


def store_calls(view: Any) -> tuple[Any, Any]:
    """``call(n)``: the store operations of one call on scope ``tenant-n``, as the
    engine makes them on the real clock: admit (a permit of 100 per second and one of 8
    slots for 60 s), release, allow (what a ``RateLimit`` field announced) and note."""
    lease_ttl = 60.0

    def call(n: int) -> None:
        scope = f"tenant-{n}"
        token = f"t{n}"
        answer = view.admit(Ask(
            scope=scope, limit=100, per=1.0, lease=Lease(slots=8, ttl=lease_ttl, token=token)
        ))
        if answer.not_before is not None:
            raise RuntimeError(f"a new scope was not admitted: {answer}")
        now = datetime.now(timezone.utc)
        view.release(scope, token)
        view.allow(scope, SERVER_QUOTA - n - 2, now + timedelta(seconds=1), now, answer.seq, 100, 1.0)
        view.note(scope, "success", now)

    return call, lambda: None


def expire(kind: str, store: Any, view: Any, scopes: int, rounds: int) -> dict[str, Any]:
    """Write new scopes (``probe-N``) at a time past every keep period, the way a call
    does, until the run's scopes hold no record (or after ``rounds`` writes); returns the
    run's records before and after, and how many writes it took."""
    base = datetime.now(timezone.utc) + FAR_AHEAD
    before = records(kind, store, view, run_only=True)
    done = 0
    started = time.perf_counter()
    after = before
    while done < rounds:
        for _ in range(500):
            at = base + timedelta(milliseconds=done)
            scope = f"{PROBE}{done}"
            view.admit(Ask(
                scope=scope, now=at, limit=100, per=1.0, lease=Lease(slots=8, ttl=60.0, token=f"p{done}")
            ))
            view.release(scope, f"p{done}")
            view.allow(scope, 50, at + timedelta(seconds=1), at, None, 100, 1.0)
            view.note(scope, "success", at)
            done += 1
        after = records(kind, store, view, run_only=True)
        if not any(after.values()):
            break
    return {
        "run_records_before": before,
        "run_records_after": after,
        "writes": done,
        "seconds": time.perf_counter() - started,
        "run_scopes": scopes,
    }


# -- what a store keeps -----------------------------------------------------------------------


def _count(keys: Any, run_only: bool) -> int:
    return sum(1 for key in keys if not key.startswith(PROBE)) if run_only else len(keys)


def memory_records(store: Any, run_only: bool = False) -> dict[str, int]:
    """A memory store's records per kind (scopes holding one)."""
    return {
        "cooldowns": _count(list(store._until), run_only),
        "permits": _count(list(store._permits), run_only),
        "leases": _count(list(store._leases), run_only),
        "allowance": _count(list(store._allowance), run_only),
        "freshness": _count(list(store._fresh), run_only),
    }


def records(kind: str, store: Any, view: Any, run_only: bool = False) -> dict[str, int]:
    """Every record the store (and this process, for the store) keeps: the store's own
    (memory: scopes per kind; SQLite: rows per table; Redis: keys), the failure layer's
    local copy and the engine's meters."""
    from retry_after_adapter.engine.meters import meters_of

    found: dict[str, int] = {}
    if kind == "memory":
        found.update(memory_records(store, run_only))
    elif kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store.path, timeout=5)
        try:
            for table in ("cooldown", "permit_log", "lease", "allowance", "freshness"):
                where = f" WHERE scope NOT LIKE '{PROBE}%'" if run_only else ""
                found[f"rows {table}"] = conn.execute(f"SELECT count(*) FROM {table}{where}").fetchone()[0]
        finally:
            conn.close()
    else:
        found["keys"] = int(store.client.dbsize())
    if view is not store:
        found.update({f"local {name}": n for name, n in memory_records(view.local, run_only).items()})
    if not run_only:
        found["meters"] = len(meters_of(view))
    return found


def redis_keys(store: Any) -> dict[str, Any]:
    """Every key of the Redis server: how many, how many without a TTL, and how long
    the others live (seconds, by bucket)."""
    client = store.client
    keys = list(client.scan_iter(count=1000))
    ttls: list[int] = []
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 1000]:
            pipe.pttl(key)
        ttls += pipe.execute()
    buckets = {"<= 2 s": 0, "<= 1 min": 0, "<= 2 h": 0, "<= 31 days": 0, "longer": 0}
    for ttl in ttls:
        if ttl < 0:
            continue
        seconds = ttl / 1000
        if seconds <= 2:
            buckets["<= 2 s"] += 1
        elif seconds <= 60:
            buckets["<= 1 min"] += 1
        elif seconds <= 7200:
            buckets["<= 2 h"] += 1
        elif seconds <= 31 * 86400:
            buckets["<= 31 days"] += 1
        else:
            buckets["longer"] += 1
    return {
        "keys": len(keys),
        "without_ttl": sum(1 for ttl in ttls if ttl == -1),
        "ttl_buckets": buckets,
    }


# -- the parent ---------------------------------------------------------------------------------


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One mode on one store in a child process (``-X faulthandler``: a crash prints
    every thread's stack). A child killed by a signal is run once more, on a new file
    for SQLite, and the crash is kept in the result (``crashed_once``) and printed: a
    crash is a defect to chase, not a figure, and one must not cost the whole run."""
    crashed = None
    for attempt in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-X", "faulthandler", str(Path(__file__)), "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode < 0 and attempt == 1:
            crashed = f"signal {-proc.returncode}: {proc.stderr[-3000:]}"
            print(f"   child {spec['mode']}/{spec['store']} crashed ({crashed}); once more", file=sys.stderr)
            if spec["store"] == "sqlite":
                spec = {**spec, "where": spec["where"] + ".again"}
            continue
        break
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {spec['mode']}/{spec['store']} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if crashed is not None:
        result["crashed_once"] = crashed
    return result


def short(records: dict[str, int]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in records.items() if n) or "none"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    p = _common.parser(__doc__ or "")
    p.add_argument("--stores", default=",".join(STORES), help="comma-separated: memory,sqlite,redis")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: adapter,store")
    p.add_argument("--checkpoints", help="comma-separated scope counts (default: per store, see the module)")
    p.add_argument("--window", type=int, help=f"calls timed before each checkpoint (default {WINDOW:,})")
    p.add_argument(
        "--expiry-rounds",
        type=int,
        help="most writes of the expiry phase (default: twice the scopes + 2,000)",
    )
    args = p.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(stores) - set(STORES) or set(modes) - set(MODES):
        p.error(f"stores are {', '.join(STORES)}; modes are {', '.join(MODES)}")
    window = args.window or (QUICK_WINDOW if args.quick else WINDOW)
    fixed = sorted({int(n) for n in args.checkpoints.split(",")}) if args.checkpoints else None
    load_at_start = _common.loadavg()

    runs: dict[str, Any] = {}
    skipped: list[str] = []
    workdir_made = tempfile.TemporaryDirectory(prefix="bench-scopes-")
    with workdir_made as workdir, _common.redis_url(workdir) as (redis_url, redis_why):
        if "redis" in stores and redis_url is None:
            skipped.append(f"redis: {redis_why}")
            print(f"Redis skipped: {redis_why}", file=sys.stderr)
        told = ("--serve", str(SERVER_QUOTA), str(SERVER_WINDOW), "ietf")
        with _common.ServerProcess("retry_after_adapter.demo", *told) as server:
            for mode in modes:
                for kind in stores:
                    if kind == "redis" and redis_url is None:
                        continue
                    if fixed is not None:
                        checkpoints = fixed
                    elif args.quick:
                        checkpoints = QUICK_CHECKPOINTS[(mode, kind)]
                    else:
                        checkpoints = CHECKPOINTS
                    where = {"memory": "", "sqlite": f"{workdir}/{mode}.db", "redis": redis_url}[kind]
                    spec = {
                        "mode": mode,
                        "store": kind,
                        "where": where,
                        "url": server.url,
                        "checkpoints": checkpoints,
                        "window": min(window, checkpoints[0]),
                        "expiry_rounds": args.expiry_rounds or 2 * checkpoints[-1] + 2_000,
                    }
                    name = f"{mode} / {kind}"
                    print(f"== {name}: {checkpoints[-1]:,} scopes", file=sys.stderr, flush=True)
                    runs[name] = run_child(spec, timeout=7200)
                    last = runs[name]["checkpoints"][-1]
                    print(
                        f"   p50 {last['p50_us']:.0f} us at {last['scopes']:,} scopes "
                        f"({last['ratio_vs_first']:.2f} x the first checkpoint), "
                        f"{runs[name]['seconds']:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )

    tables = []
    for name, run in runs.items():
        rows = []
        start_rss = run["rss_kib_at_start"]
        for row in run["checkpoints"]:
            rows.append(
                (
                    f"{row['scopes']:,}",
                    _common.fmt(row["p50_us"], 1),
                    _common.fmt(row["ratio_vs_first"], 2),
                    _common.fmt(row["cpu_p50_us"], 1),
                    _common.fmt(row["cpu_ratio_vs_first"], 2),
                    _common.fmt((row["rss_kib"] - start_rss) / 1024, 1),
                    short(row["records"]),
                )
            )
        tables.append(
            _common.table(
                f"{name}: a new scope per call, median of the last {run['checkpoints'][0]['timed_calls']:,} "
                "calls before each checkpoint",
                ["scopes", "p50 us", "p50 / first", "CPU p50 us", "CPU / first", "RSS growth MiB", "kept"],
                rows,
            )
        )
    expiry_rows = []
    for name, run in runs.items():
        if "expiry" in run:
            e = run["expiry"]
            expiry_rows.append(
                (
                    name,
                    f"{e['run_scopes']:,}",
                    short(e["run_records_before"]),
                    f"{e['writes']:,}",
                    short(e["run_records_after"]),
                )
            )
        else:
            k = run["redis_keys"]
            buckets = ", ".join(f"{b} {n:,}" for b, n in k["ttl_buckets"].items() if n)
            keys = f"{k['keys']:,} keys, {k['without_ttl']:,} without a TTL"
            expiry_rows.append((name, "-", keys, "-", f"TTLs: {buckets}"))
    tables.append(
        _common.table(
            "Records the run's scopes hold, before and after writes of other scopes past every keep "
            "period (Redis: keys after the run, by TTL)",
            ["run", "scopes", "records of the run's scopes", "writes", "after the writes"],
            expiry_rows,
        )
    )
    payload = {
        "settings": {
            "quota": "Quota(100, per=1)",
            "max_concurrency": 8,
            "server": f"QuotaServer({SERVER_QUOTA}, {SERVER_WINDOW}, quota_headers='ietf')",
            "window": window,
            "quick": args.quick,
            "stores": stores,
            "modes": modes,
        },
        "loadavg_at_start": load_at_start,
        "skipped": skipped,
        "runs": runs,
    }
    _common.finish("scopes", payload, tables, args.out)


if __name__ == "__main__":
    main()
