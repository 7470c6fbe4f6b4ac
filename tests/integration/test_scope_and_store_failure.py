"""Scopes (origin, credential, callable) and the store failure policy, end to end."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
import requests

from retry_after_adapter import (
    CooldownStoreError,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
)
from retry_after_adapter.adapter import credential_scope, origin_scope
from retry_after_adapter.cooldown import Store
from retry_after_adapter.cooldown.guard import BREAKER_FIRST, guard_of

from ..conftest import local_deferral
from ..servers import Reply


def prepared(url: str, headers: dict[str, str] | None = None) -> requests.PreparedRequest:
    return requests.Request("GET", url, headers=headers or {}).prepare()


@pytest.mark.parametrize(
    ("url", "scope"),
    [
        ("https://API.Example.com/a?token=x", "https://api.example.com:443"),
        ("http://example.com:8080/", "http://example.com:8080"),
        ("http://user:pw@example.com/x", "http://example.com:80"),
        ("http://[::1]:9000/x", "http://[::1]:9000"),
    ],
)
def test_origin_scope(url, scope):
    assert origin_scope(prepared(url)) == scope


def test_credential_scope_hashes_the_credential():
    a = credential_scope(prepared("https://x.test/", {"Authorization": "Bearer secret-one"}))
    b = credential_scope(prepared("https://x.test/", {"Authorization": "Bearer secret-two"}))
    assert a != b
    assert a.startswith("https://x.test:443|sha256:")
    assert "secret" not in a


class FlakyStore(Store):
    """A real store that can be switched to fail, like a server going away."""

    def __init__(self) -> None:
        self.inner = MemoryCooldownStore()
        self.failing = False
        self.calls = 0

    def get(self, scope: str) -> datetime | None:
        self.calls += 1
        if self.failing:
            raise CooldownStoreError("store unreachable")
        return self.inner.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        self.calls += 1
        if self.failing:
            raise CooldownStoreError("store unreachable")
        return self.inner.extend(scope, until)


def session(clock, store, **kw) -> requests.Session:
    if isinstance(store, FlakyStore):
        # The store's failure layer times its circuit breaker on the test's clock.
        guard_of(store).breaker.monotonic = clock.monotonic
    s = requests.Session()
    s.mount(
        "http://", RetryAfterAdapter(RetryAfterRetry(total=3, clock=clock, max_wait=10), cooldown=store, **kw)
    )
    return s


def test_callable_scope_per_account_and_secret_results_are_hashed(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "100"})])

    def by_key(request: requests.PreparedRequest) -> str:
        return "acct:" + request.headers["Authorization"]

    first = session(clock, store, scope=by_key).get(server.url, headers={"Authorization": "key-AAAA"})
    assert first.deferral.reason == "max_wait"
    assert "key-AAAA" not in first.deferral.scope
    assert first.deferral.scope.startswith("sha256:")
    server.serve([Reply(200)])
    # Another account is not held back by the first one's cooldown...
    other = session(clock, store, scope=by_key).get(server.url, headers={"Authorization": "key-BBBB"})
    assert other.status_code == 200
    # ...but the same account is.
    local_deferral(session(clock, store, scope=by_key).get(server.url, headers={"Authorization": "key-AAAA"}))


def test_store_outage_fails_open_keeps_the_cooldown_locally_and_warns_once(server, clock, caplog):
    store = FlakyStore()
    store.failing = True
    s = session(clock, store)
    server.serve([Reply(200)])
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        for _ in range(3):
            assert s.get(server.url).status_code == 200
        server.serve([Reply(429, {"Retry-After": "50"})])
        assert s.get(server.url).deferral.reason == "max_wait"
        # The cooldown this process learned is kept although the store is down.
        raised_deferral = local_deferral(s.get(server.url))
    assert raised_deferral.reason == "cooldown"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cooldowns are kept in this process" in warnings[0].getMessage()
    assert server.count() == 1  # serve() reset the count: only the 429, nothing after it


def test_store_outage_fail_closed_defers_with_cooldown_unknown(server, clock, caplog):
    store = FlakyStore()
    s = session(clock, store, store_failure="closed")
    server.serve([Reply(200)])
    assert s.get(server.url).status_code == 200
    store.failing = True
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        raised_deferral = local_deferral(s.get(server.url))
    assert raised_deferral.reason == "cooldown-unknown"
    # The warning says what these calls do, not what failing open would.
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "deferred with reason cooldown-unknown" in warning and "kept in this process" not in warning
    assert server.count() == 1
    store.failing = False
    # The breaker skips the store for its back-off; then one probe finds it healthy.
    assert local_deferral(s.get(server.url)).reason == "cooldown-unknown"
    clock.advance(BREAKER_FIRST)
    assert s.get(server.url).status_code == 200


def test_an_outage_noticed_by_no_call_warns_what_either_kind_of_call_does(clock, caplog):
    # A read for a report or a write in the background has no call's store_failure:
    # its warning says what calls that fail open and calls that fail closed do.
    breaker = guard_of(FlakyStore()).breaker
    breaker.monotonic = clock.monotonic
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        breaker.failed(CooldownStoreError("store unreachable"), None)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "cooldowns are kept in this process" in warning
    assert "calls that fail closed (store_failure='closed') are deferred" in warning


def test_recovered_store_is_used_again(server, clock):
    store = FlakyStore()
    s = session(clock, store)
    store.failing = True
    server.serve([Reply(200)])
    s.get(server.url)
    store.failing = False
    clock.advance(BREAKER_FIRST)
    store.inner.extend(f"http://127.0.0.1:{server.port}", clock.now() + timedelta(seconds=500))
    local_deferral(s.get(server.url))


def test_cooldown_disabled_with_none(server, clock):
    server.serve([Reply(429, {"Retry-After": "100"})])
    s = session(clock, None)
    assert s.get(server.url).deferral.reason == "max_wait"
    server.serve([Reply(200)])
    assert s.get(server.url).status_code == 200


def test_a_post_429_still_sets_the_shared_cooldown(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "100"})])
    answered = session(clock, store).post(server.url, data=b"x")
    # Not replayed (a POST), but the caller is told when it may resubmit: the cooldown's end.
    assert answered.status_code == 429 and not answered.local
    assert answered.deferral.reason == "cooldown" and answered.deferral.delay == pytest.approx(100, abs=1)
    raised_deferral = local_deferral(session(clock, store).get(server.url))
    assert raised_deferral.reason == "cooldown"
    assert server.count() == 1


def test_fake_clock_rejects_going_backwards():
    with pytest.raises(ValueError):
        FakeClock().advance(-1)
