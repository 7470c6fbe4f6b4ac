"""The loopback servers of the tests, in one place (the package's own ``QuotaServer``
and ``ScenarioServer`` live in ``retry_after_adapter.testing``: they are public).

Each binds 127.0.0.1 on a port of the kernel's choosing (port 0) and stops by itself:
its threads are daemons, and those it starts are joined when it stops. The fixtures
that hand them to tests are in ``tests/conftest.py``.

- ``ThrottleServer``: answers from a script of replies (or a responder) and records
  every request, stamped with the test's clock. The server of most tests.
- ``HoldingServer``: holds each request a while and counts how many it holds at once.
- ``PromiseServer``: scripted statuses by arrival; counts requests in progress until
  their body is written, optionally gathering a batch before answering.
- ``BusyServer``: counts a request when it gets to it (late, for one marked busy).
- ``ArrivalServer``: raw sockets, one thread; records kernel-stamped arrival times.
- ``BodyServer``: raw sockets; endless, trickling or fixed bodies, byte counts.
- ``RawServer``: raw sockets; answers with scripted bytes exactly as given.
- ``KeepAliveServer``: drops a request that comes on a connection idle too long.
- ``TLSServer``: TLS with a certificate from an unknown CA; counts connections.
- ``server_process``: a server in a process of its own (to be killed).

Ports that refuse, accept and never answer, or never accept (``closed_port``,
``black_hole``, ``connect_hangs``) are in ``retry_after_adapter.testing.ports``, which
the benchmarks share.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from retry_after_adapter import Clock, FakeClock, SystemClock
from retry_after_adapter.header import format_http_date

KiB = 1024
MiB = 1024 * KiB


class QuietHandler(BaseHTTPRequestHandler):
    """What every loopback test server's handler shares: HTTP/1.1 keep-alive, no Nagle
    delay (headers and body go out as two writes: without this, Nagle's algorithm and
    the client's delayed ACK hold the body back 40 ms on a kept-alive connection), and
    no log line per request."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass


# ------------------------------------------------------------------ ThrottleServer
class _Server(ThreadingHTTPServer):
    # The default backlog of 5 makes a burst of connects wait for a kernel retry (1 s).
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a cancelled task, a deadline) closed the connection
        # under the handler: expected in these tests, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Reply:
    """One scripted answer. ``action`` may be "reply", "reset" (close before any
    response), "reset_body" (send headers, then close mid-body) or "hang" (never answer
    until the server stops). ``gate``: the reply waits until this event is set (at most
    5 s), so the request stays in flight meanwhile."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    action: str = "reply"
    raw_headers: list[tuple[str, str]] | None = None
    gate: threading.Event | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    at: datetime
    body: bytes


class ThrottleServer:
    """Serves ``script`` replies in order (the last one repeats), records ``seen``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.script: list[Reply] = [Reply()]
        self.responder: Callable[[Seen], Reply] | None = None
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(QuietHandler):
            def date_time_string(self, timestamp: float | None = None) -> str:
                # The Date header follows the test's clock, so date-form tests are exact.
                return format_http_date(server.clock.now())

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, dict(self.headers), server.clock.now(), body)
                reply = server._next(seen)
                if reply.gate is not None:
                    reply.gate.wait(5)
                if reply.action == "reset":
                    self.close_connection = True
                    self.connection.close()
                    return
                if reply.action == "hang":
                    server._stop.wait(30)
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                pairs = list(reply.raw_headers or []) + list(reply.headers.items())
                for name, value in pairs:
                    self.send_header(name, value)
                if self.command == "HEAD" or reply.status in (204, 304) or reply.status < 200:
                    self.end_headers()
                    return
                if reply.action == "reset_body":
                    self.send_header("Content-Length", str(len(reply.body) + 100))
                    self.end_headers()
                    self.wfile.write(reply.body[: len(reply.body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.close()
                    return
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True

    def _next(self, seen: Seen) -> Reply:
        with self._lock:
            self.seen.append(seen)
            if self.responder is not None:
                return self.responder(seen)
            if len(self.script) > 1:
                return self.script.pop(0)
            return self.script[0]

    def serve(self, replies: Iterable[Reply]) -> None:
        with self._lock:
            self.script = list(replies) or [Reply()]
            self.seen.clear()

    def count(self, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self.seen if method is None or s.method == method)

    def start(self) -> ThrottleServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ HoldingServer
class HoldingServer:
    """Answers every GET 200 "ok" after holding it ``hold`` seconds, and counts what it
    holds: ``total`` requests, ``most`` held at once, and ``seen``, how many were held
    at each arrival (itself included). A request is no longer counted once its hold
    ends, before its answer is written. ``url`` is the origin followed by ``path``;
    ``protocol_version`` "HTTP/1.0" closes each connection after its answer."""

    def __init__(self, hold: float = 0.03, *, path: str = "/x", protocol_version: str = "HTTP/1.1") -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.total = 0
        self.seen: list[int] = []
        outer = self

        class Handler(QuietHandler):

            def do_GET(self) -> None:
                with outer.lock:
                    outer.now += 1
                    outer.total += 1
                    outer.most = max(outer.most, outer.now)
                    outer.seen.append(outer.now)
                time.sleep(hold)
                with outer.lock:
                    outer.now -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        Handler.protocol_version = protocol_version

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ PromiseServer
class PromiseServer:
    """A loopback HTTP/1.1 server that answers every GET with a scripted status and
    records how many requests it has *in progress* at once.

    A request is in progress from its arrival until just before the server writes its
    body: the status line and headers (with ``Content-Length``) go out first and are
    flushed, then, ``body_delay`` seconds later, the counter goes down and the body is
    written. A client that gives its slot back after reading the last byte can never be
    counted against a cap by the server's own bookkeeping.

    ``replies`` maps an arrival index (0 for the first request) to ``(status, headers)``;
    other arrivals get ``default``. ``before_reply(index)``, when set, runs before a
    request is answered (a test moves its FakeClock there). With ``gather`` set, a
    request waits (at most ``gather_timeout`` seconds) until that many are in progress
    before it is answered, so a batch that may run ``gather`` at once is seen doing so.
    """

    def __init__(self, *, body: bytes = b"ok", body_delay: float = 0.0, hold: float = 0.0) -> None:
        self.body = body
        self.body_delay = body_delay
        self.hold = hold
        self.replies: dict[int, tuple[int, dict[str, str]]] = {}
        self.default: tuple[int, dict[str, str]] = (200, {})
        self.before_reply: Callable[[int], None] | None = None
        self.gather = 0
        self.gather_timeout = 0.5
        self.cond = threading.Condition()
        self.now = 0
        self.most = 0
        self.total = 0
        outer = self

        class Handler(QuietHandler):

            def do_GET(self) -> None:
                with outer.cond:
                    index = outer.total
                    outer.total += 1
                    outer.now += 1
                    outer.most = max(outer.most, outer.now)
                    outer.cond.notify_all()
                    status, headers = outer.replies.get(index, outer.default)
                    if outer.gather:
                        until = time.monotonic() + outer.gather_timeout
                        for _ in range(1000):  # bounded: each wait ends by ``until``
                            left = until - time.monotonic()
                            if outer.now >= outer.gather or left <= 0:
                                break
                            outer.cond.wait(left)
                if outer.hold:
                    time.sleep(outer.hold)
                if outer.before_reply is not None:
                    outer.before_reply(index)
                body = outer.body
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()  # the status line and headers go out now
                    self.wfile.flush()
                    if outer.body_delay:
                        time.sleep(outer.body_delay)
                finally:
                    with outer.cond:
                        outer.now -= 1  # just before the body's bytes are written
                        outer.cond.notify_all()
                self.wfile.write(body)
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.scope = f"http://127.0.0.1:{self.port}"
        self.url = self.scope + "/items"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def restart_counts(self) -> None:
        """Count a new phase: the most in progress at once from now on."""
        with self.cond:
            self.most = self.now

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ BusyServer
class BusyServer:
    """A loopback HTTP/1.1 server (keep-alive) that counts each request when it gets to
    it, as a busy server's limiter does: a request with an ``X-Busy`` header (seconds)
    waits that long in its queue first, every other one is counted at once. Records
    ``(monotonic time counted, path)``; ``queued`` is set when the busy request came,
    ``counting`` just before it is counted (and answered)."""

    def __init__(self) -> None:
        self.counted: list[tuple[float, str]] = []
        self.queued = threading.Event()
        self.counting = threading.Event()
        self.queued_at = 0.0
        owner = self

        class Handler(QuietHandler):

            def do_GET(self) -> None:
                busy = float(self.headers.get("X-Busy") or 0)
                if busy:
                    owner.queued_at = time.monotonic()
                    owner.queued.set()
                    time.sleep(busy)
                    owner.counting.set()
                owner.counted.append((time.monotonic(), self.path))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})

    def __enter__(self) -> BusyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ ArrivalServer
#: Linux: ask the kernel to stamp each received segment (``SO_TIMESTAMPNS``; the
#: ``socket`` module does not name it) with CLOCK_REALTIME, read as ancillary data.
_SO_TIMESTAMPNS = 35
_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class ArrivalServer:
    """A loopback HTTP/1.1 server (keep-alive, one thread, answers 200 to everything)
    that records when each request arrived at it: the time the kernel stamped on the
    bytes that completed the request, so a server process the busy machine schedules
    late cannot bunch arrivals together (without kernel stamps, its own clock when it
    reads them)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.kernel_stamps = 0
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ArrivalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        buffers: dict[socket.socket, bytearray] = {}
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(0.05):
                    if key.data is None:
                        conn, _ = self._listener.accept()
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        try:
                            conn.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                        except OSError:
                            pass
                        buffers[conn] = bytearray()
                        selector.register(conn, selectors.EVENT_READ, "conn")
                        continue
                    conn = key.fileobj  # type: ignore[assignment]
                    try:
                        data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(16))
                    except OSError:
                        data, ancillary = b"", []
                    if not data:
                        selector.unregister(conn)
                        buffers.pop(conn, None)
                        conn.close()
                        continue
                    stamp = time.time()
                    for level, kind, payload in ancillary:
                        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
                            seconds, nanos = struct.unpack("qq", payload[:16])
                            stamp = seconds + nanos / 1e9
                            self.kernel_stamps += 1
                    buffer = buffers[conn]
                    buffer += data
                    while (end := buffer.find(b"\r\n\r\n")) >= 0:  # GETs: no body
                        del buffer[: end + 4]
                        self.arrivals.append(stamp)
                        try:
                            conn.sendall(_RESPONSE)
                        except OSError:
                            break
        finally:
            for conn in list(buffers):
                conn.close()
            selector.close()

    def worst_window(self, seconds: float) -> int:
        """The most arrivals in any window [t, t + seconds) that starts at an arrival."""
        times = sorted(self.arrivals)
        worst = 0
        j = 0
        for i, start in enumerate(times):
            j = max(j, i)
            while j < len(times) and times[j] < start + seconds:
                j += 1
            worst = max(worst, j - i)
        return worst


# ------------------------------------------------------------------ BodyServer
#: Seconds between the bytes of a trickling body.
TRICKLE_EVERY = 0.05
#: No body streams longer than this (seconds), whatever the client does.
STREAM_CAP = 3.0
#: How long an "endless" body is: 64 times the default ``max_retry_body`` (1 MiB);
#: endless to a client that keeps its bound. (Fixed, so that code that reads it all
#: fails on its size within a second instead of filling memory for seconds.)
ENDLESS_BYTES = 64 * MiB


@dataclass
class Body:
    """One planned response. ``kind``: "endless" (ENDLESS_BYTES in 64 KiB pieces, as
    fast as the socket takes them), "trickle" (one byte every ``TRICKLE_EVERY`` s, until
    STREAM_CAP) or "fixed" (``data``). ``framing`` of an endless or trickling body:
    "chunked" or "length" (a Content-Length of ENDLESS_BYTES)."""

    status: int = 503
    headers: dict[str, str] = field(default_factory=lambda: {"Retry-After": "0"})
    kind: str = "endless"
    framing: str = "chunked"
    data: bytes = b""


@dataclass
class Served:
    """One request the server received, and what became of its response."""

    path: str
    sent: int = 0  # bytes of the response the socket accepted
    #: "complete", "client_gone" (the client dropped the connection), "stopped" (the
    #: test stopped the server) or "capped" (STREAM_CAP reached).
    ended: str = ""
    done: threading.Event = field(default_factory=threading.Event)


_REASONS = {200: "OK", 429: "Too Many Requests", 503: "Service Unavailable"}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class BodyServer:
    """An HTTP/1.1 server on 127.0.0.1 (port 0), on plain sockets: ``plan(index,
    path)`` says how to answer the index-th request; ``served`` records each one."""

    def __init__(self, plan: Callable[[int, str], Body]) -> None:
        self.plan = plan
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []

    def start(self) -> BodyServer:
        thread = threading.Thread(target=self._accept, name="body-server", daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=2.0)

    def count(self) -> int:
        with self._lock:
            return len(self.served)

    def snapshot(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return [(s.path, s.sent, s.ended) for s in self.served]

    def wait_done(self, timeout: float) -> bool:
        """Whether every response so far has ended (completed, or its connection
        dropped) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            served = list(self.served)
        return all(s.done.wait(max(0.0, deadline - time.monotonic())) for s in served)

    # -- internals ----------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._connection, args=(conn,), daemon=True)
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buffer = b""
            while not self._stop.is_set():  # one request after another (keep-alive)
                head, buffer = self._read_head(conn, buffer)
                if head is None:
                    return
                parts = head.split(b" ", 2)
                path = parts[1].decode("latin-1") if len(parts) > 1 else ""
                served = Served(path)
                with self._lock:
                    index = len(self.served)
                    self.served.append(served)
                try:
                    served.ended = self._respond(conn, self.plan(index, path), served)
                finally:
                    served.done.set()
                if served.ended != "complete":
                    return  # the connection is closed on leaving

    def _read_head(self, conn: socket.socket, buffer: bytes) -> tuple[bytes | None, bytes]:
        while b"\r\n\r\n" not in buffer:  # bounded: by stop() and by the size check
            if self._stop.is_set() or len(buffer) > 64 * KiB:
                return None, b""
            try:
                data = conn.recv(64 * KiB)
            except TimeoutError:
                continue
            except OSError:
                return None, b""
            if not data:
                return None, b""
            buffer += data
        head, _, rest = buffer.partition(b"\r\n\r\n")
        return head, rest

    def _send(self, conn: socket.socket, data: bytes, served: Served, cap: float) -> str:
        """Write ``data``; "" when all of it went, else why the response ended."""
        view = memoryview(data)
        while view:  # bounded: by stop(), by the cap, by the client leaving
            if self._stop.is_set():
                return "stopped"
            if time.monotonic() > cap:
                return "capped"
            try:
                sent = conn.send(view)
            except TimeoutError:
                continue  # the client is not reading: look at stop and the cap again
            except OSError:
                return "client_gone"
            served.sent += sent
            view = view[sent:]
        return ""

    def _respond(self, conn: socket.socket, body: Body, served: Served) -> str:
        cap = time.monotonic() + STREAM_CAP
        lines = [f"HTTP/1.1 {body.status} {_REASONS.get(body.status, 'Status')}"]
        lines += [f"{name}: {value}" for name, value in body.headers.items()]
        if body.kind == "fixed":
            lines.append(f"Content-Length: {len(body.data)}")
        elif body.framing == "chunked":
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {ENDLESS_BYTES}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if body.kind == "fixed":
            return self._send(conn, head + body.data, served, cap) or "complete"
        ended = self._send(conn, head, served, cap)
        if ended:
            return ended
        chunked = body.framing == "chunked"
        if body.kind == "endless":
            raw = b"x" * (64 * KiB)
            piece = _chunk(raw) if chunked else raw
            for _ in range(ENDLESS_BYTES // len(raw)):
                ended = self._send(conn, piece, served, cap)
                if ended:
                    return ended
            return self._send(conn, b"0\r\n\r\n" if chunked else b"", served, cap) or "complete"
        piece = _chunk(b"x") if chunked else b"x"
        while True:  # a trickle; bounded by the cap
            ended = self._send(conn, piece, served, cap)
            if ended:
                return ended
            if self._stop.wait(TRICKLE_EVERY):
                return "stopped"
            if time.monotonic() > cap:
                return "capped"


# ------------------------------------------------------------------ RawServer
@dataclass
class Arrival:
    path: str
    at: datetime


class RawServer:
    """A loopback HTTP/1.1 server that answers each connection with scripted raw bytes.

    One request per connection (every reply says ``Connection: close``); the last
    scripted reply repeats. ``clock`` stamps arrivals and may be swapped per test.
    """

    def __init__(self) -> None:
        self.clock: FakeClock = FakeClock()
        self.replies: list[bytes] = []
        self.arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(32)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closing = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def script(self, clock: FakeClock, replies: list[bytes]) -> None:
        with self._lock:
            self.clock = clock
            self.replies = list(replies)
            self.arrivals = []

    def count(self) -> int:
        with self._lock:
            return len(self.arrivals)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._closing:
                conn.close()
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    continue
                if b"\r\n\r\n" not in data:
                    continue
                path = data.split(b" ", 2)[1].decode("latin-1")
                with self._lock:
                    self.arrivals.append(Arrival(path, self.clock.now()))
                    reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
                try:
                    conn.sendall(reply)
                except OSError:
                    continue

    def close(self) -> None:
        self._closing = True
        # A blocked accept() does not notice close(); one last connection wakes it.
        with socket.create_connection(("127.0.0.1", self.port), timeout=2):
            pass
        self._thread.join(5)
        self._sock.close()


# ------------------------------------------------------------------ KeepAliveServer
#: A KeepAliveServer drops a request that arrives on a connection idle this long
#: (seconds), as if its idle timer fired just as the request came.
DROP_AFTER = 1.05


class _KeepAliveHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: KeepAliveServer
    _last: float | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        if self._last is not None and time.monotonic() - self._last >= DROP_AFTER:
            self.server.dropped += 1
            self.close_connection = True  # closed without an answer
            return
        body = b"ok"
        self.send_response(200)
        if self.server.announce is not None:
            self.send_header("Keep-Alive", self.server.announce)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self._last = time.monotonic()


class KeepAliveServer(ThreadingHTTPServer):
    """Answers GETs 200 on kept-alive connections, announcing ``Keep-Alive: announce``
    (none when it is None), and counts the ``connections`` it accepted. A request that
    arrives on a connection idle ``DROP_AFTER`` seconds or more is ``dropped``: the
    connection is closed without an answer (Node's http server closes one 6 s after
    its last answer, having announced ``timeout=5``)."""

    daemon_threads = True
    announce: str | None = "timeout=2"
    connections = 0
    dropped = 0

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _KeepAliveHandler)
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)


# ------------------------------------------------------------------ TLSServer
class TLSServer:
    """Accepts TLS connections on 127.0.0.1 with a certificate from an unknown CA, and
    counts the connections it accepted."""

    def __init__(self) -> None:
        import trustme  # a test dependency; the TLS tests skip without it

        ca = trustme.CA()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1").configure_cert(self.context)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.accepted += 1
            try:
                conn.settimeout(2)
                with self.context.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


# ------------------------------------------------------------------ a server process
#: A server of its own process: every GET is answered 503 with ``Retry-After: 1``.
SERVER_PROGRAM = r"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        self.send_response(503)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"busy")

httpd = HTTPServer(("127.0.0.1", 0), Handler)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""


@contextlib.contextmanager
def server_process() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``SERVER_PROGRAM`` running in a process of its own: (the process, its port). A
    test may kill it; it is killed on leaving if still running."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER_PROGRAM], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
