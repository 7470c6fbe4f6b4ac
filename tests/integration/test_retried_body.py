"""Two promises, against real sockets, real SQLite files and a real ``os.fork``.

A. A retried body is read only up to a bound and only within the deadline:
   ``RetryAfterRetry(max_retry_body=...)`` (bytes; default 1 MiB; None: no bound). A
   response the engine retries (or keeps for a deferral after waiting) has its body
   read at most that many bytes and only until the call's deadline; past either the
   connection is dropped and the call goes on. The server here streams bodies that are
   endless to a bounded client (64 MiB as fast as the socket takes them, or one byte
   every 50 ms) and counts what it managed to write; every client call runs on a thread
   joined with a timeout, so code that reads on fails the test instead of hanging it
   (the server stops streaming when the test stops it, and after ``STREAM_CAP`` seconds
   at most).

B. Every lock the package owns is safe across fork: a thread of the parent holds one of
   them while the main thread forks; the child makes one real call that needs that lock
   and must finish (the parent waits ``CHILD_LIMIT`` seconds, then SIGKILLs it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    SQLiteCooldownStore,
    deferral_of,
)
from retry_after_adapter.cooldown import memory
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.engine import admission

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


# ------------------------------------------------ A. a retried body is bounded
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


# ---------------------------------------------------- B. locks safe across fork
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")

#: Seconds the parent waits for the child before it SIGKILLs it.
CHILD_LIMIT = 5.0
#: Seconds the parent's thread holds the lock (the fork happens meanwhile).
HOLD = 0.5


def _wait_child(pid: int, limit: float) -> int | None:
    """The child's wait status, or None when it was still running after ``limit``
    seconds (it is then killed with SIGKILL and reaped)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _read_report(fd: int) -> str:
    chunks: list[bytes] = []
    for _ in range(64):  # the child writes at most a few KiB
        data = os.read(fd, 4096)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def fork_while_held(lock: Any, child_call: Callable[[], None], what: str) -> None:
    """A parent thread holds ``lock`` (for HOLD s) while the main thread forks; the
    child runs ``child_call()`` and exits 0 (1 and a traceback on an exception); the
    test fails when the child hangs (killed after CHILD_LIMIT s) or fails."""
    held = threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            time.sleep(HOLD)

    thread = threading.Thread(target=holder, name="lock-holder", daemon=True)
    thread.start()
    assert held.wait(2.0), "the holding thread did not get the lock"
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process that has threads: that is the point.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            os.close(read_end)
            child_call()
            code = 0
        except BaseException:
            with contextlib.suppress(BaseException):
                os.write(write_end, traceback.format_exc()[-3000:].encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        status = _wait_child(pid, CHILD_LIMIT)
        report = _read_report(read_end)
    finally:
        os.close(read_end)
        thread.join(2.0)
    assert status is not None, (
        f"the forked child hung (killed after {CHILD_LIMIT} s): {what}, held by another thread "
        "of the parent at fork, stays held in the child"
    )
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child failed ({status}): {report}"


def _fork_plan(index: int, path: str) -> Body:
    if path.startswith("/cool"):
        return Body(429, {"Retry-After": "1"}, kind="fixed", data=b"slow down")
    return Body(200, {}, kind="fixed", data=b"ok")


@pytest.fixture
def fork_server(body_server) -> BodyServer:
    """200 "ok" for any path; 429 with ``Retry-After: 1`` for /cool..."""
    return body_server(_fork_plan)


def _get(adapter: RetryAfterAdapter, url: str) -> requests.Response:
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", adapter)
    try:
        return session.get(url, timeout=2)
    finally:
        session.close()


@needs_fork
def test_fork_while_the_default_store_lock_is_held(fork_server):
    def call() -> None:
        adapter = RetryAfterAdapter(RetryAfterRetry(total=0, raise_on_status=False), quota=Quota(5, per=1))
        assert adapter.cooldown is memory.DEFAULT_STORE
        response = _get(adapter, fork_server.url + "/")  # a quota permit: the store's lock
        assert response.status_code == 200 and response.text == "ok"

    call()  # in the parent first: everything the call path imports is imported
    fork_while_held(memory.DEFAULT_STORE._lock, call, "the default store's lock")


@needs_fork
def test_fork_while_a_memory_store_lock_is_held(fork_server):
    store = MemoryCooldownStore()

    def call() -> None:
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=0, raise_on_status=False), cooldown=store, quota=Quota(5, per=1)
        )
        response = _get(adapter, fork_server.url + "/")
        assert response.status_code == 200 and response.text == "ok"

    call()
    fork_while_held(store._lock, call, "a MemoryCooldownStore's lock")


@needs_fork
@pytest.mark.parametrize("which", ["guard-local-copy", "guard-write-back", "guard-breaker", "sqlite-store"])
def test_fork_while_a_sqlite_store_lock_is_held(fork_server, tmp_path: Path, which: str):
    store = SQLiteCooldownStore(tmp_path / "fork.db")

    def call(path: str) -> requests.Response:
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=0, raise_on_status=False), cooldown=store, quota=Quota(5, per=1)
        )
        return _get(adapter, fork_server.url + path)

    # In the parent first: the guard and its local copy exist, the parent's connection is open.
    assert call("/").status_code == 200
    guard = guard_of(store)
    lock = {
        "guard-local-copy": guard.local._lock,
        "guard-write-back": guard.writeback.lock,
        "guard-breaker": guard.breaker._lock,
        "sqlite-store": store._lock,
    }[which]

    def child() -> None:
        # A 429 with Retry-After: a cooldown learned, written to the store and mirrored
        # in the guard's local copy; the quota permit is taken in the store before.
        response = call("/cool")
        assert response.status_code == 429 and response.text == "slow down"

    try:
        fork_while_held(lock, child, f"the lock of {which}")
    finally:
        store.close()


@needs_fork
def test_fork_while_the_waiting_queue_lock_is_held(fork_server):
    def call() -> None:
        clock = FakeClock()
        store = MemoryCooldownStore()
        # A cooldown of 1 s that fits the budget: the call waits it out (on the fake
        # clock), counted among the scope's waiting calls (max_waiting) meanwhile.
        store.extend(f"http://127.0.0.1:{fork_server.port}", clock.now() + timedelta(seconds=1))
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=0, raise_on_status=False, clock=clock), cooldown=store, max_waiting=4
        )
        response = _get(adapter, fork_server.url + "/")
        assert response.status_code == 200 and deferral_of(response) is None
        assert sum(clock.sleeps) >= 1.0, clock.sleeps  # it did wait (and so queued)

    call()
    fork_while_held(admission._WAITING_LOCK, call, "the engine's waiting-queue lock")
