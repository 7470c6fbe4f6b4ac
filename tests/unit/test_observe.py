"""Counters as an on_decision hook, through a real adapter and a real loopback server."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import requests
import urllib3

from retry_after_adapter import (
    ConfigurationError,
    DecisionRecord,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    public_scope,
)
from retry_after_adapter.observe import DEFER_REASONS, OTHER, STOP_REASONS, Counters
from tests.servers import Reply


def session_with(counters, clock, store=None, scope=None, **retry_kwargs) -> requests.Session:
    retry_kwargs.setdefault("total", 3)
    retry = RetryAfterRetry(clock=clock, **retry_kwargs)
    session = requests.Session()
    adapter = RetryAfterAdapter(
        retry,
        cooldown=store if store is not None else MemoryCooldownStore(),
        scope=scope,
        on_decision=counters,
    )
    session.mount("http://", adapter)
    return session


def zeroed(names) -> dict[str, int]:
    return dict.fromkeys((*names, OTHER), 0)


def test_a_fresh_snapshot_has_every_fixed_label_at_zero():
    snap = Counters().snapshot()
    assert snap == {
        "decisions": 0,
        "retries": 0,
        "cooldown_waits": 0,
        "deferrals": zeroed(DEFER_REASONS),
        "stops": zeroed(STOP_REASONS),
        "other_actions": 0,
        "wait_seconds": 0.0,
        "cooldown_wait_seconds": 0.0,
        "deferred_seconds": 0.0,
    }
    assert set(snap["deferrals"]) == {
        "deadline",
        "max_wait",
        "attempts",
        "cooldown",
        "quota",
        "rate",
        "concurrency",
        "cancelled",
        "cooldown-unknown",
        OTHER,
    }
    assert all(type(key) is str for key in (*snap["deferrals"], *snap["stops"]))


def test_retries_deferrals_and_stops_are_counted_through_a_real_adapter(server, clock):
    counters = Counters()
    store = MemoryCooldownStore()
    session = session_with(counters, clock, store, max_wait=10)

    server.serve([Reply(503, {"Retry-After": "2"}), Reply(200)])
    assert session.get(server.url + "/ok").status_code == 200

    server.serve([Reply(429, {"Retry-After": "120"}), Reply(200)])
    assert session.get(server.url + "/long").deferral.reason == "max_wait"
    # The same origin is now cooling down: the next call defers without sending.
    local = session.get(server.url + "/again")
    assert local.local and local.status_code == 429 and local.deferral.reason == "cooldown"
    assert server.count() == 1

    clock.advance(121)
    server.serve([Reply(429, {"Retry-After": "soon"})])
    assert session.get(server.url + "/bad").stop_reason == "invalid_retry_after"

    server.serve([Reply(503)])
    with pytest.raises(requests.exceptions.RetryError):
        session_with(counters, clock, total=1, backoff_factor=0).get(server.url + "/exhaust")

    snap = counters.snapshot()
    assert snap["retries"] == 2  # one after the 503 with Retry-After 2, one before exhausting
    assert snap["wait_seconds"] == 2.0
    # Running out of retries is a deferral too (the 503 had no Retry-After, backoff 0).
    assert snap["deferrals"] == {**zeroed(DEFER_REASONS), "max_wait": 1, "cooldown": 1, "attempts": 1}
    assert snap["deferred_seconds"] == 120.0 + 120.0 + 0.0
    assert snap["stops"] == {**zeroed(STOP_REASONS), "invalid_retry_after": 1}
    assert snap["decisions"] == 2 + 2 + 2
    assert "scopes" not in snap  # scopes are never labels unless asked for


def test_a_post_that_fails_after_sending_is_counted_as_not_idempotent(server, clock):
    counters = Counters()
    server.serve([Reply(action="reset"), Reply(200)])
    with pytest.raises(requests.exceptions.ConnectionError):
        session_with(counters, clock).post(server.url + "/write", data=b"x", timeout=2)
    assert server.count("POST") == 1
    assert counters.snapshot()["stops"]["not_idempotent"] == 1
    assert counters.snapshot()["retries"] == 0


def test_a_cooldown_waited_out_before_the_first_attempt_is_not_a_retry(server, clock):
    counters = Counters()
    store = MemoryCooldownStore()
    store.extend(f"http://127.0.0.1:{server.port}", clock.now() + timedelta(seconds=20))
    server.serve([Reply(200)])
    assert session_with(counters, clock, store).get(server.url + "/x").status_code == 200
    snap = counters.snapshot()
    assert (snap["cooldown_waits"], snap["cooldown_wait_seconds"]) == (1, 20.0)
    assert (snap["retries"], snap["wait_seconds"]) == (0, 0.0)


def test_a_far_future_retry_after_keeps_the_totals_finite(server, clock):
    counters = Counters()
    server.serve([Reply(503, {"Retry-After": "9" * 40})])
    response = session_with(counters, clock, max_retry_after=None).get(server.url + "/far")
    assert response.deferral.reason == "max_wait"
    snap = counters.snapshot()
    assert snap["deferred_seconds"] == 1e15
    json.dumps(snap, allow_nan=False)  # no inf/nan: every total stays exportable


def test_by_scope_is_capped_and_overflows_into_other(server, clock):
    counters = Counters(by_scope=True, max_scopes=3)
    tenant = public_scope(lambda request: request.headers["X-Tenant"])  # labels in clear
    session = session_with(counters, clock, scope=tenant, max_wait=5)
    server.serve([Reply(429, {"Retry-After": "60"})])
    for tenant in ("t1", "t2", "t3", "t4", "t5"):
        response = session.get(server.url + "/q", headers={"X-Tenant": tenant})
        assert response.deferral.reason == "max_wait"
    scopes = counters.snapshot()["scopes"]
    assert list(scopes) == ["t1", "t2", "t3", OTHER]
    assert scopes["t1"] == {"retry": 0, "defer": 1, "stop": 0, "other": 0}
    assert scopes[OTHER]["defer"] == 2


def test_plain_urllib3_decisions_have_no_scope(server, clock):
    counters = Counters(by_scope=True)
    http = urllib3.PoolManager(retries=RetryAfterRetry(total=2, clock=clock, on_decision=counters))
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    assert http.request("GET", server.url + "/u").status == 200
    assert counters.snapshot()["scopes"] == {"none": {"retry": 1, "defer": 0, "stop": 0, "other": 0}}


def test_unknown_actions_and_reasons_land_in_other():
    counters = Counters(by_scope=True, max_scopes=0)
    counters(DecisionRecord("defer", "a-new-reason", 1.0, "s", 503, 1))
    counters(DecisionRecord("stop", None, 0.0, "s", 503, 1))
    counters(DecisionRecord("explode", "x", float("nan"), None, None, 1))
    snap = counters.snapshot()
    assert snap["deferrals"][OTHER] == 1 and snap["stops"][OTHER] == 1
    assert snap["other_actions"] == 1
    assert snap["scopes"] == {OTHER: {"retry": 0, "defer": 1, "stop": 1, "other": 1}}
    json.dumps(snap, allow_nan=False)


def test_snapshot_is_a_copy_and_reset_zeroes():
    counters = Counters(by_scope=True)
    counters(DecisionRecord("retry", None, 1.5, "s", 503, 1))
    snap = counters.snapshot()
    snap["deferrals"]["deadline"] = 99
    snap["scopes"]["s"]["retry"] = 99
    again = counters.snapshot()
    assert again["deferrals"]["deadline"] == 0 and again["scopes"]["s"]["retry"] == 1
    counters.reset()
    assert counters.snapshot() == {**Counters(by_scope=True).snapshot()}
    assert "retries=0" in repr(counters)


def test_counts_are_exact_under_concurrent_calls():
    counters = Counters(by_scope=True, max_scopes=5)
    threads_n, per_thread = 8, 2000
    start = threading.Barrier(threads_n)

    def work(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            counters(DecisionRecord("retry", None, 0.5, f"scope-{(n + i) % 7}", 503, 1))
            counters(DecisionRecord("defer", "deadline", 1.0, None, 429, 2))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    snap = counters.snapshot()
    total = threads_n * per_thread
    assert snap["retries"] == total and snap["deferrals"]["deadline"] == total
    assert snap["wait_seconds"] == 0.5 * total and snap["deferred_seconds"] == 1.0 * total
    assert len(snap["scopes"]) == 6  # 5 named scopes + "other"
    assert sum(c["retry"] + c["defer"] for c in snap["scopes"].values()) == 2 * total


def test_many_workers_share_one_counters_through_real_adapters(server, clock):
    counters = Counters()
    server.responder = lambda seen: Reply(503, {"Retry-After": "1"}) if seen.path == "/first" else Reply(200)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            session = session_with(counters, clock)
            session.get(server.url + "/first")
        except requests.exceptions.RetryError:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    snap = counters.snapshot()
    # Each worker: 3 retries then out of attempts (a deferral), 4 requests in all.
    assert snap["retries"] == 6 * 3 and snap["deferrals"]["attempts"] == 6
    assert server.count() == 6 * 4


def test_max_scopes_must_be_a_count():
    with pytest.raises(ConfigurationError):
        Counters(max_scopes=-1)
    with pytest.raises(ConfigurationError):
        Counters(max_scopes=True)
