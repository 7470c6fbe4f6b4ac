"""A real HTTP server on 127.0.0.1 (port 0) that answers from a script and records
every request it receives, stamped with the test's clock.

Used by the integration tests so that urllib3's real retry loop runs over real sockets.
Sharing the test's ``FakeClock`` lets a test assert "no request arrived before the
eligible time" without really waiting.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from retry_after_adapter import Clock, SystemClock


def format_http_date(when: datetime) -> str:
    return when.strftime("%a, %d %b %Y %H:%M:%S GMT")


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

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes: without this, Nagle's algorithm and
            # the client's delayed ACK hold the body back 40 ms on a kept-alive connection.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

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
