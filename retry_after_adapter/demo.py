"""The demo: a quota-enforcing HTTP server, and a fleet of workers run through it twice.

:class:`QuotaServer` is a real HTTP server on 127.0.0.1 (port 0) that allows ``quota``
requests per fixed window of ``window`` seconds (windows aligned to the server's clock),
shared by every client. Past the quota it answers 429 with a Retry-After that ends when
the window resets, rounded *up* to whole seconds (so it is never too short), as
delay-seconds or as an HTTP-date. It records every request and remembers every cooldown
it announced, so it can count the requests that arrive while one of them is still running
("early" requests).

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
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.util.retry import Retry

from .adapter import RetryAfterAdapter
from .clock import Clock, SystemClock
from .cooldown.memory import MemoryCooldownStore
from .deferral import Deferral
from .engine import budget
from .errors import ConfigurationError, RetryDeferred
from .header import format_http_date
from .retry import RetryAfterRetry

__all__ = [
    "IN_FLIGHT_ALLOWANCE",
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

#: Seconds after a 429 during which requests sent are not counted as early: the 429 is
#: still on its way to the worker (and into the shared store), so nobody could have known.
#: On loopback with 20 worker threads in one busy process, requests sent up to 0.08 s
#: after the server's decision were seen from workers that had checked the store before.
IN_FLIGHT_ALLOWANCE = 0.25

#: The request header in which the demo's workers stamp the moment a request is put on
#: the wire (UTC epoch seconds), so that "sent early" is judged by the send time, not by
#: when a busy server got round to reading the request.
SENT_HEADER = "X-Demo-Sent-At"

FORMS = ("seconds", "date")
ALIGNS = ("epoch", "first")
#: What a :class:`QuotaServer` says of its quota on every response (``quota_headers``):
#: nothing, the IETF fields, or GitHub's and Discord's ``X-RateLimit-*``.
QUOTA_HEADERS = (None, "ietf", "x-ratelimit")

#: The fields of each entry of :attr:`QuotaServer.log` (and of ``GET /__log``), in
#: order. Times are ``time.monotonic()`` seconds, one clock for every process of a
#: Linux host: ``sent_at`` and ``checked_at`` are the client's ``X-Sent-At`` and
#: ``X-Checked-At`` stamps (None without them), ``arrival`` and ``reply_at`` the
#: server's; ``retry_after`` is the delay-seconds sent (0 for a 200); ``client`` and
#: ``item`` the ``X-Client`` and ``X-Item`` headers; ``window`` the window's index.
LOG_FIELDS = (
    "sent_at", "checked_at", "arrival", "reply_at", "status", "retry_after", "client", "item", "window",
)  # fmt: skip
KINDS = ("stock", "adapter")
LABELS = {"stock": "stock Retry", "adapter": "RetryAfterAdapter"}


# --------------------------------------------------------------------------- the server
@dataclass(frozen=True)
class Announcement:
    """A cooldown the server announced in a 429: sent at ``at``, running until ``until``."""

    at: datetime
    until: datetime


@dataclass(frozen=True)
class Arrival:
    """One request as the server saw it: arrival and send times (aware UTC; the send time
    is the client's ``X-Demo-Sent-At`` stamp, or the arrival time without one), path,
    status, and whether it was sent while an announced cooldown was running."""

    at: datetime
    sent_at: datetime
    path: str
    status: int
    early: bool


@dataclass(frozen=True)
class ServerStats:
    """Counts of what the server saw: requests, 200s, 429s, early requests."""

    requests: int
    ok: int
    throttled: int
    early: int


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a whole fleet may connect at once
    owner: QuotaServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up on a response (its deadline ran out) closes the
        # connection under the handler: expected here, not worth a traceback.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: without this, a kept-alive body waits
    # for the client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True
    server: _HTTPServer
    _date: str | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header is the instant the request was decided, truncated to the second
        # (never later than the decision, so a Retry-After date measured against it is
        # never read as shorter than announced).
        return self._date or format_http_date(self.server.owner.clock.now())

    def do_GET(self) -> None:
        arrival = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        headers: dict[str, str]
        if self.path == "/__log":
            status, headers, body, date = 200, {}, self.server.owner.log_json().encode(), None
        else:
            status, headers, body, date = self.server.owner._decide(self.path, self.headers, arrival)
        self._date = date
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET


class QuotaServer:
    """A loopback HTTP server enforcing one shared quota of ``quota`` requests per window.

    - ``window``: seconds; windows are fixed and aligned to the server clock (window *k*
      covers ``[k * window, (k + 1) * window)`` in UTC epoch seconds).
    - ``form``: ``"seconds"`` (Retry-After as delay-seconds: the time until the window
      resets, rounded up) or ``"date"`` (the same instant as an HTTP-date, rounded up to
      the next whole second).
    - ``clock``: where the server reads the time (a real clock unless given).
    - ``in_flight``: seconds after a 429 during which arriving requests are not counted
      as early (they were already on their way).
    - ``align``: ``"epoch"`` (default: windows aligned to the server clock, as above) or
      ``"first"``: windows counted from the first request, on the monotonic clock (the
      benchmarks' fleets, whose processes share that clock).
    - ``quota_headers``: what every response says of the quota: None (nothing),
      ``"ietf"`` (``RateLimit-Policy: "default";q=Q;w=W`` and ``RateLimit:
      "default";r=R;t=T``, T the whole seconds to the reset, rounded up) or
      ``"x-ratelimit"`` (``X-RateLimit-Limit``, ``-Remaining``, ``-Reset`` as epoch
      seconds with milliseconds and ``-Reset-After`` in seconds, as Discord sends).

    Only requests that are let through count against the quota. Every request is also
    recorded in :attr:`log` (fields :data:`LOG_FIELDS`), served as JSON at ``GET
    /__log`` (so a server in another process can be read). Use as a context manager, or
    call :meth:`start` and :meth:`stop`; ``python -m retry_after_adapter.demo --serve
    QUOTA WINDOW`` runs one (``align="first"``) in its own process and prints ``PORT <n>``.

    This is the one quota server of the project: the demo, the benchmarks' fleets, the
    README's examples and the tests use it.
    """

    def __init__(
        self,
        quota: int,
        window: float,
        *,
        form: str = "seconds",
        clock: Clock | None = None,
        in_flight: float = IN_FLIGHT_ALLOWANCE,
        align: str = "epoch",
        quota_headers: str | None = None,
    ) -> None:
        if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
            raise ConfigurationError("quota must be an int >= 1")
        if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
            raise ConfigurationError("window must be a number of seconds > 0")
        if form not in FORMS:
            raise ConfigurationError("form must be 'seconds' or 'date'")
        if align not in ALIGNS:
            raise ConfigurationError("align must be 'epoch' or 'first'")
        if align == "first" and form != "seconds":
            raise ConfigurationError("windows from the first request announce delay-seconds only")
        if quota_headers not in QUOTA_HEADERS:
            raise ConfigurationError("quota_headers must be None, 'ietf' or 'x-ratelimit'")
        self.quota_headers = quota_headers
        self.align = align
        #: Every request, as a list of :data:`LOG_FIELDS`.
        self.log: list[list[Any]] = []
        self._t0: float | None = None
        self.quota = quota
        self.window = float(window)
        self.form = form
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.in_flight = timedelta(seconds=in_flight)
        self.arrivals: list[Arrival] = []
        self.announcements: list[Announcement] = []
        self._lock = threading.Lock()
        self._index: int | None = None
        self._used = 0
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._started = False

    def start(self) -> QuotaServer:
        self._thread.start()
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._httpd.shutdown()
            self._thread.join(5)
        self._httpd.server_close()

    def __enter__(self) -> QuotaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> ServerStats:
        with self._lock:
            seen = list(self.arrivals)
        return ServerStats(
            requests=len(seen),
            ok=sum(1 for a in seen if a.status == 200),
            throttled=sum(1 for a in seen if a.status == 429),
            early=sum(1 for a in seen if a.early),
        )

    def cooldown_running(self, at: datetime) -> bool:
        """Whether a cooldown announced at least ``in_flight`` before ``at`` runs at ``at``."""
        with self._lock:
            return self._running(at)

    def _running(self, at: datetime) -> bool:
        return any(a.at + self.in_flight <= at < a.until for a in self.announcements)

    def log_json(self) -> str:
        """The request log as JSON: ``t0`` (monotonic start of window 0 with
        ``align="first"``), ``quota``, ``window``, ``fields`` and ``log``."""
        with self._lock:
            data = {"t0": self._t0, "quota": self.quota, "window": self.window, "fields": LOG_FIELDS}
            return json.dumps({**data, "log": self.log})

    def _decide(
        self, path: str, headers: Any = None, arrival: float | None = None
    ) -> tuple[int, dict[str, str], bytes, str]:
        """Admit or throttle one request; returns (status, headers, body, Date value).

        ``headers`` are the request's (for the clients' stamps), ``arrival`` its arrival
        on the monotonic clock.
        """
        get = headers.get if headers is not None else (lambda name: None)
        mono = time.monotonic() if arrival is None else arrival
        with self._lock:
            now = self.clock.now()
            sent_at = min(now, _parse_stamp(get(SENT_HEADER)) or now)
            early = self._running(sent_at)
            stamp = now.timestamp()
            if self.align == "first":
                if self._t0 is None:
                    self._t0 = mono
                index = math.floor((mono - self._t0) / self.window)
                left = self._t0 + (index + 1) * self.window - mono
            else:
                index = math.floor(stamp / self.window)
                left = (index + 1) * self.window - stamp
            if index != self._index:
                self._index, self._used = index, 0
            date = format_http_date(now)  # truncated to the second: never after `now`
            if self._used < self.quota:
                self._used += 1
                self.arrivals.append(Arrival(now, sent_at, path, 200, early))
                self._record(get, mono, 200, 0, index)
                told = self._announce(stamp, left)
                return 200, told, b"ok " + path.encode("utf-8", "replace") + b"\n", date
            delay = max(1, math.ceil(left))
            if self.form == "seconds":
                until = now + timedelta(seconds=delay)
                value = str(delay)
            else:
                whole = max(math.ceil(stamp + left), math.floor(stamp) + 1)
                until = datetime.fromtimestamp(whole, timezone.utc)
                value = format_http_date(until)
            self.announcements.append(Announcement(now, until))
            self.arrivals.append(Arrival(now, sent_at, path, 429, early))
            self._record(get, mono, 429, delay, index)
            body = f"quota of {self.quota} requests per {self.window:g} s exhausted\n".encode()
            return 429, {"Retry-After": value, **self._announce(stamp, left)}, body, date

    def _announce(self, stamp: float, left: float) -> dict[str, str]:
        """The quota headers of a response decided at epoch ``stamp``, ``left`` seconds
        before the window resets (the lock is held)."""
        kind = self.quota_headers
        if kind is None:
            return {}
        remaining = self.quota - self._used
        if kind == "ietf":
            return {
                "RateLimit-Policy": f'"default";q={self.quota};w={math.ceil(self.window)}',
                "RateLimit": f'"default";r={remaining};t={max(1, math.ceil(left))}',
            }
        return {
            "X-RateLimit-Limit": str(self.quota),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": f"{math.ceil((stamp + left) * 1000) / 1000:.3f}",
            "X-RateLimit-Reset-After": f"{math.ceil(left * 1000) / 1000:.3f}",
        }

    def _record(self, get: Callable[[str], Any], arrival: float, status: int, delay: int, index: int) -> None:
        sent, checked, item = get("X-Sent-At"), get("X-Checked-At"), get("X-Item")
        self.log.append(
            [
                _number(sent),
                _number(checked),
                arrival,
                time.monotonic(),
                status,
                delay,
                get("X-Client"),
                int(item) if item and item.isdigit() else None,
                index,
            ]
        )


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _parse_stamp(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = float(text)
        return datetime.fromtimestamp(value, timezone.utc) if math.isfinite(value) else None
    except (ValueError, OverflowError, OSError):
        return None


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


def serve(quota: int, window: float, quota_headers: str | None = None) -> None:
    """Run a :class:`QuotaServer` (``align="first"``) until terminated, after printing
    ``PORT <n>``: the benchmarks' fleets start it in its own process this way."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with QuotaServer(quota, window, align="first", quota_headers=quota_headers) as server:
        print(f"PORT {server.port}", flush=True)
        while not stop.wait(1.0):
            pass


if __name__ == "__main__":  # python -m retry_after_adapter.demo --serve QUOTA WINDOW [HEADERS]
    import sys

    told = sys.argv[4:]
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--serve" and told in ([], ["ietf"], ["x-ratelimit"]):
        serve(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] if len(sys.argv) == 5 else None)
    else:
        sys.exit("usage: python -m retry_after_adapter.demo --serve QUOTA WINDOW [ietf|x-ratelimit]")
