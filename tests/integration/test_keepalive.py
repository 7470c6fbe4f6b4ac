"""Connections idle past the server's announced keep-alive timeout are not reused
(``retry_after_adapter._keepalive``): a server that closes an idle connection as a
request arrives on it loses that request (Node's http server closes one 6 s after its
last answer, having announced ``Keep-Alive: timeout=5``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import urllib3
from requests.adapters import HTTPAdapter

from retry_after_adapter import MemoryCooldownStore, RetryAfterAdapter, RetryAfterPoolManager, RetryAfterRetry
from retry_after_adapter._keepalive import idle_limit

#: The server drops a request that arrives on a connection idle this long (seconds), as
#: if its idle timer fired just as the request came.
DROP_AFTER = 1.05


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    announce: str | None = "timeout=2"
    connections = 0
    dropped = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
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


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def url(httpd: _Server) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/"


def test_the_announced_timeout_less_a_second_is_the_idle_limit() -> None:
    assert idle_limit("timeout=5") == 4.0
    assert idle_limit("timeout=5, max=100") == 4.0
    assert idle_limit("max=100, Timeout = 75") == 74.0
    assert idle_limit("timeout=1") == 0.0
    for bad in (None, "", "max=100", "timeout=", "timeout=-1", "timeout=1.5", "timeout=\u0665", "timeout=9" * 40):
        assert idle_limit(bad) is None


def test_stock_requests_loses_the_request_the_adapter_opens_a_new_connection(server: _Server) -> None:
    stock = requests.Session()
    stock.mount("http://", HTTPAdapter())
    assert stock.get(url(server), timeout=5).status_code == 200
    time.sleep(DROP_AFTER + 0.05)
    with pytest.raises(requests.ConnectionError):
        stock.get(url(server), timeout=5)  # sent on the idle connection: lost
    assert server.dropped == 1

    retry = RetryAfterRetry(total=0)  # no retry: the first attempt must get through
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(retry, cooldown=MemoryCooldownStore()))
    assert session.get(url(server), timeout=5).status_code == 200
    before = server.connections
    time.sleep(DROP_AFTER + 0.05)  # idle past 2 - 1 s: not reused
    assert session.get(url(server), timeout=5).status_code == 200
    assert server.dropped == 1 and server.connections == before + 1


def test_a_connection_is_reused_within_the_limit_and_without_the_field(server: _Server) -> None:
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=MemoryCooldownStore()))
    for _ in range(3):
        assert session.get(url(server), timeout=5).status_code == 200
    assert server.connections == 1  # within a second of each other: kept alive
    server.announce = None
    assert session.get(url(server), timeout=5).status_code == 200
    time.sleep(DROP_AFTER + 0.05)  # nothing announced: reused as urllib3 does
    with pytest.raises(requests.ConnectionError):
        session.get(url(server), timeout=5)
    assert server.connections == 1 and server.dropped == 1


def test_the_pool_manager_does_the_same(server: _Server) -> None:
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=0), cooldown=MemoryCooldownStore())
    assert manager.request("GET", url(server)).status == 200
    time.sleep(DROP_AFTER + 0.05)
    assert manager.request("GET", url(server)).status == 200
    assert server.dropped == 0 and server.connections == 2
    # A plain PoolManager is left as it was.
    assert urllib3.PoolManager().connection_from_url(url(server)).__class__ is urllib3.HTTPConnectionPool
