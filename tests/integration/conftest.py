from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
)

#: A time a day ahead of the real clock, whole seconds: Redis expires keys by its own
#: clock, so store tests on every backend use times that are still ahead there.
AHEAD = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def every_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The same test on each of the package's stores: a fresh memory store, a fresh
    SQLite file, and the session's Redis server (emptied before and after)."""
    if request.param == "memory":
        return MemoryCooldownStore()
    if request.param == "sqlite":
        return SQLiteCooldownStore(tmp_path / "every.db")
    from retry_after_adapter import RedisCooldownStore

    return RedisCooldownStore(request.getfixturevalue("redis_client"), prefix="every:")


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
