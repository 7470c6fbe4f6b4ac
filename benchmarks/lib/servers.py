"""Loopback HTTP servers run on threads of the benchmark's own process, for the
benchmarks that count what arrives at the server as it arrives (the fleets in their own
processes use ``retry_after_adapter.testing``'s ``QuotaServer`` instead).

:class:`ThreadedServer` is the machinery (a ``ThreadingHTTPServer`` on a free loopback
port, served on a daemon thread, closed on exit); a subclass says how it answers a GET.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class ThreadedServer:
    """A loopback HTTP/1.1 server on its own threads; :meth:`answer` answers each GET.

    ``url`` is ``http://127.0.0.1:<port><path>``, ``origin`` the same without the path.
    """

    path = "/"
    #: Handler sockets with TCP_NODELAY (no Nagle delay on small answers).
    nodelay = False
    #: The listen backlog (``socketserver``'s default is 5).
    backlog = 5
    #: Drop the traceback of a connection the client closed mid-answer.
    quiet_errors = False

    def __init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = outer.nodelay

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.answer(self)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = outer.backlog

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not outer.quiet_errors:
                    super().handle_error(request, client_address)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = self.origin + self.path
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        reply(handler, 200, b"ok")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def reply(
    handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    """Send one whole answer: ``status``, ``headers``, ``Content-Length`` and ``body``."""
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class LatencyServer(ThreadedServer):
    """Answers every GET ``200 ok`` after ``latency`` seconds (a remote API's round trip)
    and keeps the most requests it had in flight at once (``most``)."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        super().__init__()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(self.latency)
        with self.lock:
            self.in_flight -= 1
        reply(handler, 200, b"ok")


class CountingServer(ThreadedServer):
    """200 until armed; then one 429 with ``Retry-After: cooldown`` (seconds); counts
    what arrives while that cooldown runs (``inside``), and of that what arrives more
    than ``grace`` seconds after the 429 went out (``inside_late``)."""

    path = "/item"
    nodelay = True
    backlog = 128
    quiet_errors = True  # a client whose deadline passed hung up: not the server's problem

    def __init__(self, cooldown: int, grace: float) -> None:
        self.cooldown, self.grace = cooldown, grace
        self.lock = threading.Lock()
        self.armed = False
        self.until = 0.0
        self.fired_at = 0.0
        self.inside = 0
        self.inside_late = 0
        self.total = 0
        super().__init__()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        now = time.monotonic()
        with self.lock:
            self.total += 1
            if now < self.until:
                self.inside += 1
                self.inside_late += now > self.fired_at + self.grace
            fire = self.armed
            if fire:
                self.armed = False
                self.until = now + self.cooldown
                self.fired_at = now
        if fire:
            reply(handler, 429, b"slow down", {"Retry-After": str(self.cooldown)})
        else:
            reply(handler, 200, b"ok")

    def arm(self) -> None:
        with self.lock:
            self.armed = True
            self.until = 0.0
            self.inside = 0
            self.inside_late = 0

    def disarm(self) -> None:
        """Forget an arm that never fired (nothing reached the server)."""
        with self.lock:
            self.armed = False

    def wait_fired(self, timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if not self.armed:
                    return
            time.sleep(0.005)
