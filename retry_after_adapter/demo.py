"""The demo: a fleet of workers run twice through a quota-enforcing HTTP server.

The server is :class:`~retry_after_adapter.testing.QuotaServer` (it lives in
``retry_after_adapter.testing.server``; this module re-exports it and its constants, so
``retry_after_adapter.demo.QuotaServer`` still works).

:func:`run_fleet` runs ``workers`` threads that fetch ``items`` URLs through that server,
either with stock requests + urllib3 ``Retry`` (``"stock"``) or with
:class:`~retry_after_adapter.RetryAfterAdapter` and one shared cooldown store
(``"adapter"``), and measures what happened. :func:`run_demo` does both and
:func:`format_report` prints them side by side. The command line's ``demo`` command is a
thin wrapper; benchmarks import the same pieces.

Every duration here is in seconds. Everything is bounded: each run stops by itself at
``DemoConfig.time_limit`` even if items are left.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.util.retry import Retry

from .adapter import RetryAfterAdapter
from .cooldown.memory import MemoryCooldownStore
from .deferral import Deferral
from .deferred import RetryDeferred
from .engine import budget
from .errors import ConfigurationError
from .retry import RetryAfterRetry
from .testing.server import ALIGNS as ALIGNS
from .testing.server import FORMS as FORMS
from .testing.server import IN_FLIGHT_ALLOWANCE, LOG_FIELDS, SENT_HEADER, QuotaServer, ServerStats
from .testing.server import QUOTA_HEADERS as QUOTA_HEADERS
from .testing.server import Announcement as Announcement
from .testing.server import Arrival as Arrival
from .testing.server import serve as serve

__all__ = [
    "IN_FLIGHT_ALLOWANCE",
    "LOG_FIELDS",
    "SENT_HEADER",
    "DelayQueue",
    "DemoConfig",
    "FleetResult",
    "QuotaServer",
    "ServerStats",
    "describe",
    "format_report",
    "format_table",
    "report_json",
    "run_demo",
    "run_fleet",
    "stamp_sends",
]

KINDS = ("stock", "adapter")
LABELS = {"stock": "stock Retry", "adapter": "RetryAfterAdapter"}


# --------------------------------------------------------------------------- the fleet
class _StampedConnection(HTTPConnection):
    """A urllib3 connection that stamps each request with the moment it is sent."""

    def putrequest(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        super().putrequest(method, url, *args, **kwargs)
        self.putheader(SENT_HEADER, f"{time.time():.6f}")


class _StampedPool(HTTPConnectionPool):
    ConnectionCls = _StampedConnection


def stamp_sends(adapter: HTTPAdapter) -> HTTPAdapter:
    """Make ``adapter``'s plain-HTTP connections stamp their send time (``SENT_HEADER``),
    the same way for stock and adapter runs; returns ``adapter``."""
    classes = dict(adapter.poolmanager.pool_classes_by_scheme)
    classes["http"] = _StampedPool
    adapter.poolmanager.pool_classes_by_scheme = classes
    return adapter


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings (seconds throughout).

    - ``workers``: threads, each with its own ``requests.Session``.
    - ``items``: URLs to fetch; each is done once it got a 200.
    - ``quota`` / ``window``: the server allows ``quota`` requests per ``window`` seconds.
    - ``deadline``: what one call may take, waits included (enforced by the adapter;
      only measured for stock).
    - ``form``: the Retry-After form the server sends, ``"seconds"`` or ``"date"``.
    - ``stock_retries``: ``Retry(total=...)`` for the stock run; a call that runs out
      puts its item back at once.
    - ``adapter_retries``: ``RetryAfterRetry(total=...)`` for the adapter run.
    - ``attempt_reserve``: seconds the adapter keeps for the last attempt before the
      deadline.
    - ``work``: each item takes a random ``[0, work]`` seconds of processing after its
      fetch, so workers do not move in lockstep.
    - ``time_limit``: a run stops after this long even with items left (None: derived
      from the other settings).
    - ``seed``: seeds the processing times.
    """

    workers: int = 20
    items: int = 60
    quota: int = 20
    window: float = 2.0
    deadline: float = 2.0
    form: str = "seconds"
    stock_retries: int = 3
    adapter_retries: int = 5
    attempt_reserve: float = 0.25
    work: float = 0.5
    time_limit: float | None = None
    seed: int = 7

    def __post_init__(self) -> None:
        for name in ("workers", "items", "quota", "stock_retries", "adapter_retries"):
            value = getattr(self, name)
            least = 0 if name.endswith("retries") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(f"{name} must be an int >= {least}")
        for name in ("window", "deadline"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name} must be a number of seconds > 0")
        for name in ("attempt_reserve", "work"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"{name} must be a number of seconds >= 0")
        if self.form not in FORMS:
            raise ConfigurationError("form must be 'seconds' or 'date'")

    @property
    def limit(self) -> float:
        """The time limit of one run, in seconds: twice the windows the quota needs for
        every item, plus one deadline (14 s with the defaults, so that even two runs cut
        short stay under 30 s)."""
        if self.time_limit is not None:
            return self.time_limit
        return max(5.0, 2 * math.ceil(self.items / self.quota) * self.window + self.deadline)


@dataclass
class FleetResult:
    """What one run did. Seconds throughout; ``worst_latency`` is the slowest call."""

    kind: str
    items: int
    done: int
    calls: int
    deferrals: int
    gave_up: int
    requests: int
    throttled: int
    early: int
    overran: int
    worst_latency: float
    wall_time: float
    time_limit_hit: bool
    deadline: float
    errors: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["latencies"]
        data["worst_latency"] = round(self.worst_latency, 3)
        data["wall_time"] = round(self.wall_time, 3)
        return data


class DelayQueue:
    """Items with an eligible time (aware UTC): workers take the earliest one first.

    A worker that takes an item whose time has not come waits for it (bounded by the
    run's stop time). ``take`` returns None once every item is done or time is up.
    """

    def __init__(self, total: int, stop_at: float) -> None:
        self._heap: list[tuple[datetime, int, int, Deferral | None]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self.total = total
        self.done = 0
        self.stop_at = stop_at  # time.monotonic()

    def put(self, item: int, eligible_at: datetime, deferral: Deferral | None = None) -> None:
        with self._cond:
            heapq.heappush(self._heap, (eligible_at, next(self._seq), item, deferral))
            self._cond.notify()

    def finish(self) -> None:
        with self._cond:
            self.done += 1
            self._cond.notify_all()

    def finished(self) -> bool:
        with self._cond:
            return self.done >= self.total or time.monotonic() >= self.stop_at

    def take(self) -> tuple[int, datetime, Deferral | None] | None:
        with self._cond:
            while True:
                left = self.stop_at - time.monotonic()
                if self.done >= self.total or left <= 0:
                    return None
                if self._heap:
                    eligible_at, _, item, deferral = heapq.heappop(self._heap)
                    return item, eligible_at, deferral
                self._cond.wait(min(left, 0.2))

    def wait_until(self, eligible_at: datetime) -> bool:
        """Sleep until ``eligible_at`` (bounded by the stop time); False if time ran out."""
        left = (eligible_at - datetime.now(timezone.utc)).total_seconds()
        room = self.stop_at - time.monotonic()
        if left > room:
            time.sleep(max(0.0, room))
            return False
        if left > 0:
            time.sleep(left)
        return True


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.deferrals = 0
        self.gave_up = 0
        self.errors = 0
        self.latencies: list[float] = []


def _stock_session(config: DemoConfig) -> requests.Session:
    retry = Retry(
        total=config.stock_retries,
        status_forcelist=[429],
        respect_retry_after_header=True,
        backoff_factor=0.5,
    )
    session = requests.Session()
    session.mount("http://", stamp_sends(HTTPAdapter(max_retries=retry, pool_maxsize=1)))
    return session


def _adapter_session(config: DemoConfig, store: MemoryCooldownStore) -> requests.Session:
    retry = RetryAfterRetry(
        total=config.adapter_retries,
        deadline=config.deadline,
        attempt_reserve=config.attempt_reserve,
        backoff_factor=0.5,
    )
    session = requests.Session()
    adapter = RetryAfterAdapter(max_retries=retry, cooldown=store, pool_maxsize=1)
    session.mount("http://", stamp_sends(adapter))
    return session


def _worker(
    kind: str,
    number: int,
    config: DemoConfig,
    base_url: str,
    queue: DelayQueue,
    tally: _Tally,
    store: MemoryCooldownStore,
) -> None:
    rng = random.Random(config.seed * 1000 + number)
    session = _stock_session(config) if kind == "stock" else _adapter_session(config, store)
    try:
        while True:
            taken = queue.take()
            if taken is None:
                return
            item, eligible_at, resume = taken
            if not queue.wait_until(eligible_at):
                return
            url = f"{base_url}/items/{item}"
            started = time.monotonic()
            status: int | None = None
            deferral: Deferral | None = None
            failed = False
            try:
                if resume is not None:
                    with budget(resume=resume):
                        response = session.get(url, timeout=10)
                else:
                    response = session.get(url, timeout=10)
                status = response.status_code
                deferral = getattr(response, "deferral", None)
                response.close()
            except RetryDeferred as exc:  # deferred before anything was sent
                deferral = exc.deferral
            except requests.exceptions.RetryError:  # stock: retries used up on 429s
                failed = True
            except requests.exceptions.RequestException:
                failed = True
                with tally.lock:
                    tally.errors += 1
            latency = time.monotonic() - started
            with tally.lock:
                tally.calls += 1
                tally.latencies.append(latency)
                if deferral is not None:
                    tally.deferrals += 1
                elif failed or status != 200:
                    tally.gave_up += 1
            now = datetime.now(timezone.utc)
            if deferral is not None:
                queue.put(item, deferral.eligible_at, deferral)
            elif failed or status != 200:
                queue.put(item, now)  # what a plain worker does: try again at once
            else:
                time.sleep(rng.uniform(0.0, config.work))  # process the item
                queue.finish()
    finally:
        session.close()


def run_fleet(
    kind: str,
    config: DemoConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> FleetResult:
    """Run the fleet once (``kind`` is ``"stock"`` or ``"adapter"``) against a fresh
    :class:`QuotaServer`; ``progress`` receives a status line about once a second."""
    if kind not in KINDS:
        raise ConfigurationError("kind must be 'stock' or 'adapter'")
    store = MemoryCooldownStore()  # shared by every worker of the adapter run
    tally = _Tally()
    with QuotaServer(config.quota, config.window, form=config.form) as server:
        started = time.monotonic()
        queue = DelayQueue(config.items, started + config.limit)
        now = datetime.now(timezone.utc)
        for item in range(config.items):
            queue.put(item, now)
        threads = [
            threading.Thread(
                target=_worker,
                args=(kind, n, config, server.url, queue, tally, store),
                name=f"demo-{kind}-{n}",
                daemon=True,
            )
            for n in range(config.workers)
        ]
        for thread in threads:
            thread.start()
        next_report = started + 1.0
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(max(0.0, min(0.05, next_report - time.monotonic())))
            if progress is not None and time.monotonic() >= next_report:
                next_report += 1.0
                stats = server.stats()
                progress(
                    f"  {LABELS[kind]:<17} {time.monotonic() - started:5.1f} s  "
                    f"{queue.done:>4}/{config.items} items done  {stats.throttled:>4} x 429  "
                    f"{stats.early:>4} early"
                )
        wall = time.monotonic() - started
        stats = server.stats()
    latencies = tally.latencies
    return FleetResult(
        kind=kind,
        items=config.items,
        done=queue.done,
        calls=tally.calls,
        deferrals=tally.deferrals,
        gave_up=tally.gave_up,
        requests=stats.requests,
        throttled=stats.throttled,
        early=stats.early,
        overran=sum(1 for latency in latencies if latency > config.deadline),
        worst_latency=max(latencies, default=0.0),
        wall_time=wall,
        time_limit_hit=queue.done < config.items,
        deadline=config.deadline,
        errors=tally.errors,
        latencies=latencies,
    )


def run_demo(config: DemoConfig, *, progress: Callable[[str], None] | None = None) -> dict[str, FleetResult]:
    """Run the stock fleet, then the adapter fleet; results by kind."""
    return {kind: run_fleet(kind, config, progress=progress) for kind in KINDS}


# --------------------------------------------------------------------------- the report
def describe(config: DemoConfig) -> str:
    """One paragraph saying what the demo runs."""
    form = (
        "seconds until the window resets, rounded up"
        if config.form == "seconds"
        else "when the window resets, as an HTTP-date rounded up to the second"
    )
    return (
        f"A local HTTP server allows {config.quota} requests per {config.window:g} s window, "
        f"shared by all clients; past that it answers 429 with Retry-After ({form}). "
        f"{config.workers} worker threads fetched {config.items} items through it twice: with "
        f"stock requests + urllib3 Retry (each worker sleeps for the Retry-After of its own "
        f"429), then with RetryAfterAdapter (one cooldown store shared by all workers, a "
        f"{config.deadline:g} s deadline per call; a call whose wait would not fit is deferred "
        f"and its item queued again for its eligible time). Early = sent while a cooldown the "
        f"server had announced in a 429 was still running (requests sent within "
        f"{IN_FLIGHT_ALLOWANCE:g} s of that 429, before anyone could know, are not counted)."
    )


def _wrap(text: str, width: int = 88) -> str:
    import textwrap

    return textwrap.fill(text, width=width)


def format_table(results: dict[str, FleetResult], config: DemoConfig) -> str:
    """The side-by-side table (plain text)."""
    stock, adapter = results["stock"], results["adapter"]

    def seconds(value: float) -> str:
        return f"{value:.1f} s"

    rows: list[tuple[str, str, str]] = [
        ("items done", f"{stock.done}/{stock.items}", f"{adapter.done}/{adapter.items}"),
        ("deferrals (item queued again)", "-", str(adapter.deferrals)),
        ("requests sent", str(stock.requests), str(adapter.requests)),
        ("429s provoked", str(stock.throttled), str(adapter.throttled)),
        ("requests sent early (cooldown running)", str(stock.early), str(adapter.early)),
        (f"calls over the {config.deadline:g} s deadline", str(stock.overran), str(adapter.overran)),
        ("worst call latency", seconds(stock.worst_latency), seconds(adapter.worst_latency)),
        ("wall time", seconds(stock.wall_time), seconds(adapter.wall_time)),
    ]
    if stock.gave_up or adapter.gave_up:
        rows.insert(2, ("calls that gave up (retries used up)", str(stock.gave_up), str(adapter.gave_up)))
    if stock.errors or adapter.errors:
        rows.insert(2, ("calls that failed (network errors)", str(stock.errors), str(adapter.errors)))
    head = ("", LABELS["stock"], LABELS["adapter"])
    width = max(len(r[0]) for r in rows)
    lines = [f"{head[0]:<{width}}  {head[1]:>17}  {head[2]:>17}"]
    lines.append(f"{'-' * width}  {'-' * 17}  {'-' * 17}")
    lines.extend(f"{name:<{width}}  {a:>17}  {b:>17}" for name, a, b in rows)
    return "\n".join(lines)


def format_report(results: dict[str, FleetResult], config: DemoConfig) -> str:
    """The whole printed report: what ran, the table, and what to look at."""
    parts = [_wrap(describe(config)), "", format_table(results, config), ""]
    hit = [LABELS[k] for k, r in results.items() if r.time_limit_hit]
    if hit:
        parts.append(
            _wrap(f"Note: {' and '.join(hit)} stopped at the {config.limit:g} s time limit with items left.")
        )
    parts.append(
        _wrap(
            'Look at "requests sent early" (stock workers send into a cooldown another worker '
            "was told about; with the shared store none does) and at the deadline row (the "
            "adapter defers instead of running over)."
        )
    )
    return "\n".join(parts)


def report_json(results: dict[str, FleetResult], config: DemoConfig) -> str:
    """The results (and the settings) as a JSON document."""
    data = {
        "config": asdict(config) | {"time_limit": config.limit},
        "in_flight_allowance": IN_FLIGHT_ALLOWANCE,
        "runs": {kind: result.to_dict() for kind, result in results.items()},
    }
    return json.dumps(data, indent=2, sort_keys=True)


if __name__ == "__main__":  # python -m retry_after_adapter.demo --serve QUOTA WINDOW [HEADERS]
    import sys

    told = sys.argv[4:]
    kinds = ([], *([kind] for kind in QUOTA_HEADERS if kind))
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--serve" and told in kinds:
        serve(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] if len(sys.argv) == 5 else None)
    else:
        sys.exit("usage: python -m retry_after_adapter.demo --serve QUOTA WINDOW [ietf|x-ratelimit|express]")
