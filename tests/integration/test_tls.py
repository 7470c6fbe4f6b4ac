"""A certificate that fails verification is not retried (another attempt cannot heal
it), and the error is requests' own SSLError, as HTTPAdapter raises it."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry

trustme = pytest.importorskip("trustme", reason="trustme is a test dependency: pip install -e '.[test]'")


class TLSServer:
    """Accepts TLS connections on 127.0.0.1 with a certificate from an unknown CA, and
    counts the connections it accepted."""

    def __init__(self) -> None:
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


@pytest.fixture
def tls_server() -> Iterator[TLSServer]:
    server = TLSServer()
    yield server
    server.stop()


def test_a_certificate_that_fails_verification_is_not_retried(tls_server):
    session = requests.Session()
    session.mount("https://", RetryAfterAdapter(RetryAfterRetry(total=5, backoff_factor=0.5), cooldown=None))
    started = time.monotonic()
    with pytest.raises(requests.exceptions.SSLError):
        session.get(f"https://127.0.0.1:{tls_server.port}/", timeout=5)
    assert time.monotonic() - started < 2.0
    assert tls_server.accepted == 1
