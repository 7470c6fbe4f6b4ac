"""A throttling HTTP server for tests, examples and benchmarks: :class:`QuotaServer`.

It is a real HTTP server on 127.0.0.1 (port 0) that allows ``quota`` requests per fixed
window of ``window`` seconds, shared by every client. Past the quota it answers 429 with
a Retry-After that ends when the window resets, rounded *up* to whole seconds (so it is
never too short), as delay-seconds or as an HTTP-date; it can also announce the quota on
every response (IETF ``RateLimit`` fields or ``X-RateLimit-*``). It records every request
and remembers every cooldown it announced, so it can count the requests that arrive
while one of them is still running ("early" requests).

The demo (``retry_after_adapter.demo``), the benchmarks' fleets, the README's examples
and the package's own tests run on it. Every duration here is in seconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..clock import Clock, SystemClock
from ..dialects import google_status
from ..errors import ConfigurationError
from ..header import format_http_date

__all__ = [
    "IN_FLIGHT_ALLOWANCE",
    "LOG_FIELDS",
    "SENT_HEADER",
    "Announcement",
    "Arrival",
    "QuotaServer",
    "ServerStats",
    "serve",
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
#: nothing, the IETF fields, GitHub's and Discord's ``X-RateLimit-*``, or
#: express-rate-limit's (v7 and v8, its default MemoryStore and legacy headers).
QUOTA_HEADERS = (None, "ietf", "x-ratelimit", "express", "openai", "anthropic", "gemini")
#: The LLM APIs' stand-ins: what they answer, as JSON (a model list, a rate-limit error).
_LLM_OK = json.dumps(
    {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}
).encode()
_LLM_THROTTLED = json.dumps(
    {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached for requests"}}
).encode()
#: Gemini's stand-in: a generated answer, and its 429 (filled in per answer).
_GEMINI_OK = json.dumps(
    {"candidates": [{"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP"}]}
).encode()
_GEMINI_JSON = {"Content-Type": "application/json; charset=UTF-8"}


def _gemini_throttled(quota: int, left: float, path: str) -> bytes:
    """Gemini's 429 body: a ``google.rpc.Status`` naming the quota (per project and
    model: the model of ``path``) and the wait (``RetryInfo``, to the millisecond, up)."""
    model = path.split("/models/", 1)[-1].split(":", 1)[0] if "/models/" in path else ""
    status = google_status(left, "You exceeded your current quota, please check your plan and billing")
    violation = {
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
        "quotaDimensions": {"location": "global", **({"model": model} if model else {})},
        "quotaValue": str(quota),
    }
    failure = {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]}
    status["details"].insert(0, failure)
    return json.dumps({"error": status}).encode()


#: Node's http server (express mode): the keep-alive timeout it announces
#: (``Keep-Alive: timeout=5``), and the idle time after which it closes a connection:
#: that plus ``HTTP_SERVER_KEEP_ALIVE_TIMEOUT_BUFFER`` (1 s), counted from the end of
#: the last response.
NODE_KEEP_ALIVE = 5
NODE_IDLE_CLOSE = NODE_KEEP_ALIVE + 1.0

#: The fields of each entry of :attr:`QuotaServer.log` (and of ``GET /__log``), in
#: order. Times are ``time.monotonic()`` seconds, one clock for every process of a
#: Linux host: ``sent_at`` and ``checked_at`` are the client's ``X-Sent-At`` and
#: ``X-Checked-At`` stamps (None without them), ``arrival`` and ``reply_at`` the
#: server's; ``retry_after`` is the delay-seconds sent (0 for a 200); ``client`` and
#: ``item`` the ``X-Client`` and ``X-Item`` headers; ``window`` the window's index.
LOG_FIELDS = (
    "sent_at", "checked_at", "arrival", "reply_at", "status", "retry_after", "client", "item", "window",
)  # fmt: skip


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
        body_in = self.rfile.read(length) if length else b""
        headers: dict[str, str]
        if self.path == "/__log":
            status, headers, body, date = 200, {}, self.server.owner.log_json().encode(), None
        else:
            client = self.client_address[0]
            status, headers, body, date = self.server.owner._decide(
                self.path, self.headers, arrival, client, body_in
            )
        self._date = date
        node = self.server.owner.quota_headers == "express" and self.path != "/__log"
        self.send_response(status)
        if node:
            self.send_header("X-Powered-By", "Express")
        for name, value in headers.items():
            self.send_header(name, value)
        if node:
            # express: res.send() of a string (text/html unless the type was set, as the
            # handler that answers 200 does), its weak ETag, Node's keep-alive fields.
            kind = "text/html" if status == 429 else "text/plain"
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", _weak_etag(body))
            self.send_header("Connection", "keep-alive")
            self.send_header("Keep-Alive", f"timeout={NODE_KEEP_ALIVE}")
        else:
            if "Content-Type" not in headers:
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        if node:
            # Node closes a connection left idle this long after its last response.
            self.connection.settimeout(NODE_IDLE_CLOSE)

    def send_response(self, code: int, message: str | None = None) -> None:
        if self.server.owner.quota_headers == "express" and self.path != "/__log":
            # No Server field; Date is among the rate limiter's fields.
            self.log_request(code)
            self.send_response_only(code, message)
            return
        super().send_response(code, message)

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
      ``"first"``: windows counted from the first request (the benchmarks' fleets), on
      the server's clock, as a real server counts them: a client reads a reset on its
      wall clock too, so the two agree where the wall clock steps against the monotonic
      one (a virtual machine's clock kept in step with its host's).
    - ``quota_headers``: what every response says of the quota: None (nothing),
      ``"ietf"`` (``RateLimit-Policy: "default";q=Q;w=W`` and ``RateLimit:
      "default";r=R;t=T``, T the whole seconds to the reset, rounded up) or
      ``"x-ratelimit"`` (``X-RateLimit-Limit``, ``-Remaining``, ``-Reset`` as epoch
      seconds with milliseconds and ``-Reset-After`` in seconds, as Discord sends) or
      ``"openai"`` (``x-ratelimit-{limit,remaining,reset}-requests``, the reset a Go
      duration; ``retry-after-ms`` beside ``Retry-After`` on a 429) or ``"anthropic"``
      (``anthropic-ratelimit-requests-{limit,remaining,reset}``, the reset an RFC 3339
      time): these two answer JSON, an empty model list or a rate-limit error, as the
      OpenAI and Anthropic SDKs read them (with ``tokens``, the tokens kind too); or
      ``"gemini"``: nothing in the fields; a 429 names its wait (the time to the
      window's reset, to the millisecond, rounded up) in a JSON ``google.rpc.Status``
      body (``RESOURCE_EXHAUSTED``, a ``QuotaFailure`` per project and the path's
      model, a ``RetryInfo``), as Gemini does, and a 200 a generated answer the GenAI
      SDK reads (a window: Gemini counts requests per minute); or
      ``"express"``: express-rate-limit (v7 and v8, checked against 8.7.5 on express
      5 and Node 20) with its default ``MemoryStore`` and legacy headers, exactly: each
      client (its IP address) has its own window, which starts at its first request at
      or after the previous one's reset (``align`` does not apply); every request
      counts, 429s too; ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` (never below
      0) and ``X-RateLimit-Reset`` (the reset in epoch seconds, rounded up), no window;
      past the limit a 429 with ``Retry-After`` = the seconds to the reset, rounded up.
      ``Date`` is the decision's second, truncated (Node caches it for the second);
      the other fields are express's and Node's (``X-Powered-By``, a weak ``ETag``,
      ``Connection: keep-alive``, ``Keep-Alive: timeout=5``), and as Node does, a
      connection left idle 6 s after its last response is closed
      (:data:`NODE_IDLE_CLOSE`): a client that reuses it then loses that request.

    - ``tokens``: a token quota per window besides (None: none): a request costs its
      JSON body's ``max_tokens``, and one whose cost does not fit what is left of the
      window's tokens is refused with a 429 as one past the requests quota is.
    - ``refill``: ``"window"`` (a fixed window, as above) or ``"continuous"``: the
      limit is a bucket of ``quota`` requests (and ``tokens``) refilled continuously,
      ``quota / window`` a second, as OpenAI and Anthropic document theirs; each answer
      says what is left (whole) and the time until the bucket is full again, printed
      truncated to ``reset_precision`` seconds (0.001: ``4.5s``, ``334ms``; 1: ``6m0s``,
      and Anthropic's whole-second times); a 429's Retry-After is the time to the next
      request, rounded up (``retry-after-ms`` exact). None (the default): continuous
      for ``"openai"`` and ``"anthropic"``, a window for the others. ``filled``: the
      requests in the bucket at the start (None: ``quota``).

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
        tokens: int | None = None,
        refill: str | None = None,
        reset_precision: float = 0.001,
        filled: int | None = None,
    ) -> None:
        _check_counts(quota, tokens)
        _check_shape(window, form, align, quota_headers)
        self.refill = _check_refill(refill, quota_headers, reset_precision, filled, quota)
        self.reset_precision = float(reset_precision)
        #: The bucket's level (requests, tokens) and the server time it was counted at.
        self._level = float(quota if filled is None else filled)
        self._token_level = float(tokens or 0)
        self._level_at: float | None = None
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
        #: The latest arrival decided (monotonic seconds).
        self._latest = -math.inf
        #: The latest decision's time on the server clock (epoch seconds), and the
        #: first's (``align="first"``: window 0 starts there).
        self._stamp = -math.inf
        self._t0_stamp = 0.0
        #: The token quota per window (None: none) and the tokens let through in it.
        self.tokens = tokens
        self._spent = 0
        #: express: each client's (hits, reset in epoch ms, window index).
        self._clients: dict[str, tuple[int, int, int]] = {}
        #: express: for each entry of :attr:`log`, the decision and its window's reset
        #: in epoch seconds, and the reset announced (``X-RateLimit-Reset``).
        self.epochs: list[tuple[float, float, int]] = []
        self._windows = 0
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
        ``align="first"``), ``quota``, ``window``, ``fields`` and ``log``; in express
        mode also ``epochs`` (see :attr:`epochs`)."""
        with self._lock:
            data: dict[str, Any] = {"t0": self._t0, "quota": self.quota, "window": self.window}
            data.update(fields=LOG_FIELDS, log=self.log)
            if self.quota_headers == "express":
                data["epochs"] = self.epochs
            return json.dumps(data)

    def _decide(
        self, path: str, headers: Any = None, arrival: float | None = None, client: str = "127.0.0.1",
        body: bytes = b"",
    ) -> tuple[int, dict[str, str], bytes, str]:
        """Admit or throttle one request; returns (status, headers, body, Date value).

        ``headers`` are the request's (for the clients' stamps), ``arrival`` its arrival
        on the monotonic clock, ``client`` its address (express's key).
        """
        get = headers.get if headers is not None else (lambda name: None)
        mono = time.monotonic() if arrival is None else arrival
        with self._lock:
            # Arrivals are stamped before the lock: two handler threads may take it out
            # of order. Decided in order, a request counts in the window it is decided
            # in (an earlier stamp would start window 0 again, forgetting what it let in).
            mono = self._latest = max(mono, self._latest)
            now = self.clock.now()
            sent_at = min(now, _parse_stamp(get(SENT_HEADER)) or now)
            early = self._running(sent_at)
            if self.quota_headers == "express":
                return self._express(path, get, mono, now, sent_at, early, client)
            # The server's clock, never back: a step back would start a window again.
            stamp = self._stamp = max(now.timestamp(), self._stamp)
            if self.refill == "continuous":
                return self._bucket(path, get, mono, now, sent_at, early, stamp, body)
            index, left = self._window_of(mono, stamp)
            date = format_http_date(now)  # truncated to the second: never after `now`
            if self._let_in(body):
                self.arrivals.append(Arrival(now, sent_at, path, 200, early))
                self._record(get, mono, 200, 0, index)
                told = self._announce(stamp, left)
                if self.quota_headers in ("openai", "anthropic"):
                    return 200, {**told, "Content-Type": "application/json"}, _LLM_OK, date
                if self.quota_headers == "gemini":
                    return 200, dict(_GEMINI_JSON), _GEMINI_OK, date
                return 200, told, b"ok " + path.encode("utf-8", "replace") + b"\n", date
            delay = max(1, math.ceil(left))
            if self.form == "seconds":
                until = now + timedelta(seconds=delay)
                value = str(delay)
            else:
                whole = max(math.ceil(stamp + left), math.floor(stamp) + 1)
                until = datetime.fromtimestamp(whole, timezone.utc)
                value = format_http_date(until)
            if self.quota_headers == "openai":  # retry-after-ms: the reset itself
                until = now + timedelta(milliseconds=max(1, math.ceil(left * 1000)))
            if self.quota_headers == "gemini":  # the wait in the body, to the millisecond
                until = now + timedelta(milliseconds=max(1, math.ceil(left * 1000)))
            self.announcements.append(Announcement(now, until))
            self.arrivals.append(Arrival(now, sent_at, path, 429, early))
            self._record(get, mono, 429, delay, index)
            if self.quota_headers == "gemini":
                return 429, dict(_GEMINI_JSON), _gemini_throttled(self.quota, left, path), date
            body = f"quota of {self.quota} requests per {self.window:g} s exhausted\n".encode()
            told = {"Retry-After": value, **self._announce(stamp, left)}
            if self.quota_headers in ("openai", "anthropic"):
                told["Content-Type"] = "application/json"
                body = _LLM_THROTTLED
                if self.quota_headers == "openai":
                    told["retry-after-ms"] = str(max(1, math.ceil(left * 1000)))
            return 429, told, body, date

    def _bucket(
        self, path: str, get: Callable[[str], Any], mono: float, now: datetime, sent_at: datetime,
        early: bool, stamp: float, body: bytes,
    ) -> tuple[int, dict[str, str], bytes, str]:
        """(Lock held.) One request decided at epoch ``stamp`` by a limit refilled
        continuously, as OpenAI and Anthropic document theirs: ``quota`` requests (and
        ``tokens``) a bucket, refilled at ``quota / window`` a second (``tokens /
        window``); a request goes when a whole one (and its cost) is in the bucket. Each
        answer says what is left, whole, and the time until the bucket is full again."""
        if self._level_at is None:
            self._level_at, self._t0, self._t0_stamp = stamp, mono, stamp
        passed = max(0.0, stamp - self._level_at)
        self._level_at = stamp
        rate = self.quota / self.window
        self._level = min(float(self.quota), self._level + passed * rate)
        token_rate = (self.tokens or 0) / self.window
        self._token_level = min(float(self.tokens or 0), self._token_level + passed * token_rate)
        cost = _request_cost(body) if self.tokens is not None else 0
        index = math.floor((stamp - self._t0_stamp) / self.window)
        date = format_http_date(now)
        wait = max(0.0, (1 - self._level) / rate)
        if self.tokens is not None and cost > self._token_level:
            wait = max(wait, (min(cost, self.tokens) - self._token_level) / token_rate)
        if wait <= 0:
            self._level -= 1
            self._token_level -= cost
            self.arrivals.append(Arrival(now, sent_at, path, 200, early))
            self._record(get, mono, 200, 0, index)
            told = {**self._announce_bucket(stamp), "Content-Type": "application/json"}
            return 200, told, _LLM_OK, date
        delay = max(1, math.ceil(wait))
        until = now + timedelta(seconds=delay)
        told = {"Retry-After": str(delay), **self._announce_bucket(stamp), "Content-Type": "application/json"}
        if self.quota_headers == "openai":  # retry-after-ms: the next unit itself
            told["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            until = now + timedelta(milliseconds=max(1, math.ceil(wait * 1000)))
        self.announcements.append(Announcement(now, until))
        self.arrivals.append(Arrival(now, sent_at, path, 429, early))
        self._record(get, mono, 429, delay, index)
        return 429, told, _LLM_THROTTLED, date

    def _announce_bucket(self, stamp: float) -> dict[str, str]:
        """(Lock held.) The provider's fields of a bucket at epoch ``stamp``: its limit,
        what is left (whole) and the time until it is full, printed to
        ``reset_precision`` (truncated: a Go duration such as ``6m0s`` or ``0.334s``; an
        RFC 3339 time)."""
        kinds = [("requests", self.quota, self._level)]
        if self.tokens is not None:
            kinds.append(("tokens", self.tokens, self._token_level))
        told = {}
        for name, limit, level in kinds:
            full = (limit - level) * self.window / limit
            if self.quota_headers == "openai":
                field, reset = "x-ratelimit-{1}-{0}", _go_string(full, self.reset_precision)
            else:
                field = "anthropic-ratelimit-{0}-{1}"
                reset = _rfc3339_string(stamp + full, self.reset_precision)
            told[field.format(name, "limit")] = str(limit)
            told[field.format(name, "remaining")] = str(math.floor(level))
            told[field.format(name, "reset")] = reset
        return told

    def _window_of(self, mono: float, stamp: float) -> tuple[int, float]:
        """(Lock held.) The window a request decided at ``stamp`` (epoch seconds, the
        server clock) falls in, and the seconds left to its end; a new window starts with
        nothing used. ``mono``: its arrival (monotonic), the log's ``t0`` for the first."""
        if self.align == "first":
            if self._t0 is None:
                self._t0, self._t0_stamp = mono, stamp
            index = math.floor((stamp - self._t0_stamp) / self.window)
            left = self._t0_stamp + (index + 1) * self.window - stamp
        else:
            index = math.floor(stamp / self.window)
            left = (index + 1) * self.window - stamp
        if index != self._index:
            self._index, self._used, self._spent = index, 0, 0
        return index, left

    def _let_in(self, body: bytes) -> bool:
        """(Lock held.) Whether one more request, of ``body``'s cost in tokens, fits
        what is left of the window's requests and tokens; counted when it does."""
        cost = _request_cost(body) if self.tokens is not None else 0
        if self._used >= self.quota or (self.tokens is not None and self._spent + cost > self.tokens):
            return False
        self._used += 1
        self._spent += cost
        return True

    def _express(
        self, path: str, get: Callable[[str], Any], mono: float, now: datetime, sent_at: datetime,
        early: bool, client: str,
    ) -> tuple[int, dict[str, str], bytes, str]:
        """express-rate-limit v7/v8 (``rateLimit({windowMs, limit})``, its
        ``MemoryStore`` and legacy headers) deciding one request of ``client`` at ``now``
        (the lock is held). As its ``MemoryStore.increment``: the client's window starts
        again, with ``windowMs`` from this request, once its reset is at or before now;
        the hit is counted, then compared (``totalHits > limit``: 429, which counts
        too)."""
        if self._t0 is None:
            self._t0 = mono
        now_ms = math.floor(now.timestamp() * 1000)  # Date.now()
        hits, reset_ms, index = self._clients.get(client, (0, 0, -1))
        if reset_ms <= now_ms:
            self._windows += 1
            hits, reset_ms, index = 0, now_ms + round(self.window * 1000), self._windows - 1
        hits += 1
        self._clients[client] = (hits, reset_ms, index)
        self.epochs.append((now_ms / 1000, reset_ms / 1000, math.ceil(reset_ms / 1000)))
        # setLegacyHeaders sets Date itself, between these: new Date().toUTCString(),
        # the decision's second, truncated.
        date = format_http_date(now)
        told = {
            "X-RateLimit-Limit": str(self.quota),
            "X-RateLimit-Remaining": str(max(self.quota - hits, 0)),
            "Date": date,
            "X-RateLimit-Reset": str(math.ceil(reset_ms / 1000)),
        }
        if hits <= self.quota:
            self.arrivals.append(Arrival(now, sent_at, path, 200, early))
            self._record(get, mono, 200, 0, index)
            return 200, told, b"ok " + path.encode("utf-8", "replace") + b"\n", date
        # setRetryAfterHeader: Math.max(0, Math.ceil((resetTime - Date.now()) / 1000)).
        delay = max(0, math.ceil((reset_ms - now_ms) / 1000))
        self.announcements.append(Announcement(now, now + timedelta(seconds=delay)))
        self.arrivals.append(Arrival(now, sent_at, path, 429, early))
        self._record(get, mono, 429, delay, index)
        return 429, {**told, "Retry-After": str(delay)}, b"Too many requests, please try again later.", date

    def _announce(self, stamp: float, left: float) -> dict[str, str]:
        """The quota headers of a response decided at epoch ``stamp``, ``left`` seconds
        before the window resets (the lock is held)."""
        kind = self.quota_headers
        if kind is None or kind == "gemini":  # Gemini announces nothing in its fields
            return {}
        remaining = self.quota - self._used
        kinds = [("requests", self.quota, remaining)]
        if self.tokens is not None:
            kinds.append(("tokens", self.tokens, self.tokens - self._spent))
        if kind in ("openai", "anthropic"):
            if kind == "openai":  # resets as Go durations
                field, reset = "x-ratelimit-{1}-{0}", f"{math.ceil(left * 1000) / 1000:.3f}s"
            else:  # resets as RFC 3339 times
                at = datetime.fromtimestamp(math.ceil((stamp + left) * 1000) / 1000, timezone.utc)
                field, reset = "anthropic-ratelimit-{0}-{1}", at.isoformat(timespec="milliseconds")
                reset = reset.replace("+00:00", "Z")
            told = {}
            for name, limit, left_of in kinds:
                told[field.format(name, "limit")] = str(limit)
                told[field.format(name, "remaining")] = str(left_of)
                told[field.format(name, "reset")] = reset
            return told
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


def _check_counts(quota: object, tokens: object) -> None:
    """:class:`QuotaServer`'s counts checked: ``quota`` an int >= 1, ``tokens`` too or None."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
        raise ConfigurationError("quota must be an int >= 1")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ConfigurationError("tokens must be an int >= 1 or None")


def _check_shape(window: object, form: object, align: object, quota_headers: object) -> None:
    """:class:`QuotaServer`'s window, Retry-After form, alignment and headers checked."""
    if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
        raise ConfigurationError("window must be a number of seconds > 0")
    if form not in FORMS:
        raise ConfigurationError("form must be 'seconds' or 'date'")
    if align not in ALIGNS:
        raise ConfigurationError("align must be 'epoch' or 'first'")
    if align == "first" and form != "seconds":
        raise ConfigurationError("windows from the first request announce delay-seconds only")
    if quota_headers not in QUOTA_HEADERS:
        raise ConfigurationError(
            "quota_headers must be None, 'ietf', 'x-ratelimit', 'express', 'openai', 'anthropic' or 'gemini'"
        )


#: :class:`QuotaServer`'s refills: a fixed window, or continuously (the LLM providers').
REFILLS = ("window", "continuous")


def _check_refill(
    refill: object, quota_headers: object, precision: object, filled: object, quota: int
) -> str:
    """:class:`QuotaServer`'s refill (None: continuously for the LLM providers' fields,
    else a window), the precision of its printed resets and its starting level."""
    llm = quota_headers in ("openai", "anthropic")
    chosen = refill if refill is not None else ("continuous" if llm else "window")
    if chosen not in REFILLS:
        raise ConfigurationError("refill must be 'window' or 'continuous'")
    if chosen == "continuous" and not llm:
        raise ConfigurationError("a continuous refill is for the 'openai' or 'anthropic' fields only")
    if not (isinstance(precision, (int, float)) and math.isfinite(precision) and 0.001 <= precision <= 1):
        raise ConfigurationError("reset_precision must be seconds from 0.001 to 1")
    if filled is not None and (
        isinstance(filled, bool) or not isinstance(filled, int) or not 0 <= filled <= quota
    ):
        raise ConfigurationError("filled must be an int from 0 to the quota, or None")
    return str(chosen)


def _go_string(seconds: float, precision: float) -> str:
    """``seconds`` truncated to ``precision`` (whole milliseconds or seconds), printed as
    Go's ``time.Duration`` prints it (``6m0s``, ``1.5s``, ``334ms``, ``0s``)."""
    ms = math.floor(seconds * 1000 + 1e-9)
    ms -= ms % max(1, round(precision * 1000))
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, fraction = divmod(rest, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _rfc3339_string(epoch: float, precision: float) -> str:
    """The epoch ``epoch`` truncated to ``precision`` as RFC 3339 in UTC (whole seconds,
    as Anthropic sends, or milliseconds)."""
    ms = math.floor(epoch * 1000 + 1e-9)
    ms -= ms % max(1, round(precision * 1000))
    at = datetime.fromtimestamp(ms / 1000, timezone.utc)
    spec = "seconds" if precision >= 1 else "milliseconds"
    return at.isoformat(timespec=spec).replace("+00:00", "Z")


def _request_cost(body: bytes) -> int:
    """A request's cost in tokens, as the stand-in counts it: its JSON body's
    ``max_tokens`` (0 without one)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return 0
    value = data.get("max_tokens") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _weak_etag(body: bytes) -> str:
    """express's ETag of a body (the ``etag`` package, weak): its length in hex and the
    first 27 characters of its SHA-1 in base64."""
    digest = base64.b64encode(hashlib.sha1(body, usedforsecurity=False).digest()).decode("ascii")[:27]
    return f'W/"{len(body):x}-{digest}"'


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
