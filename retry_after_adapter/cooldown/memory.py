"""A thread-safe in-process cooldown store."""

from __future__ import annotations

import bisect
import collections
import heapq
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import ConfigurationError
from .allowance import ALLOWANCE_KEPT, Allowance, admit_allowance, merge_allowance
from .base import Admission, check_scope, check_until
from .freshness import Freshness, check_outcome, merge_note

#: Expired entries are dropped only while the store holds at least this many scopes, so
#: a small store never forgets a time (tests on a fake clock keep theirs).
_EXPIRE_AT = 4096
#: At most this many heap entries are looked at per ``extend``: expiry is spread over
#: the writes, never one long pause under the lock.
_EXPIRE_PER_EXTEND = 64


#: The answer of ``admit`` with nothing stored and nothing to take (shared: immutable).
_ADMITTED = Admission(None, None)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def _micros(at: datetime) -> int:
    """``at`` (an aware datetime) as whole microseconds since the epoch: exact, since a
    datetime holds microseconds; permits and leases are kept so (cheap to compare)."""
    try:
        return (at - _EPOCH) // _US
    except TypeError:  # naive, or not a datetime
        check_until(at)
        raise


def _as_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


#: ``_window_micros`` of the windows and lease lengths seen (a few per process).
_WINDOWS: dict[float, int] = {}


def _window_micros(per: float) -> int:
    """``per`` seconds in whole microseconds (as ``timedelta(seconds=per)`` rounds)."""
    try:
        return _WINDOWS[per]
    except (KeyError, TypeError):
        pass
    try:
        micros = timedelta(seconds=per) // _US
    except (TypeError, OverflowError, ValueError):
        raise ConfigurationError("a window must be a number of seconds") from None
    if len(_WINDOWS) >= 1024:
        _WINDOWS.clear()
    _WINDOWS[per] = micros
    return micros


class MemoryCooldownStore:
    """Cooldowns shared by every thread of one process.

    ``get`` is one dict lookup, without the lock (a single dict read is atomic).
    ``extend`` takes the lock for a dict write and a heap push: O(log n) in the number
    of scopes. Entries are expired from the heap's top, a few per ``extend``, once the
    store holds more than a few thousand scopes, so memory stays bounded by the live
    scopes and no call ever scans the whole store.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}
        #: (eligible time, scope) of every write; entries a later write replaced are
        #: skipped when they surface.
        self._heap: list[tuple[datetime, str]] = []
        #: Quota permits: per scope, the times of the permits granted (microseconds
        #: since the epoch, see ``_micros``), oldest first.
        self._permits: dict[str, collections.deque[int]] = {}
        #: Concurrency leases: per scope, token -> when the lease expires (microseconds).
        self._leases: dict[str, dict[str, int]] = {}
        #: What servers announced, per scope (see ``Allowance``).
        self._allowance: dict[str, Allowance] = {}
        #: Freshness per scope (see ``freshness.Freshness``; next_eligible not kept).
        self._fresh: dict[str, Freshness] = {}

    def get(self, scope: str) -> datetime | None:
        return self._until.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        check_scope(scope)
        until = check_until(until)
        with self._lock:
            current = self._until.get(scope)
            if current is not None and current >= until:
                return current
            self._put_locked(scope, until)
            return until

    def acquire(self, scope: str, limit: int, per: float, now: datetime) -> datetime | None:
        """Take a quota permit at ``now`` for ``scope``: granted (None) when fewer than
        ``limit`` were granted in the ``per`` seconds before ``now``; else nothing is
        taken and the time the oldest of them leaves the window is returned."""
        check_scope(scope)
        at = _micros(now)
        window = _window_micros(per)
        with self._lock:
            refused = self._permit_refused(scope, limit, window, at)
            if refused is None:
                self._take_permit(scope, at)
                return None
            return _as_datetime(refused)

    def _permit_refused(self, scope: str, limit: int, window: int, at: int) -> int | None:
        """(Lock held; times in microseconds.) None when a permit is free at ``at``, else
        when one will be; permits that left the window are dropped."""
        log = self._permits.get(scope)
        if log is None:
            log = self._permits[scope] = collections.deque()
        cut = at - window
        while log and log[0] <= cut:
            log.popleft()
        return None if len(log) < limit else log[-limit] + window

    def _take_permit(self, scope: str, at: int) -> None:
        log = self._permits[scope]
        if not log or at >= log[-1]:
            log.append(at)  # the usual order: no search
        else:
            bisect.insort(log, at)

    def _slot_refused(self, scope: str, limit: int, at: int) -> int | None:
        """(Lock held; times in microseconds.) None when a slot is free at ``at``, else
        when the earliest lease expires. Expired leases (a killed worker's) are dropped
        when every slot looks held."""
        held = self._leases.get(scope)
        if held is None:
            held = self._leases[scope] = {}
        if len(held) < limit:
            return None
        for key, expires in list(held.items()):  # a copy: release() pops without the lock
            if expires <= at:
                held.pop(key, None)
        return None if len(held) < limit else min(held.values(), default=at)

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
    ) -> None:
        """Record that the server allows ``remaining`` more requests of ``scope`` until
        ``until`` (``limit`` per ``window`` seconds when it said so), in answer to the
        attempt admitted as ``seq`` (see ``allowance.merge_allowance``)."""
        check_scope(scope)
        until = check_until(until)
        now = check_until(now)
        with self._lock:
            merged = merge_allowance(self._allowance.get(scope), remaining, until, now, seq, limit, window)
            if merged is not None:
                self._allowance[scope] = merged
                if len(self._allowance) > _EXPIRE_AT:
                    stale = now - timedelta(seconds=ALLOWANCE_KEPT)
                    for key in [k for k, record in self._allowance.items() if record.until <= stale]:
                        del self._allowance[key]

    def admit(
        self,
        scope: str,
        now: datetime,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
    ) -> Admission:
        """Admission for one attempt at ``now``, atomically and all or nothing: the
        scope's cooldown, what the server announced is left, a quota permit (``limit``
        per ``per`` seconds, when given) and a concurrency slot (``lease`` = (slots,
        ttl seconds, token), when given). See :class:`~.base.Admission`."""
        if limit is None and lease is None and scope not in self._allowance:
            # Nothing to take (the common case): as lock-free as ``get``.
            cooldown = self._until.get(scope)
            if cooldown is None:
                return _ADMITTED
            return Admission(cooldown, cooldown if cooldown > now else None)
        if type(scope) is not str:
            check_scope(scope)  # raises (a str's length is checked when first stored)
        try:
            at = (now - _EPOCH) // _US
        except TypeError:  # naive, or not a datetime
            check_until(now)
            raise
        with self._lock:
            cooldown = self._until.get(scope)
            if cooldown is not None and cooldown > now:
                return Admission(cooldown, cooldown)
            record = self._allowance.get(scope)
            rolled = None
            if record is not None:
                rolled, wait = admit_allowance(record, now)
                if wait is not None:
                    self._allowance[scope] = rolled
                    return Admission(cooldown, wait)
            log = None
            if limit is not None:
                window = _WINDOWS.get(per) or _window_micros(per)  # type: ignore[arg-type]
                log = self._permits.get(scope)
                if log is None:
                    check_scope(scope)  # a scope new to the store: checked once
                    log = self._permits[scope] = collections.deque()
                cut = at - window
                while log and log[0] <= cut:
                    log.popleft()
                if len(log) >= limit:
                    return Admission(cooldown, _as_datetime(log[-limit] + window))
            if lease is not None:
                slots, ttl, token = lease
                held = self._leases.get(scope)
                if held is None:
                    check_scope(scope)
                    held = self._leases[scope] = {}
                if len(held) >= slots:
                    busy = self._slot_refused(scope, slots, at)
                    if busy is not None:
                        return Admission(cooldown, _as_datetime(busy), None, True)
                held[token] = at + (_WINDOWS.get(ttl) or _window_micros(ttl))
            if log is not None:
                if not log or at >= log[-1]:
                    log.append(at)  # the usual order: no search
                else:
                    bisect.insort(log, at)
            if rolled is None:
                return _ADMITTED if cooldown is None else Admission(cooldown, None)
            self._allowance[scope] = rolled
            return Admission(cooldown, None, rolled.admitted - 1)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class of ``scope`` at ``at`` (later wins)."""
        check_scope(scope)
        check_outcome(outcome)
        at = check_until(at)
        with self._lock:
            self._fresh[scope] = merge_note(self._fresh.get(scope), outcome, at)

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness, its cooldown as ``next_eligible`` (None: nothing known)."""
        record = self._fresh.get(scope)
        cooldown = self._until.get(scope)
        if record is None and cooldown is None:
            return None
        return replace(record or Freshness(), next_eligible=cooldown)

    def freshness_entries(self) -> dict[str, Freshness]:
        """Every scope's freshness (see :meth:`freshness`)."""
        with self._lock:
            scopes = set(self._fresh) | set(self._until)
            return {
                scope: replace(self._fresh.get(scope) or Freshness(), next_eligible=self._until.get(scope))
                for scope in scopes
            }

    def allowance(self, scope: str) -> Allowance | None:
        """The scope's allowance record (see ``allowance.Allowance``), or None."""
        return self._allowance.get(scope)

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> datetime | None:
        """Take one of ``limit`` concurrency slots of ``scope`` for ``ttl`` seconds as
        ``token``: granted (None), or the time the earliest held lease expires (a slot
        is free by then at the latest). Expired leases (a killed worker's) free theirs."""
        check_scope(scope)
        at = _micros(now)
        with self._lock:
            busy = self._slot_refused(scope, limit, at)
            if busy is None:
                self._leases[scope][token] = at + _window_micros(ttl)
                return None
            return _as_datetime(busy)

    def release(self, scope: str, token: str) -> None:
        """Give ``token``'s slot of ``scope`` back (nothing if it expired meanwhile).
        Without the lock: one ``dict.pop`` is atomic, and a slot given back early is
        never one too many (``_slot_refused`` scans a copy)."""
        held = self._leases.get(scope)
        if held is not None:
            held.pop(token, None)

    def entries(self) -> dict[str, datetime]:
        """A copy of every stored scope and its time (expired ones not yet dropped
        included)."""
        with self._lock:
            return dict(self._until)

    def clear(self) -> None:
        """Forget every cooldown (tests, and an operator lifting them)."""
        with self._lock:
            self._until.clear()
            self._heap.clear()
            self._permits.clear()
            self._leases.clear()
            self._allowance.clear()
            self._fresh.clear()

    def delete(self, scope: str) -> bool:
        """Forget ``scope``'s cooldown (an operator lifting it); True if there was one."""
        with self._lock:
            return self._until.pop(scope, None) is not None

    # -- for the failure layer's local copy -------------------------------------------
    def _replace(self, scope: str, until: datetime | None) -> None:
        """Set ``scope`` to exactly ``until`` (None: forget it): the mirror of what the
        shared store said, which is authoritative while it answers."""
        with self._lock:
            if until is None:
                self._until.pop(scope, None)
            elif self._until.get(scope) != until:
                self._put_locked(scope, until)

    def _put_locked(self, scope: str, until: datetime) -> None:
        self._until[scope] = until
        heap = self._heap
        heapq.heappush(heap, (until, scope))
        if len(self._until) >= _EXPIRE_AT:
            self._expire_locked(datetime.now(timezone.utc))
        if len(heap) > 4 * len(self._until) + _EXPIRE_AT:
            # Mostly replaced entries (one scope written many times): rebuilding costs
            # O(n) once per 3n writes, O(1) amortized.
            self._heap = [(value, key) for key, value in self._until.items()]
            heapq.heapify(self._heap)

    def _expire_locked(self, now: datetime) -> None:
        heap = self._heap
        until = self._until
        for _ in range(_EXPIRE_PER_EXTEND):
            if not heap or heap[0][0] > now:
                return
            when, scope = heapq.heappop(heap)
            if until.get(scope) == when:
                del until[scope]

    def __reduce__(self) -> tuple[Any, ...]:
        # The default store is one per process: a copy or an unpickled one is it again.
        # Another store travels as a copy of its entries.
        if self is DEFAULT_STORE:
            return (_default_store, ())
        return (_memory_store, (self.entries(),))

    def __len__(self) -> int:
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
    for scope, until in entries.items():
        store.extend(scope, until)
    return store
