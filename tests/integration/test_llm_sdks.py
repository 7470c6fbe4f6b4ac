"""The OpenAI and Anthropic SDKs (on httpx2) with the httpx2 transports mounted, against
loopback stand-ins that answer as their APIs do (``QuotaServer(quota_headers="openai")``,
``"anthropic"``): a deferral is final inside the SDK's own retry loop, and
``deferral_of`` finds it on the SDK's exception."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from retry_after_adapter import MemoryCooldownStore, RetryAfterRetry, deferral_of  # noqa: E402
from retry_after_adapter.cost import max_tokens  # noqa: E402
from retry_after_adapter.httpx2 import AsyncRetryAfterTransport, RetryAfterTransport  # noqa: E402
from retry_after_adapter.testing.server import QuotaServer  # noqa: E402

SDKS = ["openai", "anthropic"]


def sdk_client(kind: str, url: str, http: Any) -> Any:
    """The SDK's client with its defaults (``max_retries=2``), on ``http``."""
    if kind == "openai":
        return openai.OpenAI(api_key="sk-test", base_url=url + "/v1", http_client=http)
    return anthropic.Anthropic(api_key="sk-ant-test", base_url=url, http_client=http)


def async_sdk_client(kind: str, url: str, http: Any) -> Any:
    if kind == "openai":
        return openai.AsyncOpenAI(api_key="sk-test", base_url=url + "/v1", http_client=http)
    return anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=url, http_client=http)


def chat(kind: str, client: Any, max_tokens: int) -> Any:
    """One chat call of the SDK's ``client`` (a POST) with ``max_tokens``."""
    said = [{"role": "user", "content": "hi"}]
    if kind == "openai":
        return client.chat.completions.create(model="m", messages=said, max_tokens=max_tokens)
    return client.messages.create(model="m", messages=said, max_tokens=max_tokens)


def in_threads(count: int, call: Any, timeout: float) -> list[float]:
    """``call()`` once in each of ``count`` threads started together; the seconds from
    the start at which each call ended (the calls that ended within ``timeout``)."""
    started = time.monotonic()
    done: list[float] = []

    def work() -> None:
        call()
        done.append(time.monotonic() - started)

    threads = [threading.Thread(target=work) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return done


def rate_limit_error(kind: str) -> type[Exception]:
    module: Any = openai if kind == "openai" else anthropic
    return module.RateLimitError  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", SDKS)
def test_a_servers_429_deferred_is_final_inside_the_sdks_retry_loop(kind: str) -> None:
    """A 429 whose wait (about 10 s) does not fit ``max_wait=1``: the SDK alone would
    sleep it and send again (its ``max_retries=2``); with the transport it raises
    ``RateLimitError`` at once, one request at the server, and the deferral is on the
    exception. The next call is deferred before sending (a local 429), raised the same
    way."""
    with QuotaServer(1, 10, align="first") as server:  # a 429 with Retry-After, nothing announced
        transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=1), cooldown=MemoryCooldownStore())
        with httpx2.Client(transport=transport) as http:
            client = sdk_client(kind, server.url, http)
            http.get(server.url + "/v1/models")  # the quota's one request
            started = time.monotonic()
            with pytest.raises(rate_limit_error(kind)) as raised:
                client.models.list()
            took = time.monotonic() - started
            deferral = deferral_of(raised.value)
            assert deferral is not None and deferral.reason == "max_wait", deferral
            assert raised.value.response.headers["x-should-retry"] == "false"
            assert took < 3.0, took  # not the SDK's sleep of about 10 s
            assert server.stats().requests == 2
            with pytest.raises(rate_limit_error(kind)) as local:
                client.models.list()
            assert deferral_of(local.value) is not None and local.value.response.local is True
            assert server.stats().requests == 2  # nothing sent inside the cooldown
            assert server.stats().early == 0


@pytest.mark.parametrize("kind", SDKS)
def test_a_chat_calls_429_is_final_inside_the_sdk_with_its_deferral(kind: str) -> None:
    """A chat call is a POST, not replayed after a 429 that carries none of the
    provider's fields (it promises nothing): the server's 429 (about 10 s, past
    ``max_wait=1``) comes back deferred until the cooldown it set ends,
    ``x-should-retry: false``, so the SDK raises ``RateLimitError`` at once (alone it
    sleeps the 10 s, twice), one request at the server, and the deferral says when to
    resubmit. (With the provider's fields and a wait that fits, it is replayed:
    ``test_sdk_replay.py``.)"""
    with QuotaServer(1, 10, align="first") as server:  # a 429 with Retry-After, nothing announced
        transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=1), cooldown=MemoryCooldownStore())
        with httpx2.Client(transport=transport) as http:
            http.get(server.url + "/v1/models")  # the quota's one request
            client = sdk_client(kind, server.url, http)
            started = time.monotonic()
            with pytest.raises(rate_limit_error(kind)) as raised:
                chat(kind, client, 5)
            took = time.monotonic() - started
        deferral = deferral_of(raised.value)
        assert deferral is not None and deferral.reason == "cooldown" and deferral.delay > 5, deferral
        assert raised.value.response.headers["x-should-retry"] == "false"
        assert took < 1.0, took
        assert server.stats().requests == 2 and server.stats().early == 0


@pytest.mark.parametrize("kind", SDKS)
def test_an_announced_spent_quota_defers_before_sending(kind: str) -> None:
    """The provider's headers say no request is left until the reset: the next call
    raises ``RateLimitError`` at once without reaching the server."""
    with QuotaServer(1, 10, align="first", quota_headers=kind) as server:
        transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=1), cooldown=MemoryCooldownStore())
        with httpx2.Client(transport=transport) as http:
            client = sdk_client(kind, server.url, http)
            client.models.list()  # answered "0 left" until the reset
            started = time.monotonic()
            with pytest.raises(rate_limit_error(kind)) as raised:
                client.models.list()
            assert time.monotonic() - started < 3.0
            deferral = deferral_of(raised.value)
            assert deferral is not None and raised.value.response.local is True
            # The bucket's one request comes back in 10 s (``10s`` read at its latest,
            # 11 s; Anthropic's time measured from the whole-second Date), + the margin.
            assert 8.0 < deferral.delay <= 12.1, deferral.delay
        assert server.stats().requests == 1


@pytest.mark.parametrize("kind", SDKS)
def test_the_async_sdk_gets_the_deferral_at_once_too(kind: str) -> None:
    async def main(url: str) -> tuple[Exception, float]:
        transport = AsyncRetryAfterTransport(RetryAfterRetry(total=3, max_wait=1), cooldown=MemoryCooldownStore())
        async with httpx2.AsyncClient(transport=transport) as http:
            client = async_sdk_client(kind, url, http)
            await http.get(url + "/v1/models")  # the quota's one request
            started = time.monotonic()
            try:
                await client.models.list()
            except rate_limit_error(kind) as error:
                return error, time.monotonic() - started
            raise AssertionError("the second call was not deferred")

    with QuotaServer(1, 10, align="first") as server:
        error, took = asyncio.run(main(server.url))
        assert deferral_of(error) is not None and took < 3.0, took
        assert server.stats().requests == 2


@pytest.mark.parametrize("kind", SDKS)
def test_a_fleet_of_threads_on_one_sdk_client_keeps_to_the_announced_quota(kind: str) -> None:
    """8 threads, one SDK client with its defaults, a stand-in allowing 3 requests per
    1 s and announcing it in the provider's headers: every call done, nothing sent
    inside a cooldown the server announced, and few 429s (the SDK alone: one per thread
    that finds the quota spent: 7 of 15 requests)."""
    with QuotaServer(3, 1, align="first", quota_headers=kind) as server:
        transport = RetryAfterTransport(RetryAfterRetry(total=5, max_wait=10), cooldown=MemoryCooldownStore())
        with httpx2.Client(transport=transport) as http:
            client = sdk_client(kind, server.url, http)
            done = in_threads(8, client.models.list, 30)
        stats = server.stats()
        assert len(done) == 8 and stats.ok == 8
        assert stats.early == 0
        assert stats.throttled <= 1, stats  # the SDKs alone: 7


@pytest.mark.parametrize("kind", SDKS)
def test_sdk_threads_keep_to_the_announced_token_allowance(kind: str) -> None:
    """Six threads on one SDK client with its defaults, each chat call costing 10 of the
    25 tokens per 3 s the stand-in announces in the provider's headers (and 100
    requests), ``cost=max_tokens``: every call done, none sent inside a cooldown the
    server announced, at most one 429, and no slower than the tokens allow (two calls
    per window: the last of three windows starts 6 s in)."""
    with QuotaServer(100, 3, align="first", quota_headers=kind, tokens=25) as server:
        transport = RetryAfterTransport(
            RetryAfterRetry(total=5, max_wait=10), cooldown=MemoryCooldownStore(), cost=max_tokens
        )
        with httpx2.Client(transport=transport) as http:
            client = sdk_client(kind, server.url, http)
            done = in_threads(6, lambda: chat(kind, client, 10), 60)
        stats = server.stats()
    assert len(done) == 6 and stats.ok == 6, stats
    assert stats.early == 0 and stats.throttled <= 1, stats
    assert max(done) < 6.0 + 3.0, done  # the ideal is 6 s: within one window of it


@pytest.mark.parametrize("kind", SDKS)
def test_twenty_tasks_on_one_async_sdk_client_keep_to_the_announced_quota(kind: str) -> None:
    """20 asyncio tasks, one async SDK client with its defaults, a stand-in allowing 10
    requests per 2 s and announcing it in the provider's headers: every call done,
    nothing sent inside a cooldown the server announced, at most one 429. (A window of
    2 s, not 1: Anthropic's resets are times measured against a ``Date`` truncated to
    the second, so two windows' resets 1 s apart cannot be told from one window's.)"""

    async def main(url: str) -> list[Any]:
        transport = AsyncRetryAfterTransport(RetryAfterRetry(total=5, max_wait=10), cooldown=MemoryCooldownStore())
        async with httpx2.AsyncClient(transport=transport) as http:
            client = async_sdk_client(kind, url, http)
            return await asyncio.wait_for(asyncio.gather(*(client.models.list() for _ in range(20))), 60)

    with QuotaServer(10, 2, align="first", quota_headers=kind) as server:
        answers = asyncio.run(main(server.url))
        stats = server.stats()
    assert len(answers) == 20 and stats.ok == 20, stats
    assert stats.early == 0, stats
    assert stats.throttled <= 1, stats


SDK_WORKER = r"""
import json, sys, threading, time
import httpx2
from retry_after_adapter import RetryAfterRetry
from retry_after_adapter.cooldown import store_from_url
from retry_after_adapter.httpx2 import RetryAfterTransport

from retry_after_adapter.cost import max_tokens

kind, url, store_url, threads, start_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
cost = int(sys.argv[6]) if len(sys.argv) > 6 else 0  # > 0: chat calls of that max_tokens, cost=max_tokens
options = {"cost": max_tokens} if cost else {}
transport = RetryAfterTransport(RetryAfterRetry(total=5, max_wait=10), cooldown=store_from_url(store_url), **options)
http = httpx2.Client(transport=transport)
said = [{"role": "user", "content": "hi"}]
if kind == "openai":
    import openai
    client = openai.OpenAI(api_key="sk-test", base_url=url + "/v1", http_client=http)
    chat = lambda: client.chat.completions.create(model="m", messages=said, max_tokens=cost)
else:
    import anthropic
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=url, http_client=http)
    chat = lambda: client.messages.create(model="m", messages=said, max_tokens=cost)
done, failed = [], []

def work():
    try:
        chat() if cost else client.models.list()
        done.append(1)
    except Exception as exc:  # reported, not hidden: the test asserts none
        failed.append(type(exc).__name__)

workers = [threading.Thread(target=work) for _ in range(threads)]
time.sleep(max(0.0, min(5.0, start_at - time.time())))  # every process starts together
for t in workers:
    t.start()
for t in workers:
    t.join(30)
print(json.dumps({"done": len(done), "failed": failed}))
"""


@pytest.mark.parametrize("kind", SDKS)
def test_sdk_clients_in_four_processes_share_the_announced_quota_through_the_store(
    kind: str, store_url: str
) -> None:
    """Four processes, each an SDK client with its defaults and two threads, one shared
    store (a SQLite file, or Redis), a stand-in allowing 3 requests per 2 s and
    announcing it in the provider's headers: every call done, nothing sent inside a
    cooldown the server announced, and at most one 429 between them. (Each process on
    a store of its own meets the spent quota it cannot see: 3-5 429s.)"""
    with QuotaServer(3, 2, align="first", quota_headers=kind) as server:
        stats = four_processes(server, kind, store_url)
    assert stats.early == 0, stats
    assert stats.throttled <= 1, stats


@pytest.mark.parametrize("kind", SDKS)
def test_sdk_clients_in_four_processes_share_the_announced_token_allowance(kind: str, store_url: str) -> None:
    """The same fleet making chat calls of ``max_tokens=10`` with ``cost=max_tokens``,
    the stand-in allowing 25 tokens per 3 s (and 100 requests) and announcing both:
    every call done, none early, at most one 429 between them."""
    with QuotaServer(100, 3, align="first", quota_headers=kind, tokens=25) as server:
        stats = four_processes(server, kind, store_url, cost=10)
    assert stats.early == 0 and stats.throttled <= 1, stats


def four_processes(server: QuotaServer, kind: str, store_url: str, cost: int = 0) -> Any:
    """Four processes of :data:`SDK_WORKER`, two threads each, one call a thread, started
    together: asserts every call done (one 200 each), returns the server's stats."""
    start_at = str(time.time() + 2.0)  # past the processes' imports, on a loaded machine too
    command = [sys.executable, "-c", SDK_WORKER, kind, server.url, store_url, "2", start_at, str(cost)]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for process in running:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    stats = server.stats()
    assert [r["failed"] for r in results] == [[]] * 4, results
    assert sum(r["done"] for r in results) == 8 and stats.ok == 8, (results, stats)
    return stats


# -- a provider's bucket: refilled continuously, its reset the time to the full refill ------------
def four_threads_of_six_chats(kind: str, server: QuotaServer) -> tuple[list[float], list[Any], float]:
    """4 threads x 6 chat calls of one SDK client (its defaults) through the transport
    with ``max_wait=3``: the seconds from the start each call ended, what raised (with
    its deferral), and the seconds from the first to the last 200 at the server."""
    transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=3), cooldown=MemoryCooldownStore())
    raised: list[Any] = []
    with httpx2.Client(transport=transport) as http:
        client = sdk_client(kind, server.url, http)

        def six() -> None:
            for _ in range(6):
                try:
                    chat(kind, client, 5)
                except Exception as exc:  # reported, not hidden: the test asserts none
                    raised.append((type(exc).__name__, deferral_of(exc)))

        done = in_threads(4, six, 60)
    oks = [row[2] for row in server.log if row[4] == 200]
    return done, raised, max(oks) - min(oks)


@pytest.mark.parametrize("kind", SDKS)
def test_sdk_calls_keep_to_a_bucket_refilled_continuously_at_its_pace(kind: str) -> None:
    """The provider's limit of 10 requests refills at 2 a second, and its reset says the
    time until it is full (OpenAI: a Go duration up to ``5s``; Anthropic: a time): read
    as a bucket, nothing left means the next request in about half a second, not in 5 s
    (> ``max_wait``). So no call raises (before: 14 of 24 raised ``RateLimitError`` at
    once), no 429 (each would end its POST), and the 14 past the bucket's 10 go at
    about its pace: 7 s (measured: OpenAI 7.5-8.1 s; Anthropic, its times read against
    whole-second ``Date``s, 7.7-9.9 s)."""
    with QuotaServer(10, 5, align="first", quota_headers=kind) as server:
        done, raised, spread = four_threads_of_six_chats(kind, server)
        stats = server.stats()
    assert raised == [] and len(done) == 4, raised
    assert stats.ok == 24 and stats.throttled <= 1 and stats.early == 0, stats
    assert spread >= 14 / 2 - 0.5, spread  # never faster than the bucket refills
    assert spread <= 14 / 2 / 0.5, spread  # about its pace (a loaded machine: half of it)


def test_a_newcomers_bucket_announcing_six_minutes_to_full_is_paced_not_deferred() -> None:
    """A stand-in of 1440 requests refilling one every 0.25 s, announcing the time to its
    full refill in whole seconds (``5m59s``, ``6m0s``), 4 left at the start: the next
    request after (359 + 1) / 1440 s, not six minutes (before: 20 of 24 raised). Every
    call goes, at the bucket's pace: 20 refills in 5 s."""
    with QuotaServer(1440, 360, align="first", quota_headers="openai", reset_precision=1, filled=4) as server:
        done, raised, spread = four_threads_of_six_chats("openai", server)
        stats = server.stats()
    assert raised == [] and len(done) == 4, raised
    assert stats.ok == 24 and stats.throttled <= 1 and stats.early == 0, stats
    assert 20 * 0.25 - 0.25 <= spread <= 20 * 0.25 / 0.6, spread
