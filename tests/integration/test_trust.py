"""Trust: a shared cooldown that nobody can blind, spoof or cross, with a real
``redis-server`` (ACL users, two databases, a forged ``PUBLISH``).

- A writer that may not PUBLISH writes nothing (its scripts publish first), says so by
  name, and still never sends inside the cooldown it received; the others' near copies
  never disagree with the store.
- A near copy trusts the channel only while messages come through it (canaries); a
  subscription that answers but carries nothing is stale within a bound.
- Tenants on two databases of one server never hear each other's changes.
- A pushed message is never trusted for its value: a forged one costs a round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from retry_after_adapter import RedisCooldownStore
from retry_after_adapter.cooldown import Ask, Lease
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.errors import CooldownStoreError

pytestmark = pytest.mark.redis

SCOPE = "https://api.example.com:443"


def wait_for(condition: Callable[[], bool], seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


@pytest.fixture
def acl_server(redis_factory: Callable[..., Any], redis_module: Any) -> Iterator[tuple[Any, Callable[..., Any]]]:
    """A server of the test's own with a user ``app`` that may not PUBLISH; yields an
    admin client and ``connect(user, db)`` for more clients."""
    server = redis_factory()
    admin = redis_module.Redis(host="127.0.0.1", port=server.port, socket_timeout=2.0)
    admin.execute_command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all", "-publish")
    clients: list[Any] = []

    def connect(user: str | None = None, db: int = 0) -> Any:
        kwargs: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "db": db}
        if user is not None:
            kwargs.update(username=user, password=f"{user}-pw")
        client = redis_module.Redis(host="127.0.0.1", port=server.port, **kwargs)
        clients.append(client)
        return client

    yield admin, connect
    for client in clients:
        client.close()
    admin.close()


def fresh_guard(store: RedisCooldownStore) -> Any:
    guard = guard_of(store)
    assert guard.near is not None
    assert wait_for(guard.near.cooldowns.fresh), "the near copy never became fresh"
    return guard


def test_a_writer_that_may_not_publish_writes_nothing_and_says_so_by_name(
    acl_server: tuple[Any, Callable[..., Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """Worker B's user may not PUBLISH: its extend fails before anything is written (the
    script publishes first), naming the cause, and B holds the scope back from its own
    local copy; worker A's near copy, fresh on its own canaries, agrees with the store,
    which holds nothing (0.9: the store held it, A's near copy did not: 57 sends)."""
    admin, connect = acl_server
    a = RedisCooldownStore(connect(), prefix="t:")
    b = RedisCooldownStore(connect("app"), prefix="t:")
    now = datetime.now(timezone.utc)
    until = now + timedelta(seconds=30)
    with pytest.raises(CooldownStoreError, match=r"(?i)permission|noperm") as raised:
        b.extend(SCOPE, until)
    assert "app-pw" not in str(raised.value)
    assert admin.get("t:" + SCOPE) is None  # nothing written: no copy can miss it
    guard_a = fresh_guard(a)
    assert guard_a.admit(Ask(scope=SCOPE, now=now)).not_before is None
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        guard_b = guard_of(b)
        assert guard_b.extend(SCOPE, until) == until  # kept locally
        answer = guard_b.admit(Ask(scope=SCOPE, now=now))
    assert answer.not_before == until  # B never sends inside the cooldown it received
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("permission" in w.lower() for w in warnings), warnings
    assert not any("app-pw" in w for w in warnings)


def test_a_near_copy_that_may_not_publish_trusts_the_channel_only_while_others_speak(
    acl_server: tuple[Any, Callable[..., Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """B may not publish its canaries: alone on the channel its near copy never turns
    fresh (every attempt reads the store), and its refusal is logged once by name; once
    A (who may) follows the channel too, A's canaries make B's copy fresh."""
    _, connect = acl_server
    b = RedisCooldownStore(connect("app"), prefix="t:")
    guard_b = guard_of(b)
    assert guard_b.near is not None
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        assert not wait_for(guard_b.near.cooldowns.fresh, 2.5)
    assert any("may not publish" in r.getMessage() for r in caplog.records)
    a = RedisCooldownStore(connect(), prefix="t:")
    fresh_guard(a)
    assert wait_for(guard_b.near.cooldowns.fresh, 3.0)


def test_a_subscription_that_answers_but_carries_nothing_goes_stale(
    acl_server: tuple[Any, Callable[..., Any]],
) -> None:
    """The channel is checked end to end: with every canary published elsewhere (the
    store's channel renamed under the copy), the subscription still answers, yet the
    copy is stale within the bound and every attempt reads the store."""
    _, connect = acl_server
    store = RedisCooldownStore(connect(), prefix="t:")
    guard = fresh_guard(store)
    feed = guard.near.cooldowns.feed
    feed._channel = "somewhere-else"  # canaries no longer travel through the subscription
    assert wait_for(lambda: not guard.near.cooldowns.fresh(), 3.0)


def test_tenants_on_two_databases_never_hear_each_other(acl_server: tuple[Any, Callable[..., Any]]) -> None:
    """Pub/sub is one for the server: the channel is one per database (and prefix), so a
    cooldown stored in database 0 never holds back a worker of database 1 (0.9: 123
    local deferrals), and database 1's status does not show it."""
    _, connect = acl_server
    zero = RedisCooldownStore(connect(db=0), prefix="t:")
    one = RedisCooldownStore(connect(db=1), prefix="t:")
    now = datetime.now(timezone.utc)
    guard_one = fresh_guard(one)
    for _ in range(3):
        assert guard_one.admit(Ask(scope=SCOPE, now=now)).not_before is None  # known near
    received: list[str] = []
    feed = guard_one.near.cooldowns.feed
    original = feed._changed
    feed._changed = lambda scope, until: (received.append(str(scope)), original(scope, until))  # type: ignore[method-assign]
    guard_zero = fresh_guard(zero)
    guard_zero.extend(SCOPE, now + timedelta(seconds=30))
    time.sleep(0.2)
    assert SCOPE not in received
    assert all(guard_one.admit(Ask(scope=SCOPE, now=now)).not_before is None for _ in range(50))
    assert SCOPE not in one.holds()
    assert SCOPE in zero.holds()


def test_a_forged_publish_costs_a_round_trip_never_a_wait(acl_server: tuple[Any, Callable[..., Any]]) -> None:
    """Someone publishes a cooldown ending in 9999 on the channel: the near copy reads the
    scope again (the store holds nothing) and admits; nothing is learned from the value
    (0.9 deferred every worker past max_retry_after)."""
    admin, connect = acl_server
    store = RedisCooldownStore(connect(), prefix="t:")
    guard = fresh_guard(store)
    now = datetime.now(timezone.utc)
    assert guard.admit(Ask(scope=SCOPE, now=now)).not_before is None
    assert guard.near.cooldowns.knows(SCOPE)
    channel = store._channel
    admin.publish(channel, f"c 253402300799000 {SCOPE}")
    assert wait_for(lambda: not guard.near.cooldowns.knows(SCOPE), 2.0)  # dropped: read again
    answer = guard.admit(Ask(scope=SCOPE, now=now))
    assert answer.not_before is None and answer.cooldown is None
    assert guard.local.get(SCOPE) is None  # the local copy learned nothing from it


# -- errors that name their cause ---------------------------------------------------------------------------


def test_a_wrong_redis_password_is_named_as_a_misconfiguration(
    redis_factory: Callable[..., Any], redis_module: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong password will never heal: the error and the failure layer's first warning
    say "authentication failed" and that it looks like a misconfiguration (0.9 said only
    "failed (CooldownStoreError)"), and neither carries the password."""
    server = redis_factory("--requirepass", "the-right-one")
    store = RedisCooldownStore.from_url(f"redis://:not-this-one@127.0.0.1:{server.port}/0", prefix="t:")
    with pytest.raises(CooldownStoreError) as raised:
        store.get(SCOPE)
    assert raised.value.cause == "authentication failed" and raised.value.lasting
    assert "not-this-one" not in str(raised.value)
    with caplog.at_level(logging.WARNING, logger="retry_after_adapter"):
        guard_of(store).admit(Ask(scope=SCOPE, now=datetime.now(timezone.utc)))
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "authentication failed" in warning.getMessage()
    assert "misconfiguration" in warning.getMessage() and warning.lasting  # type: ignore[attr-defined]
    assert "not-this-one" not in warning.getMessage()


def test_tls_against_a_plain_redis_is_named_and_a_refused_connection_is_not_lasting(
    redis_factory: Callable[..., Any],
) -> None:
    server = redis_factory()
    tls = RedisCooldownStore.from_url(f"rediss://127.0.0.1:{server.port}/0", prefix="t:")
    with pytest.raises(CooldownStoreError) as raised:
        tls.get(SCOPE)
    # A plain Redis reads the TLS hello as the start of a command and waits for the rest:
    # the handshake times out, as with a server that does not answer at all (see
    # test_store_messages.py), so it is named for what happened, and not called lasting
    # (a server that answers the hello with an error is a TLS failure that lasts).
    named = (raised.value.cause, raised.value.lasting)
    assert named in (("TLS handshake timed out", False), ("TLS failed", True)), str(raised.value)
    port = server.port
    server.stop()
    refused = RedisCooldownStore.from_url(f"redis://127.0.0.1:{port}/0", prefix="t:")
    with pytest.raises(CooldownStoreError) as raised:
        refused.get(SCOPE)
    assert raised.value.cause == "connection refused" and not raised.value.lasting


def test_a_file_that_is_not_a_database_is_named(tmp_path: Any) -> None:
    from retry_after_adapter import SQLiteCooldownStore

    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are someone's notes, not a database\n" * 100)
    with pytest.raises(CooldownStoreError) as raised:
        SQLiteCooldownStore(path).get(SCOPE)
    assert (raised.value.cause, raised.value.lasting) == ("not a database", True), str(raised.value)


@pytest.fixture
def tiny_disk(tmp_path: Any) -> Iterator[Any]:
    """A 512 KiB tmpfs of the test's own (root can mount one; elsewhere the test skips)."""
    import subprocess

    where = tmp_path / "tiny"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_is_named(tiny_disk: Any) -> None:
    from retry_after_adapter import SQLiteCooldownStore

    store = SQLiteCooldownStore(tiny_disk / "cooldowns.db")
    until = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(CooldownStoreError) as raised:
        for n in range(100_000):
            store.extend(f"https://host-{n}.example.com:443/" + "x" * 300, until)
    assert (raised.value.cause, raised.value.lasting) == ("disk full", True), str(raised.value)


# -- a process never sends inside a cooldown it has itself received ---------------------------------------


def test_a_grant_in_flight_when_this_process_learns_a_cooldown_is_held_back(redis_factory: Callable[..., Any]) -> None:
    """Redis paused (``CLIENT PAUSE``): an admission is on its way to the store when
    another thread of the process receives a 429 and learns its cooldown (kept locally
    at once, its write waiting too). The store then grants the admission, as it knew
    nothing else: the failure layer checks the local copy after the grant and holds the
    attempt back (0.9: 9-53 attempts started 50-250 ms after the process received a
    Retry-After, with CLIENT PAUSE 300 every 0.7 s)."""
    import threading

    server = redis_factory()
    url = f"redis://127.0.0.1:{server.port}/0"
    store = RedisCooldownStore.from_url(url, prefix="t:", socket_timeout=3.0, socket_connect_timeout=3.0)
    guard = guard_of(store)
    now = datetime.now(timezone.utc)
    assert guard.admit(Ask(scope=SCOPE, now=now)).not_before is None  # known, and the scripts loaded
    admin = RedisCooldownStore.from_url(url, prefix="admin:")._client
    admin.execute_command("CLIENT", "PAUSE", "400", "WRITE")
    answers: list[Any] = []
    lease = Lease(slots=4, ttl=30.0, token="slot-1")
    admitting = threading.Thread(target=lambda: answers.append(guard.admit(Ask(scope=SCOPE, lease=lease))))
    admitting.start()
    time.sleep(0.1)  # the admission waits on the paused server
    until = datetime.now(timezone.utc) + timedelta(seconds=30)
    learning = threading.Thread(target=lambda: guard.extend(SCOPE, until))
    learning.start()
    admitting.join(5)
    learning.join(5)
    # Held back: by what the process knew, or, when the paused server took the write
    # before the admission, by the stored cooldown (whole milliseconds, rounded up).
    assert answers and answers[0].not_before is not None
    assert until <= answers[0].not_before < until + timedelta(milliseconds=1)
    assert store.holds().get(SCOPE, []) != []  # the cooldown reached the store too
    leases = [hold for hold in store.holds().get(SCOPE, []) if hold.kind == "leases"]
    assert not leases  # the slot the store granted went back


def test_an_attempt_admitted_before_this_process_learned_a_cooldown_is_not_sent(
    tmp_path: Any, real_server: Any
) -> None:
    """The last look before the wire: a call admitted (a slot taken) on a SQLite store,
    then another thread of the process receives a 429 before the attempt goes out. The
    attempt is not sent: its slot goes back and the call, admitted again, waits for the
    cooldown or defers (here: defers, its deadline too short)."""
    import requests

    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, SQLiteCooldownStore, deferral_of
    from retry_after_adapter.engine.plan import Plan

    store = SQLiteCooldownStore(tmp_path / "shared.db")
    adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=1, deadline=1), cooldown=store, max_concurrency=2)
    session = requests.Session()
    session.mount("http://", adapter)
    scope = adapter.scope_for(requests.Request("GET", real_server.url).prepare())
    assert session.get(real_server.url).status_code == 200
    original = Plan.learned_meanwhile
    until = datetime.now(timezone.utc) + timedelta(seconds=30)

    def another_thread_learns_first(plan: Plan, call: Any) -> bool:
        guard_of(store).extend(scope, until)  # as another thread's 429 would, after the grant
        return original(plan, call)

    Plan.learned_meanwhile = another_thread_learns_first  # type: ignore[method-assign,assignment]
    try:
        response = session.get(real_server.url)
    finally:
        Plan.learned_meanwhile = original  # type: ignore[method-assign]
    deferral = deferral_of(response)
    # The 30 s fit max_wait (60 s) but not the deadline: the deadline forced it.
    assert response.status_code == 429 and deferral is not None and deferral.reason == "deadline"
    assert until <= deferral.eligible_at < until + timedelta(milliseconds=1)  # stored in whole ms, up
    assert real_server.count() == 1  # the second call sent nothing
    assert not [hold for hold in store.holds().get(scope, []) if hold.kind == "leases"]


# -- fork-safe SQLite --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_hundred_forks_while_threads_use_a_sqlite_store_every_child_finishes(tmp_path: Any) -> None:
    """Four threads use one SQLite store without pause while the main thread forks 200
    times; each child uses the store (connects, reads, writes) and exits. A child that
    inherited one of SQLite's own mutexes held by a parent thread would hang in
    ``sqlite3.connect`` for good (0.9: 1 child in 12 in one run); none may take more
    than 10 s (each takes a few milliseconds)."""
    import os
    import signal
    import threading

    from retry_after_adapter import SQLiteCooldownStore

    path = tmp_path / "forked.db"
    store = SQLiteCooldownStore(path)
    stop = threading.Event()
    now = datetime.now(timezone.utc)

    def hammer(n: int) -> None:
        while not stop.is_set():
            try:
                store.extend(f"https://h{n}.example.com:443", now + timedelta(seconds=1))
                store.admit(Ask(scope=f"https://h{n}.example.com:443", limit=1000, per=1.0))
                store.get(SCOPE)
            except CooldownStoreError:  # a lock held past the timeout by the others: go on
                continue

    threads = [threading.Thread(target=hammer, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    hung = 0
    failed = 0
    try:
        for n in range(200):
            pid = os.fork()
            if pid == 0:  # the child: its own connection, a read and a write
                code = 0
                try:
                    child = SQLiteCooldownStore(path, timeout=5.0)  # the hammering threads' locks: waited out
                    child.extend(f"https://child-{n}.example.com:443", now + timedelta(seconds=5))
                    store.get(SCOPE)  # the parent's store object, inherited: reopens its own
                except BaseException:
                    code = 1
                os._exit(code)
            deadline = time.monotonic() + 10.0
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    failed += int(not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0)
                    break
                if time.monotonic() > deadline:
                    hung += 1
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.001)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert (hung, failed) == (0, 0)
    assert len(store.entries()) >= 200  # every child's write is in the file


def test_an_open_permit_granted_then_held_back_by_the_local_copy_is_settled(tmp_path: Any) -> None:
    """A grant the failure layer holds back after all (a cooldown this process keeps that
    the store does not have yet) sends nothing: its open permit is settled from then,
    not kept 10 s longer (the next call waited 11.5 s for a 1-per-second quota)."""
    import sqlite3

    from retry_after_adapter import SQLiteCooldownStore

    path = tmp_path / "held.db"
    store = SQLiteCooldownStore(path)
    guard = guard_of(store)
    now = datetime.now(timezone.utc)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the file: the write waits
    guard.extend(SCOPE, now + timedelta(seconds=0.3))  # learned here, kept until written back
    blocker.execute("COMMIT")
    blocker.close()
    assert guard.local.get(SCOPE) is not None
    assert guard.admit(Ask(scope=SCOPE, now=now, limit=1, per=1.0, opened=10.0)).not_before is not None
    later = now + timedelta(seconds=1.4)
    assert guard.admit(Ask(scope=SCOPE, now=later, limit=1, per=1.0, opened=10.0)).not_before is None


@pytest.mark.slow
def test_no_call_begun_after_a_cooldown_was_recorded_sends_inside_it_while_redis_pauses(
    redis_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's scenario end to end: 120 threads of one process on a Redis store
    that an operator pauses (``CLIENT PAUSE 300`` every 0.7 s, so the store's calls time
    out, its breaker opens and admission fails open), against a server answering every
    25th request with a 429 and ``Retry-After: 1``. Every cooldown is stamped once the
    process has recorded it, every call as it begins and every request as it goes to
    the socket: no call that began after a cooldown was recorded may send before that
    cooldown ends. (Calls admitted before the 429 was known may still be on their way;
    they are not counted.)"""
    import threading

    import requests
    from urllib3.connection import HTTPConnection

    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, deferral_of
    from retry_after_adapter.cooldown.guard import StoreGuard
    from retry_after_adapter.testing.scenarios import Phase, ScenarioServer, every_nth, healthy

    lock = threading.Lock()
    began = threading.local()  # when this thread's current call began (monotonic seconds)
    throttles: list[float] = []  # when this process read each 429
    recorded: list[tuple[float, float]] = []  # (cooldown recorded, its end), monotonic seconds
    early: list[float] = []
    original_request = HTTPConnection.request
    original_getresponse = HTTPConnection.getresponse
    original_extend = StoreGuard.extend

    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        with lock:
            if any(began.at > at and now < end - 0.005 for at, end in recorded):
                early.append(now)
        return original_request(self, *args, **kwargs)

    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        response = original_getresponse(self, *args, **kwargs)
        if response.status == 429:
            with lock:
                throttles.append(time.monotonic())
        return response

    def extend(self: Any, scope: str, until: datetime, budget: Any = None) -> datetime:
        result = original_extend(self, scope, until, budget)
        now = time.monotonic()
        end = now + (until - datetime.now(timezone.utc)).total_seconds()
        with lock:
            recorded.append((now, end))
        return result

    monkeypatch.setattr(HTTPConnection, "request", request)
    monkeypatch.setattr(HTTPConnection, "getresponse", getresponse)
    monkeypatch.setattr(StoreGuard, "extend", extend)

    redis = redis_factory()
    url = f"redis://127.0.0.1:{redis.port}/0"
    store = RedisCooldownStore.from_url(url, prefix="paused:")
    admin = RedisCooldownStore.from_url(url, prefix="admin:")._client
    stop = threading.Event()

    def operator() -> None:
        while not stop.wait(0.7):
            admin.execute_command("CLIENT", "PAUSE", "300", "WRITE")

    script = [Phase(every_nth(25, 429, "1", times=6), 3.0), Phase(healthy())]
    deferred = [0]
    with ScenarioServer(script) as server:

        def worker() -> None:
            adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=2, max_wait=0.05), cooldown=store)
            with requests.Session() as session:
                session.mount("http://", adapter)
                while not stop.is_set():
                    began.at = time.monotonic()
                    response = session.get(server.url + "/w", timeout=5)
                    if deferral_of(response) is not None:
                        with lock:
                            deferred[0] += 1
                        time.sleep(0.01)

        threads = [threading.Thread(target=worker) for _ in range(120)]
        pausing = threading.Thread(target=operator)
        pausing.start()
        for thread in threads:
            thread.start()
        time.sleep(3.5)
        stop.set()
        for thread in threads:
            thread.join(10)
        pausing.join(5)
        assert not any(thread.is_alive() for thread in threads)
    admin.execute_command("CLIENT", "UNPAUSE")
    store.close()

    assert len(throttles) >= 2 and len(recorded) >= 2 and deferred[0] > 0  # the scenario happened
    assert early == [], f"{len(early)} sends inside a cooldown recorded before their call began"
