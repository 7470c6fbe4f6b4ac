"""Broken stores the conformance kit must fail, each with the kit run against it
(``test_kit_fails.py`` runs this module in a pytest of its own and reads what failed;
pytest does not collect it by itself: its name does not start with ``test_``).

Each is one of the package's stores, or a small store on the documented core and
mixins, with one thing broken as a third party's store was found broken:

- :class:`HoldsNothing` and :class:`ListsNoHolds`: ``Listing.holds()`` lists nothing
  (the memory store's; a small store's of the core and ``Listing``);
- :class:`DeafFeed`: a change feed that says it is fresh and never delivers a change;
- :class:`UnlockedMemoryStore` and :class:`ReadThenWriteStore`: an ``admit`` that reads,
  then writes what it read, with nothing held across (no lock at all; a lock taken for
  the read and again for the write, as a READ COMMITTED transaction without a per-scope
  lock does);
- :class:`UnderstatesItsBound` and :class:`RetriesPastItsBound`: a ``Bounded`` store
  whose operations take longer than it declares (all of them; its ``answer`` only).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter import CooldownStoreError, MemoryCooldownStore, SQLiteCooldownStore
from retry_after_adapter.cooldown import (
    Admission,
    Answer,
    Ask,
    Feed,
    Hold,
    Leases,
    Listing,
    QuotaLogs,
    Store,
    check_scope,
    check_until,
)
from retry_after_adapter.cooldown.base import Changed
from retry_after_adapter.testing.conformance import StoreContract


# -- the broken stores ------------------------------------------------------------------
class HoldsNothing(MemoryCooldownStore):
    """The memory store, but ``holds()`` lists nothing (the CLI's ``status`` then shows
    no scope held back while every worker waits)."""

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        return {}


class ListsNoHolds(Store, Listing):
    """A small store of the core and ``Listing`` (no ``Weights``, whose token test would
    read ``holds()`` too): its entries and deletion work, ``holds()`` lists nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}

    def get(self, scope: str) -> datetime | None:
        return self._until.get(check_scope(scope))

    def extend(self, scope: str, until: datetime) -> datetime:
        scope, until = check_scope(scope), check_until(until)
        with self._lock:
            kept = self._until[scope] = max(self._until.get(scope, until), until)
            return kept

    def entries(self) -> dict[str, datetime]:
        with self._lock:
            return dict(self._until)

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        return {}

    def delete(self, scope: str) -> bool:
        with self._lock:
            return self._until.pop(check_scope(scope), None) is not None


class AlwaysFresh(Feed):
    """A feed that says every change was delivered, and delivers none."""

    def fresh(self) -> bool:
        return True


class DeafFeed(SQLiteCooldownStore):
    """The SQLite store with a feed that is always fresh and never calls ``changed``:
    a process's near copy admits from memory into cooldowns learned elsewhere."""

    def feed(self, changed: Changed) -> Feed | None:
        return AlwaysFresh()


class _NoLock:
    """A lock that holds nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        return None


class UnlockedMemoryStore(MemoryCooldownStore):
    """The memory store with a lock that holds nothing: ``admit`` reads a scope's
    permits and slots, then writes what it decided from them, and another admission
    may read the same in between."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = _NoLock()  # type: ignore[assignment]


class ReadThenWriteStore(Store, QuotaLogs, Leases):
    """A small store on the documented core and mixins whose ``admit`` reads what is
    taken, lets go, and writes (as a READ COMMITTED transaction would: each statement
    sees what is committed, nothing holds the scope from the read to the write)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}
        self._permits: dict[str, list[datetime]] = {}
        self._slots: dict[str, dict[str, datetime]] = {}

    def get(self, scope: str) -> datetime | None:
        return self._until.get(check_scope(scope))

    def extend(self, scope: str, until: datetime) -> datetime:
        scope, until = check_scope(scope), check_until(until)
        with self._lock:
            kept = self._until[scope] = max(self._until.get(scope, until), until)
            return kept

    def admit(self, ask: Ask) -> Admission:
        scope = check_scope(ask.scope)
        now = check_until(ask.now) if ask.now is not None else datetime.now(timezone.utc)
        with self._lock:  # the read: one statement
            cooldown = self._until.get(scope)
            permits = [end for end in self._permits.get(scope, []) if end > now]
            slots = {token: end for token, end in self._slots.get(scope, {}).items() if end > now}
        if cooldown is not None and cooldown > now:
            return Admission(cooldown=cooldown, not_before=cooldown)
        if ask.limit is not None and ask.per is not None and len(permits) >= ask.limit:
            return Admission(cooldown=cooldown, not_before=min(permits))
        if ask.lease is not None and len(slots) >= ask.lease.slots:
            return Admission(cooldown=cooldown, not_before=min(slots.values()), slot_busy=True)
        with self._lock:  # the write: another statement
            if ask.limit is not None and ask.per is not None:
                self._permits[scope] = [*permits, now + timedelta(seconds=ask.per + ask.margin)]
            if ask.lease is not None:
                lease = ask.lease
                self._slots[scope] = {**slots, lease.token: now + timedelta(seconds=lease.ttl)}
        return Admission(cooldown=cooldown, not_before=None)

    def answer(self, answer: Answer) -> None:
        if answer.token is not None:
            with self._lock:
                self._slots.get(check_scope(answer.scope), {}).pop(answer.token, None)


class UnderstatesItsBound(SQLiteCooldownStore):
    """The SQLite store, waiting up to 1.5 s for a locked file, that declares a bound of
    0.1 s on its operations (the failure layer then calls it on the calling thread)."""

    def operation_timeout(self) -> float:
        return 0.1


class RetriesPastItsBound(SQLiteCooldownStore):
    """The SQLite store, which declares its ``timeout`` as its bound, but whose
    ``answer`` tries again, up to ten times, while the file stays locked."""

    def answer(self, answer: Answer) -> None:
        for attempt in range(10):
            try:
                super().answer(answer)
                return
            except CooldownStoreError:
                if attempt == 9:
                    raise


# -- the kit run against each ---------------------------------------------------------------
@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """A SQLite file (made by the store) that another connection then holds locked."""
    path = tmp_path / "cooldown.db"
    SQLiteCooldownStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield path
    finally:
        holder.execute("ROLLBACK")
        holder.close()


class TestKitOnHoldsNothing(StoreContract):
    @pytest.fixture
    def store(self) -> Any:
        return HoldsNothing()


class TestKitOnListsNoHolds(StoreContract):
    @pytest.fixture
    def store(self) -> Any:
        return ListsNoHolds()


class TestKitOnDeafFeed(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        with DeafFeed(tmp_path / "cooldown.db") as store:
            yield store

    @pytest.fixture
    def other_store(self, store: Any, tmp_path: Path) -> Iterator[Any]:
        with DeafFeed(tmp_path / "cooldown.db") as other:
            yield other

    @pytest.fixture
    def hung_store(self, store: Any, locked: Path) -> Iterator[Any]:
        with DeafFeed(locked, timeout=0.2) as hung:
            yield hung


class TestKitOnUnlockedMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> Any:
        return UnlockedMemoryStore()


class TestKitOnReadThenWriteStore(StoreContract):
    @pytest.fixture
    def store(self) -> Any:
        return ReadThenWriteStore()


class TestKitOnUnderstatesItsBound(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        with UnderstatesItsBound(tmp_path / "cooldown.db", timeout=1.5) as store:
            yield store

    @pytest.fixture
    def hung_store(self, locked: Path) -> Iterator[Any]:
        with UnderstatesItsBound(locked, timeout=1.5) as hung:
            yield hung


class TestKitOnRetriesPastItsBound(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        with RetriesPastItsBound(tmp_path / "cooldown.db", timeout=0.2) as store:
            yield store

    @pytest.fixture
    def hung_store(self, locked: Path) -> Iterator[Any]:
        with RetriesPastItsBound(locked, timeout=0.2) as hung:
            yield hung
