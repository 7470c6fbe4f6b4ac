"""A call's deadline bounds every store operation, whatever the store: a store of one's
own whose backend hangs holds no call past its deadline, through the requests adapter
and the httpx transports (sync and async), whatever attributes it has (a ``timeout``
of its own meaning is not a promise). Only a store of the declared type
``cooldown.Bounded`` is called on the calling thread, and the conformance kit checks
that it keeps its bound.

Real parts: a loopback HTTP server, real store classes whose backend hangs on an
event (3 s), real SQLite files and a socket that accepts and never answers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    CooldownStoreError,
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
    budget,
)
from retry_after_adapter.cooldown import Bounded, Store, check_scope, check_until
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport
from retry_after_adapter.testing.conformance import StoreContract

from ..servers import Reply, ThrottleServer

UTC = timezone.utc
#: How long the hung backends below hang (seconds): far past every deadline here.
HANG = 3.0
#: The call's deadline (seconds) and what the issue's target allows past it.
DEADLINE = 0.5
PAST_DEADLINE = 1.0


class HungBackend:
    """A backend that does not answer until released (or ``HANG`` seconds pass)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.calls = 0
        self.threads: set[int] = set()

    def wait(self) -> None:
        self.calls += 1
        self.threads.add(threading.get_ident())
        self.released.wait(HANG)


class HungStore(Store):
    """A store of one's own (the documented core) whose backend hangs, with an attribute
    named ``timeout`` of its own meaning (the backend's idle timeout, say)."""

    def __init__(self, timeout: float = 0.25) -> None:
        self.timeout = timeout
        self.backend = HungBackend()

    def get(self, scope: str) -> datetime | None:
        self.backend.wait()
        return None

    def extend(self, scope: str, until: datetime) -> datetime:
        self.backend.wait()
        return until


@pytest.fixture
def hung() -> Iterator[list[Any]]:
    """Hung stores made by a test, released at its end (their waits end at once)."""
    made: list[Any] = []
    yield made
    for store in made:
        store.backend.released.set()


def requests_get(store: Any, url: str) -> int:
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=2), cooldown=store))
    with budget(deadline=DEADLINE):
        return s.get(url).status_code


def httpx_get(store: Any, url: str) -> int:
    with httpx.Client(transport=RetryAfterTransport(RetryAfterRetry(total=2), cooldown=store)) as client:
        with budget(deadline=DEADLINE):
            return client.get(url).status_code


def httpx_async_get(store: Any, url: str) -> int:
    async def get() -> int:
        transport = AsyncRetryAfterTransport(RetryAfterRetry(total=2), cooldown=store)
        async with httpx.AsyncClient(transport=transport) as client:
            with budget(deadline=DEADLINE):
                return (await client.get(url)).status_code

    return asyncio.run(get())


CLIENTS = {"requests": requests_get, "httpx": httpx_get, "httpx-async": httpx_async_get}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("attribute", [0.25, 10.0])
def test_a_hung_store_of_ones_own_holds_no_call_past_its_deadline(
    real_server: ThrottleServer, hung: list[Any], client: str, attribute: float
) -> None:
    """0.14.0 trusted the ``timeout`` attribute and waited for the store on the calling
    thread: 3.0 s for a call under ``budget(deadline=0.5)``. Now the operation runs on a
    helper thread that the call stops waiting for (0.25 s: the bound for a store that
    declares none), and the call goes on without the store (fail open)."""
    store = HungStore(attribute)
    hung.append(store)
    real_server.serve([Reply(200)])
    started = time.monotonic()
    assert CLIENTS[client](store, real_server.url) == 200
    took = time.monotonic() - started
    assert took < DEADLINE + PAST_DEADLINE, took
    assert store.backend.calls >= 1  # the store was asked, not skipped...
    assert threading.get_ident() not in store.backend.threads  # ...on a helper thread
    # (Marked down, too, unless a loaded machine brought the call to the store with
    # less than the bound left: then the call's time ran out, not the store's.)


def test_the_next_calls_skip_the_hung_store_at_once(real_server: ThrottleServer, hung: list[Any]) -> None:
    store = HungStore()
    hung.append(store)
    real_server.serve([Reply(200)])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=2), cooldown=store))
    assert s.get(real_server.url).status_code == 200  # no deadline: the store's 0.25 s bound
    assert guard_of(store).down
    asked = store.backend.calls
    started = time.monotonic()
    for _ in range(3):
        assert requests_get(store, real_server.url) == 200
    # Within the breaker's back-off (0.5 s) no call asks the store again (three loopback
    # GETs take milliseconds; 0.25 s would be one store timeout paid again).
    assert time.monotonic() - started < 0.25
    assert store.backend.calls == asked


class BoundedStore(Store, Bounded):
    """A store of one's own that declares the bound it keeps: its backend hangs, and it
    gives up after ``bound`` seconds with ``CooldownStoreError``, as promised."""

    def __init__(self, bound: float = 0.2, keeps: bool = True) -> None:
        self.bound = bound
        self.keeps = keeps
        self.backend = HungBackend()
        self.cooldowns: dict[str, datetime] = {}
        self.lock = threading.Lock()

    def operation_timeout(self) -> float:
        return self.bound

    def _backend(self) -> None:
        if self.backend.released.is_set():
            return
        self.backend.calls += 1
        self.backend.threads.add(threading.get_ident())
        if not self.backend.released.wait(self.bound if self.keeps else HANG):
            raise CooldownStoreError("the backend did not answer", cause="timed out")

    def get(self, scope: str) -> datetime | None:
        scope = check_scope(scope)
        self._backend()
        return self.cooldowns.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        scope, until = check_scope(scope), check_until(until)
        self._backend()
        with self.lock:
            kept = self.cooldowns[scope] = max(self.cooldowns.get(scope, until), until)
            return kept


def test_a_store_that_declares_its_bound_is_called_on_the_calling_thread(
    real_server: ThrottleServer, hung: list[Any]
) -> None:
    store = BoundedStore(0.2)
    hung.append(store)
    real_server.serve([Reply(200)])
    started = time.monotonic()
    assert requests_get(store, real_server.url) == 200
    assert time.monotonic() - started < DEADLINE + PAST_DEADLINE
    assert store.backend.threads == {threading.get_ident()}  # trusted: no helper thread
    assert guard_of(store).breaker._executor is None


def test_a_declared_bound_longer_than_the_time_left_is_not_waited_for(
    real_server: ThrottleServer, hung: list[Any]
) -> None:
    """A store may bound itself at 2 s: a call with 0.5 s left does not wait that long.
    It waits for the store as long as it has (the store is up as far as it knows: the
    call's time ran out, not the store's), then defers: nothing was admitted."""
    store = BoundedStore(2.0)
    hung.append(store)
    real_server.serve([Reply(200)])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=2), cooldown=store))
    started = time.monotonic()
    with budget(deadline=DEADLINE):
        response = s.get(real_server.url)
    assert time.monotonic() - started < DEADLINE + PAST_DEADLINE
    assert response.status_code == 429 and response.deferral is not None
    assert response.deferral.reason == "deadline" and real_server.count() == 0
    assert threading.get_ident() not in store.backend.threads


def test_the_package_stores_bound_themselves_and_run_on_the_calling_thread(
    tmp_path: Path, real_server: ThrottleServer
) -> None:
    """The happy path of the package's own stores costs what it did: no helper thread."""
    store = SQLiteCooldownStore(tmp_path / "c.db")
    assert isinstance(store, Bounded) and store.operation_timeout() == 0.25
    real_server.serve([Reply(200)])
    for _ in range(3):
        assert requests_get(store, real_server.url) == 200
    assert guard_of(store).breaker._executor is None  # never needed a helper thread
    store.close()


def test_a_bad_declared_bound_is_refused_naming_the_store() -> None:
    class Odd(BoundedStore):
        def operation_timeout(self) -> float:
            return float("inf")

    with pytest.raises(ConfigurationError, match=r"Odd\.operation_timeout\(\) must return a finite"):
        RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=Odd())


# -- the conformance kit checks a declared bound ------------------------------------------


class TestABoundedStoreThatKeepsItsBound(StoreContract):
    @pytest.fixture
    def store(self, hung: list[Any]) -> BoundedStore:
        store = BoundedStore(0.1)
        store.backend.released.set()  # answers at once
        return store

    @pytest.fixture
    def hung_store(self, hung: list[Any]) -> BoundedStore:
        store = BoundedStore(0.1)
        hung.append(store)
        return store


def run_the_kits_bound_test(store: Any, hung_store: Any) -> None:
    contract = StoreContract()
    contract.ns = "kit:"
    contract.test_a_declared_bound_holds_when_the_backend_hangs(store, hung_store)


def test_the_kit_fails_a_store_that_declares_a_bound_and_hangs_longer(hung: list[Any]) -> None:
    liar = BoundedStore(0.1, keeps=False)  # says 0.1 s, hangs 3 s
    hung.append(liar)
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"declares a bound of 0\.1 s .* did not end within 0\.8 s"):
        run_the_kits_bound_test(liar, liar)
    assert time.monotonic() - started < 2.0  # the kit stopped waiting; it did not hang with it


def test_the_kit_fails_a_bounded_store_without_a_hung_handle() -> None:
    with pytest.raises(pytest.fail.Exception, match="give the contract a `hung_store` fixture"):
        run_the_kits_bound_test(BoundedStore(0.1), None)


def test_the_kit_fails_a_store_whose_bound_raises_another_error(hung: list[Any]) -> None:
    class Rude(BoundedStore):
        def _backend(self) -> None:
            raise RuntimeError("no")

    with pytest.raises(pytest.fail.Exception, match="raised RuntimeError, not CooldownStoreError"):
        run_the_kits_bound_test(Rude(0.1), Rude(0.1))


def test_the_kit_checks_the_sqlite_bound_on_a_locked_file(tmp_path: Path) -> None:
    """(The kit's SQLite run is in test_conformance.py; here, that a lock held past the
    bound is what the hung handle meets: extend fails busy within its timeout.)"""
    import sqlite3

    path = tmp_path / "c.db"
    with SQLiteCooldownStore(path, timeout=0.2) as store:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            started = time.monotonic()
            with pytest.raises(CooldownStoreError) as failed:
                store.extend("s", datetime.now(UTC) + timedelta(seconds=5))
            assert failed.value.busy and time.monotonic() - started < 3 * 0.2 + 0.5
        finally:
            holder.execute("ROLLBACK")
            holder.close()


@pytest.mark.redis
def test_a_redis_store_on_a_client_without_timeouts_declares_none_and_is_bounded_on_a_helper_thread(
    redis_url: str, redis_module: Any, real_server: ThrottleServer
) -> None:
    client = redis_module.Redis.from_url(redis_url)  # no socket timeouts: no known bound
    store = RedisCooldownStore(client, prefix="bounds:", push=False)
    assert isinstance(store, Bounded) and store.operation_timeout() is None
    real_server.serve([Reply(200)])
    assert requests_get(store, real_server.url) == 200
    assert guard_of(store).breaker._executor is not None  # asked on a helper thread
    with pytest.raises(pytest.skip.Exception, match="declares no bound"):
        run_the_kits_bound_test(store, None)  # the kit asks no hung handle of it
    client.close()


def test_a_process_whose_store_hangs_still_exits(real_server: ThrottleServer) -> None:
    """An operation abandoned on a helper thread does not keep the process from
    exiting: a store of one's own whose backend hangs 60 s, one call under a deadline,
    and the process ends within seconds (the helper threads are daemons; a
    ``ThreadPoolExecutor``'s are joined at exit, and a backend that never answers would
    keep the process forever)."""
    import subprocess
    import sys

    real_server.serve([Reply(200)])
    program = f"""
import time
import requests
from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, budget
from retry_after_adapter.cooldown import Store

class Hung(Store):
    def get(self, scope):
        time.sleep(60)
    def extend(self, scope, until):
        time.sleep(60)
        return until

s = requests.Session()
s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=Hung(), learn_rate=False))
with budget(deadline={DEADLINE}):
    print(s.get({real_server.url!r}, timeout=5).status_code, flush=True)
"""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=50)
    took = time.monotonic() - started
    assert done.returncode == 0 and done.stdout.strip() == "200", (done.stdout, done.stderr[-2000:])
    assert took < 20, f"the process took {took:.1f} s to exit (its store hangs 60 s)"
