"""The httpx transports, sync and async, over real loopback sockets: the same policy,
deferrals, result shape and stores as the requests adapter, on the same engine. Every
test runs on each installed flavour: httpx (``retry_after_adapter.httpx``) and httpx2
(``retry_after_adapter.httpx2``), one implementation."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

FLAVOURS = [name for name in ("httpx", "httpx2") if importlib.util.find_spec(name) is not None]
if not FLAVOURS:
    pytest.skip("neither httpx nor httpx2 is installed", allow_module_level=True)

from retry_after_adapter import (  # noqa: E402
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterRetry,
    RetryDeferred,
    SQLiteCooldownStore,
    budget,
    deferral_of,
)
from retry_after_adapter.cooldown import store_from_url  # noqa: E402
from retry_after_adapter.settings import LOCAL_HEADER  # noqa: E402
from retry_after_adapter.testing.server import QuotaServer  # noqa: E402

from ..servers import Reply, ThrottleServer  # noqa: E402

# The flavour's module and transports, set for each test by ``flavour``.
httpx: Any = None
RetryAfterTransport: Any = None
AsyncRetryAfterTransport: Any = None


@pytest.fixture(autouse=True, params=FLAVOURS)
def flavour(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on one flavour: ``httpx`` and the transports here are its own."""
    name: str = request.param
    transports = importlib.import_module(f"retry_after_adapter.{name}")
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "httpx", importlib.import_module(name))
    monkeypatch.setattr(here, "RetryAfterTransport", transports.RetryAfterTransport)
    monkeypatch.setattr(here, "AsyncRetryAfterTransport", transports.AsyncRetryAfterTransport)
    return name


def sync_client(clock: FakeClock | None = None, store: Any = None, **kw: Any) -> httpx.Client:
    retry_kw = {k: kw.pop(k) for k in list(kw) if k in ("total", "max_wait", "deadline", "jitter")}
    retry_kw.setdefault("total", 3)
    retry = RetryAfterRetry(clock=clock, **retry_kw)
    transport = RetryAfterTransport(retry, cooldown=store if store is not None else MemoryCooldownStore(), **kw)
    return httpx.Client(transport=transport)


def async_client(clock: FakeClock | None = None, store: Any = None, **kw: Any) -> httpx.AsyncClient:
    retry_kw = {k: kw.pop(k) for k in list(kw) if k in ("total", "max_wait", "deadline", "jitter")}
    retry_kw.setdefault("total", 3)
    retry = RetryAfterRetry(clock=clock, **retry_kw)
    store = store if store is not None else MemoryCooldownStore()
    return httpx.AsyncClient(transport=AsyncRetryAfterTransport(retry, cooldown=store, **kw))


# ---------------------------------------------------------------- synchronous


def test_sync_waits_out_a_retry_after_on_the_clock_and_never_sends_early(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(429, {"Retry-After": "7"}, b"slow down"), Reply(200, body=b"done")])
    with sync_client(clock, jitter=0) as client:
        response = client.get(server.url + "/a?token=secret")
    assert response.status_code == 200 and response.text == "done"
    assert deferral_of(response) is None
    assert clock.sleeps == [7.0]
    first, second = server.seen
    assert (second.at - first.at).total_seconds() >= 7.0


def test_sync_defers_with_the_response_and_its_body_when_the_wait_does_not_fit(
    server: ThrottleServer, clock: FakeClock
):
    server.serve([Reply(429, {"Retry-After": "120"}, b"quota spent")])
    with sync_client(clock, max_wait=5) as client:
        response = client.get(server.url + "/a?token=secret")
        deferral = deferral_of(response)
        assert response.status_code == 429 and response.text == "quota spent"
        assert deferral is not None and deferral.reason == "max_wait"
        assert deferral.delay == pytest.approx(120, abs=1)
        assert "secret" not in json.dumps(deferral.to_dict())
        # The next call of the scope is deferred before sending: a local 429.
        local = client.get(server.url + "/b")
    assert server.count() == 1
    assert local.status_code == 429 and local.local is True
    assert local.headers[LOCAL_HEADER] == "cooldown"
    assert int(local.headers["Retry-After"]) >= 119
    assert json.loads(local.content)["reason"] == "cooldown"
    assert deferral_of(local) is not None and deferral_of(local).reason == "cooldown"
    assert clock.sleeps == []


def test_sync_raise_on_defer(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "60"}, b"later")])
    with sync_client(clock, max_wait=1, raise_on_defer=True) as client:
        with pytest.raises(RetryDeferred) as raised:
            client.get(server.url + "/a")
    assert raised.value.deferral.reason == "max_wait"
    assert raised.value.response.status_code == 503


def test_sync_transport_failure_raises_httpx_error_carrying_the_deferral(closed_port: int):
    clock = FakeClock()
    with sync_client(clock, total=2, max_wait=0.1) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            client.get(f"http://127.0.0.1:{closed_port}/x")
    deferral = deferral_of(raised.value)
    assert deferral is not None and deferral.reason in ("max_wait", "attempts")
    assert deferral.attempts >= 1


def test_sync_retries_a_connect_failure_then_gives_the_last_error_when_out_of_attempts(closed_port: int):
    clock = FakeClock()
    with sync_client(clock, total=2, max_wait=60, jitter=0) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            client.get(f"http://127.0.0.1:{closed_port}/x")
    deferral = deferral_of(raised.value)
    assert deferral is not None and deferral.reason == "attempts"
    assert deferral.attempts == 3  # the first and two retries, then the last error


def test_sync_non_idempotent_method_is_not_retried_after_it_was_sent(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "1"}, b"busy"), Reply(200)])
    with sync_client(clock) as client:
        response = client.post(server.url + "/order", content=b"x")
    assert response.status_code == 503
    assert server.count() == 1


def test_sync_redirect_hops_continue_one_call(server: ThrottleServer, clock: FakeClock):
    server.serve(
        [
            Reply(429, {"Retry-After": "2"}),
            Reply(302, {"Location": "/next"}),
            Reply(429, {"Retry-After": "3"}),
            Reply(200, body=b"there"),
        ]
    )
    with sync_client(clock, total=5, jitter=0) as client:
        response = client.get(server.url + "/start", follow_redirects=True)
    assert response.status_code == 200 and response.text == "there"
    assert [s.path for s in server.seen] == ["/start", "/start", "/next", "/next"]
    assert clock.sleeps == [2.0, 3.0]


def test_sync_an_attempt_is_bounded_by_the_deadline(real_server: ThrottleServer):
    gate = threading.Event()
    real_server.serve([Reply(200, gate=gate)])
    started = time.monotonic()
    try:
        with sync_client(deadline=0.3, total=0) as client, pytest.raises(httpx.ReadTimeout):
            client.get(real_server.url + "/slow", timeout=30)
    finally:
        gate.set()
    assert time.monotonic() - started < 2.0


def test_sync_concurrency_slot_given_back_when_the_body_is_read(server: ThrottleServer, clock: FakeClock):
    store = MemoryCooldownStore()
    server.serve([Reply(200, body=b"x" * 1000)])
    with sync_client(clock, store, max_concurrency=1, max_wait=0) as client:
        for _ in range(3):  # each call's slot back once its body was read
            assert client.get(server.url + "/a").status_code == 200
        with client.stream("GET", server.url + "/a") as streamed:
            held = client.get(server.url + "/b")  # the streamed one holds the one slot
            assert held.status_code == 429 and held.local is True
            assert held.headers[LOCAL_HEADER] == "concurrency"
            streamed.read()
        assert client.get(server.url + "/c").status_code == 200
    assert server.count() == 5


def test_sync_a_deferred_redirect_is_read_and_gives_its_slot_back(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(302, {"Location": "/next", "Retry-After": "100"}, b"moved"), Reply(200)])
    with sync_client(clock, MemoryCooldownStore(), max_concurrency=1, max_wait=1) as client:
        with pytest.raises(RetryDeferred) as raised:
            client.get(server.url + "/a", follow_redirects=True)
        assert raised.value.response.read() == b"moved"  # read here, kept readable
        assert client.get(server.url + "/b").status_code == 200  # the one slot is free


@pytest.mark.parametrize("sync", [True, False])
async def test_a_deferred_response_is_a_whole_httpx_response(server: ThrottleServer, clock: FakeClock, sync: bool):
    server.serve([Reply(429, {"Retry-After": "120"}, b"spent")])
    if sync:
        with sync_client(clock, max_wait=5) as client:
            response = client.get(server.url + "/a")
    else:
        async with async_client(clock, max_wait=5) as aclient:
            response = await aclient.get(server.url + "/a")
    assert response.text == "spent" and deferral_of(response) is not None
    assert response.elapsed.total_seconds() >= 0  # read and closed by the client, as its own
    assert response.is_closed


def test_sync_transport_with_mounts_and_shared_quota(server: ThrottleServer, clock: FakeClock):
    store = MemoryCooldownStore()
    server.serve([Reply(200)])
    transport = RetryAfterTransport(
        RetryAfterRetry(total=2, max_wait=0, clock=clock), cooldown=store, quota=Quota(2, per=60)
    )
    with httpx.Client(mounts={"http://": transport}) as client:
        statuses = [client.get(server.url + "/q").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert server.count() == 2


# ---------------------------------------------------------------- async


async def test_async_waits_on_the_fake_clock_without_sleeping(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "30"}), Reply(200, body=b"ok")])
    started = time.monotonic()
    async with async_client(clock, jitter=0, max_wait=60) as client:
        response = await client.get(server.url + "/a")
    assert response.status_code == 200 and response.text == "ok"
    assert clock.sleeps == [30.0]
    assert time.monotonic() - started < 2.0
    first, second = server.seen
    assert (second.at - first.at).total_seconds() >= 30.0


async def test_async_defers_after_and_before_sending(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(429, {"Retry-After": "90"}, b"spent")])
    async with async_client(clock, max_wait=5) as client:
        response = await client.get(server.url + "/a")
        local = await client.get(server.url + "/b")
    assert response.status_code == 429 and response.text == "spent"
    assert deferral_of(response).reason == "max_wait"
    assert local.local is True and deferral_of(local).reason == "cooldown"
    assert server.count() == 1


async def test_async_transport_failure_raises_httpx_error_with_deferral(closed_port: int):
    async with async_client(FakeClock(), total=1, max_wait=0.1) as client:
        with pytest.raises(httpx.ConnectError) as raised:
            await client.get(f"http://127.0.0.1:{closed_port}/x")
    assert deferral_of(raised.value) is not None


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_async_fleet_of_tasks_sends_nothing_early(kind: str, tmp_path: Path):
    store = MemoryCooldownStore() if kind == "memory" else SQLiteCooldownStore(tmp_path / "fleet.db")
    # Windows from the first request: an epoch-aligned window could roll over during the
    # test and rightly admit an eleventh request.
    with QuotaServer(10, 30, quota_headers="ietf", align="first") as quota_server:
        async with async_client(store=store, total=2, max_wait=0.2) as client:
            responses = await asyncio.gather(*(client.get(quota_server.url + f"/i{i}") for i in range(40)))
        stats = quota_server.stats()
    # 40 tasks at once on a new scope: one goes first (cold start), the announced quota
    # admits the next nine, and the other thirty defer without sending.
    assert sum(r.status_code == 200 for r in responses) == stats.ok == 10
    assert stats.early == 0 and stats.throttled <= 2
    assert all(r.status_code == 429 for r in responses if r.status_code != 200)
    assert sum(getattr(r, "local", False) for r in responses) == 40 - stats.requests >= 28


async def test_async_budget_is_per_task(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "10"}), Reply(200)])
    async with async_client(clock, jitter=0, max_wait=60) as client:
        tight_done, loose_done = asyncio.Event(), asyncio.Event()

        async def tight() -> Any:
            with budget(max_wait=1):
                response = await client.get(server.url + "/tight")  # the 503: deferred
                tight_done.set()
                await loose_done.wait()  # its budget stays open while the other call runs
                return response

        async def loose() -> Any:
            await tight_done.wait()  # the 503 is the tight call's (the server answers in order)
            try:
                return await client.get(server.url + "/loose")
            finally:
                loose_done.set()

        began = clock.monotonic()
        tight_response, loose_response = await asyncio.gather(tight(), loose())
    assert deferral_of(tight_response) is not None and deferral_of(tight_response).reason == "max_wait"
    # The other task's call had no budget(): it waited the cooldown out on the clock.
    assert loose_response.status_code == 200 and server.count() == 2
    assert clock.monotonic() - began >= 10


async def test_async_cancel_event_ends_a_wait_with_a_deferral(real_server: ThrottleServer):
    real_server.serve([Reply(503, {"Retry-After": "20"}), Reply(200)])
    cancel = asyncio.Event()
    async with async_client(max_wait=60, jitter=0) as client:

        async def call() -> Any:
            with budget(cancel=cancel):
                return await client.get(real_server.url + "/a")

        task = asyncio.create_task(call())
        await asyncio.sleep(0.2)
        cancel.set()
        response = await asyncio.wait_for(task, 2)
    assert deferral_of(response).reason == "cancelled"
    assert real_server.count() == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_async_cancelled_task_propagates_and_gives_its_slot_back(
    kind: str, real_server: ThrottleServer, tmp_path: Path
):
    gate = threading.Event()
    real_server.serve([Reply(200, gate=gate)])
    store = MemoryCooldownStore() if kind == "memory" else SQLiteCooldownStore(tmp_path / "slots.db")
    try:
        async with async_client(store=store, max_concurrency=1, max_wait=0) as client:
            task = asyncio.create_task(client.get(real_server.url + "/hang"))
            for _ in range(100):  # until the attempt is on the wire, holding the one slot
                await asyncio.sleep(0.01)
                if real_server.count():
                    break
            busy = await client.get(real_server.url + "/busy")
            assert busy.local is True and busy.headers[LOCAL_HEADER] == "concurrency"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()
            after = await client.get(real_server.url + "/after")
    finally:
        gate.set()
    assert after.status_code == 200  # the cancelled task's slot came back at once


async def test_async_cancelled_while_waiting_propagates(real_server: ThrottleServer):
    real_server.serve([Reply(503, {"Retry-After": "30"}), Reply(200)])
    async with async_client(max_wait=60, jitter=0) as client:
        task = asyncio.create_task(client.get(real_server.url + "/a"))
        await asyncio.sleep(0.2)
        task.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.monotonic() - started < 1.0
    assert real_server.count() == 1


async def test_async_no_thread_per_waiting_task(real_server: ThrottleServer, tmp_path: Path):
    # Every answer is a 503 with Retry-After: 30 (a task that raced the first one to the
    # server gets its own and waits too), so every task is waiting half a second later.
    real_server.serve([Reply(503, {"Retry-After": "30"})])
    before = threading.active_count()
    store = SQLiteCooldownStore(tmp_path / "waiting.db")
    transport = AsyncRetryAfterTransport(RetryAfterRetry(total=3, max_wait=60), cooldown=store)
    async with httpx.AsyncClient(transport=transport) as client:
        tasks = [asyncio.create_task(client.get(real_server.url + f"/w{i}")) for i in range(50)]
        await asyncio.sleep(0.5)
        waiting = threading.active_count() - before
        pool = transport._pool
        assert pool is not None
        queued = pool._work_queue.qsize()  # steps waiting for a store thread
        assert not any(task.done() for task in tasks)  # all 50 wait out the cooldown...
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert queued == 0  # ...on the event loop: no store thread is held by a wait
    assert waiting <= 16  # the store's few threads, not one per waiting task


async def test_async_hooks_see_the_tasks_context_on_the_store_threads(server: ThrottleServer, clock: FakeClock, tmp_path: Path):
    import contextvars

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="<unset>")
    seen: list[tuple[str, str]] = []

    def hook(record: Any) -> None:
        seen.append((request_id.get(), threading.current_thread().name))

    server.serve([Reply(503, {"Retry-After": "2"}), Reply(200)])
    store = SQLiteCooldownStore(tmp_path / "context.db")
    retry = RetryAfterRetry(total=3, max_wait=60, jitter=0, clock=clock)
    transport = AsyncRetryAfterTransport(retry, cooldown=store, on_decision=hook)
    async with httpx.AsyncClient(transport=transport) as client:
        request_id.set("req-42")
        assert (await client.get(server.url + "/a")).status_code == 200
    assert seen and all(value == "req-42" for value, _ in seen)
    assert any(name.startswith("retry-after-store") for _, name in seen)  # judged on a store thread


@pytest.mark.redis
@pytest.mark.parametrize("store_failure", ["open", "closed"])
async def test_async_hung_redis_is_bounded_by_the_budget_and_the_breaker_without_blocking_the_loop(
    black_hole: int, real_server: ThrottleServer, store_failure: str
):
    from retry_after_adapter import RedisCooldownStore

    store = RedisCooldownStore.from_url(f"redis://127.0.0.1:{black_hole}/0")
    real_server.serve([Reply(429, {"Retry-After": "1"})])
    ticks = 0

    async def ticker() -> None:  # runs only while the event loop is free
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    transport = AsyncRetryAfterTransport(RetryAfterRetry(total=3), cooldown=store, store_failure=store_failure)
    async with httpx.AsyncClient(transport=transport) as client:
        tick = asyncio.create_task(ticker())
        took, reasons = [], []
        for n in range(3):
            started, before = time.monotonic(), ticks
            with budget(deadline=0.3):
                response = await client.get(real_server.url)
            took.append(time.monotonic() - started)
            reasons.append(deferral_of(response).reason)
            if n == 0:
                ticked = ticks - before
        tick.cancel()
    # The budget's promise: the deadline plus 50 ms of scheduling. Not three times the
    # first call's time (about 0.1 s: the black hole's reply timeout, 0.13 s with both
    # cores busy), which would let a call overrun its 0.3 s deadline by 90 ms unseen.
    assert max(took) <= 0.35, took
    assert took[1] < 0.05 and took[2] < 0.05, took  # the breaker spared the next ones
    # The loop ran on while the first call waited on the store (about 0.1 s: some 10
    # ticks of 10 ms on an idle machine, 4 with every core busy; a blocked loop gives
    # none).
    assert ticked >= 2, (ticked, took)
    if store_failure == "open":
        assert reasons == ["deadline"] * 3 and real_server.count() == 1
    else:
        assert reasons == ["cooldown-unknown"] * 3 and real_server.count() == 0


# ---------------------------------------------------------------- across processes and clients

REQUESTS_WORKER = r"""
import json, sys
import requests
from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown import store_from_url
url, store_url = sys.argv[1], sys.argv[2]
session = requests.Session()
session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=1, max_wait=0.1), cooldown=store_from_url(store_url)))
response = session.get(url, timeout=5)
print(json.dumps({"status": response.status_code, "reason": response.deferral.reason if response.deferral else None}))
"""

ASYNC_WORKER = r"""
import asyncio, json, sys
import httpx
from retry_after_adapter import RetryAfterRetry
from retry_after_adapter.cooldown import store_from_url
from retry_after_adapter.httpx import AsyncRetryAfterTransport
url, store_url = sys.argv[1], sys.argv[2]
async def main():
    transport = AsyncRetryAfterTransport(RetryAfterRetry(total=1, max_wait=0.1), cooldown=store_from_url(store_url))
    async with httpx.AsyncClient(transport=transport) as client:
        responses = await asyncio.gather(*(client.get(url) for _ in range(20)))
    print(json.dumps([[r.status_code, r.local, r.deferral.reason if r.deferral else None] for r in responses]))
asyncio.run(main())
"""


def test_a_requests_worker_learns_a_429_and_an_async_httpx_worker_defers_before_sending(
    real_server: ThrottleServer, store_url: str, flavour: str
):
    real_server.serve([Reply(429, {"Retry-After": "60"}, b"spent")])

    def worker(script: str, path: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-c", script, real_server.url + path, store_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = worker(REQUESTS_WORKER, "/learn")
    assert first == {"status": 429, "reason": "max_wait"}
    answers = worker(ASYNC_WORKER.replace("httpx", flavour), "/later")
    assert answers == [[429, True, "cooldown"]] * 20
    assert real_server.count() == 1  # the httpx worker sent nothing
    assert store_from_url(store_url).get(_scope(real_server.url)) is not None


def _scope(url: str) -> str:
    return url.rstrip("/")


# ---------------------------------------------------------------- users' own test tools


def test_respx_sees_one_attempt_at_a_time(clock: FakeClock, flavour: str):
    if flavour != "httpx":
        pytest.skip("respx mocks httpx's transports only")
    respx = pytest.importorskip("respx")
    with respx.mock(assert_all_called=True) as mock:
        route = mock.get("http://api.test/a").mock(
            side_effect=[httpx.Response(429, headers={"Retry-After": "4"}), httpx.Response(200, text="ok")]
        )
        with sync_client(clock, jitter=0) as client:
            response = client.get("http://api.test/a")
    assert response.status_code == 200
    assert route.call_count == 2
    assert clock.sleeps == [4.0]


async def test_pytest_httpx_sees_one_attempt_at_a_time(request: pytest.FixtureRequest, fake_clock: FakeClock, flavour: str):
    if flavour != "httpx":
        pytest.skip("pytest-httpx mocks httpx's transports only")
    pytest.importorskip("pytest_httpx", reason="pytest-httpx has no release for this httpx line")
    httpx_mock: Any = request.getfixturevalue("httpx_mock")
    httpx_mock.add_response(url="http://api.test/b", status_code=503, headers={"Retry-After": "3"})
    httpx_mock.add_response(url="http://api.test/b", status_code=200, text="ok")
    async with async_client(fake_clock, jitter=0) as client:
        response = await client.get("http://api.test/b")
    assert response.status_code == 200
    assert len(httpx_mock.get_requests()) == 2
    assert fake_clock.sleeps == [3.0]


def test_the_package_works_without_the_flavour(flavour: str):
    script = (
        f"import sys; sys.modules[{flavour!r}] = None\n"
        "import retry_after_adapter, requests\n"
        "s = requests.Session(); s.mount('http://', retry_after_adapter.RetryAfterAdapter())\n"
        "try:\n"
        f"    import retry_after_adapter.{flavour}\n"
        "except ImportError as e:\n"
        "    print('extra:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"pip install 'retry_after_adapter[{flavour}]'" in done.stdout


def test_the_transports_are_the_flavours_own(server: ThrottleServer, clock: FakeClock, flavour: str):
    """Each flavour's transports subclass that flavour's base classes and hand back its
    own responses, local ones included (no alias of one module for the other)."""
    assert isinstance(RetryAfterTransport(), httpx.BaseTransport)
    assert isinstance(AsyncRetryAfterTransport(), httpx.AsyncBaseTransport)
    assert RetryAfterTransport.__module__ == f"retry_after_adapter.{flavour}"
    server.serve([Reply(429, {"Retry-After": "120"}, b"spent")])
    with sync_client(clock, max_wait=5) as client:
        sent = client.get(server.url + "/a")
        local = client.get(server.url + "/b")
    assert type(sent) is httpx.Response and type(local) is httpx.Response
    assert type(sent).__module__.split(".")[0] == flavour
    assert local.local is True and deferral_of(local) is not None and server.count() == 1


def test_no_store_operation_of_a_blocking_store_runs_on_the_event_loop(server: ThrottleServer, tmp_path: Path):
    """With SQLite, a quota and a cap, every store operation of an async call runs on
    the transport's store threads, never on the event loop's thread: also when a
    cooldown learned meanwhile (by another task) holds back an admitted attempt and
    what it took is given back."""
    from datetime import datetime, timedelta, timezone

    server.serve([Reply(200)])
    store = SQLiteCooldownStore(tmp_path / "shared.db")
    on_loop: list[str] = []

    async def main() -> int:
        transport = AsyncRetryAfterTransport(
            RetryAfterRetry(total=2), cooldown=store, quota=Quota(100, per=1.0), max_concurrency=4
        )
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(server.url + "/warm")
            loop_thread = threading.get_ident()
            guard = transport._plan.store
            for name in ("settle", "release", "get", "admit", "answer"):
                original = getattr(guard.inner, name)

                def watched(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                    if threading.get_ident() == loop_thread:
                        on_loop.append(_name)
                    return _original(*args, **kwargs)

                setattr(guard.inner, name, watched)
            admit = guard.admit
            first = [True]

            def admit_then_learn(ask: Any, budget: Any = None) -> Any:
                answer = admit(ask, budget)
                if first[0] and answer.not_before is None:  # another task learns a 429 meanwhile
                    first[0] = False
                    guard.local.extend(ask.scope, datetime.now(timezone.utc) + timedelta(seconds=0.2))
                return answer

            guard.admit = admit_then_learn
            response = await client.get(server.url + "/x")
            assert not first[0], "the cooldown was never learned meanwhile"
            return response.status_code

    assert asyncio.run(main()) == 200
    assert on_loop == []
