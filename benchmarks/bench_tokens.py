"""Token-weighted admission with the OpenAI and Anthropic SDKs (on httpx2): a fleet
whose calls each cost tokens, under a provider's tokens-per-window quota, alone and
with the httpx2 transports mounted.

A loopback stand-in of the provider (``QuotaServer(100, per, quota_headers="openai" |
"anthropic", align="first", tokens=limit)``, a fresh one per run) allows ``--limit``
tokens (default 25) per ``--per`` seconds (default 3; 100 requests, which never bind),
windows counted from the first request; a request costs its JSON body's
``max_tokens``, and one that does not fit what is left of the window's tokens is a
429 with ``Retry-After`` (and ``retry-after-ms`` for OpenAI). Every answer announces
the requests and the tokens in the provider's own headers. Each call is a chat call
with ``max_tokens=--cost`` (default 10: two fit in a window): OpenAI's
``chat.completions.create``, Anthropic's ``messages.create``. Every SDK client keeps
its defaults (``max_retries=2``); a ``RateLimitError`` is caught and the worker calls
again when it says (``lib.llm.wait_after``), as in ``bench_llm.py``. Fleets, for each
SDK:

- SDK alone: ``--threads`` (8) threads on one client over a plain ``httpx2.Client()``;
  ``--tasks`` (8) asyncio tasks on one async client;
- ``RetryAfterTransport(cost=max_tokens)``: the same threads, each cost admitted
  against the token allowance the answers announce;
- the same with ``quota=Quota(limit, per=per, unit="tokens")`` configured too;
- ``AsyncRetryAfterTransport(cost=max_tokens)``: the same tasks.

Reported per run, as the server counted them: 429s, requests, requests "early" (inside
a cooldown it announced), calls done, the wall time from the start to the last call
done against the least the quota allows (``(ceil(calls / per_window) - 1) * per``,
``per_window = limit // cost``). Medians over ``--reps`` (3) with [min-max]. Target:
with the transport, at most one 429 and every call done. Every run is bounded (``3 x
ideal + 30 s``).

On a 2-core machine:

    python benchmarks/bench_tokens.py            # about 6 minutes
    python benchmarks/bench_tokens.py --quick    # one repetition, OpenAI only: about 1 minute
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from lib import common as _common
from lib import llm
from lib.common import cell

SHAPE = {"limit": 25, "per": 3.0, "cost": 10, "threads": 8, "tasks": 8}
#: (name, how, quota): how "threads" or "async"; transport None: the SDK alone.
FLEETS: list[tuple[str, str, str | None]] = [
    ("SDK alone, {threads} threads, one client", "threads", None),
    ("transport cost=max_tokens, {threads} threads, one client", "threads", "announced"),
    ("the same with Quota({limit}, per={per:g}, unit='tokens')", "threads", "configured"),
    ("SDK alone, async, {tasks} tasks, one client", "async", None),
    ("transport cost=max_tokens, async, {tasks} tasks, one client", "async", "announced"),
]


def chat(sdk: str, cost: int) -> Any:
    """The fleets' call on a sync client: one chat call with ``max_tokens=cost``."""
    if sdk == "openai":
        return lambda client: client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=cost
        )
    return lambda client: client.messages.create(
        model="m", max_tokens=cost, messages=[{"role": "user", "content": "hi"}]
    )


def transport_options(shape: dict[str, Any], quota: str | None) -> dict[str, Any] | None:
    """The transport's options (None: the SDK alone): a memory store, ``cost=max_tokens``,
    and the token quota when ``quota`` is "configured"."""
    if quota is None:
        return None
    from retry_after_adapter import MemoryCooldownStore, Quota
    from retry_after_adapter.cost import max_tokens

    options: dict[str, Any] = {"cooldown": MemoryCooldownStore(), "cost": max_tokens}
    if quota == "configured":
        options["quota"] = Quota(shape["limit"], per=shape["per"], unit="tokens")
    return options


def least(shape: dict[str, Any], calls: int) -> float:
    """The least wall the token quota allows (windows from the first request)."""
    per_window = shape["limit"] // shape["cost"]
    return (math.ceil(calls / per_window) - 1) * shape["per"]


def fleet_threads(sdk: str, shape: dict[str, Any], quota: str | None, server: Any) -> dict[str, Any]:
    import httpx2

    from retry_after_adapter.httpx2 import RetryAfterTransport

    options = transport_options(shape, quota)
    transport = RetryAfterTransport(**options) if options is not None else None
    with httpx2.Client(transport=transport) as http:
        client = llm.sdk_client(sdk, server.url, http)
        calls = shape["threads"]
        start_at = time.monotonic() + 0.05
        limit = 3 * least(shape, calls) + 30
        tally = llm.run_threads(sdk, [client], calls, 1, start_at, limit, chat(sdk, shape["cost"]))
    return result(shape, calls, start_at, tally, server)


def fleet_async(sdk: str, shape: dict[str, Any], quota: str | None, server: Any) -> dict[str, Any]:
    import httpx2

    from retry_after_adapter.httpx2 import AsyncRetryAfterTransport

    calls = shape["tasks"]
    limit = 3 * least(shape, calls) + 30
    tally = llm.Tally()
    call = chat(sdk, shape["cost"])

    async def main() -> float:
        options = transport_options(shape, quota)
        transport = AsyncRetryAfterTransport(**options) if options is not None else None
        async with httpx2.AsyncClient(transport=transport) as http:
            client = llm.async_sdk_client(sdk, server.url, http)
            start_at = time.monotonic()
            stop_at = start_at + limit
            tasks = [llm.async_worker(sdk, client, 1, stop_at, tally, call) for _ in range(calls)]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks), limit + 30)
            return start_at

    start_at = asyncio.run(main())
    return result(shape, calls, start_at, tally, server)


def result(shape: dict[str, Any], calls: int, start_at: float, tally: Any, server: Any) -> dict[str, Any]:
    stats = server.stats()
    done = tally.done
    wall = tally.last_done - start_at if done == calls and tally.last_done is not None else None
    ideal = least(shape, calls)
    return {
        "calls": calls,
        "done": done,
        "429": stats.throttled,
        "requests": stats.requests,
        "early": stats.early,
        "rate_limited": tally.rate_limited,
        "other_errors": len(tally.other_errors),
        "wall_s": round(wall, 3) if wall is not None else None,
        "least_s": ideal,
        "wall_minus_least_s": round(wall - ideal, 3) if wall is not None else None,
    }


NUMERIC = ("429", "early", "requests", "done", "wall_s", "wall_minus_least_s")


def run(sdks: list[str], shape: dict[str, Any], reps: int) -> dict[str, Any]:
    from retry_after_adapter.testing.server import QuotaServer

    fleets = [(name.format(**shape), how, quota) for name, how, quota in FLEETS]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        sdk: {name: [] for name, _, _ in fleets} for sdk in sdks
    }
    for rep in range(reps):
        for sdk in sdks:
            for name, how, quota in fleets:
                with QuotaServer(
                    100, shape["per"], align="first", quota_headers=sdk, tokens=shape["limit"]
                ) as server:
                    fleet = fleet_threads if how == "threads" else fleet_async
                    outcome = fleet(sdk, shape, quota, server)
                runs[sdk][name].append(outcome)
                print(
                    f"rep {rep + 1}/{reps} {sdk} {name}: 429s {outcome['429']}, early {outcome['early']}, "
                    f"done {outcome['done']}/{outcome['calls']}, wall {outcome['wall_s']} s "
                    f"(least {outcome['least_s']} s)",
                    flush=True,
                )
    report: dict[str, Any] = {}
    for sdk in sdks:
        report[sdk] = {}
        for name, _, _ in fleets:
            results = runs[sdk][name]
            summary = {}
            for key in NUMERIC:
                values = [r[key] for r in results if r[key] is not None]
                summary[key] = _common.summary(values) if values else None
            report[sdk][name] = {"runs": results, "summary": summary}
    return report


def tables(report: dict[str, Any], shape: dict[str, Any], reps: int) -> list[str]:
    rows = []
    for sdk, by_fleet in report.items():
        for name, entry in by_fleet.items():
            s = entry["summary"]
            calls = entry["runs"][0]["calls"]
            rows.append([sdk, name, cell(s["429"]), cell(s["early"]), f"{cell(s['done'])}/{calls}",
                         cell(s["wall_s"]), str(entry["runs"][0]["least_s"])])  # fmt: skip
    head = ["SDK", "fleet", "429s", "early", "done", "wall s", "least s"]
    title = (
        f"Token quota: {shape['limit']} tokens per {shape['per']:g} s announced, calls of "
        f"{shape['cost']} tokens, medians of {reps} [min-max]"
    )
    return [_common.table(title, head, rows)]


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--sdks", default=",".join(llm.SDKS), help="comma-separated (default both)")
    p.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    for key in ("limit", "cost", "threads", "tasks"):
        p.add_argument(f"--{key}", type=int, help=f"default {SHAPE[key]}")
    p.add_argument("--per", type=float, help=f"default {SHAPE['per']:g}")
    args = p.parse_args()
    sdks = [s for s in args.sdks.split(",") if s] if not args.quick else ["openai"]
    skipped = llm.missing_sdks(sdks)
    for sdk, why in skipped.items():
        print(f"skipping {sdk}: {why}", flush=True)
    sdks = [s for s in sdks if s not in skipped]
    shape = dict(SHAPE)
    if args.quick:
        shape.update(threads=4, tasks=4)
    for key in ("limit", "cost", "threads", "tasks", "per"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    reps = args.reps or (1 if args.quick else 3)
    started = time.monotonic()
    report = run(sdks, shape, reps)
    payload: dict[str, Any] = {
        "settings": {"sdks": sdks, "quick": args.quick, "reps": reps, "shape": shape},
        "loadavg_at_start": _common.loadavg(),
        "skipped": skipped,
        "fleets": report,
        "took_s": round(time.monotonic() - started, 1),
    }
    _common.finish("tokens", payload, tables(report, shape, reps), args.out)


if __name__ == "__main__":
    main()
