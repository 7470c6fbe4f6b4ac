"""A wait that fits is waited, inside the SDKs too: the real OpenAI and Anthropic SDKs
(sync and async, on httpx2 and, for OpenAI, which takes one, on httpx) with the
transports mounted, against a loopback server that answers one 429 as the provider does
(``retry-after: 1``, ``retry-after-ms: 800``, its rate-limit fields) and then 200.

A chat call is a POST. The provider documents its 429 as a request refused before any
work on it (the SDKs themselves send any request again after one), so the transport
sends it again once the wait has passed: the call succeeds in about the server's wait,
nothing sent before it. A wait that does not fit stays a deferral, final inside the SDK
(``x-should-retry: false``). A 503 is no such promise: the transport does not replay the
POST, and leaves it to the SDK's own retry, which its admission holds until the
cooldown ends. Plain requests keep urllib3's rule (a POST is not replayed) unless the
caller opts in; a body read once as it is sent is never replayed.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    deferral_of,
)
from retry_after_adapter.cooldown import store_from_url

from ..servers import Reply, Seen, ThrottleServer

httpx = pytest.importorskip("httpx")
httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from retry_after_adapter import httpx as ra_httpx  # noqa: E402
from retry_after_adapter import httpx2 as ra_httpx2  # noqa: E402

#: The issue's policy: three retries, 10 s at most a wait, 20 s the whole call.
POLICY = {"total": 3, "max_wait": 10, "deadline": 20}

#: What each provider sends on a 429 besides its wait (a token limit hit; the request
#: limit not spent), as their docs show: OpenAI's Go durations, Anthropic's RFC 3339 times.
PROVIDER_FIELDS = {
    "openai": {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "800ms",
        "x-request-id": "req_0123456789",
    },
    "anthropic": {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:00Z",
        "request-id": "req_0123456789",
    },
}
ERROR_BODY = {
    "openai": {"error": {"message": "Rate limit reached", "type": "tokens", "code": "rate_limit_exceeded"}},
    "anthropic": {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}},
}
ANSWER = {
    "openai": {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
    },
    "anthropic": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
}
JSON = {"content-type": "application/json"}


def throttled(kind: str, status: int = 429, retry_after: str = "1", ms: str | None = "800") -> Reply:
    """The provider's ``status`` with its wait (``retry-after``, ``retry-after-ms``) and
    its rate-limit fields."""
    headers = {**JSON, **PROVIDER_FIELDS[kind], "retry-after": retry_after}
    if ms is not None:
        headers["retry-after-ms"] = ms
    return Reply(status, headers, json.dumps(ERROR_BODY[kind]).encode())


def answered(kind: str) -> Reply:
    return Reply(200, JSON, json.dumps(ANSWER[kind]).encode())


def sdk(kind: str, url: str, http: Any, asynchronous: bool) -> Any:
    """The SDK's client with its defaults (``max_retries=2``) on ``http``."""
    if kind == "openai":
        made = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return made(api_key="sk-test", base_url=url + "/v1", http_client=http)
    made = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    return made(api_key="sk-ant-test", base_url=url, http_client=http)


def http_client(flavour: str, asynchronous: bool, store_url: str | None = None) -> Any:
    """An httpx or httpx2 client with the transport mounted: :data:`POLICY`, a memory
    store of its own, or the store at ``store_url``."""
    module, ours = (httpx2, ra_httpx2) if flavour == "httpx2" else (httpx, ra_httpx)
    made = ours.AsyncRetryAfterTransport if asynchronous else ours.RetryAfterTransport
    store = MemoryCooldownStore() if store_url is None else store_from_url(store_url)
    transport = made(RetryAfterRetry(**POLICY), cooldown=store)
    return (module.AsyncClient if asynchronous else module.Client)(transport=transport)


def chat_call(
    kind: str, flavour: str, url: str, asynchronous: bool, store_url: str | None = None
) -> tuple[Any, float]:
    """One chat call (a POST) of the SDK through the transport: what it returned, or the
    exception it raised, and the seconds it took."""
    said = [{"role": "user", "content": "hi"}]

    def create(client: Any) -> Any:
        if kind == "openai":
            return client.chat.completions.create(model="m", messages=said, max_tokens=5)
        return client.messages.create(model="m", messages=said, max_tokens=5)

    async def run_async() -> Any:
        async with http_client(flavour, True, store_url) as http:
            return await create(sdk(kind, url, http, True))

    started = time.monotonic()
    try:
        if asynchronous:
            result = asyncio.run(run_async())
        else:
            with http_client(flavour, False, store_url) as http:
                result = create(sdk(kind, url, http, False))
    except Exception as error:  # returned for the test to judge
        result = error
    return result, time.monotonic() - started


def gap(seen: list[Seen]) -> float:
    """Seconds between the server's first two arrivals."""
    return (seen[1].at - seen[0].at).total_seconds()


def header(seen: Seen, name: str) -> str | None:
    return next((value for key, value in seen.headers.items() if key.lower() == name), None)


CLIENTS = [("openai", "httpx2"), ("openai", "httpx"), ("anthropic", "httpx2")]  # Anthropic's SDK takes httpx2 only


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("kind", "flavour"), CLIENTS)
def test_an_sdk_call_after_one_short_429_succeeds_in_the_servers_wait(
    real_server: ThrottleServer, kind: str, flavour: str, asynchronous: bool
) -> None:
    """The 429 says 0.8 s (``retry-after-ms``, agreeing with ``retry-after: 1``): the
    transport sends the same request again once 0.8 s have passed, and the SDK gets the
    answer (0.14.0: ``RateLimitError`` at once, the POST neither replayed nor retried).
    The SDK's own retry had no part in it: the second request is its first attempt."""
    real_server.serve([throttled(kind), answered(kind)])
    result, took = chat_call(kind, flavour, real_server.url, asynchronous)
    assert not isinstance(result, Exception), repr(result)
    seen = real_server.seen
    assert [s.method for s in seen] == ["POST", "POST"]
    assert gap(seen) >= 0.8, gap(seen)  # nothing sent before the wait ended
    assert took < 3.0, took  # about the server's wait (0.8 s; 3x what a loaded machine takes)
    assert seen[1].body == seen[0].body  # the same request, whole
    assert header(seen[1], "x-stainless-retry-count") == "0"  # replayed by the transport


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_replay_waits_out_the_cooldown_kept_in_a_shared_store(
    real_server: ThrottleServer, store_url: str, asynchronous: bool
) -> None:
    """The same on a SQLite file and on Redis (the async transport reaches them from
    its store threads): the 429's cooldown is stored, and the replay is admitted once
    it has ended."""
    real_server.serve([throttled("openai"), answered("openai")])
    result, took = chat_call("openai", "httpx2", real_server.url, asynchronous, store_url)
    assert not isinstance(result, Exception), repr(result)
    assert real_server.count() == 2 and gap(real_server.seen) >= 0.8, gap(real_server.seen)
    assert took < 3.0, took


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_429_whose_wait_does_not_fit_stays_a_deferral_final_inside_the_sdk(
    real_server: ThrottleServer, kind: str, asynchronous: bool
) -> None:
    """30 s is past ``max_wait=10``: ``RateLimitError`` at once, the deferral on it,
    ``x-should-retry: false`` (the SDK does not sleep and send again), one request."""
    real_server.serve([throttled(kind, retry_after="30", ms="30000"), answered(kind)])
    result, took = chat_call(kind, "httpx2", real_server.url, asynchronous)
    assert isinstance(result, (openai.RateLimitError, anthropic.RateLimitError)), repr(result)
    deferral = deferral_of(result)
    assert deferral is not None and deferral.reason == "max_wait" and 29 <= deferral.delay <= 30.5, deferral
    assert result.response.headers["x-should-retry"] == "false"
    assert took < 1.5, took
    assert real_server.count() == 1


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_posts_503_is_left_to_the_sdks_own_retry_which_admission_holds_to_the_cooldown(
    real_server: ThrottleServer, kind: str
) -> None:
    """A 503 is no "not processed" promise: the transport does not replay the POST. Its
    wait fits, so it is not made final either: the 503 goes back to the SDK without
    ``x-should-retry: false``, and the SDK's own retry (its first, after its backoff of
    0.375-0.5 s, since ``retry-after-ms: 0`` names no wait to the SDK) is held by the
    transport's admission until the 1 s cooldown the 503 set has ended (the SDK alone
    sends it about half a second early). 0.14.0: ``InternalServerError`` at once."""
    real_server.serve([throttled(kind, status=503, retry_after="1", ms="0"), answered(kind)])
    result, took = chat_call(kind, "httpx2", real_server.url, False)
    assert not isinstance(result, Exception), repr(result)
    seen = real_server.seen
    assert len(seen) == 2 and gap(seen) >= 1.0, [s.at for s in seen]
    assert header(seen[1], "x-stainless-retry-count") == "1"  # the SDK's own retry
    assert took < 3.5, took


# -- plain clients, on the test's FakeClock ----------------------------------------------------
def openai_429() -> Reply:
    return throttled("openai")


def sent_at(server: ThrottleServer) -> list[datetime]:
    return [seen.at for seen in server.seen]


def test_a_plain_requests_post_is_not_replayed(server: ThrottleServer, clock: FakeClock) -> None:
    """requests keeps urllib3's rule: the POST's 429 comes back at once (no wait), with
    the deferral that says when to send it again; one request."""
    server.serve([openai_429(), Reply(200)])
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, **POLICY), cooldown=MemoryCooldownStore()))
    response = session.post(server.url + "/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 429 and clock.sleeps == []
    assert response.deferral is not None and response.deferral.reason == "cooldown"
    assert server.count() == 1


def test_a_requests_post_is_replayed_when_the_caller_opts_in(server: ThrottleServer, clock: FakeClock) -> None:
    """``replay_unprocessed=True``: the same POST after the provider's 0.8 s."""
    server.serve([openai_429(), Reply(200)])
    session = requests.Session()
    adapter = RetryAfterAdapter(
        RetryAfterRetry(clock=clock, **POLICY), cooldown=MemoryCooldownStore(), replay_unprocessed=True
    )
    session.mount("http://", adapter)
    response = session.post(server.url + "/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 200 and response.deferral is None
    first, second = sent_at(server)
    assert (second - first).total_seconds() == pytest.approx(0.8)
    assert server.seen[0].body == server.seen[1].body


def test_a_requests_post_with_a_streamed_body_is_not_replayed_even_when_opted_in(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """A generator is read once as it is sent: nothing could send it again whole."""
    server.serve([openai_429(), Reply(200)])
    session = requests.Session()
    adapter = RetryAfterAdapter(
        RetryAfterRetry(clock=clock, **POLICY), cooldown=MemoryCooldownStore(), replay_unprocessed=True
    )
    session.mount("http://", adapter)
    response = session.post(server.url + "/v1/files", data=(part for part in (b"a", b"b")))
    assert response.status_code == 429 and server.count() == 1 and clock.sleeps == []


def test_a_urllib3_post_is_replayed_only_when_the_caller_opts_in(server: ThrottleServer, clock: FakeClock) -> None:
    for opted_in in (False, True):
        server.serve([openai_429(), Reply(200)])
        policy = RetryAfterRetry(clock=clock, **POLICY)
        with RetryAfterPoolManager(retries=policy, cooldown=MemoryCooldownStore(), replay_unprocessed=opted_in) as pool:
            response = pool.request("POST", server.url + "/v1/chat/completions", body=b'{"model": "m"}')
        assert response.status == (200 if opted_in else 429)
        assert server.count() == (2 if opted_in else 1)
        assert [seen.body for seen in server.seen] == [b'{"model": "m"}'] * server.count()


def plain_httpx2(clock: FakeClock, **options: Any) -> Any:
    transport = ra_httpx2.RetryAfterTransport(RetryAfterRetry(clock=clock, **POLICY), cooldown=MemoryCooldownStore(), **options)
    return httpx2.Client(transport=transport)


def test_the_httpx_transport_replays_a_provider_429_post_whole(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([openai_429(), Reply(200)])
    with plain_httpx2(clock) as http:
        response = http.post(server.url + "/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 200
    first, second = sent_at(server)
    assert (second - first).total_seconds() == pytest.approx(0.8)
    assert server.seen[1].body == server.seen[0].body == b'{"model":"m"}'


def test_the_httpx_transport_does_not_replay_when_told_not_to(server: ThrottleServer, clock: FakeClock) -> None:
    """``replay_unprocessed=False``: the 429 comes back, its wait fitting, so without
    ``x-should-retry: false`` (a library's own retry may wait it out and send)."""
    server.serve([openai_429(), Reply(200)])
    with plain_httpx2(clock, replay_unprocessed=False) as http:
        response = http.post(server.url + "/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 429 and server.count() == 1 and clock.sleeps == []
    assert response.deferral.reason == "cooldown" and "x-should-retry" not in response.headers


def test_the_httpx_transport_does_not_replay_a_streamed_body(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([openai_429(), Reply(200)])
    with plain_httpx2(clock) as http:
        response = http.post(server.url + "/v1/files", content=(part for part in (b"a", b"b")))
    assert response.status_code == 429 and server.count() == 1 and clock.sleeps == []


def test_a_429_of_another_api_is_not_replayed(server: ThrottleServer, clock: FakeClock) -> None:
    """No provider field, no promise: a 429 of any other API may have been half done."""
    server.serve([Reply(429, {"Retry-After": "1", "X-RateLimit-Remaining": "0", "request-id": "r"}), Reply(200)])
    with plain_httpx2(clock) as http:
        response = http.post(server.url + "/orders", json={"n": 1})
    assert response.status_code == 429 and server.count() == 1 and clock.sleeps == []
    assert "x-should-retry" not in response.headers  # fits: left to a retry of the caller's own


def test_a_server_saying_no_is_obeyed_on_a_provider_429(server: ThrottleServer, clock: FakeClock) -> None:
    reply = openai_429()
    reply.headers["x-should-retry"] = "false"
    server.serve([reply, Reply(200)])
    with plain_httpx2(clock) as http:
        response = http.post(server.url + "/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 429 and server.count() == 1 and clock.sleeps == []
