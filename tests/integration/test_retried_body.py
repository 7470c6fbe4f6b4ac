"""A retried body is read only up to a bound and only within the deadline, against
real sockets: ``RetryAfterRetry(max_retry_body=...)`` (bytes; default 1 MiB; None: no
bound). A response the engine retries (or keeps for a deferral after waiting) has its
body read at most that many bytes and only until the call's deadline; past either the
connection is dropped and the call goes on. The server here streams bodies that are
endless to a bounded client (64 MiB as fast as the socket takes them, or one byte every
50 ms) and counts what it managed to write; every client call runs on a thread joined
with a timeout, so code that reads on fails the test instead of hanging it (the server
stops streaming when the test stops it, and after ``STREAM_CAP`` seconds at most).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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

from ..servers import TRICKLE_EVERY, Body, BodyServer

# The server (``BodyServer``, in tests/servers.py) streams endless bodies of
# ENDLESS_BYTES, trickles one byte every TRICKLE_EVERY s, and stops after STREAM_CAP s.

KiB = 1024
MiB = 1024 * KiB
#: The default ``max_retry_body``.
DEFAULT_BOUND = MiB
#: What the server may write for one response before the client drops it: the bound,
#: plus what the two sockets' buffers hold (a few MiB on loopback).
WRITTEN_AT_MOST = 16 * MiB
#: A call against an endless body must be over within this (real seconds).
CALL_LIMIT = 2.0
#: The trickling call, with ``deadline=1.0``, must be over within this. It takes 1.01 s
#: with both cores busy; not three times that, which would pass a call that read on
#: until the server's STREAM_CAP ends the trickle.
TRICKLE_LIMIT = 2.0
#: Seconds the server may take, once the call has returned, to see its connections dropped.
DROP_SEEN_WITHIN = 1.0


# ------------------------------------------------------------------------ helpers
def adapter_session(retry: RetryAfterRetry, **adapter_kwargs: Any) -> requests.Session:
    """A Session with a RetryAfterAdapter on http:// (its own memory store unless given
    ``cooldown=``), ignoring proxy settings of the environment."""
    adapter_kwargs.setdefault("cooldown", MemoryCooldownStore())
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", RetryAfterAdapter(retry, **adapter_kwargs))
    return session


def run_bounded(call: Callable[[], Any], server: BodyServer, limit: float) -> tuple[Any, float]:
    """Run ``call()`` on a thread: (what it returned, real seconds it took). Still
    running after ``limit`` seconds: the server is stopped (so the thread ends) and the
    test fails, saying what the server had written by then."""
    box: dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        try:
            box["result"] = call()
        except BaseException as exc:
            box["error"] = exc
        finally:
            box["took"] = time.monotonic() - started

    thread = threading.Thread(target=target, name="client-call", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        seen = server.snapshot()
        server.stop()
        thread.join(10.0)
        pytest.fail(
            f"the call did not return within {limit} s of real time; the server had received "
            f"{len(seen)} request(s) and written (path, bytes, ended) {seen}"
        )
    if "error" in box:
        raise box["error"]
    return box["result"], box["took"]


def assert_bodies_bounded(server: BodyServer, expected_requests: int) -> None:
    """Each endless response was dropped by the client (not read on, not left hanging)
    with at most WRITTEN_AT_MOST bytes written."""
    assert server.wait_done(DROP_SEEN_WITHIN), (
        f"a connection was not dropped: the server was still writing {DROP_SEEN_WITHIN} s after "
        f"the call returned: {server.snapshot()}"
    )
    seen = server.snapshot()
    assert len(seen) == expected_requests, seen
    for path, sent, ended in seen:
        assert sent < WRITTEN_AT_MOST, f"the server wrote {sent} bytes for one {path} response: {seen}"
        assert ended == "client_gone", f"a response was not dropped by the client: {seen}"


def check_endless_call(server: BodyServer, response: Any, took: float, bound: int, content: bytes) -> None:
    """Three attempts (total=2), each body dropped within its bound; the last response
    comes back deferred ("attempts") with what was read of its body."""
    assert took < CALL_LIMIT
    assert_bodies_bounded(server, expected_requests=3)
    deferral = deferral_of(response)
    assert deferral is not None and deferral.reason == "attempts", deferral
    assert len(content) <= bound, f"the body was read to {len(content)} bytes, past the bound of {bound}"
    assert set(content) <= {ord("x")}  # what was read of the body, nothing else


# ------------------------------------------------ a retried body is bounded
@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_endless_retried_body_is_read_only_up_to_max_retry_body(body_server, framing):
    server = body_server(lambda index, path: Body(framing=framing))
    bound = 256 * KiB
    retry = RetryAfterRetry(total=2, max_retry_body=bound, raise_on_status=False, clock=FakeClock())
    session = adapter_session(retry)
    response, took = run_bounded(lambda: session.get(server.url + "/endless", timeout=5), server, CALL_LIMIT)
    assert response.status_code == 503
    check_endless_call(server, response, took, bound, response.content)


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_endless_retried_body_is_bounded_at_one_mib_by_default(body_server, framing):
    server = body_server(lambda index, path: Body(framing=framing))
    retry = RetryAfterRetry(total=2, raise_on_status=False, clock=FakeClock())
    session = adapter_session(retry)
    response, took = run_bounded(lambda: session.get(server.url + "/endless", timeout=5), server, CALL_LIMIT)
    assert response.status_code == 503
    check_endless_call(server, response, took, DEFAULT_BOUND, response.content)


def test_endless_retried_bodies_then_a_short_last_body_kept_whole(body_server):
    # The two retried responses stream without end; the last one (retries out) is short.
    def plan(index: int, path: str) -> Body:
        if index < 2:
            return Body()
        return Body(kind="fixed", data=b"the last body, whole")

    server = body_server(plan)
    retry = RetryAfterRetry(total=2, raise_on_status=False, clock=FakeClock())
    session = adapter_session(retry)
    response, took = run_bounded(lambda: session.get(server.url + "/twice", timeout=5), server, CALL_LIMIT)
    assert took < CALL_LIMIT
    assert response.status_code == 503
    assert deferral_of(response).reason == "attempts"
    assert response.content == b"the last body, whole"
    assert server.wait_done(DROP_SEEN_WITHIN), server.snapshot()
    seen = server.snapshot()
    assert len(seen) == 3, seen
    for _, sent, ended in seen[:2]:
        assert sent < WRITTEN_AT_MOST and ended == "client_gone", seen
    assert seen[2][2] == "complete"


@pytest.mark.parametrize(
    ("bound", "framing"),
    [(256 * KiB, "chunked"), (None, "chunked"), (None, "length")],
    ids=["max_retry_body=256KiB-chunked", "default-chunked", "default-length"],
)
def test_pool_manager_bounds_an_endless_retried_body(body_server, bound, framing):
    server = body_server(lambda index, path: Body(framing=framing))
    extra: dict[str, Any] = {} if bound is None else {"max_retry_body": bound}
    retry = RetryAfterRetry(total=2, raise_on_status=False, clock=FakeClock(), **extra)
    http = RetryAfterPoolManager(retries=retry, cooldown=MemoryCooldownStore())
    try:
        # preload_content=True (urllib3's default): the body is read inside the call.
        response, took = run_bounded(
            lambda: http.request("GET", server.url + "/endless", timeout=5), server, CALL_LIMIT
        )
        assert response.status == 503
        check_endless_call(server, response, took, bound or DEFAULT_BOUND, response.data)
    finally:
        http.clear()


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_trickling_retried_body_is_read_only_within_the_deadline(body_server, framing):
    server = body_server(lambda index, path: Body(kind="trickle", framing=framing))
    retry = RetryAfterRetry(total=3, deadline=1.0, raise_on_status=False)  # the real clock
    session = adapter_session(retry)
    response, took = run_bounded(
        lambda: session.get(server.url + "/trickle", timeout=5), server, TRICKLE_LIMIT + 0.5
    )
    assert took <= TRICKLE_LIMIT, f"the call took {took:.2f} s of real time with deadline=1.0"
    assert response.status_code == 503
    deferral = deferral_of(response)
    assert deferral is not None and deferral.reason in ("deadline", "attempts"), deferral
    # What was read of the trickle (one byte every 50 ms for at most TRICKLE_LIMIT), nothing else.
    assert set(response.content) <= {ord("x")}
    assert len(response.content) <= TRICKLE_LIMIT / TRICKLE_EVERY + 10
    assert server.wait_done(DROP_SEEN_WITHIN), server.snapshot()
    seen = server.snapshot()
    assert 1 <= len(seen) <= 4, seen
    assert all(ended == "client_gone" for _, _, ended in seen), seen
