from __future__ import annotations

import requests

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry


def make_session(
    clock: FakeClock | None = None,
    store: MemoryCooldownStore | None = None,
    **retry_kwargs: object,
) -> requests.Session:
    """A Session with a RetryAfterAdapter on http:// (its own store unless given one)."""
    retry_kwargs.setdefault("total", 5)
    retry = RetryAfterRetry(clock=clock, **retry_kwargs)  # type: ignore[arg-type]
    session = requests.Session()
    session.mount(
        "http://",
        RetryAfterAdapter(max_retries=retry, cooldown=store if store is not None else MemoryCooldownStore()),
    )
    return session
