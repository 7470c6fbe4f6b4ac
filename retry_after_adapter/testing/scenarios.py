"""A scripted HTTP server for tests and benchmarks: :class:`ScenarioServer`.

It is a real HTTP server on 127.0.0.1 (port 0) whose answers follow a script of
:class:`Phase` s over time: each phase lasts ``seconds`` (the last one lasts for ever)
and has one behaviour, which decides every answer of the phase:

- :func:`healthy`: 200 always;
- :func:`every_nth`: every n-th request of the phase answered a status (429 by default)
  with a Retry-After, the others 200, at most ``times`` times;
- :func:`all_status`: every answer one status (a deploy's 503s), with a Retry-After;
- :func:`storm`: every answer 429 without a usable Retry-After (none, or ``"0"``);
- :func:`fixed_window`: at most ``limit`` 200s per fixed window of ``window`` seconds
  (windows aligned to the phase's start), past it 429 with Retry-After = the whole
  seconds to the window's reset, rounded up; it may announce its quota in IETF
  ``RateLimit`` fields or ``X-RateLimit-*``;
- :func:`sliding_window`: at most ``limit`` 200s in any ``window`` seconds (a sliding
  log), past it 429 with Retry-After = the seconds until the oldest of them leaves the
  window, rounded up.

A behaviour is a small frozen dataclass with ``decide(now, state) -> (status,
headers)`` (``now``: seconds since its phase began; ``state``: the phase's
:class:`PhaseState`), ``allowed(seconds)`` (how many 2xx answers it allows in that many
seconds; None when it sets no bound) and ``overruns(times)`` (its windows in which more
requests arrived than its limit). Anything with those methods can be a phase's
behaviour.

The server records every arrival (:class:`ScriptedArrival`) and every cooldown it
announced (a Retry-After of a whole number of seconds > 0), so it can count "early"
requests: sent while a cooldown it announced was running, more than ``in_flight``
seconds after the announcement (the answer was still on its way before that). The send
time is the client's ``X-Sent-At`` stamp (``time.monotonic()`` when the request started
being written; the benchmarks' fleets stamp it) or, without one, the arrival.

Every time here is in seconds: the script's own (since :meth:`ScenarioServer.start`) or,
where said, the server clock's monotonic reading.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..clock import Clock, SystemClock
from ..errors import ConfigurationError
from ..header import format_http_date
from ._behaviours import (  # the behaviours, re-exported here
    AllStatus,
    Behaviour,
    EveryNth,
    FixedWindow,
    Headers,
    Healthy,
    PhaseState,
    SlidingWindow,
    all_status,
    every_nth,
    fixed_window,
    healthy,
    sliding_window,
    storm,
)
from .server import IN_FLIGHT_ALLOWANCE

__all__ = [
    "CHECKED_AT_HEADER",
    "SENT_AT_HEADER",
    "AllStatus",
    "Behaviour",
    "EveryNth",
    "FixedWindow",
    "Goodput",
    "Healthy",
    "Phase",
    "PhaseState",
    "ScenarioServer",
    "ScriptedAnnouncement",
    "ScriptedArrival",
    "SlidingWindow",
    "all_status",
    "every_nth",
    "fixed_window",
    "healthy",
    "sliding_window",
    "storm",
]

#: The request header with the client's send time (``time.monotonic()`` seconds, the
#: server clock's monotonic reading when it is the real one), as the fleets stamp it.
SENT_AT_HEADER = "X-Sent-At"
#: The request header with the time the client last read its cooldown store before
#: this request (monotonic seconds, as :data:`SENT_AT_HEADER`; the fleets' recording
#: stores stamp it): whether the store already knew of a cooldown when it admitted it.
CHECKED_AT_HEADER = "X-Checked-At"


@dataclass(frozen=True)
class Phase:
    """One step of a script: ``behaviour`` for ``seconds`` (None: for ever; only the
    last phase may last for ever)."""

    behaviour: Behaviour
    seconds: float | None = None


@dataclass(frozen=True)
class ScriptedArrival:
    """One request as the server saw it.

    - ``at``: arrival, the server clock's monotonic seconds; ``t``: the same in seconds
      since :meth:`ScenarioServer.start`;
    - ``sent_at``: the client's ``X-Sent-At`` stamp (monotonic seconds) or None;
      ``checked_at``: its ``X-Checked-At`` stamp, the same way;
    - ``status`` and ``retry_after`` (the header's value as sent, None without one);
    - ``phase``: the index of the phase that answered;
    - ``early``: sent while a cooldown the server announced was running.
    """

    at: float
    t: float
    sent_at: float | None
    status: int
    retry_after: str | None
    phase: int
    early: bool
    checked_at: float | None = None


@dataclass(frozen=True)
class ScriptedAnnouncement:
    """A cooldown the server announced: from ``at`` to ``until`` (server clock's monotonic
    seconds; ``t`` and ``t_until`` are the same since the start)."""

    at: float
    until: float
    t: float
    t_until: float


@dataclass(frozen=True)
class Goodput:
    """Over ``seconds`` of a script: the 2xx answers given (``good``) and the most the
    script allowed (``allowed``; None when a phase in the range sets no bound)."""

    good: int
    allowed: float | None
    seconds: float

    @property
    def per_second(self) -> float:
        """2xx answers per second."""
        return self.good / self.seconds if self.seconds > 0 else math.nan

    @property
    def allowed_per_second(self) -> float | None:
        """What the script allowed, per second (None: no bound)."""
        if self.allowed is None or self.seconds <= 0:
            return None
        return self.allowed / self.seconds


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a whole fleet may connect at once
    owner: ScenarioServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up closes the connection under the handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header on the server's clock (truncated to the second: never later).
        return format_http_date(self.server.owner.clock.now())

    def do_GET(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        owner = self.server.owner
        status, headers = owner.decide(self.headers.get(SENT_AT_HEADER), self.headers.get(CHECKED_AT_HEADER))
        if owner.latency > 0:
            time.sleep(owner.latency)
        body = f"{status}\n".encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET


class ScenarioServer:
    """A loopback HTTP server that answers as its script says (see the module).

    - ``script``: the phases, in order; each but the last must have ``seconds``;
    - ``clock``: where the server reads the time (a real clock unless given); the script
      runs on its monotonic reading from :meth:`start`;
    - ``in_flight``: seconds after an announcement during which sends are not early;
    - ``latency``: seconds every answer waits, after its decision, before it is written
      (a remote server's round trip; 0: none).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        script: Sequence[Phase],
        *,
        clock: Clock | None = None,
        in_flight: float = IN_FLIGHT_ALLOWANCE,
        latency: float = 0.0,
    ) -> None:
        if not script:
            raise ConfigurationError("a script needs at least one phase")
        for phase in script[:-1]:
            if phase.seconds is None or not (math.isfinite(phase.seconds) and phase.seconds > 0):
                raise ConfigurationError("every phase but the last needs seconds > 0")
        self.script = list(script)
        #: When each phase begins, in seconds since the start.
        self.starts: list[float] = [0.0]
        for phase in self.script[:-1]:
            assert phase.seconds is not None
            self.starts.append(self.starts[-1] + phase.seconds)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.in_flight = in_flight
        self.latency = latency
        #: Every request, in the order decided.
        self.arrivals: list[ScriptedArrival] = []
        #: Every cooldown announced, in the order announced.
        self.announcements: list[ScriptedAnnouncement] = []
        self._ats: list[float] = []  # the announcements' ``at``
        self._until_max: list[float] = []  # the latest ``until`` among the first k + 1
        self._lock = threading.Lock()
        self._states: dict[int, PhaseState] = {}
        self.t0: float | None = None
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._started = False

    @property
    def transient_end(self) -> float:
        """When the last phase begins (seconds since the start): the script's end."""
        return self.starts[-1]

    def start(self) -> ScenarioServer:
        """Start serving; the script's time 0 is now."""
        self.t0 = self.clock.monotonic()
        self._thread.start()
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._httpd.shutdown()
            self._thread.join(5)
        self._httpd.server_close()

    def __enter__(self) -> ScenarioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def phase_at(self, t: float) -> int:
        """The index of the phase running ``t`` seconds after the start."""
        return max(0, bisect.bisect_right(self.starts, t) - 1)

    def decide(self, sent_stamp: str | None = None, checked_stamp: str | None = None) -> tuple[int, Headers]:
        """Answer one request arriving now: its status and headers. ``sent_stamp`` and
        ``checked_stamp``: the client's ``X-Sent-At`` and ``X-Checked-At`` headers, if any."""
        with self._lock:
            at = self.clock.monotonic()
            if self.t0 is None:
                self.t0 = at
            t = at - self.t0
            index = self.phase_at(t)
            state = self._states.setdefault(index, PhaseState())
            state.epoch = self.clock.now().timestamp()
            status, headers = self.script[index].behaviour.decide(t - self.starts[index], state)
            state.requests += 1
            sent = _number(sent_stamp)
            early = self._running(min(at, sent) if sent is not None else at)
            told = headers.get("Retry-After")
            if status >= 300 and told is not None and told.isdigit() and int(told) > 0:
                until = at + int(told)
                self.announcements.append(ScriptedAnnouncement(at, until, t, until - self.t0))
                self._ats.append(at)
                self._until_max.append(max(until, self._until_max[-1] if self._until_max else until))
            checked = _number(checked_stamp)
            self.arrivals.append(ScriptedArrival(at, t, sent, status, told, index, early, checked))
            return status, headers

    def _running(self, sent: float) -> bool:
        """Whether a cooldown announced at least ``in_flight`` before ``sent`` runs then."""
        k = bisect.bisect_right(self._ats, sent - self.in_flight)
        return k > 0 and self._until_max[k - 1] > sent

    # -- what happened ---------------------------------------------------------------------

    def seen(self) -> list[ScriptedArrival]:
        """A copy of the arrivals so far."""
        with self._lock:
            return list(self.arrivals)

    def early(self) -> int:
        """Requests sent while a cooldown the server announced was running."""
        return sum(1 for a in self.seen() if a.early)

    def overruns(self) -> int:
        """Windows (of the windowed phases) in which more requests arrived than the
        phase's limit, counted by each phase's ``overruns``."""
        seen = self.seen()
        total = 0
        for index, phase in enumerate(self.script):
            begin = self.starts[index]
            times = [a.t - begin for a in seen if a.phase == index]
            total += phase.behaviour.overruns(times)
        return total

    def goodput(self, begin: float, end: float) -> Goodput:
        """The 2xx answers to requests arriving in ``[begin, end)`` (seconds since the
        start) and the most the script allowed in that range (None: some phase in it sets
        no bound)."""
        good = sum(1 for a in self.seen() if begin <= a.t < end and 200 <= a.status < 300)
        allowed: float | None = 0.0
        for index, phase in enumerate(self.script):
            lo = max(begin, self.starts[index])
            hi = min(end, self.starts[index + 1] if index + 1 < len(self.starts) else math.inf)
            if hi <= lo:
                continue
            share = phase.behaviour.allowed(hi - lo)
            allowed = None if share is None or allowed is None else allowed + share
        return Goodput(good, allowed, end - begin)


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
