"""The engine's guarantees through the public names, against a real loopback server:
one deadline across redirects, one result shape, exhaustion that keeps the time,
exceptions of their own class, copies and pickles, plain urllib3 with admission."""

from __future__ import annotations

import copy
import pickle
import threading
from datetime import timedelta
from typing import Any

import pytest
import requests
import urllib3

from retry_after_adapter import (
    FakeClock,
    MaxRetryDeferred,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterResponse,
    RetryAfterRetry,
    RetryDeferred,
    SQLiteCooldownStore,
    budget,
    deferral_of,
)
from retry_after_adapter.cooldown.memory import DEFAULT_STORE

from ..conftest import local_deferral
from ..servers import Reply, Seen, ThrottleServer
from .conftest import make_session

# -- one deadline per session.get(), redirects included -------------------------------------


def redirecting(server: ThrottleServer, first_wait: str, second_wait: str) -> None:
    """/start: 302 to /next with Retry-After first_wait; /next: 429 with second_wait, then 200."""
    answered: dict[str, int] = {}

    def respond(seen):
        answered[seen.path] = answered.get(seen.path, 0) + 1
        if seen.path == "/start":
            return Reply(302, {"Location": "/next", "Retry-After": first_wait})
        if answered[seen.path] == 1:
            return Reply(429, {"Retry-After": second_wait}, b"busy")
        return Reply(200, body=b"done")

    server.responder = respond


def test_the_deadline_spans_redirect_hops(server, clock):
    # deadline 10: a 302 asking 6 s, then a 429 asking 8 s: 6 + 8 does not fit.
    redirecting(server, "6", "8")
    started = clock.monotonic()
    response = make_session(clock, deadline=10, max_wait=None).get(server.url + "/start")
    assert response.status_code == 429 and response.text == "busy"
    assert response.deferral.reason == "deadline" and response.deferral.delay == 8.0
    assert clock.monotonic() - started == 6.0  # the 302's wait, never the 429's
    assert [s.path for s in server.seen] == ["/start", "/next"]
    assert server.seen[1].at - server.seen[0].at == timedelta(seconds=6)
    assert [r.status_code for r in response.history] == [302]


def test_redirect_hops_that_fit_the_deadline_are_all_waited_out(server, clock):
    redirecting(server, "3", "4")
    response = make_session(clock, deadline=10, max_wait=None).get(server.url + "/start")
    assert response.status_code == 200 and response.deferral is None
    assert clock.sleeps == [3.0, 4.0]
    assert [s.path for s in server.seen] == ["/start", "/next", "/next"]


def test_budget_deadline_spans_redirect_hops_too(server, clock):
    redirecting(server, "6", "8")
    with budget(deadline=10, max_wait=None):
        response = make_session(clock).get(server.url + "/start")
    assert response.deferral.reason == "deadline"


def test_the_same_prepared_request_sent_twice_starts_a_fresh_call(server, clock):
    server.serve([Reply(302, {"Location": "/b"}), Reply(200)])
    session = make_session(clock, deadline=10)
    prepared = session.prepare_request(requests.Request("GET", server.url + "/a"))
    first = session.send(prepared, allow_redirects=False)
    assert first.status_code == 302
    clock.advance(60)  # far past the first call's deadline
    server.serve([Reply(200, body=b"fresh")])
    assert session.send(prepared).text == "fresh"


# -- exhaustion and int max_retries -----------------------------------------------------------


def test_max_retries_zero_returns_the_503_as_http_adapter_does(server):
    server.serve([Reply(503, {"Retry-After": "2"}, b"down")])
    for adapter in (
        RetryAfterAdapter(max_retries=0, cooldown=None),
        requests.adapters.HTTPAdapter(max_retries=0),
    ):
        session = requests.Session()
        session.mount("http://", adapter)
        response = session.get(server.url + "/z")
        assert response.status_code == 503 and response.text == "down"
    assert server.count() == 2  # one each, nothing retried
    assert deferral_of(response) is None  # the stock one
    ours = requests.Session()
    ours.mount("http://", RetryAfterAdapter(max_retries=0, cooldown=None))
    assert deferral_of(ours.get(server.url + "/z")).reason == "attempts"


def test_the_exhausted_deferral_includes_backoff_and_cooldown(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(503)])  # no Retry-After: the next try would be after the backoff
    response = make_session(clock, store, total=2, backoff_factor=1, raise_on_status=False).get(
        server.url + "/b"
    )
    assert response.deferral.reason == "attempts"
    assert clock.sleeps == [2.0]  # urllib3's backoff: 0 after the first error, then 2
    assert response.deferral.delay == 4.0  # and 4 s after the third
    clock.advance(5)
    server.serve([Reply(429, {"Retry-After": "50"})])
    response = make_session(clock, store, total=0, raise_on_status=False).get(server.url + "/b")
    assert response.deferral.reason == "attempts" and response.deferral.delay == 50.0


# -- exceptions keep their class ------------------------------------------------------------------


def test_a_read_timeout_after_the_last_attempt_is_a_read_timeout(real_server):
    real_server.serve([Reply(action="hang")])
    session = make_session(None, total=1, backoff_factor=0)
    with pytest.raises(requests.exceptions.ReadTimeout) as raised:
        session.get(real_server.url + "/slow", timeout=0.2)
    assert isinstance(raised.value, RetryDeferred)
    assert isinstance(raised.value, requests.exceptions.Timeout)
    assert deferral_of(raised.value).reason == "attempts"
    assert raised.value.request is not None and raised.value.response is None
    assert real_server.count() == 2


def test_a_connection_error_keeps_its_class_and_pickles(closed_port):
    session = make_session(FakeClock(), total=1, backoff_factor=0)
    with pytest.raises(requests.exceptions.ConnectionError) as raised:
        session.get(f"http://127.0.0.1:{closed_port}/x", timeout=1)
    assert not isinstance(raised.value, requests.exceptions.Timeout)
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is type(raised.value) and deferral_of(again) == deferral_of(raised.value)


# -- the body of a deferred response stays readable -------------------------------------------------


def test_a_cancel_during_the_wait_returns_the_response_with_its_body(real_server):
    real_server.serve([Reply(429, {"Retry-After": "30"}, b"the server's explanation"), Reply(200)])
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with budget(cancel=stop):
        response = make_session(None, max_wait=60).get(real_server.url + "/c")
    assert response.deferral.reason == "cancelled"
    assert response.status_code == 429 and response.text == "the server's explanation"
    assert real_server.count() == 1


def test_a_cooldown_grown_during_the_wait_defers_with_the_body(server, clock):
    store = MemoryCooldownStore()
    scope = f"http://127.0.0.1:{server.port}"
    server.serve([Reply(503, {"Retry-After": "5"}, b"first body"), Reply(200)])

    def grow(record):
        if record.action == "retry" and record.reason is None:  # another worker learns 600 s
            store.extend(scope, clock.now() + timedelta(seconds=600))

    session = requests.Session()
    retry = RetryAfterRetry(total=3, clock=clock, max_wait=60, on_decision=grow)
    session.mount("http://", RetryAfterAdapter(retry, cooldown=store))
    response = session.get(server.url + "/g")
    assert response.deferral.reason == "cooldown" and response.text == "first body"
    assert server.count() == 1


# -- typed results --------------------------------------------------------------------------------


def test_every_response_of_the_adapter_is_a_retry_after_response(server, clock):
    server.serve([Reply(200, body=b"fine")])
    response = make_session(clock).get(server.url + "/t")
    assert isinstance(response, RetryAfterResponse)
    assert (response.deferral, response.stop_reason, response.local) == (None, None, False)
    assert deferral_of(requests.Response()) is None  # not through the adapter: None, no error


# -- copies and pickles ------------------------------------------------------------------------------


def sessions_round_trip(session: requests.Session) -> list[requests.Session]:
    return [copy.copy(session), copy.deepcopy(session), pickle.loads(pickle.dumps(session))]


def test_adapters_and_sessions_copy_deepcopy_and_pickle(server):
    server.serve([Reply(429, {"Retry-After": "100"}), Reply(200)])
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=2, max_wait=10)))
    first = session.get(server.url + "/p")
    assert first.deferral.reason == "max_wait"  # the default store now holds a cooldown
    for other in sessions_round_trip(session):
        adapter = other.get_adapter(server.url)
        assert isinstance(adapter, RetryAfterAdapter)
        assert adapter.cooldown is DEFAULT_STORE  # the default store maps back to itself
        assert adapter.max_retries.total == 2 and adapter.max_retries.max_wait == 10
        assert local_deferral(other.get(server.url + "/p")).reason == "cooldown"
    assert server.count() == 1
    for adapter in (
        copy.copy(session.get_adapter(server.url)),
        pickle.loads(pickle.dumps(session.get_adapter(server.url))),
    ):
        assert (
            local_deferral(adapter.send(requests.Request("GET", server.url + "/p").prepare())).reason
            == "cooldown"
        )


def test_a_sqlite_adapter_pickles_as_its_path(tmp_path):
    store = SQLiteCooldownStore(tmp_path / "cooldown.db")
    adapter = RetryAfterAdapter(cooldown=store, scope="credential", store_failure="closed")
    again = pickle.loads(pickle.dumps(adapter))
    assert isinstance(again.cooldown, SQLiteCooldownStore) and again.cooldown.path == store.path
    assert (again.scope, again.store_failure) == ("credential", "closed")


def test_a_private_memory_store_is_copied_with_its_entries(server, clock):
    store = MemoryCooldownStore()
    store.extend("http://x:80", clock.now() + timedelta(seconds=5))
    adapter = RetryAfterAdapter(cooldown=store)
    deep = copy.deepcopy(adapter)
    assert deep.cooldown is not store and deep.cooldown.get("http://x:80") == store.get("http://x:80")
    assert copy.copy(adapter).cooldown is store


def test_the_pool_manager_copies_and_pickles(server):
    server.serve([Reply(200, body=b"ok")])
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=1), headers={"X-Test": "1"})
    for other in (copy.copy(manager), copy.deepcopy(manager), pickle.loads(pickle.dumps(manager))):
        assert isinstance(other, RetryAfterPoolManager) and other.cooldown is DEFAULT_STORE
        assert other.request("GET", server.url + "/m").data == b"ok"
    assert server.seen[-1].headers["X-Test"] == "1"


# -- RetryAfterPoolManager: the engine for plain urllib3 ---------------------------------------------


def test_the_pool_manager_admits_before_the_first_request(server, clock):
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "100"}, b"busy")])
    manager = RetryAfterPoolManager(
        retries=RetryAfterRetry(total=3, clock=clock, max_wait=10), cooldown=store
    )
    first = manager.request("GET", server.url + "/u")
    assert first.status == 429 and first.data == b"busy" and deferral_of(first).reason == "max_wait"
    second = manager.request("GET", server.url + "/u")
    assert local_deferral(second).eligible_at == deferral_of(first).eligible_at
    assert server.count() == 1


def test_the_pool_manager_waits_and_follows_redirects_inside_one_deadline(server, clock):
    redirecting(server, "6", "8")
    manager = RetryAfterPoolManager(
        retries=RetryAfterRetry(total=3, clock=clock, deadline=10, max_wait=None), cooldown=None
    )
    response = manager.request("GET", server.url + "/start")
    assert response.status == 429 and deferral_of(response).reason == "deadline"
    assert clock.sleeps == [6.0]
    redirecting(server, "3", "4")
    assert manager.request("GET", server.url + "/start").data == b"done"


def test_the_pool_manager_strips_credentials_on_a_cross_host_redirect(server):
    other = ThrottleServer().start()
    try:
        server.serve([Reply(302, {"Location": other.url.replace("127.0.0.1", "localhost") + "/there"})])
        manager = RetryAfterPoolManager(cooldown=None)
        response = manager.request(
            "GET", server.url + "/here", headers={"Authorization": "Bearer t0ken", "X-Keep": "1"}
        )
        assert response.status == 200
        assert "Authorization" not in other.seen[0].headers and other.seen[0].headers["X-Keep"] == "1"
    finally:
        other.stop()


def test_the_pool_manager_raises_max_retry_error_on_exhaustion_and_after_transport_errors(
    server, closed_port
):
    server.serve([Reply(503, {"Retry-After": "1"})])
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=1, clock=FakeClock()), cooldown=None)
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        manager.request("GET", server.url + "/x")
    assert isinstance(raised.value, MaxRetryDeferred) and raised.value.deferral.reason == "attempts"
    assert raised.value.response.status == 503
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        manager.request("GET", f"http://127.0.0.1:{closed_port}/x", timeout=1)
    assert isinstance(raised.value.reason, urllib3.exceptions.NewConnectionError)
    assert deferral_of(raised.value).reason == "attempts"


class CountingStore(MemoryCooldownStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.extends = 0

    def get(self, scope):
        self.gets += 1
        return super().get(scope)

    def admit(self, ask):
        self.gets += 1  # admission: the cooldown read (and the allowance) in one operation
        return super().admit(ask)

    def extend(self, scope, until):
        self.extends += 1
        return super().extend(scope, until)


def test_the_success_path_costs_one_store_read_and_no_write(server, clock):
    store = CountingStore()
    server.serve([Reply(200)])
    session = make_session(clock, store)
    for _ in range(5):
        assert session.get(server.url + "/ok").status_code == 200
    assert (store.gets, store.extends) == (5, 0)
    # A retry reads again before its attempt (admission before every attempt).
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    session.get(server.url + "/retry")
    assert (store.gets, store.extends) == (7, 1)


def test_a_redis_adapter_pickles_as_its_url():
    pytest.importorskip("redis")
    from retry_after_adapter import RedisCooldownStore

    store = RedisCooldownStore.from_url("redis://127.0.0.1:6399/3", prefix="app:")  # no connection made
    again = pickle.loads(pickle.dumps(RetryAfterAdapter(cooldown=store)))
    assert isinstance(again.cooldown, RedisCooldownStore)
    assert (
        again.cooldown.prefix == "app:" and again.cooldown.client.connection_pool.connection_kwargs["db"] == 3
    )


def test_a_follow_up_sent_through_response_connection_runs_the_policy(server, clock):
    # requests' HTTPDigestAuth answers a 401 with r.connection.send(prepared): that must
    # be the adapter itself (its policy, its store), not the one-attempt view it sends on.
    session = make_session(clock)
    server.serve([Reply(401), Reply(503, {"Retry-After": "2"}), Reply(200, body=b"in")])
    first = session.get(server.url + "/auth")
    adapter = session.get_adapter(server.url)
    assert first.connection is adapter
    again = first.connection.send(first.request.copy())
    assert again.text == "in" and clock.sleeps == [2.0]


class AlwaysBusyStore(MemoryCooldownStore):
    """Every admission answers "ask again in 20 ms", as a contended shared store does."""

    def admit(self, ask):
        from retry_after_adapter.cooldown.base import Admission

        return Admission(cooldown=None, not_before=ask.now + timedelta(milliseconds=20))


def test_admission_that_never_comes_defers_with_its_reason_and_a_future_time(server, clock):
    from retry_after_adapter import Quota, RetryAfterAdapter

    server.serve([Reply(200)])
    session = requests.Session()
    retry = RetryAfterRetry(total=2, clock=clock, max_wait=5, raise_on_status=False)
    session.mount("http://", RetryAfterAdapter(retry, cooldown=AlwaysBusyStore(), quota=Quota(5, per=1)))
    response = session.get(server.url + "/x")
    deferral = deferral_of(response)
    assert deferral is not None and response.status_code == 429 and not server.seen
    assert deferral.reason == "quota"  # what held it back, not "cooldown"
    assert deferral.delay > 0 and deferral.eligible_at > clock.now()
    assert len(clock.sleeps) >= 8  # it waited within its budget before deferring


@pytest.mark.parametrize("cap", [False, True], ids=["adapter", "quota-and-cap"])
def test_a_get_leaves_no_reference_cycle_for_the_garbage_collector(server, cap: bool) -> None:
    # A slot handed to a response must not make the response hold itself (a cycle
    # through its own release hook): every attempt's objects are freed when the caller
    # drops them, not left for the cyclic collector.
    import gc

    from retry_after_adapter import Quota

    server.serve([Reply(200, body=b"ok")])
    kw: dict[str, object] = {"quota": Quota(1_000_000, per=1), "max_concurrency": 8} if cap else {}
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(cooldown=MemoryCooldownStore(), **kw))  # type: ignore[arg-type]
    for _ in range(5):
        session.get(server.url + "/warm").close()
    gc.collect()
    # Every object alive now stays alive until the end: what another test left (a store
    # whose helper threads end meanwhile, and the guard they held) is not collected
    # during the loop, so only what the loop's attempts made can be found.
    alive = gc.get_objects()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept, to be named
    try:
        for _ in range(20):
            response = session.get(server.url + "/ok")
            assert response.content == b"ok"
            del response
        gc.collect()
        # Other threads (a test server torn down meanwhile, with its FakeClock; an
        # earlier test's QuotaServer whose last handler thread ends now, its client's
        # kept-alive connection closed) may leave garbage of their own: only what an
        # attempt makes counts.
        ours = sorted(
            {
                type(o).__module__ + "." + type(o).__qualname__
                for o in gc.garbage
                if type(o).__module__.startswith(("urllib3", "requests", "retry_after_adapter"))
                and type(o).__module__ not in ("retry_after_adapter.clock", "retry_after_adapter.testing.server")
            }
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        del alive
    assert ours == [], f"attempts left cycles for the collector: {ours}"


# -- a redirect hop that used up the deadline -------------------------------------------


def mount(adapter: RetryAfterAdapter) -> requests.Session:
    session = requests.Session()
    session.mount("http://", adapter)
    return session


@pytest.mark.parametrize("store", ["none", "memory"])
def test_redirect_hop_that_used_up_the_deadline_defers_before_the_next_hop(
    clock: FakeClock, server: ThrottleServer, store: str
) -> None:
    def slow_redirect(seen: Seen) -> Reply:
        if seen.path == "/start":
            clock.advance(5.0)  # this hop took 5 s of the call's 2 s deadline
            return Reply(302, {"Location": "/next"}, b"")
        return Reply(200)

    server.responder = slow_redirect
    cooldown = None if store == "none" else MemoryCooldownStore()
    session = mount(RetryAfterAdapter(RetryAfterRetry(3, deadline=2.0, clock=clock), cooldown=cooldown))

    response = session.get(f"{server.url}/start")

    assert [s.path for s in server.seen] == ["/start"], (
        f"the next hop was sent after the deadline had passed: {[s.path for s in server.seen]}"
    )
    assert response.status_code == 429
    assert response.headers.get("X-Local-Deferral") == "deadline"
    assert local_deferral(response).reason == "deadline"


# -- urllib3's own loop: a cancelled wait keeps the response it waited after ------------


def test_stock_urllib3_cancelled_wait_keeps_the_503_and_its_retry_after(
    clock: FakeClock, server: ThrottleServer
) -> None:
    server.serve([Reply(503, {"Retry-After": "5"}, b"busy")])
    records: list[Any] = []
    pool = urllib3.PoolManager(retries=RetryAfterRetry(3, clock=clock, on_decision=records.append))
    cancel = threading.Event()
    cancel.set()

    with budget(cancel=cancel), pytest.raises(MaxRetryDeferred) as raised:
        pool.request("GET", f"{server.url}/busy")

    deferral = raised.value.deferral
    assert server.count() == 1
    assert deferral.reason == "cancelled"
    assert deferral.status == 503, f"the deferral lost the last response's status: {deferral.status!r}"
    assert deferral.retry_after == "5", f"the deferral lost its Retry-After: {deferral.retry_after!r}"
    assert deferral.attempts == 1
    assert records, "the on_decision hook was never called"
    assert (records[-1].action, records[-1].reason) == ("defer", "cancelled")
    assert [r.status for r in records] == [503] * len(records), (
        f"hook records lost the 503: {[(r.action, r.reason, r.status) for r in records]}"
    )
