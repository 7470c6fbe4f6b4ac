"""The aiohttp middleware against plain aiohttp, aiohttp-retry and retryhttp, side by side.

1. Happy path, per GET (``--part happy``): one task sending GETs one after another
   through a session with ``RetryAfterMiddleware(RetryAfterRetry(total=5,
   backoff_factor=0.5, deadline=30))`` (the default memory store), against a plain
   session, on the keep-alive ``200 ok`` server of the other benchmarks (its own
   process). Each round every variant sends one block of ``--block`` GETs, in an order
   rotated every round; a block's time over the plain block's of the same round is the
   round's ratio, in wall time and in this process's CPU time (the steadier on a shared
   machine). A second plain session is the control (A/A, ideally 1.000). No target: the
   engine's own cost per call (what the async httpx transport adds too) against
   aiohttp's, about a third of httpx's.

2. Async fleet (``--part fleet``): 500 tasks in one process work through 200 items (one GET each) against
the quota server (its own process; 50 per 5 s window, counted from the first request;
quota headers ``RateLimit``/``RateLimit-Policy`` on every answer, ``Retry-After`` on
each 429); an item is done on a 200, a deferred one re-queued for its ``eligible_at``
(resumed from its deferral), anything else re-queued at once. Every client is one
``aiohttp.ClientSession`` (a connector of 600 connections), each attempt stamped
``X-Sent-At`` by an inner middleware as it is handed to aiohttp's connection:

- ``RetryAfterMiddleware(RetryAfterRetry(total=10, backoff_factor=0.5, deadline=3,
  attempt_reserve=0.2))`` on a memory store (and on a SQLite file with ``--stores``);
- aiohttp-retry 2.9: ``RetryClient(retry_options=ExponentialRetry(attempts=10,
  start_timeout=0.5, statuses={429}))``: it has no Retry-After at all (its issue #59);
- retryhttp 1.5: ``@retry(max_attempt_number=10)`` around the call (tenacity; a 429's
  Retry-After waited, one above 120 s shortened to exponential backoff), the call
  raising for a 429 as retryhttp needs.

Counted as the fleet benchmark counts them (``lib.fleet.analyse``): 429s, early sends
(sent inside a cooldown a 429 announced), overruns (calls longer than 3 s), items done,
goodput (items done a second) against what the server allowed (quota / window), wall
against the ideal 15 s. Targets for ours: 0 early, <= 1 429, in every run.

    python benchmarks/bench_aiohttp.py            # full: about 6 minutes
    python benchmarks/bench_aiohttp.py --quick    # a few seconds
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from lib import common as _common
from lib import fleet as _fleet

FLEET = {"quota": 50, "window": 5.0, "items": 200, "deadline": 3.0, "tasks": 500}
QUICK_FLEET = {"quota": 10, "window": 1.0, "items": 20, "deadline": 0.5, "tasks": 50}
TOTAL = 10
OURS = "RetryAfterMiddleware"
CLIENTS = (OURS, "aiohttp-retry", "retryhttp")


async def _stamp(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
    """Stamps ``X-Sent-At`` (monotonic) on each attempt as it goes to aiohttp's
    connection, as the fleet benchmark's urllib3 patch does."""
    request.headers["X-Sent-At"] = repr(time.monotonic())
    response: aiohttp.ClientResponse = await handler(request)
    return response


class _Client:
    """One variant's way to GET a URL: ``get(url, headers) -> (status, deferral)``."""

    def __init__(self, variant: str, shape: dict[str, Any], store: Any) -> None:
        self.variant = variant
        self.middleware: Any = None
        middlewares: tuple[Any, ...] = (_stamp,)
        if variant.startswith(OURS):
            from retry_after_adapter import MemoryCooldownStore, RetryAfterRetry
            from retry_after_adapter.aiohttp import RetryAfterMiddleware

            policy = RetryAfterRetry(
                total=TOTAL, backoff_factor=0.5, deadline=shape["deadline"], attempt_reserve=0.2
            )
            self.middleware = RetryAfterMiddleware(
                policy, cooldown=store if store is not None else MemoryCooldownStore()
            )
            middlewares = (self.middleware, _stamp)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=600), middlewares=middlewares
        )
        self.get: Callable[[str, dict[str, str]], Awaitable[tuple[int, Any]]] = self._ours
        if variant == "aiohttp-retry":
            from aiohttp_retry import ExponentialRetry, RetryClient

            options = ExponentialRetry(attempts=TOTAL, start_timeout=0.5, statuses={429})
            self.retry_client = RetryClient(client_session=self.session, retry_options=options)
            self.get = self._aiohttp_retry
        elif variant == "retryhttp":
            from retryhttp import retry

            self.get = retry(max_attempt_number=TOTAL)(self._raising)

    async def _ours(self, url: str, headers: dict[str, str]) -> tuple[int, Any]:
        async with self.session.get(url, headers=headers) as response:
            await response.read()
            return response.status, getattr(response, "deferral", None)

    async def _aiohttp_retry(self, url: str, headers: dict[str, str]) -> tuple[int, Any]:
        async with self.retry_client.get(url, headers=headers) as response:
            await response.read()
            return response.status, None

    async def _raising(self, url: str, headers: dict[str, str]) -> tuple[int, Any]:
        async with self.session.get(url, headers=headers) as response:
            await response.read()
            response.raise_for_status()  # retryhttp retries what raises
            return response.status, None

    async def close(self) -> None:
        await self.session.close()
        if self.middleware is not None:
            self.middleware.close()


async def _fleet_run(
    variant: str, url: str, shape: dict[str, Any], time_limit: float, store: Any = None
) -> dict[str, Any]:
    """The async fleet (``lib.fleet.async_items``) on one client of ``variant``."""
    client = _Client(variant, shape, store)
    return await _fleet.async_items(client.get, client.close, url, shape, time_limit)


# -- happy path --------------------------------------------------------------------------------


def happy(block: int, rounds: int) -> dict[str, Any]:
    """Per variant: microseconds per GET (wall, and this process's CPU), and each
    block's ratio to the plain session's block of the same round (wall, CPU)."""
    from retry_after_adapter import RetryAfterRetry
    from retry_after_adapter.aiohttp import RetryAfterMiddleware

    with _common.ok_server() as server:
        url = server.url + "/ok"
        loop = asyncio.new_event_loop()
        middleware = RetryAfterMiddleware(RetryAfterRetry(total=5, backoff_factor=0.5, deadline=30))

        async def open_sessions() -> dict[str, aiohttp.ClientSession]:
            return {
                "plain": aiohttp.ClientSession(),
                "plain (control)": aiohttp.ClientSession(),
                OURS: aiohttp.ClientSession(middlewares=(middleware,)),
            }

        sessions = loop.run_until_complete(open_sessions())

        async def one_block(session: aiohttp.ClientSession) -> None:
            for _ in range(block):
                async with session.get(url) as response:
                    await response.read()

        times = _common.paired_blocks(
            list(sessions), lambda name: loop.run_until_complete(one_block(sessions[name])), rounds, discard=2
        )
        for session in sessions.values():
            loop.run_until_complete(session.close())
        loop.close()
        middleware.close()
    base = times["plain"]
    return {
        name: {
            "per_get_us": _common.summary([w / block * 1e6 for w, _ in values]),
            "cpu_per_get_us": _common.summary([c / block * 1e6 for _, c in values]),
            "ratio": _common.summary(_common.ratios([w for w, _ in values], [w for w, _ in base])),
            "cpu_ratio": _common.summary(_common.ratios([c for _, c in values], [c for _, c in base])),
        }
        for name, values in times.items()
    }


# -- async fleet ---------------------------------------------------------------------------------


Runs = dict[str, list[dict[str, Any]]]


def fleet(shape: dict[str, Any], reps: int, stores: list[str]) -> Runs:
    """``reps`` runs of each client: ours on each of ``stores`` (memory, sqlite), and
    the two others; in an order rotated every run."""
    time_limit = _fleet.time_limit(shape)
    variants = [OURS if kind == "memory" else f"{OURS}, SQLite" for kind in stores] + list(CLIENTS[1:])
    runs: Runs = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(reps):
            for variant in _common.rotation(variants, rep):
                store = None
                if variant.endswith("SQLite"):
                    store = _common.open_store("sqlite", os.path.join(workdir, f"fleet-{rep}.db"))
                with _fleet.throttle_server(shape, "ietf") as server:
                    result = asyncio.run(_fleet_run(variant, server.url, shape, time_limit, store))
                    log = _fleet.fetch_log(server.url)["log"]
                analysed = _fleet.analyse(
                    log,
                    result["calls"],
                    [],
                    quota=shape["quota"],
                    window=shape["window"],
                    items=shape["items"],
                    processes=1,
                    deadline=shape["deadline"],
                    start_at=result["start_at"],
                    done_at=result["done_at"],
                )
                # Goodput: the items done against what the server allowed until the last
                # was done (a quota for each window that had opened by then).
                wall = analysed["wall_s"]
                allowed = None if wall is None else shape["quota"] * (math.floor(wall / shape["window"]) + 1)
                analysed["allowed"] = allowed
                analysed["goodput_over_allowed"] = None if not allowed else analysed["items_done"] / allowed
                runs[variant].append(analysed)
    return runs


def _rows(runs: Runs) -> list[list[Any]]:
    rows = []
    for variant, results in runs.items():

        def cell(key: str, digits: int = 0, results: list[dict[str, Any]] = results) -> str:
            values = [r[key] for r in results if r.get(key) is not None]
            if not values:
                return "-"
            return _common.fmt_summary(_common.summary(values), digits)

        done = min(r["items_done"] for r in results)
        rows.append([
            variant, cell("429"), cell("early"), cell("overran_deadline"), done,
            cell("goodput_over_allowed", 2), cell("wall_s", 1), cell("wall_over_ideal", 3),
        ])  # fmt: skip
    return rows


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--part", choices=("happy", "fleet", "all"), default="all")
    p.add_argument("--block", type=int, help="GETs per block (default 50; quick 20)")
    p.add_argument("--rounds", type=int, help="rounds (default 60; quick 4)")
    p.add_argument("--reps", type=int, help="fleet repetitions (default 3; quick 1)")
    p.add_argument("--stores", help="our middleware's stores: memory,sqlite (default both; quick memory)")
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    block = args.block or (20 if args.quick else 50)
    rounds = args.rounds or (4 if args.quick else 60)
    shape = QUICK_FLEET if args.quick else FLEET
    stores = (args.stores or ("memory" if args.quick else "memory,sqlite")).split(",")
    payload: dict[str, Any] = {"pid": os.getpid(), "aiohttp": aiohttp.__version__}
    tables = []
    if args.part in ("happy", "all"):
        measured = happy(block, rounds)
        payload["happy"] = measured
        rows = [
            [
                name,
                _common.fmt_summary(v["per_get_us"], 1),
                _common.fmt_summary(v["cpu_per_get_us"], 1),
                _common.fmt_summary(v["ratio"]),
                _common.fmt_summary(v["cpu_ratio"]),
            ]
            for name, v in measured.items()
        ]
        tables.append(
            _common.table(
                f"aiohttp happy path, {block} GETs per block, {rounds} rounds",
                ["session", "us per GET", "CPU us per GET", "ratio to plain (wall)", "ratio to plain (CPU)"],
                rows,
            )
        )
    if args.part in ("fleet", "all"):
        runs = fleet(shape, reps, stores)
        payload["shape"] = shape
        payload["runs"] = runs
        title = (
            f"aiohttp async fleet: {shape['tasks']} tasks, quota {shape['quota']} per {shape['window']:g} s, "
            f"{shape['items']} items, deadline {shape['deadline']:g} s (ours), quota headers, {reps} runs"
        )
        tables.append(
            _common.table(
                title,
                ["client", "429s", "early", "overruns", "items done (least)", "goodput / allowed", "wall s",
                 "wall / ideal"],
                _rows(runs),
            )
        )
    _common.finish("bench_aiohttp", payload, tables, args.out)


if __name__ == "__main__":
    main()
