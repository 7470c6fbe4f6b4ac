"""The cooldown stores against real backends: a SQLite file and a real redis-server.

The protocol every backend keeps is the conformance kit's (``test_conformance.py``);
here is each backend's own behaviour (locks, expiry, outages, URLs), and real processes
sharing one cooldown: 8 processes x 8 threads extend random times into the same few
scopes, and afterwards every scope holds exactly the maximum of everything written,
with ``spawn`` (the store pickled into the child) and ``fork`` (the child inherits the
parent's store and its open connection). No mocks: the database, the server and its
failures are real.
"""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import queue
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter.cooldown import (
    CooldownStore,
    MemoryCooldownStore,
    RedisCooldownStore,
    SQLiteCooldownStore,
    store_from_url,
)
from retry_after_adapter.cooldown.sqlite import store as sqlite_module
from retry_after_adapter.errors import ConfigurationError, CooldownStoreError

from ..conftest import RedisServer

UTC = timezone.utc
PASSWORD = "hunter2-not-in-messages"


def now_ms() -> datetime:
    """Now, truncated to whole milliseconds (what every backend stores exactly)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# The protocol every backend keeps (get, extend later-wins, entries and delete, bad
# scopes and naive times refused, admission all or nothing) is the conformance kit's:
# retry_after_adapter.testing.conformance, run on every store by test_conformance.py.


# -- SQLite --------------------------------------------------------------------------


def test_sqlite_missing_directory_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "cooldown.db"
    with pytest.raises(ConfigurationError, match="does not exist"):
        SQLiteCooldownStore(missing)
    assert not missing.parent.exists()  # the store never creates directories


@pytest.mark.parametrize("path", ["", ":memory:", "file:cooldown.db?mode=memory"])
def test_sqlite_refuses_paths_other_processes_cannot_share(path: str) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteCooldownStore(path)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5"])
def test_sqlite_refuses_bad_timeouts(tmp_path: Path, timeout: Any) -> None:
    with pytest.raises(ConfigurationError):
        SQLiteCooldownStore(tmp_path / "c.db", timeout=timeout)


def test_sqlite_table_layout_and_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "layout.db"
    with SQLiteCooldownStore(path) as store:
        until = now_ms() + timedelta(seconds=7)
        store.extend("s", until)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = [(row[1], row[2], row[3], row[5]) for row in conn.execute("PRAGMA table_info(cooldown)")]
        assert columns == [("scope", "TEXT", 0, 1), ("until_ms", "INTEGER", 1, 0)]
        ms = conn.execute("SELECT until_ms FROM cooldown WHERE scope = 's'").fetchone()[0]
        assert ms == int(until.timestamp() * 1000)
    finally:
        conn.close()


def test_sqlite_two_store_objects_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SQLiteCooldownStore(path) as first, SQLiteCooldownStore(str(path)) as second:
        until = now_ms() + timedelta(seconds=30)
        first.extend("s", until)
        assert second.get("s") == until
        assert second.extend("s", until - timedelta(seconds=1)) == until


def test_sqlite_store_pickles_as_its_path(tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "p.db", timeout=2.5) as store:
        until = now_ms() + timedelta(seconds=30)
        store.extend("s", until)
        data = pickle.dumps(store)
        assert b"Connection" not in data
        with pickle.loads(data) as copy:
            assert copy.path == store.path and copy.timeout == 2.5
            assert copy.get("s") == until


def test_sqlite_relative_path_is_fixed_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with SQLiteCooldownStore("rel.db") as store:
        assert store.path == str(tmp_path / "rel.db")


def test_sqlite_fallback_without_returning_keeps_later_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The upsert + select transaction used on SQLite older than 3.35, on the real file.
    monkeypatch.setattr(sqlite_module, "_HAS_RETURNING", False)
    with SQLiteCooldownStore(tmp_path / "old.db") as store:
        base = now_ms()
        assert store.extend("s", base + timedelta(seconds=20)) == base + timedelta(seconds=20)
        assert store.extend("s", base + timedelta(seconds=5)) == base + timedelta(seconds=20)
        assert store.extend("s", base + timedelta(seconds=40)) == base + timedelta(seconds=40)
        assert store.get("s") == base + timedelta(seconds=40)


def test_sqlite_sweep_deletes_only_long_expired_rows(tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "sweep.db") as store:
        now = now_ms()
        store.extend("ancient", now - timedelta(hours=2))
        store.extend("recent", now - timedelta(minutes=5))
        store.extend("live", now + timedelta(minutes=5))
        assert store.sweep() == 1
        assert store.get("ancient") is None
        assert store.get("recent") == now - timedelta(minutes=5)
        assert store.get("live") == now + timedelta(minutes=5)


@pytest.mark.random_sweep
def test_sqlite_extend_sweeps_now_and_then(tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "auto.db") as store:
        now = now_ms()
        for i in range(50):
            store.extend(f"old-{i}", now - timedelta(hours=3))
        # About one extend in 256 sweeps: 3000 calls miss it with probability < 1e-5.
        # A sweep may already run while the old rows go in, so wait for the last one:
        # only a sweep after all fifty were written removes it.
        for _ in range(3000):
            store.extend("live", now + timedelta(minutes=1))
            if store.get("old-49") is None:
                break
        assert all(store.get(f"old-{i}") is None for i in range(50))


def test_sqlite_write_lock_held_past_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = SQLiteCooldownStore(path, timeout=0.3)
    before = now_ms() + timedelta(seconds=5)
    store.extend("s", before)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        start = time.monotonic()
        with pytest.raises(CooldownStoreError, match="locked") as caught:
            store.extend("s", before + timedelta(seconds=5))
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed < 2.0
        assert not isinstance(caught.value, sqlite3.Error)
        # WAL: readers do not wait for the writer.
        assert store.get("s") == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # The lock is gone: the same store works again.
    assert store.extend("s", before + timedelta(seconds=5)) == before + timedelta(seconds=5)
    store.close()


def test_sqlite_database_locked_for_readers_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "exclusive.db"
    with SQLiteCooldownStore(path) as first:
        first.extend("s", now_ms())
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        # Exclusive locking mode: not even WAL readers may open the file meanwhile.
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE cooldown SET until_ms = until_ms + 1")
        start = time.monotonic()
        with pytest.raises(CooldownStoreError, match="locked"):
            SQLiteCooldownStore(path, timeout=0.3)
        assert 0.25 <= time.monotonic() - start < 2.0
    finally:
        holder.close()
    with SQLiteCooldownStore(path, timeout=0.3) as again:
        assert again.get("s") is not None


def test_sqlite_lock_released_within_timeout_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "brief.db"
    store = SQLiteCooldownStore(path, timeout=5.0)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        until = now_ms() + timedelta(seconds=1)
        start = time.monotonic()
        assert store.extend("s", until) == until
        assert 0.2 <= time.monotonic() - start < 4.0
    finally:
        release.join()
        holder.close()
        store.close()


def test_sqlite_file_that_is_not_a_database_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database, just some bytes" * 100)
    start = time.monotonic()
    with pytest.raises(CooldownStoreError, match="not a database"):
        SQLiteCooldownStore(path, timeout=5.0)
    assert time.monotonic() - start < 1.0  # a permanent error is not retried


def test_sqlite_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "closed.db")
    store.extend("s", now_ms())
    store.close()
    with pytest.raises(CooldownStoreError, match="closed"):
        store.get("s")
    with pytest.raises(CooldownStoreError, match="closed"):
        store.extend("s", now_ms())


def test_sqlite_threads_each_use_their_own_connection(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "threads.db")
    seen: list[int] = []
    barrier = threading.Barrier(4, timeout=10)

    def use() -> None:
        store.extend("s", now_ms())
        seen.append(id(store._local.slot.conn))
        barrier.wait()  # all four alive at once, so no id can be reused

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(set(seen)) == 4
    store.close()


def test_sqlite_connections_of_ended_threads_are_closed(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "churn.db")
    for _ in range(20):
        thread = threading.Thread(target=lambda: store.extend("s", now_ms()))
        thread.start()
        thread.join(timeout=10)
    gc.collect()
    assert len(store._conns) == 1  # only the main thread's connection is still open
    store.close()


# -- Redis ---------------------------------------------------------------------------


@pytest.mark.redis
def test_redis_key_value_and_expiry(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client, prefix="ra:")
    until = now_ms() + timedelta(seconds=30)
    store.extend("https://api.example:443", until)
    raw = redis_client.get("ra:https://api.example:443")
    assert int(raw) == int(until.timestamp() * 1000)
    # The key outlives the cooldown by the grace minute, then cleans itself up.
    expire_at = time.time() * 1000 + redis_client.pttl("ra:https://api.example:443")
    assert abs(expire_at - (int(until.timestamp() * 1000) + 60_000)) < 1000
    # A shorter extend changes neither value nor expiry.
    store.extend("https://api.example:443", until - timedelta(seconds=20))
    assert int(redis_client.get("ra:https://api.example:443")) == int(until.timestamp() * 1000)
    expire_again = time.time() * 1000 + redis_client.pttl("ra:https://api.example:443")
    assert abs(expire_again - expire_at) < 1000


@pytest.mark.redis
def test_redis_long_expired_cooldown_deletes_its_key(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client)
    past = now_ms() - timedelta(minutes=5)
    assert store.extend("gone", past) == past
    assert redis_client.exists("retry-after:gone") == 0
    assert store.get("gone") is None


@pytest.mark.redis
def test_redis_value_that_is_not_a_time(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client)
    redis_client.set("retry-after:junk", "not-a-number")
    with pytest.raises(CooldownStoreError, match="not a time"):
        store.get("junk")
    until = now_ms() + timedelta(seconds=3)
    assert store.extend("junk", until) == until  # the script replaces it
    redis_client.lpush("retry-after:list", "x")
    with pytest.raises(CooldownStoreError, match="ResponseError"):
        store.extend("list", until)
    with pytest.raises(CooldownStoreError):
        store.get("list")


@pytest.mark.redis
def test_redis_script_is_reloaded_after_script_flush(redis_client: Any) -> None:
    store = RedisCooldownStore(redis_client)
    base = now_ms()
    store.extend("s", base + timedelta(seconds=1))
    redis_client.script_flush()
    assert store.extend("s", base + timedelta(seconds=2)) == base + timedelta(seconds=2)


@pytest.mark.redis
def test_redis_from_url_and_valkey_scheme_reach_the_server(redis_url: str, redis_client: Any) -> None:
    until = now_ms() + timedelta(seconds=9)
    for url in (redis_url, redis_url.replace("redis://", "valkey://")):
        store = store_from_url(url)
        assert isinstance(store, RedisCooldownStore)
        assert store.extend("u", until) == until
        assert store.get("u") == until
        store.close()
    prefixed = store_from_url(redis_url + "?prefix=other%3A")
    assert isinstance(prefixed, RedisCooldownStore) and prefixed.prefix == "other:"
    prefixed.extend("u", until)
    assert redis_client.exists("other:u") == 1
    prefixed.close()


@pytest.mark.redis
def test_redis_store_from_url_pickles_client_store_does_not(redis_url: str, redis_client: Any) -> None:
    store = RedisCooldownStore.from_url(redis_url, prefix="p:")
    until = now_ms() + timedelta(seconds=9)
    store.extend("s", until)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.prefix == "p:" and copy.get("s") == until
    with pytest.raises(TypeError, match="from_url"):
        pickle.dumps(RedisCooldownStore(redis_client))
    store.close()
    copy.close()


def test_redis_store_refuses_an_object_that_is_not_a_client() -> None:
    with pytest.raises(ConfigurationError, match="redis-py compatible"):
        RedisCooldownStore(object())


@pytest.mark.redis
def test_redis_wrong_password_error_never_shows_the_password(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory("--requirepass", "the-right-one")
    store = RedisCooldownStore.from_url(f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0")
    calls: list[Callable[[], object]] = [lambda: store.get("s"), lambda: store.extend("s", now_ms())]
    for call in calls:
        with pytest.raises(CooldownStoreError) as caught:
            call()
        assert PASSWORD not in str(caught.value) and PASSWORD not in repr(caught.value)
        assert PASSWORD not in str(caught.value.__cause__)
    store.close()
    good = RedisCooldownStore.from_url(f"redis://:the-right-one@127.0.0.1:{server.port}/0")
    until = now_ms() + timedelta(seconds=1)
    assert good.extend("s", until) == until
    good.close()


def _run_through_outage(store: RedisCooldownStore, outage: Callable[[], None], run_for: float) -> list[Any]:
    """Threads call get/extend while ``outage()`` happens; returns (duration, error) per call."""
    calls: list[tuple[float, BaseException | None]] = []
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(20_000):
            if stop.is_set():
                return
            start = time.monotonic()
            try:
                if rng.random() < 0.5:
                    store.extend(f"s{seed}", now_ms() + timedelta(seconds=rng.randrange(1, 60)))
                else:
                    store.get(f"s{seed}")
                error = None
            except BaseException as exc:  # everything is recorded, nothing escapes the thread
                error = exc
            calls.append((time.monotonic() - start, error))
            time.sleep(0.002)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.15)
    outage()
    time.sleep(run_for)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    return calls


def _works_again(store: RedisCooldownStore) -> None:
    """After the server is back the store recovers (each pooled connection the server
    dropped may fail one call first)."""
    until = now_ms() + timedelta(seconds=42)
    deadline = time.monotonic() + 5
    for _ in range(50):
        try:
            assert store.extend("after", until) == until
            break
        except CooldownStoreError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    else:
        pytest.fail("the store did not recover after the server came back")
    assert store.get("after") == until


@pytest.mark.redis
def test_redis_killed_mid_run_raises_only_store_errors_then_recovers(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    store = RedisCooldownStore.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    store.extend("warm", now_ms())
    calls = _run_through_outage(store, server.kill, run_for=0.4)
    errors = [error for _, error in calls if error is not None]
    assert errors, "no call saw the outage"
    assert all(type(error) is CooldownStoreError for error in errors), {type(e) for e in errors}
    assert max(duration for duration, _ in calls) < 1.5
    server.restart()
    _works_again(store)
    store.close()


@pytest.mark.redis
def test_redis_hung_server_fails_calls_within_the_socket_timeout(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    store = RedisCooldownStore.from_url(server.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    store.extend("warm", now_ms())
    try:
        calls = _run_through_outage(store, server.freeze, run_for=0.8)
    finally:
        server.thaw()
    errors = [error for _, error in calls if error is not None]
    assert errors, "no call saw the outage"
    assert all(type(error) is CooldownStoreError for error in errors), {type(e) for e in errors}
    assert max(duration for duration, _ in calls) < 0.3 + 0.5  # one timeout, no retry after it
    _works_again(store)
    store.close()


# -- the optional dependency ---------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path.cwd()
    )


def test_importing_the_stores_does_not_import_redis() -> None:
    result = _python(
        "import sys\n"
        "import retry_after_adapter.cooldown as c\n"
        "assert c.RedisCooldownStore and c.store_from_url\n"
        "print('redis' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_from_url_without_redis_names_the_extra() -> None:
    result = _python(
        "import sys\n"
        "sys.modules['redis'] = None  # as if redis-py were not installed\n"
        "from retry_after_adapter.cooldown import RedisCooldownStore, store_from_url\n"
        "from retry_after_adapter.errors import ConfigurationError\n"
        "for make in (RedisCooldownStore.from_url, store_from_url):\n"
        "    try:\n"
        "        make('redis://127.0.0.1:1/0')\n"
        "    except ConfigurationError as exc:\n"
        "        print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert all("pip install 'retry_after_adapter[redis]'" in line for line in lines)


# -- store_from_url ------------------------------------------------------------------


def test_url_memory_gives_the_process_default_store() -> None:
    from retry_after_adapter.adapter import RetryAfterAdapter

    first, second = store_from_url("memory://"), store_from_url(" MEMORY:// ")
    assert isinstance(first, MemoryCooldownStore)
    # memory:// names the same cooldowns every adapter shares by default.
    assert first is second is RetryAfterAdapter().cooldown


def test_url_sqlite_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    relative = store_from_url("sqlite:///sub/rel.db")
    absolute = store_from_url(f"sqlite:///{tmp_path}/abs.db?timeout=2.5")
    assert isinstance(relative, SQLiteCooldownStore) and isinstance(absolute, SQLiteCooldownStore)
    assert relative.path == str(tmp_path / "sub" / "rel.db")
    assert absolute.path == str(tmp_path / "abs.db") and absolute.timeout == 2.5
    spaced = store_from_url("sqlite:///with%20space.db")
    assert isinstance(spaced, SQLiteCooldownStore) and spaced.path == str(tmp_path / "with space.db")
    for store in (relative, absolute, spaced):
        store.close()


def test_url_sqlite_three_slashes_is_relative_and_the_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="four slashes"):
        store_from_url("sqlite:///var/no-such-dir/cooldown.db")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "cooldown.db",
        "memory://somewhere",
        "sqlite://",
        "sqlite:///",
        f"sqlite://user:{PASSWORD}@host/x.db",
        "sqlite:///x.db?mode=ro",
        "sqlite:///x.db?timeout=soon",
        "sqlite:///x.db?timeout=-1",
        f"redis://:{PASSWORD}@127.0.0.1:notaport/0",
        f"redis://:a@b/{PASSWORD}?x@127.0.0.1:notaport/0",
        f":{PASSWORD}@127.0.0.1:6379",
        "redis://127.0.0.1:6379/cache",
        f"rediss://admin:{PASSWORD}@[::1/0",
        f"redis://127.0.0.1:6379/0?password={PASSWORD}&prefix=a&prefix=b",
        f"https://user:{PASSWORD}@example.com/",
        f"mysql://root:{PASSWORD}@db/cooldowns",
    ],
)
def test_bad_urls_are_configuration_errors_without_secrets(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as caught:
        store_from_url(url)
    assert PASSWORD not in str(caught.value)
    assert caught.value.__cause__ is None or PASSWORD not in str(caught.value.__cause__)


def test_url_must_be_a_string() -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(b"memory://")  # type: ignore[arg-type]


# -- the memory store's expiry ----------------------------------------------------------


def test_memory_store_expires_past_entries_from_its_heap_never_live_ones() -> None:
    from retry_after_adapter.cooldown import memory

    store = MemoryCooldownStore()
    past = datetime.now(UTC) - timedelta(hours=1)
    future = datetime.now(UTC) + timedelta(hours=1)
    for i in range(memory._EXPIRE_AT):
        store.extend(f"old{i}", past + timedelta(microseconds=i))
    for i in range(100):
        store.extend(f"live{i}", future)
    # Each extend past the threshold drops a bounded batch of expired entries.
    for i in range(memory._EXPIRE_AT // memory._EXPIRE_PER_EXTEND + 1):
        store.extend(f"new{i}", future)
    # Expired entries went until the store was back under the threshold; no live one did.
    assert len(store) <= memory._EXPIRE_AT
    assert sum(key.startswith("old") for key in store.entries()) < memory._EXPIRE_AT - 100
    assert all(store.get(f"live{i}") == future for i in range(100))
    assert all(store.get(f"new{i}") == future for i in range(10))
    # One scope written over and over does not grow the heap without bound.
    for i in range(50_000):
        store.extend("hot", future + timedelta(microseconds=i))
    assert len(store._heap) <= 4 * len(store) + memory._EXPIRE_AT + 1


def test_memory_store_under_the_threshold_keeps_even_past_times() -> None:
    store = MemoryCooldownStore()
    past = datetime(2020, 1, 1, tzinfo=UTC)  # a FakeClock's "now" is often in the past
    store.extend("s", past)
    for i in range(100):
        store.extend(f"x{i}", past)
    assert store.get("s") == past


@pytest.mark.redis
def test_redis_delete_lifts_only_its_own_scopes_permits(redis_client: Any) -> None:
    """A scope whose key has a hash tag of its own (``tenant-{7}``) finds its quota and
    token keys by a pattern that another scope's keys match too when they end in
    ``:<key>``; delete lifts only its own."""
    from datetime import datetime, timezone

    from retry_after_adapter import RedisCooldownStore
    from retry_after_adapter.cooldown import Ask, Weigh

    store = RedisCooldownStore(redis_client, prefix="del:")
    now = datetime.now(timezone.utc)
    mine, other = "tenant-{7}", "z:del:tenant-{7}"
    for scope in (mine, other):
        assert store.admit(Ask(scope=scope, now=now, limit=1, per=60.0, weigh=Weigh(25, 25, 60.0))).not_before is None
    assert store.delete(mine)
    assert store.admit(Ask(scope=mine, now=now, limit=1, per=60.0, weigh=Weigh(25, 25, 60.0))).not_before is None
    assert store.admit(Ask(scope=other, now=now, limit=1, per=60.0)).not_before is not None  # its permit still counts
    assert store.admit(Ask(scope=other, now=now, weigh=Weigh(1, 25, 60.0))).not_before is not None


# -- real processes sharing one cooldown ----------------------------------------------------

PROCESSES = 8
THREADS = 8
CALLS_PER_THREAD = 40
SCOPES = ("https://a.example:443", "https://b.example:443", "https://c.example:443")
LONG_SCOPE = "https://long.example:443"
RESULT_TIMEOUT = 40.0

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform"
)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def hammer(store: CooldownStore, base_ms: int, seed: int, results: Any) -> None:
    """One worker process: THREADS threads extend random times and check every reply.

    Reports ``(seed, {scope: max ms written}, [problems])`` on ``results``.
    """
    written: dict[str, int] = {}
    problems: list[str] = []
    lock = threading.Lock()

    def thread_main(thread_seed: int) -> None:
        rng = random.Random(thread_seed)
        last: dict[str, datetime] = {}
        mine: dict[str, int] = {}
        for _ in range(CALLS_PER_THREAD):
            scope = rng.choice((*SCOPES, LONG_SCOPE))
            ms = base_ms + rng.randrange(0, 3_600_000)
            until = datetime.fromtimestamp(ms / 1000, UTC)
            try:
                effective = store.extend(scope, until)
            except Exception as exc:
                problems.append(f"extend raised {type(exc).__name__}: {exc}")
                return
            if effective < until:
                problems.append(f"extend shortened: {effective} < {until}")
            if scope in last and effective < last[scope]:
                problems.append(f"stored time went backwards: {effective} < {last[scope]}")
            last[scope] = effective
            mine[scope] = max(mine.get(scope, 0), ms)
        with lock:
            for scope, ms in mine.items():
                written[scope] = max(written.get(scope, 0), ms)

    threads = [threading.Thread(target=thread_main, args=(seed * 1000 + n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RESULT_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        problems.append("a thread did not finish")
    results.put((seed, written, problems))


def run_processes(method: str, store: CooldownStore) -> None:
    """Run PROCESSES hammer workers under ``method`` and check the final state; while
    they run, the parent writes one long cooldown that no worker may shorten."""
    context: Any = multiprocessing.get_context(method)
    results = context.Queue()
    now = datetime.now(UTC)
    base_ms = _ms(now.replace(microsecond=now.microsecond // 1000 * 1000))
    long_until = datetime.fromtimestamp((base_ms + 2 * 3_600_000) / 1000, UTC)
    workers = [
        context.Process(target=hammer, args=(store, base_ms, seed, results), daemon=True)
        for seed in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    try:
        assert store.extend(LONG_SCOPE, long_until) == long_until
        reports: list[tuple[int, dict[str, int], list[str]]] = []
        deadline = time.monotonic() + RESULT_TIMEOUT
        while len(reports) < PROCESSES:
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"only {len(reports)} of {PROCESSES} workers reported in time")
        for worker in workers:
            worker.join(timeout=10)
            assert worker.exitcode == 0
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
    problems = [problem for _, _, found in reports for problem in found]
    assert problems == []
    expected: dict[str, int] = {}
    for _, written, _ in reports:
        for scope, ms in written.items():
            expected[scope] = max(expected.get(scope, 0), ms)
    assert set(expected) >= set(SCOPES)
    for scope in SCOPES:
        stored = store.get(scope)
        assert stored is not None and _ms(stored) == expected[scope], scope
    # The long cooldown outlasts every shorter one the workers wrote over it.
    assert store.get(LONG_SCOPE) == long_until


@pytest.mark.parametrize("method", ["spawn", pytest.param("fork", marks=needs_fork)])
def test_sqlite_processes_and_threads_end_with_the_maximum(method: str, tmp_path: Path) -> None:
    with SQLiteCooldownStore(tmp_path / "shared.db", timeout=10.0) as store:
        store.get("warm")  # the parent's connection is open before the workers start
        run_processes(method, store)


@pytest.mark.redis
@pytest.mark.parametrize("method", ["spawn", pytest.param("fork", marks=needs_fork)])
def test_redis_processes_and_threads_end_with_the_maximum(
    method: str, redis_url: str, redis_client: Any
) -> None:
    # from_url: picklable for spawn; under fork redis-py opens new connections in the child.
    store = RedisCooldownStore.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
    store.get("warm")
    try:
        run_processes(method, store)
    finally:
        store.close()


def child_uses_inherited_store(store: SQLiteCooldownStore, until: datetime, results: Any) -> None:
    try:
        inherited = store._slot() is None  # the parent's connection is not reused here
        effective = store.extend("forked", until)
        seen = store.get("forked")
        store.close()  # closes only what the child opened
        results.put((inherited, effective, seen, None))
    except Exception as exc:
        results.put((False, None, None, f"{type(exc).__name__}: {exc}"))


@needs_fork
def test_sqlite_store_created_before_fork_works_in_the_child(tmp_path: Path) -> None:
    store = SQLiteCooldownStore(tmp_path / "fork.db")
    before = datetime.fromtimestamp(int(time.time()) + 10, UTC)
    store.extend("forked", before)  # the parent's connection is open across the fork
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    later = before + timedelta(minutes=1)
    child = context.Process(target=child_uses_inherited_store, args=(store, later, results))
    child.start()
    try:
        fresh_connection, effective, seen, error = results.get(timeout=RESULT_TIMEOUT)
        child.join(timeout=10)
    finally:
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
    assert error is None
    assert fresh_connection
    assert effective == later and seen == later
    assert child.exitcode == 0
    # The parent's own connection is intact after the child closed its store copy.
    assert store.get("forked") == later
    assert store.extend("forked", later + timedelta(seconds=1)) == later + timedelta(seconds=1)
    store.close()
