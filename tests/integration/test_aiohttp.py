"""The aiohttp middleware over real loopback sockets: the async promises the httpx
transport keeps (never early, defer instead of shorten, the deadline, cancellation,
idempotency, shared cooldowns and quotas), on the same engine and stores, with the
result shapes of the async httpx transport, and bodies sent again only when aiohttp
holds them whole."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

aiohttp = pytest.importorskip("aiohttp")

import requests  # noqa: E402

from retry_after_adapter import (  # noqa: E402
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    RetryDeferred,
    SQLiteCooldownStore,
    budget,
    deferral_of,
)
from retry_after_adapter.aiohttp import RetryAfterMiddleware  # noqa: E402
from retry_after_adapter.cooldown import store_from_url  # noqa: E402
from retry_after_adapter.errors import ConfigurationError  # noqa: E402
from retry_after_adapter.settings import LOCAL_HEADER  # noqa: E402
from retry_after_adapter.testing.server import QuotaServer  # noqa: E402

from ..servers import Reply, ThrottleServer  # noqa: E402


def middleware(clock: FakeClock | None = None, store: Any = None, **kw: Any) -> RetryAfterMiddleware:
    retry_kw = {k: kw.pop(k) for k in list(kw) if k in ("total", "max_wait", "deadline", "jitter")}
    retry_kw.setdefault("total", 3)
    retry = RetryAfterRetry(clock=clock, **retry_kw)
    return RetryAfterMiddleware(retry, cooldown=store if store is not None else MemoryCooldownStore(), **kw)


def session(clock: FakeClock | None = None, store: Any = None, **kw: Any) -> Any:
    return aiohttp.ClientSession(middlewares=(middleware(clock, store, **kw),))


# ---------------------------------------------------------------- waits: never early, never shortened


async def test_waits_on_the_fake_clock_without_sleeping_and_never_sends_early(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "30"}), Reply(200, body=b"ok")])
    started = time.monotonic()
    async with session(clock, jitter=0, max_wait=60) as client:
        async with client.get(server.url + "/a?token=secret") as response:
            assert response.status == 200 and await response.text() == "ok"
            assert deferral_of(response) is None and response.local is False
    assert clock.sleeps == [30.0]
    assert time.monotonic() - started < 2.0
    first, second = server.seen
    assert (second.at - first.at).total_seconds() >= 30.0


async def test_defers_with_the_response_and_its_body_instead_of_shortening(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(429, {"Retry-After": "90"}, b"spent")])
    async with session(clock, max_wait=5) as client:
        response = await client.get(server.url + "/a")
        assert response.status == 429 and await response.text() == "spent"
        assert deferral_of(response).reason == "max_wait" and deferral_of(response).delay == 90.0
        assert response.headers["x-should-retry"] == "false"  # an SDK's own loop ends here
        assert response.headers["Retry-After"] == "90" and response.local is False
        # Held back before sending: a local 429, the deferral as JSON.
        local = await client.get(server.url + "/b")
        assert local.status == 429 and local.local is True
        assert local.headers[LOCAL_HEADER] == "cooldown" and local.headers["x-should-retry"] == "false"
        assert int(local.headers["Retry-After"]) == 90
        body = await local.json()
        assert body["reason"] == "cooldown" and body == deferral_of(local).to_dict()
        assert await local.content.read() == await local.read()  # streamed or read: the same
        local.release()
    assert clock.sleeps == [] and server.count() == 1


async def test_raise_on_defer_raises_before_and_after_sending(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(429, {"Retry-After": "90"}, b"spent")])
    async with session(clock, max_wait=5, raise_on_defer=True) as client:
        with pytest.raises(RetryDeferred) as after:
            await client.get(server.url + "/a")
        assert await after.value.response.read() == b"spent"
        with pytest.raises(RetryDeferred) as before:
            await client.get(server.url + "/b")
    assert after.value.deferral.reason == "max_wait" and before.value.deferral.reason == "cooldown"
    assert before.value.response is None and server.count() == 1


async def test_a_transport_failure_raises_aiohttps_error_with_the_deferral(closed_port: int):
    async with session(FakeClock(), total=1, max_wait=0.1) as client:
        with pytest.raises(aiohttp.ClientConnectorError) as raised:
            await client.get(f"http://127.0.0.1:{closed_port}/x")
    assert deferral_of(raised.value) is not None


async def test_an_attempt_is_bounded_by_the_deadline(real_server: ThrottleServer):
    gate = threading.Event()
    real_server.serve([Reply(200, gate=gate)])
    started = time.monotonic()
    try:
        async with session(deadline=0.3, total=0) as client:
            with pytest.raises(asyncio.TimeoutError):
                await client.get(real_server.url + "/slow")
    finally:
        gate.set()
    assert time.monotonic() - started < 2.0


async def test_budget_is_per_task(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "10"}), Reply(200)])
    async with session(clock, jitter=0, max_wait=60) as client:
        tight_done, loose_done = asyncio.Event(), asyncio.Event()

        async def tight() -> Any:
            with budget(max_wait=1):
                response = await client.get(server.url + "/tight")  # the 503: deferred
                tight_done.set()
                await loose_done.wait()
                return response

        async def loose() -> Any:
            await tight_done.wait()
            try:
                return await client.get(server.url + "/loose")
            finally:
                loose_done.set()

        began = clock.monotonic()
        tight_response, loose_response = await asyncio.gather(tight(), loose())
    assert deferral_of(tight_response).reason == "max_wait"
    assert loose_response.status == 200 and server.count() == 2
    assert clock.monotonic() - began >= 10


# ---------------------------------------------------------------- cancellation


async def test_the_cancel_event_ends_a_wait_with_a_deferral(real_server: ThrottleServer):
    real_server.serve([Reply(503, {"Retry-After": "20"}), Reply(200)])
    cancel = asyncio.Event()
    async with session(max_wait=60, jitter=0) as client:

        async def call() -> Any:
            with budget(cancel=cancel):
                return await client.get(real_server.url + "/a")

        task = asyncio.create_task(call())
        await asyncio.sleep(0.2)
        cancel.set()
        response = await asyncio.wait_for(task, 2)
    assert deferral_of(response).reason == "cancelled"
    assert real_server.count() == 1


async def test_a_task_cancelled_while_it_waits_is_cancelled_at_once(real_server: ThrottleServer):
    real_server.serve([Reply(503, {"Retry-After": "30"}), Reply(200)])
    async with session(max_wait=60, jitter=0) as client:
        task = asyncio.create_task(client.get(real_server.url + "/a"))
        await asyncio.sleep(0.2)
        task.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.monotonic() - started < 1.0
    assert real_server.count() == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_task_cancelled_on_the_wire_gives_its_slot_back(kind: str, real_server: ThrottleServer, tmp_path: Path):
    gate = threading.Event()
    real_server.serve([Reply(200, gate=gate)])
    store = MemoryCooldownStore() if kind == "memory" else SQLiteCooldownStore(tmp_path / "slots.db")
    try:
        async with session(store=store, max_concurrency=1, max_wait=0) as client:
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
    assert after.status == 200  # the cancelled task's slot came back at once


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_the_slot_comes_back_once_the_body_is_read_or_released(
    kind: str, server: ThrottleServer, clock: FakeClock, tmp_path: Path
):
    store = MemoryCooldownStore() if kind == "memory" else SQLiteCooldownStore(tmp_path / "slots.db")
    # Larger than what aiohttp reads ahead: the connection is the call's until it is read.
    server.serve([Reply(200, body=b"x" * 4_000_000)])
    async with session(clock, store, max_concurrency=1, max_wait=0) as client:
        for _ in range(3):  # each call's slot back once its body was read
            # (a blocking store's release runs on the store's threads: a moment later)
            for _ in range(100):
                response = await client.get(server.url + "/a")
                if not response.local:
                    break
                response.release()
                await asyncio.sleep(0.01)
            assert len(await response.read()) == 4_000_000
        held = await client.get(server.url + "/open")  # its body unread: it holds the slot
        busy = await client.get(server.url + "/b")
        assert busy.local is True and busy.headers[LOCAL_HEADER] == "concurrency"
        held.release()
        for _ in range(100):  # a blocking store's release runs on the store's threads
            again = await client.get(server.url + "/c")
            if not again.local:
                break
            await asyncio.sleep(0.01)
        assert again.status == 200
        await again.read()
    assert server.count() == 5


async def test_no_thread_per_waiting_task(real_server: ThrottleServer, tmp_path: Path):
    real_server.serve([Reply(503, {"Retry-After": "30"})])
    before = threading.active_count()
    store = SQLiteCooldownStore(tmp_path / "waiting.db")
    mw = RetryAfterMiddleware(RetryAfterRetry(total=3, max_wait=60), cooldown=store)
    async with aiohttp.ClientSession(middlewares=(mw,)) as client:
        tasks = [asyncio.create_task(client.get(real_server.url + f"/w{i}")) for i in range(50)]
        await asyncio.sleep(0.5)
        waiting = threading.active_count() - before
        pool = mw._pool
        assert pool is not None
        queued = pool._work_queue.qsize()
        assert not any(task.done() for task in tasks)  # all 50 wait out the cooldown...
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    mw.close()
    assert queued == 0  # ...on the event loop: no store thread is held by a wait
    assert waiting <= 16  # the store's few threads, not one per waiting task


def test_no_store_operation_of_a_blocking_store_runs_on_the_event_loop(server: ThrottleServer, tmp_path: Path):
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    store = SQLiteCooldownStore(tmp_path / "shared.db")
    on_loop: list[str] = []

    async def main() -> int:
        mw = RetryAfterMiddleware(
            RetryAfterRetry(total=2, jitter=0, clock=FakeClock()),
            cooldown=store, quota=Quota(100, per=1.0), max_concurrency=4,
        )
        async with aiohttp.ClientSession(middlewares=(mw,)) as client:
            await (await client.get(server.url + "/warm")).read()
            loop_thread = threading.get_ident()
            guard = mw._plan.store  # the failure layer around the SQLite store
            for name in ("settle", "release", "get", "admit", "answer", "extend"):
                original = getattr(guard.inner, name, None)
                if original is None:
                    continue

                def watched(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                    if threading.get_ident() == loop_thread:
                        on_loop.append(_name)
                    return _original(*args, **kwargs)

                setattr(guard.inner, name, watched)
            async with client.get(server.url + "/x") as response:
                await response.read()
                status: int = response.status
        mw.close()
        return status

    assert asyncio.run(main()) == 200
    assert on_loop == []


# ---------------------------------------------------------------- idempotency and bodies


async def test_a_post_sent_is_not_sent_again(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "2"}), Reply(200)])
    async with session(clock, jitter=0, max_wait=60) as client:
        response = await client.post(server.url + "/p", data=b"once")
        assert response.status == 503 and deferral_of(response) is not None
    assert server.count() == 1 and clock.sleeps == []


@pytest.mark.parametrize(
    "body",
    [{"data": b"raw bytes"}, {"data": "a string"}, {"json": {"n": 1}}, {"data": {"field": "value"}}],
    ids=["bytes", "str", "json", "form"],
)
async def test_a_retried_request_sends_its_whole_body_again(server: ThrottleServer, clock: FakeClock, body: dict[str, Any]):
    server.serve([Reply(503, {"Retry-After": "2"}), Reply(429, {"Retry-After": "1"}), Reply(200)])
    async with session(clock, jitter=0, max_wait=60) as client:
        async with client.put(server.url + "/p", **body) as response:
            assert response.status == 200
    bodies = [seen.body for seen in server.seen]
    assert len(bodies) == 3 and bodies[0] and bodies[0] == bodies[1] == bodies[2]
    assert len({seen.headers.get("Content-Length") for seen in server.seen}) == 1
    assert clock.sleeps == [2.0, 1.0]


async def test_a_body_read_as_it_is_sent_is_never_replayed(server: ThrottleServer, clock: FakeClock, tmp_path: Path):
    # A PUT is idempotent, but its body is a file aiohttp reads as it sends it: the
    # answer's wait is deferred with the response, not spent on a replay that might send
    # what is left of the file, or nothing.
    path = tmp_path / "upload.bin"
    path.write_bytes(b"file body " * 100)
    server.serve([Reply(503, {"Retry-After": "2"}, b"later"), Reply(200)])
    async with session(clock, jitter=0, max_wait=60) as client:
        with path.open("rb") as upload:
            response = await client.put(server.url + "/f", data=upload)
        assert response.status == 503 and await response.text() == "later"
        assert deferral_of(response) is not None and deferral_of(response).delay == 2.0
        # A whole body on the same session is retried as before.
        async with client.put(server.url + "/b", data=b"whole") as again:
            assert again.status == 200
    assert [seen.body for seen in server.seen] == [b"file body " * 100, b"whole"]
    assert clock.sleeps == [2.0]  # the whole one waited out the cooldown the file's answer taught


async def test_an_unprocessed_429_post_is_replayed_with_its_body(server: ThrottleServer, clock: FakeClock):
    # OpenAI documents its 429 as not processed: a POST is sent again once the wait fits.
    server.serve([
        Reply(429, {"Retry-After": "1", "x-request-id": "req_1", "openai-processing-ms": "1"},
              b'{"error": {"type": "requests", "code": "rate_limit_exceeded"}}'),
        Reply(200, body=b"{}"),
    ])
    async with session(clock, jitter=0, max_wait=60) as client:
        async with client.post(server.url + "/v1/chat/completions", json={"q": 1}) as response:
            status = response.status
    if server.count() == 1:
        pytest.skip("the OpenAI dialect does not see this answer as OpenAI's")
    assert status == 200 and [seen.body for seen in server.seen] == [b'{"q": 1}'] * 2


# ---------------------------------------------------------------- shared cooldowns and quotas


@pytest.mark.parametrize("learner", ["requests", "aiohttp"])
async def test_a_cooldown_is_shared_with_a_requests_session_both_ways(
    learner: str, real_server: ThrottleServer, store_url: str
):
    real_server.serve([Reply(429, {"Retry-After": "60"}, b"spent")])
    retry = RetryAfterRetry(total=1, max_wait=0.1)
    http = requests.Session()
    http.mount("http://", RetryAfterAdapter(retry, cooldown=store_from_url(store_url)))
    mw = RetryAfterMiddleware(retry, cooldown=store_from_url(store_url))
    async with aiohttp.ClientSession(middlewares=(mw,)) as client:
        if learner == "requests":
            first = await asyncio.to_thread(http.get, real_server.url + "/learn", timeout=5)
            assert first.status_code == 429 and first.deferral.reason == "max_wait"
            answers = await asyncio.gather(*(client.get(real_server.url + "/later") for _ in range(20)))
            assert [(a.status, a.local, deferral_of(a).reason) for a in answers] == [(429, True, "cooldown")] * 20
        else:
            first = await client.get(real_server.url + "/learn")
            assert first.status == 429 and deferral_of(first).reason == "max_wait"
            later = await asyncio.to_thread(http.get, real_server.url + "/later", timeout=5)
            assert later.status_code == 429 and later.local is True and later.deferral.reason == "cooldown"
    mw.close()
    http.close()
    assert real_server.count() == 1  # the other front end sent nothing


async def test_a_quota_is_shared_with_a_requests_session(tmp_path: Path):
    db = tmp_path / "quota.db"
    quota = Quota(6, per=60)
    with QuotaServer(6, 60, align="first") as quota_server:
        http = requests.Session()
        adapter = RetryAfterAdapter(RetryAfterRetry(total=1, max_wait=0), cooldown=SQLiteCooldownStore(db), quota=quota)
        http.mount("http://", adapter)
        statuses = [http.get(quota_server.url + f"/r{i}", timeout=5).status_code for i in range(3)]
        mw = RetryAfterMiddleware(RetryAfterRetry(total=1, max_wait=0), cooldown=SQLiteCooldownStore(db), quota=quota)
        async with aiohttp.ClientSession(middlewares=(mw,)) as client:
            answers = await asyncio.gather(*(client.get(quota_server.url + f"/a{i}") for i in range(10)))
        mw.close()
        http.close()
        stats = quota_server.stats()
    assert statuses == [200] * 3
    assert sum(a.status == 200 for a in answers) == 3  # what the requests session left
    assert all(a.local and a.headers[LOCAL_HEADER] == "quota" for a in answers if a.status != 200)
    assert stats.requests == stats.ok == 6 and stats.early == 0


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_async_fleet_on_an_announced_quota_sends_nothing_early(kind: str, tmp_path: Path):
    store = MemoryCooldownStore() if kind == "memory" else SQLiteCooldownStore(tmp_path / "fleet.db")
    with QuotaServer(10, 30, quota_headers="ietf", align="first") as quota_server:
        mw = RetryAfterMiddleware(RetryAfterRetry(total=2, max_wait=0.2), cooldown=store)
        async with aiohttp.ClientSession(middlewares=(mw,)) as client:
            answers = await asyncio.gather(*(client.get(quota_server.url + f"/i{i}") for i in range(40)))
            for answer in answers:
                await answer.read()
        mw.close()
        stats = quota_server.stats()
    # 40 tasks at once on a new scope: one goes first (cold start), the announced quota
    # admits the next nine, and the other thirty defer without sending.
    assert sum(a.status == 200 for a in answers) == stats.ok == 10
    assert stats.early == 0 and stats.throttled <= 1
    assert all(a.status == 429 for a in answers if a.status != 200)
    assert sum(a.local for a in answers) == 40 - stats.requests >= 29


# ---------------------------------------------------------------- aiohttp's own ways


async def test_aiohttp_follows_a_redirect_through_the_middleware(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(307, {"Location": "/next"}), Reply(503, {"Retry-After": "3"}), Reply(200, body=b"there")])
    async with session(clock, jitter=0, max_wait=60) as client:
        async with client.get(server.url + "/a") as response:
            assert response.status == 200 and await response.text() == "there"
            assert len(response.history) == 1
    assert [seen.path for seen in server.seen] == ["/a", "/next", "/next"] and clock.sleeps == [3.0]


async def test_a_per_request_middleware_and_a_session_without_one(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    async with aiohttp.ClientSession() as client:
        mw = middleware(clock, jitter=0, max_wait=60)
        async with client.get(server.url + "/a", middlewares=(mw,)) as response:
            assert response.status == 200
    assert server.count() == 2


def test_options_are_checked_as_for_every_front_end():
    with pytest.raises(ConfigurationError, match="quoat"):
        RetryAfterMiddleware(3, quoat=Quota(1, per=1))  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError):
        RetryAfterMiddleware(-1)
    mw = RetryAfterMiddleware(3, max_concurrency=2)
    assert mw.max_concurrency == 2 and "RetryAfterMiddleware" in repr(mw)


async def test_the_deferral_names_no_secret(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(429, {"Retry-After": "90"})])
    async with session(clock, max_wait=1) as client:
        deferred = await client.get(server.url.replace("http://", "http://user:hunter2@") + "/a?key=sk-secret")
        local = await client.get(server.url + "/b?key=sk-secret")
    for response in (deferred, local):
        text = json.dumps(deferral_of(response).to_dict()) + repr(deferral_of(response))
        assert "hunter2" not in text and "sk-secret" not in text


async def test_cost_reads_the_json_body_aiohttp_holds(server: ThrottleServer, clock: FakeClock):
    from retry_after_adapter.cost import max_tokens

    server.serve([Reply(200, body=b"{}")])
    tokens = Quota(100, per=60, unit="tokens")
    async with session(clock, max_wait=0, quota=tokens, cost=max_tokens) as client:
        first = await client.post(server.url + "/v1/chat", json={"max_tokens": 60})
        second = await client.post(server.url + "/v1/chat", json={"max_tokens": 60})
    assert first.status == 200 and second.local is True
    assert deferral_of(second).reason == "quota" and server.count() == 1


@pytest.mark.redis
@pytest.mark.parametrize("store_failure", ["open", "closed"])
async def test_a_hung_redis_is_bounded_by_the_budget_and_never_blocks_the_loop(
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

    mw = RetryAfterMiddleware(RetryAfterRetry(total=3), cooldown=store, store_failure=store_failure)
    async with aiohttp.ClientSession(middlewares=(mw,)) as client:
        tick = asyncio.create_task(ticker())
        took, reasons = [], []
        for n in range(3):
            started, before = time.monotonic(), ticks
            with budget(deadline=0.3):
                response = await client.get(real_server.url)
                await response.read()
            took.append(time.monotonic() - started)
            reasons.append(deferral_of(response).reason)
            if n == 0:
                ticked = ticks - before
        tick.cancel()
    mw.close()
    assert max(took) <= 1.0, took  # the deadline (0.3 s), plus a loaded machine's scheduling
    assert took[1] < 0.2 and took[2] < 0.2, took  # the breaker spared the next ones (no 0.3 s wait)
    assert ticked >= 5, (ticked, took)  # the loop ran on while the first call waited on the store
    if store_failure == "open":
        assert reasons == ["deadline"] * 3 and real_server.count() == 1
    else:
        assert reasons == ["cooldown-unknown"] * 3 and real_server.count() == 0


def test_the_package_works_without_aiohttp():
    script = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "import retry_after_adapter, requests\n"
        "s = requests.Session(); s.mount('http://', retry_after_adapter.RetryAfterAdapter())\n"
        "try:\n"
        "    import retry_after_adapter.aiohttp\n"
        "except ImportError as e:\n"
        "    print('extra:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'retry_after_adapter[aiohttp]'" in done.stdout


async def test_a_reset_is_retried_for_a_get_and_raised_for_a_post(server: ThrottleServer, clock: FakeClock):
    server.serve([Reply(action="reset"), Reply(200, body=b"back")])
    async with session(clock, jitter=0, max_wait=60) as client:
        async with client.get(server.url + "/g") as response:
            assert response.status == 200 and await response.text() == "back"
        sent = server.count()
        server.serve([Reply(action="reset"), Reply(200)])  # (a new script: a new record)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.post(server.url + "/p", data=b"once")
    assert sent == 2  # the GET sent again once
    assert [seen.method for seen in server.seen] == ["POST"]  # a POST that may have been done: not again


async def test_a_quota_wait_that_fits_is_waited_and_one_that_does_not_is_deferred(server: ThrottleServer, clock: FakeClock):
    quota = Quota(2, per=10)
    async with session(clock, jitter=0, max_wait=60, quota=quota) as client:
        for i in range(6):
            async with client.get(server.url + f"/{i}") as response:
                assert response.status == 200 and response.local is False
        with budget(max_wait=5):  # the next permit is 10 s away
            held = await client.get(server.url + "/late")
    # Never more than two in any 10 s of the clock: the waits were taken, not shortened.
    times = [(seen.at - server.seen[0].at).total_seconds() for seen in server.seen]
    assert len(times) == 6 and all(later - earlier >= 10 for earlier, later in zip(times, times[2:]))
    assert len(clock.sleeps) == 2 and all(10 <= slept <= 10.5 for slept in clock.sleeps)
    assert held.local is True and held.headers[LOCAL_HEADER] == "quota" and deferral_of(held).reason == "quota"


async def test_redirect_hops_continue_one_call_and_its_deadline(server: ThrottleServer, clock: FakeClock):
    server.serve([
        Reply(503, {"Retry-After": "6"}), Reply(307, {"Location": "/next"}),
        Reply(503, {"Retry-After": "6"}, b"again"), Reply(200),
    ])  # fmt: skip
    async with session(clock, jitter=0, max_wait=60) as client:
        with budget(deadline=10):  # 6 s waited before the hop: another 6 s would end past it
            response = await client.get(server.url + "/a")
        assert response.status == 503 and await response.text() == "again"
        assert deferral_of(response).reason == "deadline" and deferral_of(response).attempts == 3
        # The next request of the same task is a call of its own.
        async with client.get(server.url + "/b") as fresh:
            assert fresh.status == 200
    assert [seen.path for seen in server.seen] == ["/a", "/a", "/next", "/b"]
