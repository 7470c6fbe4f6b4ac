"""Happy-path overhead: RetryAfterAdapter vs requests' HTTPAdapter with a stock urllib3 Retry.

Every request is a GET answered ``200 ok`` by a keep-alive server on loopback that runs
in its own process (asyncio, so its CPU does not compete for the client's GIL). Both
sessions have equivalent settings:

- stock:   ``HTTPAdapter(max_retries=Retry(total=5, backoff_factor=0.5,
  status_forcelist=(429, 502, 503, 504)))`` (Retry-After respected, urllib3's default)
- adapter: ``RetryAfterAdapter(max_retries=RetryAfterRetry(total=5, backoff_factor=0.5,
  deadline=30))`` with the default (process-wide, in-memory) cooldown store

With ``--diagnostic`` two more variants isolate parts of the adapter's per-call work:
``adapter, no deadline`` (no per-attempt timeout clamping) and ``adapter, no store``
(``cooldown=None``: no cooldown lookup before sending).

Method: ``--rounds`` rounds; in each, every variant sends one block of ``--block``
requests, in an order rotated every round (no variant always runs first). The wall
time of a block divided by the stock block's of the same round is that round's ratio;
the table quotes the median ratio over rounds with its min-max, and the per-request
time (microseconds) the same way. The same ratio in CPU time of the client process is
shown too: it is not inflated when other processes take the cores. A second stock
session runs in the rotation as a control: its ratio to stock (an A/A comparison,
ideally 1.000) shows the method's resolution on the machine at hand. Targets, median
(wall) ratio: adapter <= 1.03; adapter with a ``Quota`` and ``max_concurrency`` (a
permit taken and a slot held and given back on every attempt) <= 1.05.

Why many short blocks: on a small virtual machine the speed of the same loop drifts by
10-25 % from one second to the next (other tenants, frequency); the ratio of two blocks
run back to back is far steadier than the blocks themselves, and 200 pairs of 50
requests pin the median ratio down to about +-1 %, where 20 pairs of 500 did not.

A component breakdown (timeit, microseconds per operation) times each piece of work
the adapter adds to a call, and ``--profile`` adds a cProfile of both sessions listing
the package's functions.

    python benchmarks/bench_happy_path.py              # full: 200 rounds x 50 requests
    python benchmarks/bench_happy_path.py --quick      # a few seconds
    python benchmarks/bench_happy_path.py --profile    # adds the cProfile listing
    python benchmarks/bench_happy_path.py --diagnostic # adds the two diagnostic variants
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
import timeit
from collections.abc import Callable
from typing import Any

import _common
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout

from retry_after_adapter import MemoryCooldownStore, Quota, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.adapter import DEFAULT_STORE, RetryAfterResponse
from retry_after_adapter.engine import Call, admit

STATUSES = (429, 502, 503, 504)
TIMEOUT = 10.0
TARGET = 1.03
ADMISSION = "adapter + Quota + max_concurrency"
ADMISSION_TARGET = 1.05


def stock_session() -> requests.Session:
    session = requests.Session()
    retry = Retry(total=5, backoff_factor=0.5, status_forcelist=STATUSES, respect_retry_after_header=True)
    session.mount("http://", HTTPAdapter(max_retries=retry))
    return session


def adapter_session(
    *, deadline: float | None = 30.0, store: bool = True, admission: bool = False
) -> requests.Session:
    session = requests.Session()
    retry = RetryAfterRetry(total=5, backoff_factor=0.5, status_forcelist=STATUSES, deadline=deadline)
    if admission:
        # A quota and a concurrency cap that never bind: what taking a permit and a
        # slot (and giving the slot back) costs on every attempt.
        adapter = RetryAfterAdapter(max_retries=retry, quota=Quota(1_000_000, per=1.0), max_concurrency=8)
    elif store:
        adapter = RetryAfterAdapter(max_retries=retry)  # the default cooldown store
    else:
        adapter = RetryAfterAdapter(max_retries=retry, cooldown=None)
    session.mount("http://", adapter)
    return session


#: "stock, again" is a second, identical stock session: its ratio to stock (an A/A
#: comparison) shows how finely this method can tell two sessions apart on this machine.
VARIANTS: dict[str, Callable[[], requests.Session]] = {
    "stock": stock_session,
    "adapter": adapter_session,
    ADMISSION: lambda: adapter_session(admission=True),
    "stock, again (A/A control)": stock_session,
}
DIAGNOSTIC_VARIANTS: dict[str, Callable[[], requests.Session]] = {
    "adapter, no deadline": lambda: adapter_session(deadline=None),
    "adapter, no store": lambda: adapter_session(store=False),
}


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


def measure(url: str, rounds: int, block: int, warmup: int, diagnostic: bool) -> dict[str, Any]:
    variants = {**VARIANTS, **DIAGNOSTIC_VARIANTS} if diagnostic else VARIANTS
    sessions = {name: make() for name, make in variants.items()}
    names = list(sessions)
    for name in names:
        run_block(sessions[name], url, warmup)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gc.collect()
            wall, used = run_block(sessions[name], url, block)
            times[name].append(wall)
            cpu[name].append(used)
    for session in sessions.values():
        session.close()
    result: dict[str, Any] = {}
    for name in names:
        result[name] = {
            "us_per_request": _common.summary([t / block * 1e6 for t in times[name]]),
            "ratio_vs_stock": _common.summary(_common.ratios(times[name], times["stock"])),
            "cpu_us_per_request": _common.summary([t / block * 1e6 for t in cpu[name]]),
            "cpu_ratio_vs_stock": _common.summary(_common.ratios(cpu[name], cpu["stock"])),
            "block_seconds": times[name],
            "block_cpu_seconds": cpu[name],
        }
    return result


# -- the component breakdown -------------------------------------------------------------


def breakdown(url: str, number: int, repeat: int) -> dict[str, dict[str, float | int]]:
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
        "engine.admit (no cooldown)": lambda: admit(call),
        "call.attempt_timeout (no deadline)": lambda: call.attempt_timeout(TIMEOUT),
        "call.attempt_timeout (deadline: one Timeout)": lambda: deadline_call.attempt_timeout(TIMEOUT),
        "stock: Timeout(...) (requests builds it)": lambda: Timeout(connect=TIMEOUT, read=TIMEOUT),
        "RetryAfterResponse.adopt (class swap)": lambda: RetryAfterResponse.adopt(response),
    }
    out: dict[str, dict[str, float | int]] = {}
    for name, op in ops.items():
        samples = timeit.repeat(op, number=number, repeat=repeat)
        out[name] = _common.summary([s / number * 1e6 for s in samples])
    session.close()
    return out


def profile(url: str, n: int) -> dict[str, Any]:
    """cProfile of ``n`` GETs per session: the package's functions, and the totals."""
    out: dict[str, Any] = {}
    for name, make in (
        ("stock", stock_session),
        ("adapter", adapter_session),
        (ADMISSION, lambda: adapter_session(admission=True)),
    ):
        session = make()
        run_block(session, url, 200)
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
        out[name] = {
            "total_us_per_request": stats.total_tt / n * 1e6,  # type: ignore[attr-defined]
            "package_functions": rows,
        }
    return out


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--rounds", type=int, help="rounds (default 200; quick 10)")
    p.add_argument("--block", type=int, help="requests per block (default 50; quick 20)")
    p.add_argument("--profile", action="store_true", help="add a cProfile listing of both sessions")
    p.add_argument(
        "--diagnostic",
        action="store_true",
        help="also time 'adapter, no deadline' and 'adapter, no store' in the rotation",
    )
    args = p.parse_args()
    rounds = args.rounds or (10 if args.quick else 200)
    block = args.block or (20 if args.quick else 50)
    warmup = 50 if args.quick else 500

    load_at_start = _common.loadavg()
    with _common.ok_server() as server:
        url = server.url + "/"
        results = measure(url, rounds, block, warmup, args.diagnostic)
        parts = breakdown(url, number=2000 if args.quick else 20000, repeat=3 if args.quick else 7)
        prof = profile(url, 500 if args.quick else 5000) if args.profile else None

    stock_us = results["stock"]["us_per_request"]["median"]
    adapter_ratio = results["adapter"]["ratio_vs_stock"]["median"]
    rows = []
    for name, r in results.items():
        extra_us = r["us_per_request"]["median"] - stock_us
        rows.append(
            [
                name,
                _common.fmt_summary(r["us_per_request"], 1),
                _common.fmt_summary(r["ratio_vs_stock"], 3),
                "" if name == "stock" else f"{extra_us:+.1f}",
                _common.fmt_summary(r["cpu_ratio_vs_stock"], 3),
            ]
        )
    tables = [
        _common.table(
            f"Happy path: {rounds} rounds x {block} GETs per variant (median [min-max])",
            ["variant", "us per request (wall)", "ratio vs stock", "extra us (medians)", "CPU-time ratio"],
            rows,
        ),
        _common.table(
            "Work the adapter adds per call (timeit, us per operation, median [min-max])",
            ["operation", "us"],
            [[name, _common.fmt_summary(s, 3)] for name, s in parts.items()],
        ),
    ]
    if prof is not None:
        tables.append(
            f"cProfile totals, us per request: stock {prof['stock']['total_us_per_request']:.1f}, "
            f"adapter {prof['adapter']['total_us_per_request']:.1f}, "
            f"{ADMISSION} {prof[ADMISSION]['total_us_per_request']:.1f} (profiling inflates all)\n"
        )
        for name in ("adapter", ADMISSION):
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
                        for r in prof[name]["package_functions"][:25]
                    ],
                )
            )
    admission_ratio = results[ADMISSION]["ratio_vs_stock"]["median"]
    verdict = "meets" if adapter_ratio <= TARGET else "MISSES"
    tables.append(f"adapter median ratio {adapter_ratio:.3f}: {verdict} the target <= {TARGET}\n")
    verdict = "meets" if admission_ratio <= ADMISSION_TARGET else "MISSES"
    tables.append(
        f"{ADMISSION} median ratio {admission_ratio:.3f}: {verdict} the target <= {ADMISSION_TARGET}\n"
    )
    payload = {
        "settings": {
            "rounds": rounds,
            "block": block,
            "warmup": warmup,
            "timeout": TIMEOUT,
            "quick": args.quick,
        },
        "loadavg_at_start": load_at_start,
        "target_ratio": TARGET,
        "adapter_ratio_median": adapter_ratio,
        "meets_target": adapter_ratio <= TARGET,
        "admission_target_ratio": ADMISSION_TARGET,
        "admission_ratio_median": admission_ratio,
        "admission_meets_target": admission_ratio <= ADMISSION_TARGET,
        "variants": results,
        "breakdown_us": parts,
        "profile": prof,
    }
    _common.finish("happy_path", payload, tables, args.out)


if __name__ == "__main__":
    main()
