"""Happy-path overhead: RetryAfterAdapter on each store vs requests' HTTPAdapter with a
stock urllib3 Retry, side by side in one run.

Every request is a GET answered ``200 ok`` by a keep-alive server on loopback that runs
in its own process (asyncio, so its CPU does not compete for the client's GIL). The
sessions have equivalent settings:

- stock:   ``HTTPAdapter(max_retries=Retry(total=5, backoff_factor=0.5,
  status_forcelist=(429, 502, 503, 504)))`` (Retry-After respected, urllib3's default)
- adapter: ``RetryAfterAdapter(max_retries=RetryAfterRetry(total=5, backoff_factor=0.5,
  deadline=30))`` with the default (process-wide, in-memory) cooldown store
- ``adapter, SQLite`` / ``adapter, Redis``: the same on a ``SQLiteCooldownStore`` (a file
  in a temporary directory) or a ``RedisCooldownStore`` (a ``redis-server`` the script
  starts on a free loopback port, without persistence; the Redis rows are skipped with a
  message when the binary or the ``redis`` package is missing)
- ``+ Quota + max_concurrency``: each of those with ``quota=Quota(100000, per=1)`` and
  ``max_concurrency=8``, which never bind: a permit taken and a slot held (and given
  back) on every attempt
- ``--before`` adds the shared stores with ``push=False`` (no near copy: one store
  round trip per attempt, as before the near copy), a "before" row in the same run.

Each store variant has its own store object (its own file, its own key prefix), so its
near copy, change feed, permit batches and held slots are its own.

With ``--diagnostic`` two more variants isolate parts of the adapter's per-call work:
``adapter, no deadline`` (no per-attempt timeout clamping) and ``adapter, no store``
(``cooldown=None``: no cooldown lookup before sending).

Method: ``--rounds`` rounds; in each, every variant sends one block of ``--block``
requests, in an order rotated every round (no variant always runs first). The wall
time of a block divided by the stock block's of the same round is that round's ratio;
the table quotes the median ratio over rounds with its min-max, and the per-request
time (microseconds) the same way. The same ratio in CPU time of the client process is
shown too: it is not inflated when other processes take the cores (the store's server,
Redis, runs in another process: its CPU is in the wall ratio, not in the CPU ratio). A
second stock session runs in the rotation as a control: its ratio to stock (an A/A
comparison, ideally 1.000) shows the method's resolution on the machine at hand.

Warm-up: a near copy takes quota permits in batches sized to its process's rate over
the last whole second, so a batch forms only after a second of history. Before any
block is measured, each variant in turn sends GETs for ``--warm-seconds`` (default
1.5 s, at least 500 GETs; quick 1.1 s), then whole rotation rounds run unmeasured for
``--settle-seconds`` (default 3 s): the warm-up's long pauses between a variant's turns
reset its rate (a near copy forgets a rate older than 2 s), and the settling rounds let
it learn the one it has in the rotation. There a variant sends a burst of ``--block``
GETs about every N blocks (N variants), so its rate over a second, and so its batch
(``floor(rate x 0.1 s)``, at most 16), is about 1/N of what a process sending without
pause gets; a pause over 2 s (the rotation's wrap-around on a slow machine) drops it to
one permit per operation for the next second. The quota rows measure such a bursty
client: pessimistic for a steady one. The table counts each shared store's operations
per request during the measured blocks.

Targets, median (wall) ratio to stock: adapter (memory) <= 1.03; memory with a quota
and a cap <= 1.05; SQLite and Redis <= 1.05; SQLite and Redis with a quota and a cap
<= 1.10.

Why many short blocks: on a small virtual machine the speed of the same loop drifts by
10-25 % from one second to the next (other tenants, frequency); the ratio of two blocks
run back to back is far steadier than the blocks themselves, and 200 pairs of 50
requests pin the median ratio down to about +-1 %, where 20 pairs of 500 did not.

A component breakdown (timeit, microseconds per operation) times each piece of work
the adapter adds to a call, and ``--profile`` adds a cProfile listing of the package's
functions for chosen variants (by key: see ``--only``).

    python benchmarks/bench_happy_path.py              # full: 200 rounds x 50 requests
    python benchmarks/bench_happy_path.py --quick      # about half a minute
    python benchmarks/bench_happy_path.py --before     # adds the push=False rows
    python benchmarks/bench_happy_path.py --only redis,redis-qc   # stock, A/A and these
    python benchmarks/bench_happy_path.py --profile    # cProfile of stock, memory, memory-qc
    python benchmarks/bench_happy_path.py --profile redis-qc,sqlite-qc
    python benchmarks/bench_happy_path.py --diagnostic # adds the two diagnostic variants
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
import timeit
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
from lib import common as _common
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout

from retry_after_adapter import MemoryCooldownStore, Quota, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.adapter import DEFAULT_STORE, RetryAfterResponse
from retry_after_adapter.cooldown import Ask
from retry_after_adapter.cooldown.guard import DEFAULT, guard_of
from retry_after_adapter.engine import Call, admitted, drive

STATUSES = (429, 502, 503, 504)
TIMEOUT = 10.0
TARGET = 1.03
ADMISSION = "adapter + Quota + max_concurrency"
ADMISSION_TARGET = 1.05
STORE_TARGET = 1.05
STORE_ADMISSION_TARGET = 1.10
#: The quota and the cap of the "+ Quota + max_concurrency" rows: they never bind.
QUOTA_LIMIT = 100_000
CAP = 8


def stock_session() -> requests.Session:
    session = requests.Session()
    retry = Retry(total=5, backoff_factor=0.5, status_forcelist=STATUSES, respect_retry_after_header=True)
    session.mount("http://", HTTPAdapter(max_retries=retry))
    return session


def adapter_session(
    *, deadline: float | None = 30.0, cooldown: Any = DEFAULT, admission: bool = False
) -> requests.Session:
    """An adapter session on ``cooldown`` (DEFAULT: the process-wide memory store; None:
    no store); ``admission``: with a quota and a concurrency cap that never bind."""
    session = requests.Session()
    retry = RetryAfterRetry(total=5, backoff_factor=0.5, status_forcelist=STATUSES, deadline=deadline)
    kwargs: dict[str, Any] = {}
    if cooldown is not DEFAULT:
        kwargs["cooldown"] = cooldown
    if admission:
        # A quota and a concurrency cap that never bind: what taking a permit and a
        # slot (and giving the slot back) costs on every attempt.
        kwargs.update(quota=Quota(QUOTA_LIMIT, per=1.0), max_concurrency=CAP)
    session.mount("http://", RetryAfterAdapter(max_retries=retry, **kwargs))
    return session


@dataclass
class Variant:
    """One session in the rotation: a short ``key`` (for ``--only`` and ``--profile``),
    the ``name`` the table shows, how to make it and its target ratio (if any)."""

    key: str
    name: str
    make: Callable[[], requests.Session]
    target: float | None = None
    #: The store operations of its store object, by operation (shared stores only).
    operations: Counter[str] | None = None


#: Keys of the shared-store variants, in table order: (key, store kind, admission, push).
STORE_VARIANTS = (
    ("sqlite", "SQLite", False, True),
    ("sqlite-qc", "SQLite", True, True),
    ("redis", "Redis", False, True),
    ("redis-qc", "Redis", True, True),
)
BEFORE_VARIANTS = (
    ("sqlite-nopush", "SQLite", False, False),
    ("sqlite-qc-nopush", "SQLite", True, False),
    ("redis-nopush", "Redis", False, False),
    ("redis-qc-nopush", "Redis", True, False),
)
ALL_KEYS = (
    "stock", "aa", "memory", "memory-qc",
    *(v[0] for v in STORE_VARIANTS + BEFORE_VARIANTS),
    "no-deadline", "no-store",
)  # fmt: skip


def store_variant_name(kind: str, admission: bool, push: bool) -> str:
    name = f"adapter, {kind}" + (" + Quota + max_concurrency" if admission else "")
    return name if push else name + ", push=False"


#: The store operations counted on a shared store object (each a round trip to Redis,
#: or a statement on the SQLite file; the near copy's feed checks are not among them).
OPERATIONS = ("get", "extend", "admit", "release", "settle", "allow", "note")


def count_operations(store: Any) -> Counter[str]:
    """Count ``store``'s operations from now on (its failure layer calls them through the
    instance, so wrapping the instance's methods sees every one; a few tenths of a
    microsecond each)."""
    counts: Counter[str] | None = getattr(store, "_bench_operations", None)
    if counts is not None:
        return counts  # wrapped already (a store's variant made twice: --profile)
    counts = store._bench_operations = Counter()
    for name in OPERATIONS:
        method = getattr(store, name)

        def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    return counts


@contextlib.contextmanager
def stores(workdir: str, kinds: set[str]) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """The store objects of the shared-store variants (by key) and the notes of what
    was skipped; closed on exit."""
    made: dict[str, Any] = {}
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        wanted = [v for v in STORE_VARIANTS + BEFORE_VARIANTS if v[0] in kinds]
        redis_url = None
        if any(kind == "Redis" for _, kind, _, _ in wanted):
            server, why = stack.enter_context(_common.redis_server(workdir))
            if server is None:
                notes.append(f"Redis rows skipped: {why}")
            else:
                redis_url = server.url
        for key, kind, _admission, push in wanted:
            if kind == "SQLite":
                made[key] = _common.open_store("sqlite", os.path.join(workdir, f"{key}.db"), push=push)
            elif redis_url is not None:
                made[key] = _common.open_store("redis", redis_url, prefix=f"bench-{key}:", push=push)
        try:
            yield made, notes
        finally:
            for store in made.values():
                guard_of(store).close()  # its held slots, its change feed, then the store


def variants(keys: set[str], made: dict[str, Any]) -> list[Variant]:
    """The rotation's variants among ``keys``, in table order (stock first)."""
    out = [
        Variant("stock", "stock", stock_session),
        Variant("memory", "adapter", adapter_session, TARGET),
        Variant("memory-qc", ADMISSION, lambda: adapter_session(admission=True), ADMISSION_TARGET),
    ]
    for key, kind, admission, push in STORE_VARIANTS + BEFORE_VARIANTS:
        if key in made:
            store = made[key]
            target = None if not push else STORE_ADMISSION_TARGET if admission else STORE_TARGET

            def make(store: Any = store, admission: bool = admission) -> requests.Session:
                return adapter_session(cooldown=store, admission=admission)

            counts = count_operations(store)
            out.append(Variant(key, store_variant_name(kind, admission, push), make, target, counts))
    out += [
        Variant("aa", "stock, again (A/A control)", stock_session),
        Variant("no-deadline", "adapter, no deadline", lambda: adapter_session(deadline=None)),
        Variant("no-store", "adapter, no store", lambda: adapter_session(cooldown=None)),
    ]
    return [v for v in out if v.key in keys]


def run_block(session: requests.Session, url: str, n: int) -> tuple[float, float]:
    """Wall and CPU seconds (this process) for ``n`` sequential GETs, bodies read."""
    get = session.get
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(n):
        response = get(url, timeout=TIMEOUT)
        if response.status_code != 200:
            raise RuntimeError(f"unexpected status {response.status_code}")
    return time.perf_counter() - start, time.process_time() - cpu


def warm(session: requests.Session, url: str, seconds: float, at_least: int) -> int:
    """Send GETs for ``seconds`` (and at least ``at_least`` of them); how many were sent."""
    sent = 0
    end = time.perf_counter() + seconds
    while sent < at_least or time.perf_counter() < end:
        run_block(session, url, 10)
        sent += 10
    return sent


def measure(
    url: str, chosen: list[Variant], rounds: int, block: int, warm_seconds: float, settle_seconds: float
) -> tuple[dict[str, Any], int]:
    """Per variant (by name): the rounds' blocks and their ratios to stock; and how many
    unmeasured rounds ran to settle."""
    sessions = {v.name: v.make() for v in chosen}
    names = list(sessions)
    for name in names:
        warm(sessions[name], url, warm_seconds, 500 if warm_seconds >= 1 else 20)
    settle_end = time.perf_counter() + settle_seconds
    settle_rounds = 0
    while time.perf_counter() < settle_end:
        for name in _common.rotation(names, settle_rounds):
            run_block(sessions[name], url, block)
        settle_rounds += 1
    for v in chosen:
        if v.operations is not None:
            v.operations.clear()
    blocks = _common.paired_blocks(
        names, lambda name: run_block(sessions[name], url, block), rounds, before=gc.collect
    )
    times = {name: [wall for wall, _ in kept] for name, kept in blocks.items()}
    cpu = {name: [used for _, used in kept] for name, kept in blocks.items()}
    for session in sessions.values():
        session.close()
    result: dict[str, Any] = {}
    operations = {v.name: v.operations for v in chosen}
    for name in names:
        counted = operations[name]
        result[name] = {
            "store_operations_per_request": None
            if counted is None
            else {op: n / (rounds * block) for op, n in sorted(counted.items())},
            "us_per_request": _common.summary([t / block * 1e6 for t in times[name]]),
            "ratio_vs_stock": _common.summary(_common.ratios(times[name], times["stock"])),
            "cpu_us_per_request": _common.summary([t / block * 1e6 for t in cpu[name]]),
            "cpu_ratio_vs_stock": _common.summary(_common.ratios(cpu[name], cpu["stock"])),
            "block_seconds": times[name],
            "block_cpu_seconds": cpu[name],
        }
    return result, settle_rounds


# -- the component breakdown -------------------------------------------------------------


def breakdown(
    url: str, number: int, repeat: int, made: dict[str, Any], warm_seconds: float
) -> dict[str, dict[str, float | int]]:
    """Microseconds per operation for each piece of work the adapter adds to a call."""
    session = adapter_session()
    adapter = session.get_adapter(url)
    assert isinstance(adapter, RetryAfterAdapter)
    request = requests.Request("GET", url + "/").prepare()
    retry = adapter.max_retries
    scope = adapter.scope_for(request)
    plan = adapter._plan
    deadline_retry = retry.new(deadline=30)
    call = Call(retry, plan, scope=scope, hooks=adapter.on_decision)
    deadline_call = Call(deadline_retry, plan, scope=scope)
    response = session.get(url, timeout=TIMEOUT)
    empty_store = MemoryCooldownStore()

    ops: dict[str, Callable[[], object]] = {
        "scope_for (origin scope)": lambda: adapter.scope_for(request),
        "Call(...) (the call's state)": lambda: Call(retry, plan, scope=scope, hooks=adapter.on_decision),
        "store.get (default memory store)": lambda: DEFAULT_STORE.get(scope),
        "store.get (empty memory store)": lambda: empty_store.get(scope),
        "engine.admitted (no cooldown)": lambda: drive(call, None, admitted(call)),
        "call.attempt_timeout (no deadline)": lambda: call.attempt_timeout(TIMEOUT),
        "call.attempt_timeout (deadline: one Timeout)": lambda: deadline_call.attempt_timeout(TIMEOUT),
        "stock: Timeout(...) (requests builds it)": lambda: Timeout(connect=TIMEOUT, read=TIMEOUT),
        "RetryAfterResponse.adopt (class swap)": lambda: RetryAfterResponse.adopt(response),
    }
    # A shared store's admission through its failure layer and near copy, as a call
    # makes it (no lease: a slot would have to be given back each time).
    quota = Quota(QUOTA_LIMIT, per=1.0)
    for kind in ("SQLite", "Redis"):
        key = kind.lower()
        if key in made:
            guard = guard_of(made[key])
            ops[f"admit, {kind} near copy (a scope it knows)"] = lambda g=guard: g.admit(Ask(scope=scope))
        if key + "-qc" in made:
            guard = guard_of(made[key + "-qc"])

            def permit(g: Any = guard) -> object:
                return g.admit(Ask(scope=scope, limit=quota.limit, per=quota.per, margin=quota.margin))

            end = time.perf_counter() + warm_seconds  # a second of history: batches form
            while time.perf_counter() < end:
                permit()
            ops[f"admit, {kind} + quota (a batch's permit; 1 store op per batch)"] = permit
    out: dict[str, dict[str, float | int]] = {}
    for name, op in ops.items():
        samples = timeit.repeat(op, number=number, repeat=repeat)
        out[name] = _common.summary([s / number * 1e6 for s in samples])
    session.close()
    return out


def profile(url: str, chosen: list[Variant], n: int, warm_seconds: float) -> dict[str, Any]:
    """cProfile of ``n`` GETs per variant (after ``warm_seconds`` of GETs): the
    package's functions, and the totals."""
    out: dict[str, Any] = {}
    for variant in chosen:
        session = variant.make()
        warm(session, url, warm_seconds, 200)
        prof = cProfile.Profile()
        prof.enable()
        run_block(session, url, n)
        prof.disable()
        session.close()
        stats = pstats.Stats(prof)
        rows = []
        for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            if "retry_after_adapter" in path:
                short = path.split("retry_after_adapter", 1)[1].lstrip("/")
                rows.append(
                    {
                        "function": f"{short}:{line}({func})",
                        "calls_per_request": calls / n,
                        "tottime_us_per_request": tottime / n * 1e6,
                        "cumtime_us_per_request": cumtime / n * 1e6,
                    }
                )
        rows.sort(key=lambda r: -r["tottime_us_per_request"])
        out[variant.name] = {
            "total_us_per_request": stats.total_tt / n * 1e6,  # type: ignore[attr-defined]
            "package_us_per_request": sum(r["tottime_us_per_request"] for r in rows),
            "package_functions": rows,
        }
    return out


def parse_keys(text: str, parser: Any, option: str) -> set[str]:
    keys = {k.strip() for k in text.split(",") if k.strip()}
    unknown = keys - set(ALL_KEYS)
    if unknown:
        parser.error(
            f"{option}: unknown variant(s) {', '.join(sorted(unknown))}; known: {', '.join(ALL_KEYS)}"
        )
    return keys


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--rounds", type=int, help="rounds (default 200; quick 10)")
    p.add_argument("--block", type=int, help="requests per block (default 50; quick 20)")
    p.add_argument(
        "--warm-seconds",
        type=float,
        help="seconds of GETs per variant before measuring (default 1.5; quick 1.1: batches need > 1 s)",
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        help="seconds of unmeasured rotation rounds after the warm-up (default 3; quick 0.5)",
    )
    p.add_argument("--before", action="store_true", help="add the shared stores with push=False")
    p.add_argument(
        "--only",
        help="comma-separated variant keys to run (stock and the A/A control always run): "
        + ", ".join(k for k in ALL_KEYS if k not in ("stock", "aa")),
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="stock,memory,memory-qc",
        help="add a cProfile listing of these variant keys (default: stock,memory,memory-qc)",
    )
    p.add_argument(
        "--diagnostic",
        action="store_true",
        help="also time 'adapter, no deadline' and 'adapter, no store' in the rotation",
    )
    args = p.parse_args()
    rounds = args.rounds or (10 if args.quick else 200)
    block = args.block or (20 if args.quick else 50)
    warm_seconds = args.warm_seconds if args.warm_seconds is not None else (1.1 if args.quick else 1.5)
    settle_seconds = args.settle_seconds if args.settle_seconds is not None else (0.5 if args.quick else 3.0)
    keys = {"stock", "aa", "memory", "memory-qc", *(v[0] for v in STORE_VARIANTS)}
    if args.before:
        keys |= {v[0] for v in BEFORE_VARIANTS}
    if args.only:
        keys = {"stock", "aa"} | parse_keys(args.only, p, "--only")
    if args.diagnostic:
        keys |= {"no-deadline", "no-store"}
    profiled = parse_keys(args.profile, p, "--profile") if args.profile else set()

    load_at_start = _common.loadavg()
    with (
        tempfile.TemporaryDirectory(prefix="bench-happy-path-") as workdir,
        stores(workdir, keys | profiled) as (made, notes),
        _common.ok_server() as server,
    ):
        for note in notes:
            print(note, file=sys.stderr, flush=True)
        url = server.url + "/"
        chosen = variants(keys, made)
        results, settle_rounds = measure(url, chosen, rounds, block, warm_seconds, settle_seconds)
        parts = breakdown(url, 2000 if args.quick else 20000, 3 if args.quick else 7, made, warm_seconds)
        prof = (
            profile(url, variants(profiled, made), 500 if args.quick else 5000, warm_seconds)
            if profiled
            else None
        )

    stock_us = results["stock"]["us_per_request"]["median"]
    targets = {v.name: v.target for v in chosen}
    rows = []
    for name, r in results.items():
        extra_us = r["us_per_request"]["median"] - stock_us
        target = targets.get(name)
        ratio = r["ratio_vs_stock"]["median"]
        rows.append(
            [
                name,
                _common.fmt_summary(r["us_per_request"], 1),
                _common.fmt_summary(r["ratio_vs_stock"], 3),
                "" if name == "stock" else f"{extra_us:+.1f}",
                _common.fmt_summary(r["cpu_ratio_vs_stock"], 3),
                ""
                if r["store_operations_per_request"] is None
                else f"{sum(r['store_operations_per_request'].values()):.3f}",
                "" if target is None else f"<= {target:.2f}: " + ("met" if ratio <= target else "MISSED"),
            ]
        )
    tables = [
        _common.table(
            f"Happy path: {rounds} rounds x {block} GETs per variant (median [min-max])",
            [
                "variant",
                "us per request (wall)",
                "ratio vs stock",
                "extra us (medians)",
                "CPU-time ratio",
                "store ops / request",
                "target",
            ],
            rows,
        ),
        _common.table(
            "Work the adapter adds per call (timeit, us per operation, median [min-max])",
            ["operation", "us"],
            [[name, _common.fmt_summary(s, 3)] for name, s in parts.items()],
        ),
    ]
    counted = {name: r["store_operations_per_request"] for name, r in results.items()}
    counted = {name: per for name, per in counted.items() if per is not None}
    if counted:
        ops = [op for op in OPERATIONS if any(op in per for per in counted.values())]
        tables.append(
            _common.table(
                "Store operations per request in the rotation, by operation (shared stores)",
                ["variant", *ops],
                [[name, *(f"{per.get(op, 0):.4f}" for op in ops)] for name, per in counted.items()],
            )
        )
    if prof is not None:
        tables.append(
            "cProfile totals, us per request (profiling inflates all): "
            + ", ".join(
                f"{name} {entry['total_us_per_request']:.1f} (package {entry['package_us_per_request']:.1f})"
                for name, entry in prof.items()
            )
            + "\n"
        )
        for name, entry in prof.items():
            if name == "stock":
                continue
            tables.append(
                _common.table(
                    f"cProfile, {name}: the package's functions (us per request)",
                    ["function", "calls", "tottime", "cumtime"],
                    [
                        [
                            r["function"],
                            f"{r['calls_per_request']:.2f}",
                            f"{r['tottime_us_per_request']:.2f}",
                            f"{r['cumtime_us_per_request']:.2f}",
                        ]
                        for r in entry["package_functions"][:25]
                    ],
                )
            )
    verdicts: dict[str, dict[str, Any]] = {}
    for name, target in targets.items():
        if target is not None:
            ratio = results[name]["ratio_vs_stock"]["median"]
            verdicts[name] = {"target": target, "ratio_median": ratio, "meets": ratio <= target}
            verdict = "meets" if ratio <= target else "MISSES"
            tables.append(f"{name} median ratio {ratio:.3f}: {verdict} the target <= {target}\n")
    tables += [f"{note}\n" for note in notes]
    adapter_ratio = results["adapter"]["ratio_vs_stock"]["median"] if "adapter" in results else None
    admission_ratio = results[ADMISSION]["ratio_vs_stock"]["median"] if ADMISSION in results else None
    payload = {
        "settings": {
            "rounds": rounds,
            "block": block,
            "warm_seconds": warm_seconds,
            "settle_seconds": settle_seconds,
            "settle_rounds": settle_rounds,
            "timeout": TIMEOUT,
            "quota": {"limit": QUOTA_LIMIT, "per": 1.0},
            "max_concurrency": CAP,
            "quick": args.quick,
            "before": args.before,
            "only": args.only,
        },
        "loadavg_at_start": load_at_start,
        "skipped": notes,
        "target_ratio": TARGET,
        "adapter_ratio_median": adapter_ratio,
        "meets_target": None if adapter_ratio is None else adapter_ratio <= TARGET,
        "admission_target_ratio": ADMISSION_TARGET,
        "admission_ratio_median": admission_ratio,
        "admission_meets_target": None if admission_ratio is None else admission_ratio <= ADMISSION_TARGET,
        "targets": verdicts,
        "variants": results,
        "breakdown_us": parts,
        "profile": prof,
    }
    _common.finish("happy_path", payload, tables, args.out)


if __name__ == "__main__":
    main()
