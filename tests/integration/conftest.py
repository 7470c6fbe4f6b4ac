from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry

from .throttle_server import ThrottleServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[ThrottleServer]:
    srv = ThrottleServer(clock).start()
    yield srv
    srv.stop()


@pytest.fixture
def real_server() -> Iterator[ThrottleServer]:
    srv = ThrottleServer().start()
    yield srv
    srv.stop()


def make_session(
    clock: FakeClock | None = None,
    store: MemoryCooldownStore | None = None,
    **retry_kwargs: object,
) -> requests.Session:
    """A Session with a RetryAfterAdapter on http:// (its own store unless given one)."""
    retry_kwargs.setdefault("total", 5)
    retry = RetryAfterRetry(clock=clock, **retry_kwargs)  # type: ignore[arg-type]
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=store if store is not None else MemoryCooldownStore()))
    return session
