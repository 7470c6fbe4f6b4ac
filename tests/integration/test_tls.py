"""A certificate that fails verification is not retried (another attempt cannot heal
it), and the error is requests' own SSLError, as HTTPAdapter raises it."""

from __future__ import annotations

import time

import pytest
import requests

from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry

from ..servers import TLSServer

pytest.importorskip("trustme", reason="trustme is a test dependency: pip install -e '.[test]'")


def test_a_certificate_that_fails_verification_is_not_retried(tls_server: TLSServer) -> None:
    session = requests.Session()
    session.mount("https://", RetryAfterAdapter(RetryAfterRetry(total=5, backoff_factor=0.5), cooldown=None))
    started = time.monotonic()
    with pytest.raises(requests.exceptions.SSLError):
        session.get(f"https://127.0.0.1:{tls_server.port}/", timeout=5)
    assert time.monotonic() - started < 2.0
    assert tls_server.accepted == 1
