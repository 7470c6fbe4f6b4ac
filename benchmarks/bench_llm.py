"""The OpenAI and Anthropic SDKs (on httpx2), alone and with the httpx2 transports mounted:
a fleet under a provider's requests quota, and the happy path's instructions per call.

1. Fleet (``--part fleet``): a loopback stand-in of the provider
   (``QuotaServer(limit, per, quota_headers="openai" | "anthropic", align="first")``, in
   this process, a fresh one per run) allows ``--limit`` requests per ``--per`` seconds
   (default 3 per 4 s), windows counted from the first request, and announces the quota
   in the provider's own headers on every answer (OpenAI's
   ``x-ratelimit-*-requests`` and ``retry-after-ms``, Anthropic's
   ``anthropic-ratelimit-requests-*``). Every SDK client keeps its defaults
   (``max_retries=2``); the only thing set is its ``http_client``. Each worker makes
   ``--calls`` calls of ``client.models.list()`` (what the stand-in answers for both
   SDKs: an empty model list), one after the other. A ``RateLimitError`` the SDK
   raises is caught: with the transport it carries a deferral (``deferral_of(exc)``) and
   the worker waits until its ``eligible_at`` and calls again, as a job queue would;
   the SDK alone raises it after its own retries, and the worker then waits what that
   last 429 said (``retry-after-ms``, else ``Retry-After``; 1 s without either), as the
   SDK itself would, and calls again. Fleets, for each SDK:

   - SDK alone: 8 threads on one client over a plain ``httpx2.Client()``; the same as
     4 processes x 2 threads (each process its own client); 20 asyncio tasks on one
     ``AsyncOpenAI`` / ``AsyncAnthropic`` over a plain ``httpx2.AsyncClient()``;
   - with ``RetryAfterTransport(cooldown=store)`` (everything else its defaults): 8
     threads on one client with a ``MemoryCooldownStore``; 8 threads each with its own
     client (and transport), sharing one ``MemoryCooldownStore``; 4 processes x 2
     threads, each process its own client, sharing one ``SQLiteCooldownStore`` file
     (a fresh one per run), and the same sharing one ``RedisCooldownStore`` (a
     ``redis-server`` this script starts on a free loopback port, flushed before each
     run; the rows are skipped with a message without the binary or redis-py); 20
     asyncio tasks on one async client with ``AsyncRetryAfterTransport`` and a
     ``MemoryCooldownStore``.

   Reported per run, as the server counted them: the 429s it sent, the requests it
   received, the requests it saw "early" (arriving while a cooldown it had announced in
   a 429 was still running, past its 0.25 s in-flight allowance); the calls done (of
   those asked); the ``RateLimitError`` s the workers caught; the wall time from the
   start to the last call done, against the ideal ``calls / limit * per`` (with
   windows counted from the first request the least possible is ``(ceil(calls /
   limit) - 1) * per``, so a perfect fleet is a little under 1.0) and against the SDK
   alone of the same shape in the same repetition. Tables quote medians over ``--reps``
   with [min-max]. Every run is bounded: past ``3 x ideal + 30 s`` its workers stop
   (processes are ended) and the calls left count as not done.

2. Instructions (``--part instructions``): the happy path through the SDK, in CPU
   instructions per call under valgrind's callgrind, as ``bench_instructions.py``
   counts them: each variant in its own process, 600 warm-up calls (past the learned
   rate's cold start), then ``--rounds`` (300) measured calls inside
   ``functools.reduce`` and only that call collected
   (``--toggle-collect=functools_reduce``; the child checks, on its last warm-up calls
   under ``sys.setprofile``, that nothing on the call's path calls ``reduce`` itself).
   The stand-in is a ``QuotaServer`` with the provider's headers and a quota that never
   binds, in its own process (not counted). Variants, for each SDK: sync
   ``client.models.list()`` over a plain ``httpx2.Client()`` against the same over
   ``httpx2.Client(transport=RetryAfterTransport())`` (defaults: a memory store).
   Target: the transport within 1.05 x the SDK alone (median ratio over ``--repeats``).
   Without valgrind the part says so and is marked skipped. ``--quick`` (20 warm-up and
   20 measured calls, a few minutes) checks the harness only: it measures the
   transport inside the learned rate's cold start.

Without httpx2, openai or anthropic installed, the SDKs missing are skipped with a
message.

On a 2-core machine:

    python benchmarks/bench_llm.py                       # both parts: about 40 minutes
    python benchmarks/bench_llm.py --part fleet          # about 22 minutes
    python benchmarks/bench_llm.py --part instructions   # about 16 minutes
    python benchmarks/bench_llm.py --quick --part fleet  # about 35 seconds
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from lib import common as _common
from lib.common import cell
from lib.llm import (
    SDKS,
    Tally,
    async_sdk_client,
    async_worker,
    http_client,
    missing_sdks,
    process_main,
    run_threads,
    sdk_client,
)

#: The issue's target quota, and the fleets' sizes.
FLEET = {"limit": 3, "per": 4.0, "threads": 8, "calls": 3, "processes": 4, "process_threads": 2, "tasks": 20,
         "task_calls": 1}  # fmt: skip
QUICK_FLEET = {"limit": 3, "per": 1.0, "threads": 4, "calls": 1, "processes": 2, "process_threads": 2,
               "tasks": 6, "task_calls": 1}  # fmt: skip
INSTRUCTIONS_TARGET = 1.05
WARM_UP = 600
INSTRUCTION_VARIANTS = ("SDK alone", "RetryAfterTransport()")
#: The modules every fleet process needs, imported once by the fork server.
_PRELOAD = ["httpx2", "openai", "anthropic", "retry_after_adapter", "retry_after_adapter.httpx2"]


# -- the fleets ----------------------------------------------------------------------------------


def time_limit(ideal: float) -> float:
    """Seconds a run may take before its workers stop."""
    return 3 * ideal + 30.0


def fleet_threads(
    sdk: str, shape: dict[str, Any], store: str | None, shared: bool, server: Any
) -> dict[str, Any]:
    """Threads in this process: on one client (``shared``), or each on its own client
    over its own transport, all on one store."""
    calls = shape["threads"] * shape["calls"]
    one = _common.open_store(store)
    https = [http_client(one) for _ in range(1 if shared else shape["threads"])]
    clients = [sdk_client(sdk, server.url, http) for http in https]
    start_at = time.monotonic() + 0.05
    tally = run_threads(
        sdk, clients, shape["threads"], shape["calls"], start_at, time_limit(ideal_of(shape, calls))
    )
    for http in https:
        http.close()
    return outcome(shape, calls, start_at, [tally.as_dict()], server)


def fleet_processes(
    sdk: str, shape: dict[str, Any], store: tuple[str, str] | None, server: Any, ctx: Any
) -> dict[str, Any]:
    """``shape["processes"]`` processes of ``shape["process_threads"]`` threads, each
    process its own client, sharing ``store`` (None: the SDK alone)."""
    calls = shape["processes"] * shape["process_threads"] * shape["calls"]
    limit = time_limit(ideal_of(shape, calls))
    specs = [
        {"sdk": sdk, "url": server.url, "store": store, "threads": shape["process_threads"],
         "calls": shape["calls"], "limit": limit, "name": f"p{n}"}
        for n in range(shape["processes"])
    ]  # fmt: skip
    start_at, results = _common.process_fleet(ctx, process_main, specs, limit + 60)
    return outcome(shape, calls, start_at, results, server)


def fleet_async(sdk: str, shape: dict[str, Any], store: str | None, server: Any) -> dict[str, Any]:
    """``shape["tasks"]`` asyncio tasks on one async client."""
    import httpx2

    from retry_after_adapter.httpx2 import AsyncRetryAfterTransport

    calls = shape["tasks"] * shape["task_calls"]
    limit = time_limit(ideal_of(shape, calls))
    tally = Tally()

    async def main() -> float:
        one = _common.open_store(store)
        transport = AsyncRetryAfterTransport(cooldown=one) if one is not None else None
        async with httpx2.AsyncClient(transport=transport) as http:
            client = async_sdk_client(sdk, server.url, http)
            start_at = time.monotonic()
            stop_at = start_at + limit
            tasks = [
                async_worker(sdk, client, shape["task_calls"], stop_at, tally) for _ in range(shape["tasks"])
            ]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks), limit + 30)
            return start_at

    start_at = asyncio.run(main())
    return outcome(shape, calls, start_at, [tally.as_dict()], server)


def ideal_of(shape: dict[str, Any], calls: int) -> float:
    return calls / shape["limit"] * shape["per"]


def outcome(
    shape: dict[str, Any], calls: int, start_at: float, tallies: list[dict[str, Any]], server: Any
) -> dict[str, Any]:
    stats = server.stats()
    done = sum(t["done"] for t in tallies)
    ends = [t["last_done"] for t in tallies if t["last_done"] is not None]
    wall = max(ends) - start_at if done == calls and ends else None
    ideal = ideal_of(shape, calls)
    return {
        "calls": calls,
        "done": done,
        "429": stats.throttled,
        "requests": stats.requests,
        "ok": stats.ok,
        "early": stats.early,
        "rate_limited": sum(t["rate_limited"] for t in tallies),
        "deferred": sum(t["deferred"] for t in tallies),
        "other_errors": sum(t["other_error_count"] for t in tallies),
        "other_error_examples": [e for t in tallies for e in t["other_errors"]][:5],
        "wall_s": round(wall, 3) if wall is not None else None,
        "ideal_s": round(ideal, 3),
        "least_s": (math.ceil(calls / shape["limit"]) - 1) * shape["per"],
        "wall_over_ideal": round(wall / ideal, 4) if wall is not None else None,
    }


#: (name, how, store); how: "threads" (one client), "clients" (a client per thread),
#: "processes", "async".
FLEETS: list[tuple[str, str, str | None]] = [
    ("SDK alone, 1 process x {threads} threads, one client", "threads", None),
    ("transport, 1 process x {threads} threads, one client, memory", "threads", "memory"),
    ("transport, 1 process x {threads} threads, a client each, one memory store", "clients", "memory"),
    ("SDK alone, {processes} processes x {process_threads} threads", "processes", None),
    ("transport, {processes} processes x {process_threads} threads, SQLite", "processes", "sqlite"),
    ("transport, {processes} processes x {process_threads} threads, Redis", "processes", "redis"),
    ("SDK alone, async, {tasks} tasks, one client", "async", None),
    ("transport, async, {tasks} tasks, one client, memory", "async", "memory"),
]


def baseline_of(how: str) -> str:
    """The SDK-alone row a fleet's wall is compared with."""
    return {"threads": "threads", "clients": "threads", "processes": "processes", "async": "async"}[how]


def fleet_part(sdks: list[str], shape: dict[str, Any], reps: int, skipped: dict[str, str]) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="bench-llm-")
    try:
        with _common.redis_server(workdir) as (redis, why):
            if redis is None:
                skipped["redis"] = why
                print(f"skipping the Redis runs: {why}", flush=True)
            return _run_fleets(sdks, shape, reps, workdir, redis)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_fleets(
    sdks: list[str], shape: dict[str, Any], reps: int, workdir: str, redis: _common.RedisServer | None
) -> dict[str, Any]:
    """Every fleet of ``FLEETS`` ``reps`` times per SDK (the Redis ones on ``redis``,
    flushed before each run; skipped without it), then their summary."""
    from retry_after_adapter.testing.server import QuotaServer

    fleets = [(name.format(**shape), how, store) for name, how, store in FLEETS if store != "redis" or redis]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        sdk: {name: [] for name, _, _ in fleets} for sdk in sdks
    }
    for rep in range(reps):
        for sdk in sdks:
            for n, (name, how, store) in enumerate(fleets):
                with QuotaServer(shape["limit"], shape["per"], align="first", quota_headers=sdk) as server:
                    if how in ("threads", "clients"):
                        result = fleet_threads(sdk, shape, store, how == "threads", server)
                    elif how == "async":
                        result = fleet_async(sdk, shape, store, server)
                    else:
                        where: tuple[str, str] | None = None
                        if store == "sqlite":
                            where = ("sqlite", os.path.join(workdir, f"cooldown-{sdk}-{rep}-{n}.db"))
                        elif store == "redis":
                            assert redis is not None
                            import redis as redis_py

                            redis_py.Redis.from_url(redis.url).flushdb()
                            where = ("redis", redis.url)
                        result = fleet_processes(sdk, shape, where, server, ctx)
                runs[sdk][name].append(result)
                print(
                    f"rep {rep + 1}/{reps} {sdk} {name}: 429s {result['429']}, early {result['early']}, "
                    f"requests {result['requests']}, done {result['done']}/{result['calls']}, "
                    f"wall {result['wall_s']} s (ideal {result['ideal_s']} s), "
                    f"RateLimitErrors caught {result['rate_limited']} ({result['deferred']} deferrals)"
                    + (f", other errors {result['other_errors']}" if result["other_errors"] else ""),
                    flush=True,
                )
    return summarise_fleets(sdks, shape, fleets, runs)


NUMERIC = ("429", "early", "requests", "done", "rate_limited", "deferred", "wall_s", "wall_over_ideal")


def summarise_fleets(
    sdks: list[str], shape: dict[str, Any], fleets: list[tuple[str, str, str | None]],
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> dict[str, Any]:  # fmt: skip
    report: dict[str, Any] = {}
    for sdk in sdks:
        alone = {how: runs[sdk][name] for name, how, store in fleets if store is None}
        report[sdk] = {}
        for name, how, _store in fleets:
            results = runs[sdk][name]
            entry: dict[str, Any] = {"runs": results, "summary": {}}
            for key in NUMERIC:
                values = [r[key] for r in results if r[key] is not None]
                entry["summary"][key] = _common.summary(values) if values else None
            base = alone.get(baseline_of(how))
            if base is not None:
                pairs = zip([r["wall_s"] for r in results], [b["wall_s"] for b in base], strict=True)
                vs = [a / b for a, b in pairs if a and b]
                entry["wall_vs_sdk_alone"] = _common.summary(vs) if vs else None
            report[sdk][name] = entry
    return {"shape": shape, "sdks": report}


def fleet_tables(report: dict[str, Any], reps: int) -> list[str]:
    shape = report["shape"]
    rows = []
    for sdk, by_fleet in report["sdks"].items():
        for name, entry in by_fleet.items():
            s = entry["summary"]
            calls = entry["runs"][0]["calls"]
            rows.append(
                [
                    sdk,
                    name,
                    cell(s["429"]),
                    cell(s["early"]),
                    cell(s["requests"]),
                    f"{cell(s['done'])} / {calls}",
                    cell(s["rate_limited"]),
                    cell(s["wall_s"], 2),
                    _common.fmt(entry["runs"][0]["ideal_s"], 2),
                    cell(s["wall_over_ideal"], 3),
                    cell(entry.get("wall_vs_sdk_alone"), 3),
                ]
            )
    title = (
        f"SDK fleets against a stand-in allowing {shape['limit']} requests per {shape['per']:g} s "
        f"(the provider's quota headers), {reps} repetition(s), median [min-max]; ideal = calls / "
        f"{shape['limit']} x {shape['per']:g} s"
    )
    headers = ["SDK", "fleet", "429s", "early", "requests", "done / calls", "RateLimitErrors caught",
               "wall s", "ideal s", "wall / ideal", "wall vs SDK alone"]  # fmt: skip
    return [_common.table(title, headers, rows)]


# -- instructions ---------------------------------------------------------------------------------


def instructions_child(sdk: str, variant: str, n: int, url: str, warm_up: int) -> None:
    """One variant's process: ``max(n, warm_up)`` warm-up calls, a check that the call
    never runs ``functools.reduce`` itself, then ``n`` measured calls inside it."""
    import httpx2

    from retry_after_adapter.httpx2 import RetryAfterTransport

    http = (
        httpx2.Client()
        if variant == INSTRUCTION_VARIANTS[0]
        else httpx2.Client(transport=RetryAfterTransport())
    )
    client = sdk_client(sdk, url, http)

    def call(count: int, _: int) -> int:
        page = client.models.list()
        assert page.data == [], page
        return count + 1

    for i in range(max(n, warm_up)):
        call(0, i)
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg is functools.reduce:
            seen.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")

    sys.setprofile(profile)
    for i in range(3):
        call(0, i)
    sys.setprofile(None)
    if seen:
        raise RuntimeError(
            f"functools.reduce runs inside the call ({seen[0]}): it cannot mark the measured loop"
        )
    assert functools.reduce(call, range(n), 0) == n  # measured: collected alone
    http.close()


def measure(sdk: str, variant: str, n: int, url: str, warm_up: int) -> int:
    """Instructions of ``n`` warm calls of ``variant`` (the collected reduce call)."""
    return _common.callgrind_collected(
        __file__, [sdk, variant, str(n), url, str(warm_up)], f"{sdk} {variant}", timeout=3600
    )


def instructions_part(sdks: list[str], n: int, repeats: int, warm_up: int) -> dict[str, Any]:
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind is not installed"}
    per_call: dict[str, dict[str, list[float]]] = {}
    for sdk in sdks:
        per_call[sdk] = {variant: [] for variant in INSTRUCTION_VARIANTS}
        # The stand-in in its own process, outside valgrind; a quota that never binds.
        with _common.ServerProcess("retry_after_adapter.demo", "--serve", str(10**9), "3600", sdk) as server:
            for rep in range(repeats):
                for variant in INSTRUCTION_VARIANTS:
                    count = measure(sdk, variant, n, server.url, warm_up)
                    per_call[sdk][variant].append(count / n)
                    print(
                        f"{sdk} {variant} repeat {rep + 1}/{repeats}: {count / n:,.0f} per call", flush=True
                    )
    out: dict[str, Any] = {
        "per_call": {},
        "ratio": {},
        "meets_target": {},
        "target_ratio": INSTRUCTIONS_TARGET,
    }
    for sdk, variants in per_call.items():
        alone, ours = variants[INSTRUCTION_VARIANTS[0]], variants[INSTRUCTION_VARIANTS[1]]
        out["per_call"][sdk] = {variant: _common.summary(values) for variant, values in variants.items()}
        out["ratio"][sdk] = _common.summary(_common.ratios(ours, alone))
        out["meets_target"][sdk] = out["ratio"][sdk]["median"] <= INSTRUCTIONS_TARGET
    return out


def instructions_tables(report: dict[str, Any], n: int, repeats: int) -> list[str]:
    if "skipped" in report:
        return [f"instructions: skipped ({report['skipped']})\n"]
    rows = []
    for sdk, variants in report["per_call"].items():
        base = variants[INSTRUCTION_VARIANTS[0]]["median"]
        for variant, s in variants.items():
            ratio = (
                "1" if variant == INSTRUCTION_VARIANTS[0] else _common.fmt_summary(report["ratio"][sdk], 4)
            )
            rows.append([sdk, f"client.models.list(), {variant}", f"{s['median'] / 1e6:.4f} M",
                         f"{(s['median'] - base) / 1e3:+,.0f} k", ratio])  # fmt: skip
    title = (
        f"Instructions per call, happy path ({n} warm calls, {repeats} repeats; median [min-max]; "
        f"target <= {INSTRUCTIONS_TARGET})"
    )
    return [_common.table(title, ["SDK", "variant", "per call", "vs SDK alone", "ratio"], rows)]


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--part", choices=("all", "fleet", "instructions"), default="all", help="default: both")
    p.add_argument("--sdks", default=",".join(SDKS), help="comma-separated: openai, anthropic (default both)")
    p.add_argument("--reps", type=int, help="fleet repetitions (default 3; quick 1)")
    p.add_argument("--limit", type=int, help="the quota's requests per window (default 3)")
    p.add_argument("--per", type=float, help="the quota's window in seconds (default 4; quick 1)")
    p.add_argument("--calls", type=int, help="calls per sync worker (default 3; quick 1)")
    p.add_argument(
        "--rounds", type=int, default=300, help="measured calls per instructions run (default 300)"
    )
    p.add_argument("--repeats", type=int, default=3, help="instructions runs of each variant (default 3)")
    args = p.parse_args()
    sdks = [s for s in args.sdks.split(",") if s]
    unknown = [s for s in sdks if s not in SDKS]
    if unknown:
        p.error(f"--sdks: unknown {', '.join(unknown)}")
    skipped = missing_sdks(sdks)
    for sdk, why in skipped.items():
        print(f"skipping {sdk}: {why}", flush=True)
    sdks = [s for s in sdks if s not in skipped]
    shape = dict(QUICK_FLEET if args.quick else FLEET)
    for key in ("limit", "per", "calls"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    reps = args.reps or (1 if args.quick else 3)
    n, repeats, warm_up = (20, 1, 20) if args.quick else (args.rounds, args.repeats, WARM_UP)
    payload: dict[str, Any] = {
        "settings": {
            "part": args.part,
            "sdks": sdks,
            "quick": args.quick,
            "reps": reps,
            "shape": shape,
            "instruction_calls": n,
            "instruction_repeats": repeats,
            "warm_up": warm_up,
        },
        "loadavg_at_start": _common.loadavg(),
        "skipped": skipped,
    }
    tables: list[str] = []
    timings: dict[str, float] = {}
    if args.part in ("all", "fleet"):
        started = time.monotonic()
        payload["fleet"] = fleet_part(sdks, shape, reps, skipped)
        timings["fleet_s"] = round(time.monotonic() - started, 1)
        tables += fleet_tables(payload["fleet"], reps)
    if args.part in ("all", "instructions"):
        started = time.monotonic()
        payload["instructions"] = instructions_part(sdks, n, repeats, warm_up)
        timings["instructions_s"] = round(time.monotonic() - started, 1)
        tables += instructions_tables(payload["instructions"], n, repeats)
    payload["took"] = timings
    _common.finish("llm", payload, tables, args.out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        instructions_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
    else:
        main()
