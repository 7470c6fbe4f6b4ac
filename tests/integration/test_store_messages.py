"""The failure layer's messages say what happened: a timeout is named a timeout, a
refused connection a refused connection, and "may not publish" is said only when Redis
answers NOPERM. (0.14.0, 8 processes x 8 threads flat out on one Redis: "this process
may not publish on the cooldown store's change channel ... (failed during publish:
timed out (TimeoutError ...))".)

Real parts: redis-servers of the test's own (an ACL user without PUBLISH, a server
paused with SIGSTOP), a port that refuses connections, a socket that accepts and never
answers, and a store of one's own that hangs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from retry_after_adapter import CooldownStoreError, RedisCooldownStore
from retry_after_adapter.cooldown import Store
from retry_after_adapter.cooldown.guard import guard_of

UTC = timezone.utc
SCOPE = "https://api.example:443"
#: How long a test waits (seconds, polling) for the feed's thread to log a line: the
#: canary goes out within PING_EVERY (0.5 s, up to 0.75 s) of the last message and
#: the channel is stale after STALE_AFTER (1.5 s); three times that on a loaded machine.
LOG_WITHIN = 5.0


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "retry_after_adapter"]


def wait_for_line(caplog: pytest.LogCaptureFixture, words: str, store: Any) -> str:
    """The first line holding ``words``, while the store's feed is kept in use."""
    guard = guard_of(store)
    deadline = time.monotonic() + LOG_WITHIN
    while time.monotonic() < deadline:
        for line in lines(caplog):
            if words in line:
                return line
        assert guard.near is not None and guard.near.cooldowns.feed is not None
        guard.near.cooldowns.feed.fresh()  # in use: the feed's thread goes on
        time.sleep(0.02)
    raise AssertionError(f"no line with {words!r} within {LOG_WITHIN} s: {lines(caplog)}")


def fresh_feed(store: Any) -> None:
    """Use the store until its change feed is trusted (its canaries come through)."""
    guard = guard_of(store)
    deadline = time.monotonic() + LOG_WITHIN
    while time.monotonic() < deadline:
        guard.get(SCOPE)
        feed = guard.near.cooldowns.feed if guard.near is not None else None
        if feed is not None and feed.fresh():
            return
        time.sleep(0.02)
    raise AssertionError("the change feed did not become fresh")


@pytest.mark.redis
def test_a_user_without_publish_is_told_it_may_not_publish(
    redis_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory()
    admin = RedisCooldownStore.from_url(server.url, push=False)
    admin.client.execute_command("ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish")
    store = RedisCooldownStore.from_url(
        f"redis://nopub:pw@127.0.0.1:{server.port}/0", socket_timeout=2, socket_connect_timeout=2
    )
    try:
        with caplog.at_level(logging.INFO, logger="retry_after_adapter"):
            guard_of(store).get(SCOPE)  # starts the feed: its first canary is refused
            line = wait_for_line(caplog, "may not publish", store)
            assert "permission denied" in line and "NoPermissionError" in line, line
            assert "pw" not in line.replace("publish", "")  # the password is not shown
            # Its own writes fail the same way, and are named for it (a lasting cause).
            with pytest.raises(CooldownStoreError) as refused:
                store.extend(SCOPE, datetime.now(UTC) + timedelta(seconds=5))
            assert refused.value.cause == "permission denied" and refused.value.lasting
        assert sum("may not publish" in line for line in lines(caplog)) == 1  # once
        assert not any("timed out" in line for line in lines(caplog))
    finally:
        store.close()
        admin.close()


@pytest.mark.redis
def test_a_canary_that_times_out_is_named_a_timeout_not_a_missing_permission(
    redis_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory()
    store = RedisCooldownStore.from_url(server.url)  # 0.1 s socket timeouts
    try:
        fresh_feed(store)
        with caplog.at_level(logging.INFO, logger="retry_after_adapter"):
            server.freeze()  # SIGSTOP: connections stay open, nothing answers
            try:
                line = wait_for_line(caplog, "canary", store)
                stale = wait_for_line(caplog, "change channel is unavailable", store)
            finally:
                server.thaw()
        assert "was not published" in line and "timed out" in line and "TimeoutError" in line, line
        assert "no message came through it for 1.5 s" in stale, stale
        assert not any("may not publish" in text or "permission" in text for text in lines(caplog))
    finally:
        store.close()


@pytest.mark.redis
def test_a_refused_connection_is_named_as_such(closed_port: int, caplog: pytest.LogCaptureFixture) -> None:
    store = RedisCooldownStore.from_url(f"redis://127.0.0.1:{closed_port}/0")
    try:
        with caplog.at_level(logging.INFO, logger="retry_after_adapter"):
            guard_of(store).get(SCOPE)
            line = wait_for_line(caplog, "cooldown store RedisCooldownStore failed", store)
        assert "connection refused" in line and "misconfiguration" not in line, line
        assert not any("may not publish" in text or "permission" in text for text in lines(caplog))
    finally:
        store.close()


@pytest.mark.redis
def test_a_tls_handshake_that_times_out_is_a_timeout_not_a_lasting_misconfiguration(
    black_hole: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that accepts and never answers (0.14.0: "TLS failed", "this looks like a
    misconfiguration, which will not heal by itself")."""
    store = RedisCooldownStore.from_url(f"rediss://127.0.0.1:{black_hole}/0", push=False)
    with pytest.raises(CooldownStoreError) as failed:
        store.get(SCOPE)
    assert (failed.value.cause, failed.value.lasting) == ("TLS handshake timed out", False), str(failed.value)
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        guard_of(store).get(SCOPE)
    (line,) = lines(caplog)
    assert "TLS handshake timed out" in line and "misconfiguration" not in line, line
    store.close()


class HungStore(Store):
    """A store of one's own whose backend does not answer until released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def get(self, scope: str) -> datetime | None:
        self.released.wait(3)
        return None

    def extend(self, scope: str, until: datetime) -> datetime:
        self.released.wait(3)
        return until


def test_a_store_that_does_not_answer_in_time_is_named_a_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """The failure layer stopped waiting for it (a helper thread's bound): a timeout."""
    store = HungStore()
    try:
        with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
            guard_of(store).get(SCOPE)
        (line,) = lines(caplog)
        assert "failed: timed out" in line and "misconfiguration" not in line, line
    finally:
        store.released.set()


@pytest.mark.redis
def test_an_unknown_redis_client_option_is_a_configuration_error_naming_it() -> None:
    """redis-py keeps a keyword its connections do not take until it connects, then
    fails with a TypeError that would read as an outage ("timed out"): the store refuses
    it when built, naming it; options redis-py takes go through."""
    from retry_after_adapter.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown Redis client option timeout"):
        RedisCooldownStore.from_url("redis://127.0.0.1:1/0", timeout=30)
    with pytest.raises(ConfigurationError, match="options retry_on_timout, timeout"):
        RedisCooldownStore.from_url("redis://127.0.0.1:1/0", timeout=30, retry_on_timout=True)
    store = RedisCooldownStore.from_url("redis://127.0.0.1:1/0", health_check_interval=5, max_connections=4)
    store.close()
