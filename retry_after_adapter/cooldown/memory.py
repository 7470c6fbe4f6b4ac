"""A thread-safe in-process cooldown store."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

from .base import check_scope, check_until

#: Past this many scopes, entries already expired are swept on the next extend.
_SWEEP_AT = 4096


class MemoryCooldownStore:
    """Cooldowns shared by every thread of one process.

    ``get`` and ``extend`` take one lock for a dict lookup: no I/O. Expired entries are
    swept when the store holds more than a few thousand scopes, so memory stays bounded
    by the number of live scopes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}

    def get(self, scope: str) -> datetime | None:
        with self._lock:
            return self._until.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        check_scope(scope)
        until = check_until(until)
        with self._lock:
            current = self._until.get(scope)
            if current is not None and current >= until:
                return current
            if len(self._until) >= _SWEEP_AT:
                self._sweep(datetime.now(timezone.utc))
            self._until[scope] = until
            return until

    def _sweep(self, now: datetime) -> None:
        for key in [key for key, value in self._until.items() if value <= now]:
            del self._until[key]

    def clear(self) -> None:
        """Forget every cooldown (tests, and an operator lifting them)."""
        with self._lock:
            self._until.clear()

    def __reduce__(self) -> tuple[Any, ...]:
        # The default store is one per process: a copy or an unpickled one is it again.
        # Another store travels as a copy of its entries.
        if self is DEFAULT_STORE:
            return (_default_store, ())
        with self._lock:
            return (_memory_store, (dict(self._until),))

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)

    def __repr__(self) -> str:
        return f"MemoryCooldownStore(scopes={len(self)})"


#: The store every adapter shares unless given its own, and what ``memory://`` names:
#: one per process, so that one Session per thread still shares cooldowns.
DEFAULT_STORE = MemoryCooldownStore()


def _default_store() -> MemoryCooldownStore:
    return DEFAULT_STORE


def _memory_store(entries: dict[str, datetime]) -> MemoryCooldownStore:
    store = MemoryCooldownStore()
    store._until.update(entries)
    return store
