"""The httpx transports against plain httpx and httpx-retries, side by side in one run.

1. Happy path, per GET (``--part happy``): ``RetryAfterTransport`` (the default memory
   store, a ``deadline``) against a plain ``httpx.HTTPTransport``, and
   ``AsyncRetryAfterTransport`` against a plain ``httpx.AsyncHTTPTransport`` (one task
   sending its GETs one after another), on the keep-alive ``200 ok`` server of the other
   benchmarks (its own process). Each round every variant sends one block of
   ``--block`` GETs, in an order rotated every round; a block's time over the plain
   block's of the same round is the round's ratio, quoted as the median over rounds
   [min-max], in wall time and in the client process's CPU time (the server is another
   process; on a shared machine the CPU ratio is the steadier). A second plain client in
   the rotation is the control (A/A, ideally 1.000). Targets: median ratio <= 1.05, sync
   and async.

2. Async fleet (``--part fleet``): 500 tasks in one process work through 200 items (one
   GET each) against the quota server (its own process; 50 per 5 s window, counted from
   the first request; quota headers ``RateLimit``/``RateLimit-Policy`` on every answer),
   each call with a 3 s deadline; an item is done on a 200, a deferred one re-queued for
   its ``eligible_at`` (resumed from its deferral), anything else re-queued at once.
   Clients: ``AsyncRetryAfterTransport(RetryAfterRetry(total=10, backoff_factor=0.5,
   deadline=3, attempt_reserve=0.2))`` on a memory store, and on a SQLite file and a
   Redis (a ``redis-server`` the script starts; the row is skipped without one), against
   httpx-retries' ``RetryTransport(
   retry=Retry(total=10, backoff_factor=0.5))`` (it sleeps each Retry-After, capped at
   its ``max_backoff_wait``, inside the call). Counted as the fleet benchmark counts
   them (``lib.fleet.analyse``): early sends, 429s, overruns (calls longer than 3 s),
   items done, wall against the ideal 15 s. Targets for ours: 0 early, <= 2 429s, 0
   overruns, wall <= 1.05x, in every run.

    python benchmarks/bench_httpx.py            # full: about 3 minutes
    python benchmarks/bench_httpx.py --quick    # a few seconds
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
import time
from typing import Any

import httpx
from lib import common as _common
from lib import fleet as _fleet

HAPPY_TARGET = 1.05
FLEET = {"quota": 50, "window": 5.0, "items": 200, "deadline": 3.0, "tasks": 500}
QUICK_FLEET = {"quota": 10, "window": 1.0, "items": 20, "deadline": 0.5, "tasks": 50}
TOTAL = 10


# -- happy path --------------------------------------------------------------------------------


def _policy() -> Any:
    from retry_after_adapter import RetryAfterRetry

    return RetryAfterRetry(total=5, backoff_factor=0.5, deadline=30)


def happy(block: int, rounds: int) -> dict[str, Any]:
    from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport

    with _common.ok_server() as server:
        url = server.url + "/ok"
        sync = {
            "plain": httpx.Client(transport=httpx.HTTPTransport()),
            "plain (control)": httpx.Client(transport=httpx.HTTPTransport()),
            "RetryAfterTransport": httpx.Client(transport=RetryAfterTransport(_policy())),
        }

        def sync_block(client: httpx.Client) -> None:
            for _ in range(block):
                client.get(url)

        sync_times = _common.paired_blocks(list(sync), lambda name: sync_block(sync[name]), rounds, discard=2)
        for client in sync.values():
            client.close()

        loop = asyncio.new_event_loop()
        clients = {
            "plain": httpx.AsyncClient(transport=httpx.AsyncHTTPTransport()),
            "plain (control)": httpx.AsyncClient(transport=httpx.AsyncHTTPTransport()),
            "AsyncRetryAfterTransport": httpx.AsyncClient(transport=AsyncRetryAfterTransport(_policy())),
        }

        async def async_block(client: httpx.AsyncClient) -> None:
            for _ in range(block):
                await client.get(url)

        async_times = _common.paired_blocks(
            list(clients), lambda name: loop.run_until_complete(async_block(clients[name])), rounds, discard=2
        )
        for async_client in clients.values():
            loop.run_until_complete(async_client.aclose())
        loop.close()
    return {"sync": _ratios(sync_times, block), "async": _ratios(async_times, block)}


def _ratios(times: dict[str, list[tuple[float, float]]], block: int) -> dict[str, Any]:
    """Per client: microseconds per GET, and the ratio of each block to the plain
    client's of the same round, in wall time and in this process's CPU time (which the
    server's process and other tenants do not inflate)."""
    base = times["plain"]
    return {
        name: {
            "per_get_us": _common.summary([w / block * 1e6 for w, _ in values]),
            "ratio": _common.summary(_common.ratios([w for w, _ in values], [w for w, _ in base])),
            "cpu_ratio": _common.summary(_common.ratios([c for _, c in values], [c for _, c in base])),
        }
        for name, values in times.items()
    }


# -- async fleet ---------------------------------------------------------------------------------


class _Stamped(httpx.AsyncBaseTransport):
    """Stamps ``X-Sent-At`` (monotonic) on each attempt as it is handed to the socket
    layer, as the fleet benchmark's urllib3 patch does."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=600))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["X-Sent-At"] = repr(time.monotonic())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _client(variant: str, shape: dict[str, Any], store: Any = None) -> httpx.AsyncClient:
    if variant == "httpx-retries":
        from httpx_retries import Retry, RetryTransport

        retry = Retry(total=TOTAL, backoff_factor=0.5)
        return httpx.AsyncClient(transport=RetryTransport(transport=_Stamped(), retry=retry), timeout=30)
    from retry_after_adapter import MemoryCooldownStore, RetryAfterRetry
    from retry_after_adapter.httpx import AsyncRetryAfterTransport

    policy = RetryAfterRetry(total=TOTAL, backoff_factor=0.5, deadline=shape["deadline"], attempt_reserve=0.2)
    store = store if store is not None else MemoryCooldownStore()
    transport = AsyncRetryAfterTransport(policy, cooldown=store, transport=_Stamped())
    return httpx.AsyncClient(transport=transport, timeout=30)


async def _fleet_run(
    variant: str, url: str, shape: dict[str, Any], time_limit: float, store: Any = None
) -> dict[str, Any]:
    """The async fleet (``lib.fleet.async_items``) on one client of ``variant``."""
    client = _client(variant, shape, store)

    async def get(target: str, headers: dict[str, str]) -> tuple[int | None, Any]:
        response = await client.get(target, headers=headers)
        return response.status_code, getattr(response, "deferral", None)

    return await _fleet.async_items(get, client.aclose, url, shape, time_limit)


Runs = dict[str, list[dict[str, Any]]]


def fleet(shape: dict[str, Any], reps: int, stores: list[str]) -> tuple[Runs, list[str]]:
    """``reps`` runs of each client: ours on each of ``stores`` (memory, sqlite, redis),
    and httpx-retries; the rows skipped, and why."""
    ideal = (math.ceil(shape["items"] / shape["quota"]) - 1) * shape["window"]
    time_limit = ideal + max(30.0, 3 * ideal)
    names = {"memory": "AsyncRetryAfterTransport", "sqlite": "AsyncRetryAfterTransport, SQLite",
             "redis": "AsyncRetryAfterTransport, Redis"}  # fmt: skip
    runs: Runs = {names[kind]: [] for kind in stores}
    runs["httpx-retries"] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as workdir, _common.redis_server(workdir) as (redis, why):
        if redis is None and "redis" in stores:
            skipped.append(f"Redis: {why}")
            del runs[names["redis"]]
        for rep in range(reps):
            for variant in runs:
                store = _store(variant, workdir, rep, redis)
                server = _common.ServerProcess(
                    _fleet.SERVER_MODULE, "--serve", str(shape["quota"]), str(shape["window"]), "ietf"
                )
                with server:
                    result = asyncio.run(_fleet_run(variant, server.url, shape, time_limit, store))
                    log = _fleet.fetch_log(server.url)["log"]
                runs[variant].append(
                    _fleet.analyse(
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
                )
    return runs, skipped


def _store(variant: str, workdir: str, rep: int, redis: Any) -> Any:
    """The store of a variant's run: a new SQLite file, or a new key prefix on Redis."""
    if variant.endswith("SQLite"):
        return _common.open_store("sqlite", os.path.join(workdir, f"fleet-{rep}.db"))
    if variant.endswith("Redis"):
        return _common.open_store("redis", redis.url, prefix=f"fleet{rep}:", socket_timeout=2.0)
    return None


def _fleet_rows(runs: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    rows = []
    for variant, results in runs.items():

        def cell(key: str, results: list[dict[str, Any]] = results) -> str:
            values = [r[key] for r in results if r.get(key) is not None]
            if not values:
                return "-"
            return _common.fmt_summary(_common.summary(values), 3 if key == "wall_over_ideal" else 0)

        done = min(r["items_done"] for r in results)
        rows.append(
            [variant, cell("429"), cell("early"), cell("overran_deadline"), done, cell("wall_over_ideal")]
        )
    return rows


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--part", choices=("happy", "fleet", "all"), default="all")
    p.add_argument("--block", type=int, help="GETs per block (default 50; quick 20)")
    p.add_argument("--rounds", type=int, help="rounds (default 60; quick 4)")
    p.add_argument("--reps", type=int, help="fleet repetitions (default 3; quick 1)")
    p.add_argument("--stores", help="async fleet stores: memory,sqlite,redis (default all; quick: memory)")
    args = p.parse_args()
    block = args.block or (20 if args.quick else 50)
    rounds = args.rounds or (4 if args.quick else 60)
    reps = args.reps or (1 if args.quick else 3)
    shape = QUICK_FLEET if args.quick else FLEET
    payload: dict[str, Any] = {"pid": os.getpid()}
    tables = []
    if args.part in ("happy", "all"):
        measured = happy(block, rounds)
        payload["happy"] = measured
        rows = [
            [
                kind,
                name,
                _common.fmt_summary(v["per_get_us"], 1),
                _common.fmt_summary(v["ratio"]),
                _common.fmt_summary(v["cpu_ratio"]),
            ]
            for kind, variants in measured.items()
            for name, v in variants.items()
        ]
        tables.append(
            _common.table(
                f"httpx happy path, {block} GETs per block, {rounds} rounds (target <= {HAPPY_TARGET})",
                ["client", "transport", "us per GET", "ratio to plain (wall)", "ratio to plain (CPU)"],
                rows,
            )
        )
    if args.part in ("fleet", "all"):
        stores = (args.stores or ("memory" if args.quick else "memory,sqlite,redis")).split(",")
        runs, skipped = fleet(shape, reps, stores)
        payload["fleet"] = {"shape": shape, "runs": runs, "skipped": skipped}
        for line in skipped:
            print(f"skipped: {line}")
        tables.append(
            _common.table(
                f"async fleet: {shape['tasks']} tasks, quota {shape['quota']} per {shape['window']:g} s, "
                f"{shape['items']} items, deadline {shape['deadline']:g} s, quota headers, {reps} runs",
                ["client", "429s", "early", "overruns", "items done (least)", "wall / ideal"],
                _fleet_rows(runs),
            )
        )
    _common.finish("bench_httpx", payload, tables, args.out)


if __name__ == "__main__":
    main()
