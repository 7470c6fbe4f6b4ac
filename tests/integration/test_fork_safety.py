"""Every lock the package owns is safe across fork, with real sockets, real SQLite files
and a real ``os.fork``: a thread of the parent holds one of them while the main thread
forks; the child makes one real call that needs that lock and must finish (the parent
waits ``CHILD_LIMIT`` seconds, then SIGKILLs it).
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
    RetryAfterRetry,
    SQLiteCooldownStore,
    deferral_of,
)
from retry_after_adapter.cooldown import memory
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.engine import admission

from ..servers import Body, BodyServer

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
