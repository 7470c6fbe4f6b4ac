"""Gemini's 429 names its wait in its JSON body (``google.rpc.RetryInfo``), not in a
field. The recorded exchanges replayed by a loopback server through a real
``requests.Session`` (on a FakeClock), the httpx transports, and the real GenAI SDK
(``google.genai.Client`` with ``HttpOptions(httpx_client=..., httpx_async_client=...)``,
on the real clock): the wait is waited when it fits, defers and is shared by every client
of the store when it does not, keyed on the model (and on the project for a quota of
the whole project), never on the API key; the body is read only on a 429, bounded, and
stays readable."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    deferral_of,
)
from retry_after_adapter.cooldown import store_from_url

from ..conftest import local_deferral
from ..servers import ENDLESS_BYTES, Body, Reply, Seen, ThrottleServer
from ..unit.dialect_corpus import GEMINI_GENERATE, GEMINI_HEADERS, RECEIVED_AT, Exchange, exchange, gemini_429

httpx = pytest.importorskip("httpx")
httpx2 = pytest.importorskip("httpx2")
genai = pytest.importorskip("google.genai")

from google.genai import errors as genai_errors  # noqa: E402
from google.genai import types as genai_types  # noqa: E402

from retry_after_adapter import httpx as ra_httpx  # noqa: E402
from retry_after_adapter import httpx2 as ra_httpx2  # noqa: E402

#: The API key the SDK sends (``x-goog-api-key``): never in a scope, a deferral or a log.
API_KEY = "AIzaT0k3n-gemini-never-shown"
OTHER_MODEL = "/v1beta/models/gemini-2.5-pro:generateContent"
ANSWER = {"candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"}, "finishReason": "STOP"}]}
JSON = {"Content-Type": "application/json; charset=UTF-8"}


def at(seconds: float) -> Any:
    return RECEIVED_AT + timedelta(seconds=seconds)


def reply(case: Exchange) -> Reply:
    return Reply(case.status, dict(case.headers), case.body)


def ok() -> Reply:
    return Reply(200, JSON, json.dumps(ANSWER).encode())


def throttled(retry_delay: str = "1.2s", **more: Any) -> Reply:
    return Reply(429, dict(GEMINI_HEADERS), gemini_429(retry_delay, **more))


def session(clock: FakeClock, store: Any, **kw: Any) -> requests.Session:
    """A session whose POSTs a quota refusal says were not processed are replayed."""
    kw.setdefault("total", 2)
    kw.setdefault("max_wait", 1)
    options = {"replay_unprocessed": kw.pop("replay_unprocessed", True)}
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, **kw), cooldown=store, **options))
    return s


def generate(s: requests.Session, server: ThrottleServer, path: str = GEMINI_GENERATE) -> Any:
    case = exchange("gemini-429-per-model")
    return s.post(server.url + path, headers=case.request, data=b'{"contents": []}', timeout=5)


# -- the recorded exchanges, through requests on a FakeClock ---------------------------------
@pytest.mark.clock_start(RECEIVED_AT)
def test_a_wait_that_does_not_fit_defers_and_holds_back_the_model_for_every_client(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    server.serve([reply(exchange("gemini-429-per-model")), ok()])
    first = generate(session(clock, store), server)  # max_wait 1: 37.5 s does not fit
    deferral = deferral_of(first)
    assert first.status_code == 429 and deferral is not None
    assert deferral.reason == "max_wait" and deferral.eligible_at == at(37.5) and deferral.delay == 37.5
    assert deferral.retry_after == "37.5s"
    assert deferral.scope == f"http://127.0.0.1:{server.port}|gemini:gemini-2.0-flash"
    assert first.json()["error"]["status"] == "RESOURCE_EXHAUSTED"  # the body kept, readable
    second = local_deferral(generate(session(clock, store), server))  # another client: nothing sent
    assert second.reason == "cooldown" and second.eligible_at == at(37.5)
    assert server.count() == 1
    other = generate(session(clock, store), server, OTHER_MODEL)  # another model's quota: sent
    assert other.status_code == 200 and server.count() == 2


@pytest.mark.clock_start(RECEIVED_AT)
def test_a_wait_that_fits_is_waited_exactly_and_the_post_replayed(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([reply(exchange("gemini-429-per-model")), ok()])
    response = generate(session(clock, MemoryCooldownStore(), max_wait=60), server)
    assert response.status_code == 200 and deferral_of(response) is None
    assert clock.sleeps == [pytest.approx(37.5)]
    assert [seen.at for seen in server.seen] == [RECEIVED_AT, at(37.5)]
    assert server.seen[1].body == server.seen[0].body


@pytest.mark.clock_start(RECEIVED_AT)
def test_without_replay_unprocessed_a_post_is_returned_with_its_deferral(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """requests keeps urllib3's rule unless the caller opts in: the POST comes back with a
    deferral until the cooldown ends, and the next call is held until then."""
    store = MemoryCooldownStore()
    server.serve([reply(exchange("gemini-429-per-model")), ok()])
    first = generate(session(clock, store, max_wait=60, replay_unprocessed=False), server)
    assert first.status_code == 429 and deferral_of(first).reason == "cooldown"
    assert deferral_of(first).eligible_at == at(37.5) and server.count() == 1


@pytest.mark.clock_start(RECEIVED_AT)
def test_a_quota_of_the_whole_project_holds_back_every_model(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([reply(exchange("gemini-429-project")), ok()])
    first = generate(session(clock, store), server)  # 2 s: does not fit max_wait 1
    assert deferral_of(first).reason == "max_wait" and deferral_of(first).eligible_at == at(2)
    other = local_deferral(generate(session(clock, store), server, OTHER_MODEL))
    assert other.reason == "cooldown" and other.eligible_at == at(2) and server.count() == 1


@pytest.mark.clock_start(RECEIVED_AT)
@pytest.mark.parametrize("delay", ["37.5", "-1s", "1e3s", "2 s", "PT2S", "1.1234567891s"])
def test_a_malformed_retry_delay_stops_as_an_invalid_retry_after(
    server: ThrottleServer, clock: FakeClock, delay: str
) -> None:
    server.serve([throttled(delay), ok()])
    response = generate(session(clock, MemoryCooldownStore(), max_wait=60, allowed_methods=None), server)
    assert response.status_code == 429 and response.stop_reason == "invalid_retry_after"
    assert server.count() == 1 and clock.sleeps == []
    assert response.json()["error"]["code"] == 429


@pytest.mark.clock_start(RECEIVED_AT)
def test_a_malformed_retry_delay_backs_off_when_asked(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([throttled("soon"), ok()])
    s = session(
        clock, MemoryCooldownStore(), max_wait=60, on_invalid="backoff", backoff_factor=0.5, allowed_methods=None
    )
    assert generate(s, server).status_code == 200 and server.count() == 2


@pytest.mark.clock_start(RECEIVED_AT)
def test_a_retry_delay_past_max_retry_after_is_not_obeyed(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([throttled("90000s"), ok()])  # past the default bound of a day
    response = generate(session(clock, store, max_wait=60, allowed_methods=None), server)
    assert response.status_code == 429 and response.stop_reason == "retry_after_too_long"
    assert generate(session(clock, store), server).status_code == 200  # nothing learned


@pytest.mark.clock_start(RECEIVED_AT)
def test_the_api_key_in_the_query_is_never_in_a_scope_deferral_or_log(
    server: ThrottleServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="retry_after_adapter")
    server.serve([throttled("30s"), ok()])
    s = session(clock, MemoryCooldownStore())
    response = s.post(f"{server.url}{GEMINI_GENERATE}?key={API_KEY}", data=b"{}", timeout=5)
    held = s.post(f"{server.url}{GEMINI_GENERATE}?key={API_KEY}", data=b"{}", timeout=5)
    ours = "".join(r.getMessage() for r in caplog.records if r.name.startswith("retry_after_adapter"))
    assert "defer" in ours and API_KEY not in ours and API_KEY not in held.text
    text = json.dumps(deferral_of(response).to_dict())
    assert deferral_of(response).scope.endswith("|gemini:gemini-2.0-flash") and API_KEY not in text
    assert "AIza" not in text


# -- the body: nothing read on a 200, bounded on a 429 ---------------------------------------
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_200_is_handed_over_unread_and_a_429_read_and_still_readable(
    real_server: ThrottleServer, asynchronous: bool
) -> None:
    real_server.serve([ok(), throttled("30s")])
    url = real_server.url + GEMINI_GENERATE

    async def run_async() -> tuple[Any, Any]:
        async with httpx2.AsyncClient(transport=ra_httpx2.AsyncRetryAfterTransport(RetryAfterRetry(max_wait=1))) as c:
            first = await c.send(c.build_request("POST", url, content=b"{}"), stream=True)
            unread = not first.is_stream_consumed and not isinstance(first.stream, httpx2.ByteStream)
            await first.aclose()
            second = await c.send(c.build_request("POST", url, content=b"{}"), stream=True)
            await second.aread()
            return unread, second

    if asynchronous:
        unread, second = asyncio.run(run_async())
    else:
        with httpx2.Client(transport=ra_httpx2.RetryAfterTransport(RetryAfterRetry(max_wait=1))) as c:
            first = c.send(c.build_request("POST", url, content=b"{}"), stream=True)
            unread = not first.is_stream_consumed and not isinstance(first.stream, httpx2.ByteStream)
            first.close()
            second = c.send(c.build_request("POST", url, content=b"{}"), stream=True)
            second.read()
    assert unread  # the 200's body streamed to the caller as it came: not read here
    assert second.status_code == 429 and second.json() == json.loads(gemini_429("30s"))
    assert deferral_of(second).delay == 30.0


def test_an_endless_json_429_is_read_only_up_to_max_retry_body(body_server: Any) -> None:
    server = body_server(lambda index, path: Body(status=429, headers={"Content-Type": "application/json"}))
    bound = 64 * 1024
    started = time.monotonic()
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0, max_retry_body=bound, clock=FakeClock())))
    response = s.post(server.url + GEMINI_GENERATE, data=b"{}", timeout=5)
    took = time.monotonic() - started
    assert response.status_code == 429 and len(response.content) <= bound
    assert took < 3.0, took
    assert server.wait_done(3.0)
    sent = server.snapshot()[0][1]
    assert sent < ENDLESS_BYTES // 4, sent  # dropped, not drained


@pytest.mark.parametrize("front", ["requests", "httpx2"])
def test_a_trickling_json_429_is_read_only_within_the_calls_time(body_server: Any, front: str) -> None:
    """One byte every 50 ms, never ending: the 429 is read while the call has time
    (``deadline=1``), then its connection dropped; the call is over in about a second."""
    server = body_server(lambda index, path: Body(status=429, headers=JSON, kind="trickle"))
    url = server.url + GEMINI_GENERATE
    retry = RetryAfterRetry(total=2, deadline=1.0, raise_on_status=False)
    started = time.monotonic()
    if front == "requests":
        s = requests.Session()
        s.mount("http://", RetryAfterAdapter(retry))
        response = s.post(url, data=b"{}", timeout=5)
        content = response.content
    else:
        with httpx2.Client(transport=ra_httpx2.RetryAfterTransport(retry)) as c:
            response = c.post(url, content=b"{}", timeout=5)
            content = response.content
    took = time.monotonic() - started
    assert response.status_code == 429 and took < 2.0, took  # 1.0 s and a loaded machine's slack
    assert set(content) <= {ord("x")} and len(content) <= 2.0 / 0.05 + 10
    assert server.wait_done(1.0), server.snapshot()


# -- the GenAI SDK ----------------------------------------------------------------------------
def client(url: str, transport: Any, asynchronous: bool, flavour: str = "httpx2") -> Any:
    """``google.genai.Client`` on an httpx or httpx2 client with ``transport`` mounted."""
    module = httpx2 if flavour == "httpx2" else httpx
    if asynchronous:
        options = genai_types.HttpOptions(base_url=url, httpx_async_client=module.AsyncClient(transport=transport))
    else:
        options = genai_types.HttpOptions(base_url=url, httpx_client=module.Client(transport=transport))
    return genai.Client(api_key=API_KEY, http_options=options)


def transport(asynchronous: bool, store: Any, flavour: str = "httpx2", **policy: Any) -> Any:
    ours = ra_httpx2 if flavour == "httpx2" else ra_httpx
    made = ours.AsyncRetryAfterTransport if asynchronous else ours.RetryAfterTransport
    return made(RetryAfterRetry(**{"total": 3, "max_wait": 10, **policy}), cooldown=store)


def sdk_call(url: str, made: Any, asynchronous: bool, flavour: str = "httpx2", model: str = "gemini-2.0-flash") -> Any:
    """One ``generate_content`` (a POST): its answer, or the exception raised."""
    sdk = client(url, made, asynchronous, flavour)
    try:
        if asynchronous:
            return asyncio.run(sdk.aio.models.generate_content(model=model, contents="hi"))
        return sdk.models.generate_content(model=model, contents="hi")
    except Exception as error:  # judged by the test
        return error


def gap(seen: list[Seen]) -> float:
    return (seen[1].at - seen[0].at).total_seconds()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
def test_the_sdk_call_after_a_429_of_1_2_s_succeeds_in_that_wait(
    real_server: ThrottleServer, asynchronous: bool, flavour: str
) -> None:
    """0.14.0: ``ClientError`` at once (the SDK retries nothing by default). Now the
    transport waits RetryInfo's 1.2 s and sends the POST again; the SDK gets the answer."""
    real_server.serve([throttled("1.2s"), ok()])
    started = time.monotonic()
    result = sdk_call(real_server.url, transport(asynchronous, MemoryCooldownStore(), flavour), asynchronous, flavour)
    took = time.monotonic() - started
    assert not isinstance(result, Exception), repr(result)
    assert result.text == "hi"
    seen = real_server.seen
    assert [s.method for s in seen] == ["POST", "POST"] and seen[1].body == seen[0].body
    assert 1.2 <= gap(seen) <= 1.25 + 0.1, gap(seen)  # 1.2 s to within 50 ms (and a loaded machine's slack)
    assert took < 4.0, took


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_wait_that_does_not_fit_is_a_clear_error_and_every_client_of_the_store_holds_back(
    real_server: ThrottleServer, store_url: str, asynchronous: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    real_server.serve([throttled("1.2s"), ok()])
    made = transport(asynchronous, store_from_url(store_url), max_wait=0.5)
    error = sdk_call(real_server.url, made, asynchronous)
    assert isinstance(error, genai_errors.ClientError), repr(error)
    assert error.code == 429 and error.status == "RESOURCE_EXHAUSTED"  # the server's own error
    deferral = deferral_of(error)
    assert deferral is not None and deferral.reason == "max_wait" and deferral.retry_after == "1.2s"
    assert deferral.scope.endswith("|gemini:gemini-2.0-flash") and real_server.count() == 1
    # Another transport of the same store (the other flavour of call), then a requests Session.
    other = sdk_call(
        real_server.url, transport(not asynchronous, store_from_url(store_url), max_wait=0.5), not asynchronous
    )
    assert isinstance(other, genai_errors.ClientError), repr(other)
    assert other.code == 429 and other.status == "RESOURCE_EXHAUSTED"
    assert other.message.startswith("deferred before sending (cooldown)")
    held = deferral_of(other)
    answered = real_server.seen[0].at + timedelta(seconds=1.2)  # the 429's arrival and its wait
    assert held is not None and held.reason == "cooldown" and held.eligible_at >= answered
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(max_wait=0.1), cooldown=store_from_url(store_url)))
    plain = local_deferral(
        s.post(
            real_server.url + "/v1beta/models/gemini-2.0-flash:generateContent",
            data=b"{}",
            headers={"x-goog-api-key": API_KEY},  # a Google client's request, made with requests
        )
    )
    assert plain.reason == "cooldown" and plain.eligible_at >= answered
    assert real_server.count() == 1  # nobody sent into the quota
    text = caplog.text + json.dumps([d.to_dict() for d in (deferral, held, plain)]) + str(other)
    assert API_KEY not in text and "AIza" not in text


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_429_that_is_no_quota_refusal_is_not_replayed(real_server: ThrottleServer, asynchronous: bool) -> None:
    """A 429 whose body is not RESOURCE_EXHAUSTED promises nothing: the POST is not sent
    again; the SDK raises the server's error, its deferral on it."""
    body = json.loads(gemini_429("0.3s"))
    body["error"]["status"] = "UNAVAILABLE"
    real_server.serve([Reply(429, dict(GEMINI_HEADERS), json.dumps(body).encode()), ok()])
    error = sdk_call(real_server.url, transport(asynchronous, MemoryCooldownStore()), asynchronous)
    assert isinstance(error, genai_errors.ClientError), repr(error)
    assert deferral_of(error).reason == "cooldown" and real_server.count() == 1


def test_the_quota_servers_gemini_stand_in_names_its_wait_in_the_body() -> None:
    from retry_after_adapter.dialects import google_rpc_error
    from retry_after_adapter.testing import QuotaServer

    with QuotaServer(1, 30, align="first", quota_headers="gemini") as stand_in, requests.Session() as plain:
        url = stand_in.url + GEMINI_GENERATE
        first = plain.post(url, data=b"{}", timeout=5)
        assert first.status_code == 200 and first.json() == {
            "candidates": [{"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP"}]
        }
        second = plain.post(url, data=b"{}", timeout=5)
        assert second.status_code == 429 and "Retry-After" not in second.headers
        found = google_rpc_error(second.content)
        assert found is not None and found.quota_refused and found.models == ("gemini-2.0-flash",)
        assert found.delay is not None and 25 < found.delay <= 30
        assert stand_in.announcements[-1].until >= stand_in.arrivals[-1].at + timedelta(seconds=found.delay - 0.001)


def test_scope_credential_keeps_two_api_keys_apart_and_never_shows_them(server: ThrottleServer) -> None:
    """Gemini's quotas are per project; an API key is a project's: ``scope="credential"``
    keys on its hash (the key itself nowhere)."""
    clock = FakeClock()
    store = MemoryCooldownStore()
    server.serve([throttled("30s"), ok()])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, max_wait=1), cooldown=store, scope="credential"))
    url = server.url + GEMINI_GENERATE
    first = s.post(url, headers={"x-goog-api-key": API_KEY}, data=b"{}", timeout=5)
    scope = deferral_of(first).scope
    assert scope.startswith(f"http://127.0.0.1:{server.port}|sha256:") and scope.endswith("|gemini:gemini-2.0-flash")
    assert API_KEY not in scope
    assert local_deferral(s.post(url, headers={"x-goog-api-key": API_KEY}, data=b"{}", timeout=5)).reason == "cooldown"
    other_project = s.post(url, headers={"x-goog-api-key": "AIzaOther-project-key"}, data=b"{}", timeout=5)
    assert other_project.status_code == 200 and server.count() == 2


@pytest.mark.clock_start(RECEIVED_AT)
def test_a_violation_naming_another_model_holds_that_model_too(server: ThrottleServer, clock: FakeClock) -> None:
    """An alias (``gemini-flash-latest``) counted against the model it names."""
    store = MemoryCooldownStore()
    server.serve([throttled("30s", model="gemini-2.0-flash"), ok()])
    alias = "/v1beta/models/gemini-flash-latest:generateContent"
    assert deferral_of(generate(session(clock, store), server, alias)).scope.endswith("|gemini:gemini-flash-latest")
    held = local_deferral(generate(session(clock, store), server))  # gemini-2.0-flash
    assert held.reason == "cooldown" and held.eligible_at == at(30) and server.count() == 1


def test_a_streamed_sdk_call_waits_the_429_and_streams_the_answer(real_server: ThrottleServer) -> None:
    """``generate_content_stream`` (server-sent events, ``?alt=sse``): the 429 before the
    stream is waited and the stream then read as the SDK reads it."""
    event = b"data: " + json.dumps(ANSWER).encode() + b"\r\n\r\n"
    real_server.serve([throttled("0.3s"), Reply(200, {"Content-Type": "text/event-stream"}, event)])
    sdk = client(real_server.url, transport(False, MemoryCooldownStore()), False)
    chunks = [chunk.text for chunk in sdk.models.generate_content_stream(model="gemini-2.0-flash", contents="hi")]
    assert chunks == ["hi"] and real_server.count() == 2 and gap(real_server.seen) >= 0.3
    assert real_server.seen[1].path.endswith(":streamGenerateContent?alt=sse")


def test_the_aiohttp_middleware_reads_the_same_body(real_server: ThrottleServer) -> None:
    """The body hook is the engine's, whatever the front end: through aiohttp's client
    middleware a RetryInfo of 0.3 s is waited, one of 30 s deferred (body readable)."""
    aiohttp = pytest.importorskip("aiohttp")
    from retry_after_adapter.aiohttp import RetryAfterMiddleware

    async def post(store: Any) -> tuple[int, bytes, Any]:
        middleware = RetryAfterMiddleware(RetryAfterRetry(total=3, max_wait=5), cooldown=store)
        async with aiohttp.ClientSession(middlewares=(middleware,)) as s:
            async with s.post(real_server.url + GEMINI_GENERATE, data=b"{}", headers={"x-goog-api-key": API_KEY}) as response:
                return response.status, await response.read(), deferral_of(response)

    real_server.serve([throttled("0.3s"), ok()])
    status, body, deferral = asyncio.run(post(MemoryCooldownStore()))
    assert status == 200 and deferral is None and gap(real_server.seen) >= 0.3
    real_server.serve([throttled("30s"), ok()])
    status, body, deferral = asyncio.run(post(MemoryCooldownStore()))
    assert status == 429 and json.loads(body) == json.loads(gemini_429("30s"))
    assert deferral.reason == "max_wait" and deferral.scope.endswith("|gemini:gemini-2.0-flash")


def test_the_sdk_on_its_aiohttp_client_waits_the_429_and_shares_what_does_not_fit(
    real_server: ThrottleServer, store_url: str
) -> None:
    """``HttpOptions(aiohttp_client=...)``: the SDK's async calls on an aiohttp session
    with the middleware mounted. RetryInfo's 1.2 s is waited (to within 50 ms at the
    server) and the POST sent again; a wait that does not fit is the server's own 429
    error with its deferral, and a second session of the same store sends nothing."""
    aiohttp = pytest.importorskip("aiohttp")
    from retry_after_adapter.aiohttp import RetryAfterMiddleware

    async def call(store: Any, max_wait: float) -> Any:
        middleware = RetryAfterMiddleware(RetryAfterRetry(total=3, max_wait=max_wait), cooldown=store)
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            options = genai_types.HttpOptions(base_url=real_server.url, aiohttp_client=session)
            sdk = genai.Client(api_key=API_KEY, http_options=options)
            try:
                return await sdk.aio.models.generate_content(model="gemini-2.0-flash", contents="hi")
            except Exception as error:  # judged below
                return error

    real_server.serve([throttled("1.2s"), ok()])
    result = asyncio.run(call(MemoryCooldownStore(), 10))
    assert not isinstance(result, Exception), repr(result)
    assert result.text == "hi" and [s.method for s in real_server.seen] == ["POST", "POST"]
    assert 1.2 <= gap(real_server.seen) <= 1.25 + 0.1, gap(real_server.seen)

    real_server.serve([throttled("1.2s"), ok()])
    error = asyncio.run(call(store_from_url(store_url), 0.5))
    assert isinstance(error, genai_errors.ClientError) and error.code == 429, repr(error)
    deferral = deferral_of(error)
    assert deferral is not None and deferral.reason == "max_wait"
    held = asyncio.run(call(store_from_url(store_url), 0.5))
    assert isinstance(held, genai_errors.ClientError) and held.code == 429, repr(held)
    assert held.message.startswith("deferred before sending (cooldown)")
    assert real_server.count() == 1  # the second session sent nothing into the quota


def test_a_configured_quota_binds_the_scope_not_each_model(real_server: ThrottleServer) -> None:
    """``Quota(2, per=60)`` is the scope's, whatever model each request names: four
    models' requests of a Google client send 2 (0.15's first Gemini dialect admitted
    each model under its own quota: 4 and more). A request of another client naming a
    model in its path is not a Gemini one: its scope stays the origin."""
    from retry_after_adapter import Quota

    real_server.serve([ok()] * 8)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(max_wait=0.1), cooldown=MemoryCooldownStore(),
                                         quota=Quota(2, per=60)))
    statuses = []
    for model in ("gemini-2.0-flash", "gemini-2.5-pro", "gemini-2.5-flash", "gemma-3"):
        url = f"{real_server.url}/v1beta/models/{model}:generateContent"
        statuses.append(s.post(url, data=b"{}", headers={"x-goog-api-key": API_KEY}).status_code)
    assert real_server.count() == 2 and statuses.count(200) == 2, statuses
    held = s.post(real_server.url + GEMINI_GENERATE, data=b"{}", headers={"x-goog-api-key": API_KEY})
    assert local_deferral(held).reason == "quota" and local_deferral(held).scope == real_server.url

    plain = requests.Session()
    plain.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=MemoryCooldownStore()))
    real_server.serve([throttled("30s")])
    other = plain.post(real_server.url + "/api/models/bert:predict", data=b"{}")  # no Google client
    assert deferral_of(other) is not None and deferral_of(other).scope == real_server.url


def test_an_async_gemini_call_reads_no_store_on_the_event_loop(real_server: ThrottleServer, tmp_path: Any) -> None:
    """Before its first attempt a Gemini call is held back by its project's cooldown:
    on an async transport over SQLite that is read from this process's copy, not the
    store, so the event loop never waits for the file (every store operation runs on
    the transport's threads)."""
    import threading

    from retry_after_adapter import SQLiteCooldownStore

    real_server.serve([ok(), ok()])
    made = transport(True, SQLiteCooldownStore(tmp_path / "gemini.db"))
    on_loop: list[str] = []

    async def main() -> None:
        loop_thread = threading.get_ident()
        inner = made._plan.store.inner
        for name in ("get", "admit", "settle", "note"):
            original = getattr(inner, name)

            def watched(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                if threading.get_ident() == loop_thread:
                    on_loop.append(_name)
                return _original(*args, **kwargs)

            setattr(inner, name, watched)
        async with httpx2.AsyncClient(transport=made) as session:
            for _ in range(2):
                response = await session.post(
                    real_server.url + GEMINI_GENERATE, content=b"{}", headers={"x-goog-api-key": API_KEY}
                )
                assert response.status_code == 200

    asyncio.run(main())
    assert on_loop == [] and real_server.count() == 2
