"""The fleet benchmark's parts: a throttling server that enforces a quota, a fleet of
worker threads (in one process or several) that works through a list of items, and
the analysis of what the server saw.

The server is the project's one ``QuotaServer`` (``retry_after_adapter.testing``), run in
its own process (``python -m retry_after_adapter.demo --serve QUOTA WINDOW``; prints
``PORT <n>``). It admits ``QUOTA`` requests per fixed window of ``WINDOW`` seconds, the
windows counted from the first request it receives. Past the quota it answers ``429``
with ``Retry-After`` = the seconds until the window resets, rounded up (integer
delay-seconds, at least 1). A rejected request does not use up quota. It logs every
request: the client's send time (header ``X-Sent-At``, stamped by the client just
before the request is written), the arrival, the reply time, status, Retry-After, client
process and item. ``GET /__log`` returns that log as JSON. All times are
``time.monotonic()``, which on Linux is one clock for every process of the host.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import math
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

import requests

from retry_after_adapter.testing.server import LOG_FIELDS as LOG_FIELDS

from . import common as _common
from . import express as _express

# -- the throttling server: the project's one QuotaServer -----------------------------------

#: How a fleet benchmark starts its server: in its own process, windows from the first
#: request (``python -m retry_after_adapter.demo --serve QUOTA WINDOW``).
SERVER_MODULE = "retry_after_adapter.demo"


def fetch_log(url: str) -> dict[str, Any]:
    """The server's log (see ``LOG_FIELDS``), each entry as a dict."""
    with requests.Session() as session:
        data = session.get(url + "/__log", timeout=30).json()
    fields = data["fields"]
    data["log"] = [dict(zip(fields, entry, strict=True)) for entry in data["log"]]
    return data


# -- the client side --------------------------------------------------------------------------


#: The time (monotonic) at which this thread last read a cooldown store: the adapter
#: reads its store before every attempt, so this is when the attempt was admitted.
_checked = threading.local()

#: Times (monotonic) at which a cooldown store write of this process completed.
STORE_WRITES: list[float] = []


def install_send_stamp() -> None:
    """Make every urllib3 request carry ``X-Sent-At``: ``time.monotonic()`` when it starts
    being written, and ``X-Checked-At``: when this thread last read a recording cooldown
    store (adapter only). Applies to every session in this process alike."""
    from urllib3.connection import HTTPConnection

    original = HTTPConnection.request
    if getattr(original, "_bench_stamp", False):
        return

    def request(
        self: Any, method: str, url: str, body: Any = None, headers: Any = None, *a: Any, **kw: Any
    ) -> Any:
        stamped = dict(headers) if headers is not None else {}
        checked = getattr(_checked, "at", None)
        if checked is not None:
            stamped["X-Checked-At"] = repr(checked)
            _checked.at = None
        stamped["X-Sent-At"] = repr(time.monotonic())
        return original(self, method, url, body, stamped, *a, **kw)

    request._bench_stamp = True  # type: ignore[attr-defined]
    HTTPConnection.request = request  # type: ignore[method-assign]


SessionFactory = Callable[[], requests.Session]


class Fleet:
    """``threads`` workers in this process working through ``items``.

    Each worker has its own Session (built by ``make_session()``). An item is done on a
    200. A deferred item (a response with ``.deferral``, or ``RetryDeferred``) is
    re-queued for its ``eligible_at`` and resumed from its deferral
    (``budget(resume=...)``); any other failure is re-queued at once. Bounded by
    ``time_limit`` seconds from the start: past it the workers stop and the items left
    are reported as not done.
    """

    def __init__(
        self,
        make_session: SessionFactory,
        url: str,
        items: list[int],
        threads: int,
        client: str,
        time_limit: float,
        timeout: float = 30.0,
    ) -> None:
        self.make_session = make_session
        self.url = url
        self.items = items
        self.threads = threads
        self.client = client
        self.time_limit = time_limit
        self.timeout = timeout
        self.cond = threading.Condition()
        self.queue: list[tuple[float, int, int, Any]] = []
        self.done = 0
        self.calls: list[dict[str, Any]] = []
        self.sessions: list[requests.Session] = []

    def prepare(self) -> None:
        """Build the sessions (before the clock starts)."""
        self.sessions = [self.make_session() for _ in range(self.threads)]

    def run(self, start_at: float) -> dict[str, Any]:
        """Start at monotonic time ``start_at``; return calls, store writes and times."""
        if not self.sessions:
            self.prepare()
        now = time.monotonic()
        if start_at > now:
            time.sleep(start_at - now)
        STORE_WRITES.clear()
        self.stop_at = start_at + self.time_limit
        self.queue = [(start_at, n, item, None) for n, item in enumerate(self.items)]
        heapq.heapify(self.queue)
        self.seq = len(self.items)
        workers = [threading.Thread(target=self._work, args=(s,), daemon=True) for s in self.sessions]
        for w in workers:
            w.start()
        for w in workers:
            w.join(self.time_limit + 60)
        for s in self.sessions:
            s.close()
        ends = [c["end"] for c in self.calls if c["outcome"] == "ok"]
        return {
            "client": self.client,
            "start_at": start_at,
            "done_at": max(ends) if ends else None,
            "items": len(self.items),
            "done": self.done,
            "calls": self.calls,
            "store_writes": list(STORE_WRITES),
        }

    def _next(self) -> tuple[int, Any] | None:
        """The next eligible item and the deferral it resumes (None for a first try)."""
        with self.cond:
            while True:
                now = time.monotonic()
                if self.done >= len(self.items) or now >= self.stop_at:
                    self.cond.notify_all()
                    return None
                if self.queue and self.queue[0][0] <= now:
                    _, _, item, resume = heapq.heappop(self.queue)
                    return item, resume
                wait = self.stop_at - now
                if self.queue:
                    wait = min(wait, self.queue[0][0] - now)
                self.cond.wait(min(wait, 0.5))

    def _put(self, item: int, eligible: float | None, deferral: Any = None) -> None:
        with self.cond:
            if eligible is None:
                self.done += 1
                if self.done >= len(self.items):
                    self.cond.notify_all()
                return
            self.seq += 1
            heapq.heappush(self.queue, (eligible, self.seq, item, deferral))
            self.cond.notify()

    def _work(self, session: requests.Session) -> None:
        from retry_after_adapter import RetryDeferred, budget

        headers = {"X-Client": self.client}
        while True:
            taken = self._next()
            if taken is None:
                return
            item, resume = taken
            start = time.monotonic()
            deferral = None
            status = None
            try:
                # A deferred item resumes its deferral, as the README shows: its counts
                # carry over and nothing is sent before its eligible_at.
                with budget(resume=resume) if resume is not None else contextlib.nullcontext():
                    response = session.get(
                        f"{self.url}/item/{item}",
                        headers={**headers, "X-Item": str(item)},
                        timeout=self.timeout,
                    )
                status = response.status_code
                deferral = getattr(response, "deferral", None)
                outcome = "ok" if status == 200 else ("deferred" if deferral is not None else "failed")
            except RetryDeferred as exc:
                deferral = exc.deferral
                outcome = "deferred"
            except requests.RequestException as exc:
                outcome = "failed:" + type(exc).__name__
            end = time.monotonic()
            eligible: float | None = None
            if outcome != "ok":
                eligible = end
                if deferral is not None:
                    eligible = end + (deferral.eligible_at - datetime.now(timezone.utc)).total_seconds()
            self.calls.append(
                {
                    "item": item,
                    "start": start,
                    "end": end,
                    "outcome": outcome,
                    "status": status,
                    "reason": deferral.reason if deferral is not None else None,
                }
            )
            self._put(item, eligible, deferral)


# -- the analysis ------------------------------------------------------------------------------


def analyse(
    log: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    store_writes: list[float],
    *,
    quota: int,
    window: float,
    items: int,
    processes: int,
    deadline: float,
    start_at: float,
    done_at: float | None,
) -> dict[str, Any]:
    """What the server saw and what the calls did, as the benchmark reports it.

    - A request is *early* when its send started (``sent_at``) after a 429 was sent and
      before the end of the cooldown that 429 announced (its reply time + Retry-After).
    - A request is *in flight* when it is not early but a 429 was sent after its send
      started and before it arrived: it was already on its way when the cooldown was
      announced.
    - An early request is *early after the store knew* when its attempt read the shared
      cooldown store (``checked_at``) after a client had written a cooldown learned from
      a 429 of that cooldown: the store knew, and the request went anyway (a defect).
      Otherwise it is early in the race between a 429 and its reaching the store (it
      was admitted before the store knew, and sent after the 429 was sent). Only the
      adapter reads a store; for stock both are None.
    - ``ideal_s`` = (ceil(items / quota) - 1) x window: the earliest moment at which the
      last window needed opens, counted from the start; ``wall_s`` runs from the start
      to the end of the last successful call.
    """
    q = sorted((e["reply_at"], e["reply_at"] + e["retry_after"]) for e in log if e["status"] == 429)
    sent429 = [a for a, _ in q]
    end_max: list[float] = []
    running = -math.inf
    for _, end in q:
        running = max(running, end)
        end_max.append(running)
    writes = sorted(store_writes)

    early = in_flight = early_known = unstamped = 0
    early429 = in_flight429 = 0
    windows429: set[int] = set()
    windows_ok: set[int] = set()
    for e in log:
        if e["status"] == 429:
            windows429.add(e["window"])
        else:
            windows_ok.add(e["window"])
        s = e["sent_at"]
        if s is None:
            unstamped += 1
            continue
        i = bisect.bisect_right(sent429, s)
        if i and end_max[i - 1] > s:
            early += 1
            early429 += e["status"] == 429
            # The earliest 429 whose cooldown covers s: had the store learned of it (a
            # write after that 429 was sent) before this attempt read the store?
            first = next(a for a, end in q[:i] if end > s)
            checked = e["checked_at"]
            h = bisect.bisect_left(writes, first)
            if checked is not None and h < len(writes) and writes[h] < checked:
                early_known += 1
            continue
        j = bisect.bisect_right(sent429, e["arrival"])
        if j > i and any(end > e["arrival"] for _, end in q[i:j]):
            in_flight += 1
            in_flight429 += e["status"] == 429

    gaps = [(e["sent_at"] - e["checked_at"]) * 1e3 for e in log if e["sent_at"] and e["checked_at"]]
    durations = [c["end"] - c["start"] for c in calls]
    overruns = [d - deadline for d in durations if d > deadline]
    n429 = len(q)
    allowance = len(windows429) * processes
    ideal = (math.ceil(items / quota) - 1) * window
    wall = None if done_at is None else done_at - start_at
    outcomes: dict[str, int] = {}
    for c in calls:
        outcomes[c["outcome"]] = outcomes.get(c["outcome"], 0) + 1
    has_store = any(e["checked_at"] is not None for e in log)
    return {
        "requests": len(log),
        "ok": sum(1 for e in log if e["status"] == 200),
        "429": n429,
        "429_in_flight": in_flight429,
        "429_early": early429,
        "429_beyond_in_flight": n429 - in_flight429,
        "429_allowance": allowance,
        "429_within_target": n429 - in_flight429 <= allowance,
        "windows_with_429": len(windows429),
        "early": early,
        "early_after_store_knew": early_known if has_store else None,
        "early_before_store_knew": early - early_known if has_store else None,
        "in_flight": in_flight,
        "check_to_send_ms": {
            "median": statistics.median(gaps) if gaps else None,
            "p99": sorted(gaps)[int(len(gaps) * 0.99)] if gaps else None,
            "max": max(gaps) if gaps else None,
        },
        "unstamped": unstamped,
        "calls": len(calls),
        "outcomes": outcomes,
        "deadline_s": deadline,
        "overran_deadline": len(overruns),
        "max_overrun_s": max(overruns) if overruns else 0.0,
        "max_call_s": max(durations) if durations else 0.0,
        "items": items,
        "items_done": outcomes.get("ok", 0),
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": None if wall is None or ideal <= 0 else wall / ideal,
    }


# -- one fleet in a child process (multiprocessing spawn) ------------------------------------


def process_main(spec: dict[str, Any], messages: Any, start: Any, start_value: Any) -> None:
    """Entry point of a child process: build a fleet from ``spec``, report ready, wait
    for the start signal, run, put the result on ``messages``."""
    try:
        install_send_stamp()
        make = session_factory(
            spec["variant"], spec["deadline"], spec.get("store"), spec["attempt_reserve"], spec.get("quota")
        )
        fleet = Fleet(make, spec["url"], spec["items"], spec["threads"], spec["client"], spec["time_limit"])
        fleet.prepare()
        messages.put(("ready", spec["client"]))
        if not start.wait(120):
            messages.put(("error", spec["client"], "no start signal"))
            return
        result = fleet.run(start_value.value)
        messages.put(("done", result))
    except BaseException as exc:  # report, never hang the parent
        messages.put(("error", spec["client"], f"{type(exc).__name__}: {exc}"))
        raise


class _Recorder:
    """Records when this thread reads a store (a read, or an admission: the cooldown is
    read by every admission), and when a write completes."""

    def get(self, scope: str) -> datetime | None:
        _checked.at = time.monotonic()
        value: datetime | None = super().get(scope)  # type: ignore[misc]
        return value

    def admit(self, ask: Any) -> Any:
        _checked.at = time.monotonic()
        return super().admit(ask)  # type: ignore[misc]

    def extend(self, scope: str, until: datetime) -> datetime:
        value: datetime = super().extend(scope, until)  # type: ignore[misc]
        STORE_WRITES.append(time.monotonic())
        return value


def make_store(store: tuple[str, str] | None) -> Any:
    """A recording cooldown store from ``(kind, where)``: memory, sqlite (path) or redis
    (URL). Each is a subclass of the package's store that only adds two clock reads."""
    from retry_after_adapter import MemoryCooldownStore

    if store is None or store[0] == "memory":

        class Memory(_Recorder, MemoryCooldownStore):
            pass

        return Memory()
    if store[0] == "sqlite":
        from retry_after_adapter.cooldown import SQLiteCooldownStore

        class SQLite(_Recorder, SQLiteCooldownStore):
            pass

        return SQLite(store[1])
    if store[0] == "redis":
        from retry_after_adapter.cooldown import RedisCooldownStore

        class Redis(_Recorder, RedisCooldownStore):
            pass

        return Redis.from_url(store[1])
    raise ValueError(f"unknown store {store!r}")


STATUSES = (429, 502, 503, 504)
TOTAL = 10


def session_factory(
    variant: str,
    deadline: float,
    store: tuple[str, str] | None,
    attempt_reserve: float,
    quota: tuple[int, float] | None = None,
) -> SessionFactory:
    """Sessions for ``variant`` "stock", "adapter" (nothing configured: the learned
    rate), "adapter+nolearn" (``learn_rate=False``), "adapter+quota" (the adapter told
    the server's quota, ``(limit, per seconds)``) or "adapter+cap8" (the adapter with
    ``max_concurrency=8``, no quota information); adapters share one store per process.

    ``deadline`` and ``attempt_reserve`` (seconds) are the adapter's; stock has neither.
    """
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry

    shared = make_store(store) if variant.startswith("adapter") else None
    told = Quota(quota[0], per=quota[1]) if variant == "adapter+quota" and quota else None

    def make() -> requests.Session:
        session = requests.Session()
        adapter: HTTPAdapter
        if variant == "stock":
            retry = Retry(
                total=TOTAL, backoff_factor=0.5, status_forcelist=STATUSES, respect_retry_after_header=True
            )
            adapter = HTTPAdapter(max_retries=retry)
        elif variant.startswith("adapter"):
            policy = RetryAfterRetry(
                total=TOTAL,
                backoff_factor=0.5,
                status_forcelist=STATUSES,
                deadline=deadline,
                attempt_reserve=attempt_reserve,
            )
            cap = 8 if variant == "adapter+cap8" else None
            learn = variant != "adapter+nolearn"
            adapter = RetryAfterAdapter(
                max_retries=policy, cooldown=shared, quota=told, max_concurrency=cap, learn_rate=learn
            )
        else:
            raise ValueError(variant)
        session.mount("http://", adapter)
        return session

    make.store = shared  # type: ignore[attr-defined]
    return make


class RateSampler:
    """Samples the learned rate of ``scope`` in ``store`` every ``every`` seconds while
    a fleet runs (a thread), and keeps each change: ``(seconds from start_at, cap,
    limit, window s)``. A store of another process is read through its own file or URL."""

    def __init__(self, store: Any, scope: str, every: float = 0.1) -> None:
        self.store, self.scope, self.every = store, scope, every
        self.changes: list[tuple[float, int, int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start_at = time.monotonic()

    def start(self, start_at: float) -> None:
        self.start_at = start_at
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.wait(self.every):
            try:
                rate = self.store.rate_of(self.scope)
            except Exception:
                continue
            if rate is None:
                continue
            now = (rate.cap, rate.limit, round(rate.window, 2))
            if now != last:
                last = now
                self.changes.append((round(time.monotonic() - self.start_at, 2), *now))

    def stop(self) -> list[tuple[float, int, int, float]]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        return self.changes


def describe_rate(changes: list[Any]) -> str:
    """The learned rate over time, one step per change: ``t s: cap N`` while cold,
    ``t s: L/W s`` once learned, ``t s: open`` when the cap was lifted."""
    steps = []
    for t, cap, limit, window in changes:
        what = f"{limit}/{window:g} s" if limit else f"cap {cap}" if cap else "open"
        steps.append(f"{t:g} s: {what}")
    return "; ".join(steps) if steps else "-"


# -- one run of bench_fleet.py: a fleet in threads or in processes -------------------------------------------


def time_limit(shape: dict[str, Any]) -> float:
    """Seconds a run may take before its workers stop (bounds every run)."""
    ideal = (math.ceil(shape["items"] / shape["quota"]) - 1) * shape["window"]
    return ideal + max(30.0, 3 * ideal)


#: Where the real express server's npm packages are (``benchpy --express-modules`` sets it).
EXPRESS_MODULES = _express.modules_dir(None)


def throttle_server(shape: dict[str, Any], headers: str | None = None) -> Any:
    """The quota server in its own process; ``headers``: the quota headers it sends
    (None, "ietf", "x-ratelimit", "express": the emulation of express-rate-limit, or
    "express-real": express-rate-limit itself, run with node)."""
    if headers == "express-real":
        return _express.ExpressServer(EXPRESS_MODULES, shape["quota"], shape["window"])
    told = [headers] if headers else []
    return _common.ServerProcess(
        SERVER_MODULE, "--serve", str(shape["quota"]), str(shape["window"]), *told
    )


def run_threads(
    shape: dict[str, Any], variant: str, threads: int, reserve: float, headers: str | None = None
) -> dict[str, Any]:
    install_send_stamp()
    with throttle_server(shape, headers) as server:
        told = (shape["quota"], shape["window"])
        make = session_factory(variant, shape["deadline"], ("memory", ""), reserve, told)
        fleet = Fleet(
            make, server.url, list(range(shape["items"])), threads, str(os.getpid()), time_limit(shape)
        )
        fleet.prepare()
        scope = _common.scope_of(server.url)
        sampler = RateSampler(make.store, scope) if make.store is not None else None  # type: ignore[attr-defined]
        start_at = time.monotonic() + 0.05
        if sampler is not None:
            sampler.start(start_at)
        result = fleet.run(start_at)
        changes = sampler.stop() if sampler is not None else []
        data = fetch_log(server.url)
        log = data["log"]
    return _with_server(
        data,
        _with_rate(
            changes,
            analyse(
                log,
                result["calls"],
                result["store_writes"],
                quota=shape["quota"],
                window=shape["window"],
                items=shape["items"],
                processes=1,
                deadline=shape["deadline"],
                start_at=result["start_at"],
                done_at=result["done_at"] if result["done"] == shape["items"] else None,
            ),
        ),
    )


def _with_rate(changes: list[Any], result: dict[str, Any]) -> dict[str, Any]:
    result["rate_changes"] = changes
    result["learned_rate"] = describe_rate(changes)
    return result


def _with_server(data: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """What the server itself saw beside the analysis: the most requests it had open at
    once (from arrival to reply) and the connections it accepted (the real express
    server says). For express-rate-limit, real or emulated (their store's times): how
    long after each window's reset the next window's first request arrived (seconds),
    and how many requests arrived before the reset the server had announced for the
    window before theirs (a request sent before it: never, by the adapter's rules)."""
    log = data["log"]
    edges = sorted([(e["arrival"], 1) for e in log] + [(e["reply_at"], -1) for e in log])
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    result["server_most_open"] = most
    result["server_connections"] = data.get("sockets")
    # (window, arrival, its window's reset, the reset announced), epoch seconds.
    seen: list[tuple[int, float, float, int]] = []
    if "epochs" in data:
        seen = [(e["window"], *epochs) for e, epochs in zip(log, data["epochs"], strict=True)]
    elif log and log[0].get("now_ms") is not None:
        seen = [(e["window"], e["now_ms"] / 1000, e["reset_ms"] / 1000, int(e["reset"])) for e in log]
    firsts: dict[int, tuple[float, float, int]] = {}
    for window, arrival, reset, announced in sorted(seen, key=lambda s: s[1]):
        firsts.setdefault(window, (arrival, reset, announced))
    ordered = [firsts[k] for k in sorted(firsts)]
    result["late_after_reset_s"] = [round(b[0] - a[1], 3) for a, b in itertools.pairwise(ordered)]
    announced_before = {k: firsts[k - 1][2] for k in firsts if k - 1 in firsts}
    early = sum(1 for window, arrival, _, _ in seen if arrival < announced_before.get(window, -math.inf))
    result["before_announced_reset"] = early if seen else None
    return result


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def run_processes(
    shape: dict[str, Any],
    variant: str,
    store: tuple[str, str] | None,
    processes: int,
    threads: int,
    reserve: float,
    headers: str | None = None,
) -> dict[str, Any]:
    items = list(range(shape["items"]))
    limit = time_limit(shape)
    sampler = None
    with throttle_server(shape, headers) as server:
        if store is not None and variant == "adapter":
            sampler = RateSampler(make_store(store), _common.scope_of(server.url))
        specs = [
            {
                "variant": variant,
                "deadline": shape["deadline"],
                "store": store,
                "attempt_reserve": reserve,
                "quota": (shape["quota"], shape["window"]),
                "url": server.url,
                "items": items[n::processes],
                "threads": count,
                "client": f"p{n}",
                "time_limit": limit,
            }
            for n, count in enumerate(split(threads, processes))
        ]
        try:
            start_at, results = _common.process_fleet(
                multiprocessing.get_context("spawn"),
                process_main,
                specs,
                limit + 120,
                on_start=sampler.start if sampler is not None else None,
                join_timeout=30,
            )
        finally:
            changes = sampler.stop() if sampler is not None else []
        data = fetch_log(server.url)
        log = data["log"]
    calls = [c for r in results for c in r["calls"]]
    writes = [w for r in results for w in r["store_writes"]]
    complete = sum(r["done"] for r in results) == shape["items"]
    done_at = max(r["done_at"] for r in results if r["done_at"] is not None) if complete else None
    return _with_server(
        data,
        _with_rate(
            changes,
            analyse(
                log,
                calls,
                writes,
                quota=shape["quota"],
                window=shape["window"],
                items=shape["items"],
                processes=processes,
                deadline=shape["deadline"],
                start_at=start_at,
                done_at=done_at,
            ),
        ),
    )


async def async_items(
    get: Callable[[str, dict[str, str]], Awaitable[tuple[int | None, Any]]],
    close: Callable[[], Awaitable[None]],
    url: str,
    shape: dict[str, Any],
    time_limit: float,
) -> dict[str, Any]:
    """An async fleet: ``shape["tasks"]`` workers take ``shape["items"]`` items from one
    queue, each a GET of ``url/item/<n>`` by ``get(url, headers)`` (its status and
    deferral); a deferred item comes back to the queue at its ``eligible_at`` (a timer
    on the loop, so a waiting item costs no task), any other failure at once. Ends when
    every item is done or at ``time_limit`` seconds, then ``close()``; each call's start,
    end (monotonic seconds) and outcome."""
    from retry_after_adapter import budget

    loop = asyncio.get_running_loop()
    items = shape["items"]
    ready: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue()
    start_at = time.monotonic()
    for n in range(items):
        ready.put_nowait((n, None))
    done = 0
    calls: list[dict[str, Any]] = []
    finished = asyncio.Event()

    def back(item: int, deferral: Any, eligible: float) -> None:
        when = loop.time() + max(0.0, eligible - time.monotonic())
        loop.call_at(when, ready.put_nowait, (item, deferral))

    async def worker() -> None:
        nonlocal done
        while True:
            taken = await ready.get()
            if taken is None:
                return
            item, resume = taken
            start = time.monotonic()
            deferral = status = None
            try:
                with budget(resume=resume) if resume is not None else contextlib.nullcontext():
                    status, deferral = await get(f"{url}/item/{item}", {"X-Item": str(item)})
                outcome = "ok" if status == 200 else ("deferred" if deferral is not None else "failed")
            except Exception as exc:  # the competitors' last error (a 429 raised, a reset)
                deferral = getattr(exc, "deferral", None)
                outcome = "failed:" + type(exc).__name__
            end = time.monotonic()
            call = {"item": item, "start": start, "end": end, "outcome": outcome, "status": status}
            calls.append(call)
            if outcome == "ok":
                done += 1
                if done == items:
                    finished.set()
                continue
            eligible = end
            if deferral is not None:
                eligible = end + (deferral.eligible_at - datetime.now(timezone.utc)).total_seconds()
                call["reason"], call["eligible"] = str(deferral.reason), eligible
            back(item, deferral, eligible)

    workers = [asyncio.create_task(worker()) for _ in range(shape["tasks"])]
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(finished.wait(), time_limit)
    for _ in workers:
        ready.put_nowait(None)
    for task in workers:  # past the time limit, calls still running are cut short
        if not finished.is_set():
            task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await close()
    ends = [c["end"] for c in calls if c["outcome"] == "ok"]
    return {"start_at": start_at, "done_at": max(ends) if ends and done == items else None, "calls": calls}
