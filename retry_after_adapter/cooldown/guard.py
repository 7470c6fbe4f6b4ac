"""The store failure layer: one per store object in a process, shared by every adapter,
session and pool manager that uses that store.

:class:`StoreGuard` sits between the calls and a shared store (SQLite, Redis, or your
own). It gives every process one answer to "what if the store fails?":

- **One local copy.** Every cooldown read from or written to the store is mirrored in
  memory. While the store answers, it is authoritative (an operator's ``clear`` lifts
  a cooldown for everyone); while it fails, the local copy answers (fail open), and a
  cooldown learned then is kept, later-wins, never shortened.
- **Write-back.** A cooldown learned while the store failed is *pending*; when the store
  answers again, every pending cooldown is written to it (later-wins), so the other
  processes and hosts hold back too. A store that reports it was replaced under us (a
  SQLite file deleted or swapped: its ``generation`` changes) gets the whole local copy
  written back.
- **Bounded operations and a circuit breaker.** One operation takes at most the store's
  own timeout (``timeout``, seconds; see :data:`STORE_TIMEOUT`) and never more than the
  call has left; an operation that fails or times out opens the breaker: the store is
  skipped for a back-off interval (0.5 s, doubling to 5 s; kept at 0.5 s while cooldowns
  wait to be written back) and then tried by one probe,
  so no call pays a store timeout twice and a hung store costs a fleet one timeout per
  interval, not one per request.
- **One health state and one warning per outage** (a WARNING when it starts, an INFO
  line once the store has answered for :data:`SETTLE` seconds without a failure), with
  hysteresis: a store that fails again within :data:`QUIET_PERIOD` of recovering
  continues the same outage, and the line that ends it waits until the store has
  stayed healthy for that long, so a flapping store logs a few lines a minute at most.

Whether a call goes on (``store_failure="open"``) or defers with ``cooldown-unknown``
(``"closed"``) while the store fails is each adapter's own choice; the guard is shared.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol, TypeVar

from .. import _forksafe
from ..errors import ConfigurationError, CooldownStoreError, CooldownUnavailable
from .base import Admission, CooldownStore, Granted
from .freshness import Freshness
from .memory import MemoryCooldownStore

_T = TypeVar("_T")

#: Seconds one store operation may take when the store does not say (a store says with
#: a ``timeout`` attribute: :class:`~retry_after_adapter.SQLiteCooldownStore` waits
#: 0.25 s for a lock by default, :class:`~retry_after_adapter.RedisCooldownStore` built
#: from a URL 0.1 s to connect plus 0.1 s for a reply).
STORE_TIMEOUT = 0.25
#: The first back-off (seconds) of the circuit breaker after a failure; it doubles on
#: each failed probe up to :data:`BREAKER_MAX` (:data:`BREAKER_MAX_PENDING` while
#: cooldowns wait to be written back: other processes do not know them yet), and resets
#: when the store answers.
BREAKER_FIRST = 0.5
BREAKER_MAX = 5.0
BREAKER_MAX_PENDING = 0.5
#: Seconds of health that end an outage that flapped, and within which a new failure
#: after a recovery continues the same outage (no new warning).
QUIET_PERIOD = 30.0
#: Busy answers in a row (locks held by other writers past the store's timeout, with no
#: success in between) that open the breaker; fewer only make that operation fall back.
BUSY_RUN = 8
#: Seconds between the writer thread's looks while cooldowns wait to be written back.
WRITER_POLL = 0.1
#: At most this many writes wait for the writer thread (past it, newer ones are not
#: kept: a lease still expires by itself, a permit still counts until its stored end).
MAX_CHORES = 4096
#: Seconds the writer keeps trying to give a slot back (the default ``lease_ttl``: by
#: then the lease has expired by itself).
RELEASE_KEPT = 60.0
#: Seconds without a failure before the line that ends an outage is logged (operations
#: that were in flight when the store broke can still succeed after the first failure).
SETTLE = 1.0

#: "Not given": an adapter or pool manager without ``cooldown=`` uses the process-wide
#: default store.
DEFAULT: Any = type("_Default", (), {"__repr__": lambda self: "DEFAULT"})()

log = logging.getLogger("retry_after_adapter")


def check_store_failure(value: object) -> str:
    """Validate a ``store_failure`` argument: ``"open"`` or ``"closed"``."""
    if value not in ("open", "closed"):
        raise ConfigurationError("store_failure must be 'open' or 'closed'")
    return str(value)


class CallBudget(Protocol):
    """What the guard needs of a call: how long it may still wait (seconds, None for
    no deadline), and whether a store operation already failed during it."""

    store_failed: bool

    def store_time_left(self) -> float | None: ...


class Shared(Protocol):
    """What the engine talks to: a store behind this adapter's failure policy."""

    def read(self, scope: str, call: CallBudget | None = None) -> datetime | None:
        """The scope's eligible time; raises CooldownUnavailable when failing closed."""
        ...

    def learn(self, scope: str, until: datetime, call: CallBudget | None = None) -> datetime:
        """Advance the scope's eligible time to ``until`` (later wins); never raises."""
        ...

    def take(
        self, scope: str, limit: int, per: float, now: datetime, call: CallBudget | None = None
    ) -> datetime | None:
        """Take a quota permit (None: granted) or say when one may be; raises
        CooldownUnavailable when failing closed."""
        ...

    def hold(
        self, scope: str, limit: int, ttl: float, now: datetime, token: str, call: CallBudget | None = None
    ) -> datetime | None:
        """Take a concurrency slot (None: granted) or say by when one is free; raises
        CooldownUnavailable when failing closed."""
        ...

    def free(self, scope: str, token: str) -> None:
        """Give a concurrency slot back; never raises (an unreleased lease expires)."""
        ...

    def settle(
        self,
        scope: str,
        limit: int,
        per: float,
        expires: datetime,
        now: datetime | None = None,
        call: CallBudget | None = None,
    ) -> None:
        """The permit stopping at ``expires`` counts until at least ``now + per`` (its
        attempt was answered at ``now``; None: the present); never raises."""
        ...

    #: Whether the store has ``admit`` and ``allow`` (else the two below are not called).
    admits: bool
    #: Whether the store keeps freshness records (else ``note`` is not called).
    notes: bool
    #: What the engine keeps of each scope in this process, shared by every view of the
    #: same store object (see :func:`meters_of`).
    meters: dict[str, Any]
    #: A memory store used as it is (its ``admit`` and ``release`` called directly), or None.
    direct: MemoryCooldownStore | None

    def note(self, scope: str, outcome: str, at: datetime, call: CallBudget | None = None) -> None:
        """Note a success or an error class of the scope; never raises."""
        ...

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness (None: nothing known)."""
        ...

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        call: CallBudget | None = None,
        margin: float = 0.0,
    ) -> Admission:
        """Admission for one attempt (see :class:`~.base.Admission`): the cooldown, the
        allowance, a quota permit (``limit`` per ``per`` seconds, counted ``per +
        margin``) and a concurrency slot, all or nothing, in one store operation, at
        ``now`` (None: the real present, read by the store as it grants); raises
        CooldownUnavailable when failing closed."""
        ...

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
        call: CallBudget | None = None,
    ) -> None:
        """Record that the server allows ``remaining`` more requests until ``until``
        (``limit`` per ``window`` seconds, when it said), in answer to the attempt
        admitted as ``seq``."""
        ...


#: Per store object (a memory store, or a store's guard): what the engine keeps of each
#: scope in this process (``engine._Meter``), shared by every view of that object.
_METERS: weakref.WeakKeyDictionary[object, dict[str, Any]] = weakref.WeakKeyDictionary()
_METERS_LOCK = threading.Lock()


def all_meters() -> list[dict[str, Any]]:
    """Every store object's meters in this process (for a forked child to reset)."""
    return list(_METERS.values())


def meters_of(underlying: object) -> dict[str, Any]:
    """The per-scope meters of a store object in this process (made on first use)."""
    with _METERS_LOCK:
        meters = _METERS.get(underlying)
        if meters is None:
            meters = _METERS[underlying] = {}
        return meters


class Direct:
    """A store that cannot fail (in memory): used as it is."""

    __slots__ = ("admits", "direct", "meters", "modern", "notes", "store")

    def __init__(self, store: CooldownStore) -> None:
        self.store = store
        self.admits = supports_admit(store)
        self.notes = supports_freshness(store)
        self.meters = meters_of(store)
        self.modern = stamps_grants(store)
        #: The memory store itself, when it is one: the engine admits and releases on
        #: it directly (the same operations as this view's, one call less per attempt).
        self.direct = store if isinstance(store, MemoryCooldownStore) and self.modern else None

    def note(self, scope: str, outcome: str, at: datetime, call: CallBudget | None = None) -> None:
        self.store.note(scope, outcome, at)  # type: ignore[attr-defined]

    def freshness(self, scope: str) -> Freshness | None:
        return self.store.freshness(scope)  # type: ignore[attr-defined, no-any-return]

    def read(self, scope: str, call: CallBudget | None = None) -> datetime | None:
        return self.store.get(scope)

    def learn(self, scope: str, until: datetime, call: CallBudget | None = None) -> datetime:
        return self.store.extend(scope, until)

    def take(
        self, scope: str, limit: int, per: float, now: datetime, call: CallBudget | None = None
    ) -> datetime | None:
        return _acquirer(self.store)(scope, limit, per, now)

    def hold(
        self, scope: str, limit: int, ttl: float, now: datetime, token: str, call: CallBudget | None = None
    ) -> datetime | None:
        return self.store.lease(scope, limit, ttl, now, token)  # type: ignore[attr-defined, no-any-return]

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        call: CallBudget | None = None,
        margin: float = 0.0,
    ) -> Admission:
        return admit_on(self.store, self.modern, scope, now, limit, per, lease, margin)

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
        call: CallBudget | None = None,
    ) -> None:
        self.store.allow(scope, remaining, until, now, seq, limit, window)  # type: ignore[attr-defined]

    def free(self, scope: str, token: str) -> None:
        self.store.release(scope, token)  # type: ignore[attr-defined]

    def settle(
        self,
        scope: str,
        limit: int,
        per: float,
        expires: datetime,
        now: datetime | None = None,
        call: CallBudget | None = None,
    ) -> None:
        settle = getattr(self.store, "settle", None)
        if settle is not None:
            settle(scope, limit, per, expires, now)

    def __repr__(self) -> str:
        return f"Direct({self.store!r})"


class Guarded:
    """A store's process-wide :class:`StoreGuard` under one adapter's failure policy."""

    __slots__ = ("admits", "fail_closed", "guard", "meters", "notes")
    direct: MemoryCooldownStore | None = None  #: never used as it is (see ``Direct.direct``)

    def __init__(self, guard: StoreGuard, *, fail_closed: bool) -> None:
        self.guard = guard
        self.fail_closed = fail_closed
        self.admits = supports_admit(guard.inner)
        self.notes = supports_freshness(guard.inner)
        self.meters = meters_of(guard)

    def note(self, scope: str, outcome: str, at: datetime, call: CallBudget | None = None) -> None:
        self.guard.note(scope, outcome, at, call=call)

    def freshness(self, scope: str) -> Freshness | None:
        return self.guard.freshness(scope)

    def read(self, scope: str, call: CallBudget | None = None) -> datetime | None:
        return self.guard.get(scope, fail_closed=self.fail_closed, call=call)

    def learn(self, scope: str, until: datetime, call: CallBudget | None = None) -> datetime:
        return self.guard.extend(scope, until, call=call)

    def take(
        self, scope: str, limit: int, per: float, now: datetime, call: CallBudget | None = None
    ) -> datetime | None:
        return self.guard.acquire(scope, limit, per, now, fail_closed=self.fail_closed, call=call)

    def hold(
        self, scope: str, limit: int, ttl: float, now: datetime, token: str, call: CallBudget | None = None
    ) -> datetime | None:
        return self.guard.lease(scope, limit, ttl, now, token, fail_closed=self.fail_closed, call=call)

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        call: CallBudget | None = None,
        margin: float = 0.0,
    ) -> Admission:
        return self.guard.admit(
            scope, now, limit, per, lease, margin=margin, fail_closed=self.fail_closed, call=call
        )

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
        call: CallBudget | None = None,
    ) -> None:
        self.guard.allow(scope, remaining, until, now, seq, limit, window, call=call)

    def free(self, scope: str, token: str) -> None:
        self.guard.release(scope, token)

    def settle(
        self,
        scope: str,
        limit: int,
        per: float,
        expires: datetime,
        now: datetime | None = None,
        call: CallBudget | None = None,
    ) -> None:
        self.guard.settle(scope, limit, per, expires, now, call)

    def __repr__(self) -> str:
        return f"Guarded({self.guard.inner!r}, fail_closed={self.fail_closed})"


def stamps_grants(store: object) -> bool:
    """Whether ``store.admit`` stamps a permit as it grants it (takes ``now`` None) and
    keeps each quota's margin (a ``margin`` argument): the stores of this package do,
    unless a subclass overrides ``admit`` with the earlier signature."""
    if not getattr(store, "stamps_grants", False):
        return False
    try:
        parameters = inspect.signature(store.admit).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False
    return "margin" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def admit_on(
    store: Any,
    modern: bool,
    scope: str,
    now: datetime | None,
    limit: int | None,
    per: float | None,
    lease: tuple[int, float, str] | None,
    margin: float,
) -> Admission:
    """``store.admit`` as the store takes it: a ``modern`` store (:func:`stamps_grants`)
    stamps a permit as it grants it (``now`` None) and keeps each one's margin; a store
    of an earlier protocol is given the present and the whole window (``per +
    margin``), and no lease argument when it has none to take."""
    if modern:
        answer: Admission = store.admit(scope, now, limit, per, lease, margin)
        return answer
    if now is None:
        now = datetime.now(timezone.utc)
    window = per + margin if per is not None else None
    if lease is None:
        answer = store.admit(scope, now, limit, window)
    else:
        answer = store.admit(scope, now, limit, window, lease)
    return Admission(*answer)  # a plain tuple of an earlier protocol too


def _acquirer(store: object) -> Callable[[str, int, float, datetime], datetime | None]:
    acquire = getattr(store, "acquire", None)
    if not callable(acquire):
        raise ConfigurationError(
            f"a quota needs a store that can take permits (acquire()); {type(store).__name__} cannot: "
            "use MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
        )
    return acquire  # type: ignore[no-any-return]


def supports_quota(store: object) -> bool:
    """Whether ``store`` can take quota permits (an ``acquire`` method)."""
    return callable(getattr(store, "acquire", None))


def supports_admit(store: object) -> bool:
    """Whether ``store`` admits in one operation (``admit``) and records the server's
    announced allowance (``allow``): quota headers spread ``remaining`` over workers."""
    return callable(getattr(store, "admit", None)) and callable(getattr(store, "allow", None))


def supports_freshness(store: object) -> bool:
    """Whether ``store`` keeps freshness records (``note`` and ``freshness``)."""
    return callable(getattr(store, "note", None)) and callable(getattr(store, "freshness", None))


def supports_leases(store: object) -> bool:
    """Whether ``store`` can hold concurrency slots (``lease`` and ``release``)."""
    return callable(getattr(store, "lease", None)) and callable(getattr(store, "release", None))


def failure_layer(cooldown: object, store_failure: str) -> Shared | None:
    """What a call talks to for ``cooldown`` (None: no sharing): a memory store as it
    is (it cannot fail), any other store through its process-wide guard."""
    if cooldown is None:
        return None
    if not isinstance(cooldown, CooldownStore):
        raise ConfigurationError("cooldown must be a CooldownStore (get and extend) or None")
    if isinstance(cooldown, MemoryCooldownStore):
        return Direct(cooldown)
    return Guarded(guard_of(cooldown), fail_closed=store_failure == "closed")


# ------------------------------------------------------------------ one guard per store
_GUARD_ATTR = "_retry_after_guard"
_REGISTRY_LOCK = threading.Lock()
#: Guards of stores that take no attribute (``__slots__``): kept for the process's life.
_PINNED: dict[int, StoreGuard] = {}


def _new_module_locks() -> None:
    """In a forked child: a parent thread may have held one of these."""
    global _REGISTRY_LOCK, _METERS_LOCK
    _REGISTRY_LOCK = threading.Lock()
    _METERS_LOCK = threading.Lock()


_forksafe.at_fork(_new_module_locks)


def guard_of(store: CooldownStore) -> StoreGuard:
    """The process-wide :class:`StoreGuard` of ``store`` (made on first use).

    The guard lives as long as the store object: a new Session or adapter on the same
    store object finds the same local copy and health state.
    """
    guard = getattr(store, _GUARD_ATTR, None)
    if isinstance(guard, StoreGuard) and guard.inner is store:
        return guard
    pinned = _PINNED.get(id(store))
    if pinned is not None and pinned.inner is store:
        return pinned
    with _REGISTRY_LOCK:
        guard = getattr(store, _GUARD_ATTR, None)
        if isinstance(guard, StoreGuard) and guard.inner is store:
            return guard
        guard = StoreGuard(store)
        try:
            setattr(store, _GUARD_ATTR, guard)
        except (AttributeError, TypeError):
            _PINNED[id(store)] = guard  # holds the store, so its id stays unique
        return guard


#: Errors by which a store refuses an operation's values rather than fails: they never
#: open the breaker (an absurd value must not shut out every other scope).
_REFUSED_VALUES = (ConfigurationError, ValueError, TypeError, OverflowError)


class _OutOfTime(Exception):
    """A store operation was cut short by the call's own deadline, not the store's."""


#: Less than this (seconds) left in a call: the store is not asked at all.
_TOO_LITTLE = 0.001
#: A quota permit the store could not answer for (busy, or the call's time ran out) is
#: "not yet": asked again after this long, never granted locally while the store is up.
_PERMIT_RETRY = timedelta(milliseconds=20)


def _no_guard() -> None:
    return None


def _answered_late(abandoned: Callable[[Any], None]) -> Callable[[concurrent.futures.Future[Any]], None]:
    """A done-callback handing an abandoned operation's answer, if any, to ``abandoned``."""

    def done(future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        try:
            abandoned(future.result())
        except Exception as exc:  # housekeeping: the lease expires by itself
            log.debug("giving back an abandoned slot failed: %s", type(exc).__name__)

    return done


def _declared_timeout(store: object) -> float | None:
    value = getattr(store, "timeout", None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not (math.isfinite(value) and value > 0):
        return None
    return float(value)


class StoreGuard:
    """The failure layer of one store object in this process (see the module)."""

    def __init__(self, inner: CooldownStore) -> None:
        self.inner = inner
        #: Whether the store stamps permits as it grants them (see :func:`stamps_grants`).
        self.modern = stamps_grants(inner)
        #: The local copy: what the store said, and what was learned while it failed.
        self.local = MemoryCooldownStore()
        #: Scopes learned while the store failed, not yet written back.
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        #: The guard's own clock (seconds, monotonic): breaker and log timing.
        self.monotonic: Callable[[], float] = time.monotonic
        self._native = _declared_timeout(inner)
        #: Bound (seconds) of one operation: the store's own timeout, else STORE_TIMEOUT.
        self.timeout = self._native if self._native is not None else STORE_TIMEOUT
        self._generation = getattr(inner, "generation", None)
        #: Goes up at every write (local first, then the store), when a write-back
        #: starts and ends, and when the whole local copy is marked for one: an answer
        #: read across those moments is not mirrored down.
        self._epoch = 0
        self._open_until = 0.0  # the breaker is open until then (0: closed)
        self._backoff = BREAKER_FIRST
        self._probing = False
        self._down = False
        self._announced = False  # an outage warning is outstanding
        self._relapsed = False  # ...and the store failed again soon after recovering
        self._since = 0.0  # when the announced outage started
        self._last_failure = -math.inf
        self._last_recovery_line = -math.inf
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: Outages announced with a warning; failed operations; cooldowns written back;
        #: operations that found the store busy (locked by other writers).
        self.outages = 0
        self.busy = 0
        self._busy_run = 0
        #: A write was kept locally while the store was not down (busy, or the call ran
        #: out of time): the next success writes it back.
        self._stranded = False
        self.failures = 0
        self.written_back = 0
        #: The thread that writes pending cooldowns back once the store answers again,
        #: even if this process makes no further call (None: none runs).
        self._writer: threading.Thread | None = None
        #: Writes the store did not take (busy or down) that must still land: slots to
        #: give back and permits to settle, as (operation, arguments, give up at); the
        #: writer thread tries them again.
        self._chores: list[tuple[str, tuple[Any, ...], datetime]] = []
        _forksafe.register(self)

    # -- the two operations --------------------------------------------------------
    def get(
        self, scope: str, *, fail_closed: bool = False, call: CallBudget | None = None
    ) -> datetime | None:
        """The scope's eligible time: the store's answer (plus a pending local one), or
        while the store fails the local copy (fail open) or CooldownUnavailable."""
        if (self._open_until or (call is not None and call.store_failed)) and not self._may_try(call):
            return self._fallback(scope, fail_closed)
        epoch = self._epoch
        try:
            remote = self._bounded(self.inner.get, (scope,), call)
        except _OutOfTime:
            self._gave_up(call)
            return self.local.get(scope)
        except Exception as exc:
            self._failed(exc, call)
            return self._fallback(scope, fail_closed)
        return self._reconcile(scope, remote, epoch, self._succeeded())

    def _reconcile(self, scope: str, remote: datetime | None, epoch: int, wrote: bool) -> datetime | None:
        """The scope's eligible time after the store answered ``remote`` (read at
        ``epoch``; ``wrote``: a write-back ran): the store's answer, mirrored into the
        local copy; or, when the answer may predate a write (a write-back, a write since
        ``epoch``, the scope's time still pending), the later of it and the local one."""
        local = self.local.get(scope)
        if wrote or epoch != self._epoch or (self._pending and scope in self._pending):
            return local if remote is None or (local is not None and local > remote) else remote
        if remote != local:
            self.local._replace(scope, remote)
        return remote

    def extend(self, scope: str, until: datetime, *, call: CallBudget | None = None) -> datetime:
        """Advance the scope's eligible time (later wins) in the store and the local
        copy; while the store fails, keep it locally and write it back on recovery."""
        local = self.local.extend(scope, until)
        # Pending until the store confirms it: a read that raced this write must not
        # mirror the store's older answer over it.
        self._keep(scope)
        if (self._open_until or (call is not None and call.store_failed)) and not self._may_try(call):
            self._start_writer()
            return local
        try:
            # A pending local time is written along: it is at least as late.
            remote = self._bounded(self.inner.extend, (scope, local), call)
        except _OutOfTime:
            self._gave_up(call)  # still pending: the writer or the next operation writes it
            self._start_writer()
            return local
        except Exception as exc:
            self._failed(exc, call)
            self._start_writer()
            return local
        self._succeeded()
        with self._lock:
            if self.local.get(scope) == local:
                self._pending.discard(scope)
        if remote > local:
            self.local._replace(scope, remote)
        return max(local, remote)

    def acquire(
        self,
        scope: str,
        limit: int,
        per: float,
        now: datetime,
        *,
        fail_closed: bool = False,
        call: CallBudget | None = None,
    ) -> datetime | None:
        """Take a quota permit in the store; while it fails, in the local copy (limits
        kept in this process: fail open) or CooldownUnavailable (fail closed)."""
        args = (scope, limit, per, now)
        later = now + _PERMIT_RETRY
        return self._admission(_acquirer(self.inner), self.local.acquire, args, later, fail_closed, call)[0]

    def lease(
        self,
        scope: str,
        limit: int,
        ttl: float,
        now: datetime,
        token: str,
        *,
        fail_closed: bool = False,
        call: CallBudget | None = None,
    ) -> datetime | None:
        """Take a concurrency slot in the store; while it fails, in the local copy (the
        cap kept in this process: fail open) or CooldownUnavailable (fail closed)."""
        inner: Any = self.inner
        args = (scope, limit, ttl, now, token)
        later = now + _PERMIT_RETRY
        return self._admission(inner.lease, self.local.lease, args, later, fail_closed, call)[0]

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        *,
        margin: float = 0.0,
        fail_closed: bool = False,
        call: CallBudget | None = None,
    ) -> Admission:
        """Admission for one attempt in one store operation (``admit``): the cooldown
        (mirrored as :meth:`get` does), the allowance, the quota permit and the slot.
        While the store is down, the local copy admits (fail open; its admission
        numbers are not the store's, so none is returned) or CooldownUnavailable; busy
        or out of time: "ask again shortly" (never admitted locally)."""
        args = (scope, now, limit, per, lease, margin)
        epoch = self._epoch
        present = now if now is not None else datetime.now(timezone.utc)
        later = Admission(self.local.get(scope), present + _PERMIT_RETRY)
        abandoned = None
        if lease is not None:

            def abandoned(answer: Admission) -> None:
                # An admission the call stopped waiting for granted a slot nobody uses.
                if answer.not_before is None:
                    self.release(scope, lease[2])

        answer, wrote = self._admission(
            self._inner_admit, self._local_admit, args, later, fail_closed, call, abandoned
        )
        if wrote is None:
            return answer  # not the store's answer: nothing to mirror
        cooldown = self._reconcile(scope, answer.cooldown, epoch, wrote)
        if cooldown is None or cooldown == answer.cooldown:
            return answer
        # A later local time (not yet written back) holds the attempt back.
        not_before = cooldown if cooldown > present else answer.not_before
        if answer.not_before is None and not_before is not None and lease is not None:
            # The store granted a slot the attempt will not use: give it back now.
            self.release(scope, lease[2])
        if not_before is None and answer.permit is not None:
            return Granted.of(answer.permit, cooldown, answer.seq)
        return Admission(cooldown, not_before, answer.seq, answer.slot_busy)

    def _inner_admit(self, *args: Any) -> Admission:
        return admit_on(self.inner, self.modern, *args)

    def _local_admit(self, *args: Any) -> Admission:
        """The local copy admits (its admission numbers are not the store's)."""
        answer: Admission = self.local.admit(*args)
        return answer._replace(seq=None)

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
        *,
        call: CallBudget | None = None,
    ) -> None:
        """Record the server's announced allowance locally and in the store (a failure
        leaves it local: it ends by itself at the reset). The local copy counts its
        own admissions (during an outage), so it is given no admission number."""
        self.local.allow(scope, remaining, until, now, None, limit, window)
        inner: Any = self.inner
        self._write_through(inner.allow, (scope, remaining, until, now, seq, limit, window), call)

    def _write_through(
        self, operation: Callable[..., object], args: tuple[Any, ...], call: CallBudget | None
    ) -> bool:
        """Write to the store what the local copy already holds; a failure counts
        against the store but is not the call's (the local copy keeps it). Returns
        whether the store took it."""
        if (self._open_until or (call is not None and call.store_failed)) and not self._may_try(call):
            return False
        try:
            self._bounded(operation, args, call)
        except _OutOfTime:
            self._gave_up(call)
            return False
        except Exception as exc:
            self._failed(exc, call)
            return False
        self._succeeded()
        return True

    def _admission(
        self,
        remote: Callable[..., Any],
        local: Callable[..., Any],
        args: tuple[Any, ...],
        later: _T,
        fail_closed: bool,
        call: CallBudget | None,
        abandoned: Callable[[Any], None] | None = None,
    ) -> tuple[_T, bool | None]:
        """A permit, a slot or a whole admission: ``(answer, wrote)``, ``wrote`` being
        whether the store's success wrote anything back (None: the answer is not the
        store's). While the store is down, ``local`` answers (fail open) or
        CooldownUnavailable (fail closed); a store that is up but busy, or a call out of
        time, answers ``later`` ("ask again shortly"): never granted locally."""
        if (self._open_until or (call is not None and call.store_failed)) and not self._may_try(call):
            return self._local_admission(local, args, fail_closed), None
        try:
            answer: _T = self._bounded(remote, args, call, abandoned)
        except _OutOfTime:
            self._gave_up(call)
            return later, None
        except Exception as exc:
            self._failed(exc, call)
            if not self._down:
                return later, None
            return self._local_admission(local, args, fail_closed), None
        return answer, self._succeeded()

    def release(self, scope: str, token: str) -> None:
        """Give a slot back, in the store and locally. A store that is busy or down
        gets it later from the writer thread (for up to :data:`RELEASE_KEPT` seconds;
        past that the lease has expired by itself), so a slot is never lost to a
        moment of contention."""
        self.local.release(scope, token)
        if not self._open_until:
            inner: Any = self.inner
            try:
                self._bounded(inner.release, (scope, token), None)
                return
            except Exception as exc:
                log.debug("releasing a concurrency slot failed: %s", type(exc).__name__)
        give_up = datetime.now(timezone.utc) + timedelta(seconds=RELEASE_KEPT)
        self._add_chore("release", (scope, token), give_up)

    def _add_chore(self, operation: str, args: tuple[Any, ...], give_up: datetime) -> None:
        with self._lock:
            if len(self._chores) >= MAX_CHORES:
                return  # past it, newer ones are not kept (each ends by itself)
            self._chores.append((operation, args, give_up))
        self._start_writer()

    def settle(
        self,
        scope: str,
        limit: int,
        per: float,
        expires: datetime,
        now: datetime | None = None,
        call: CallBudget | None = None,
    ) -> None:
        """Move a permit's end later in the store (see ``MemoryCooldownStore.settle``),
        within what the call has left; a failure is counted against the store but never
        the call's."""
        settle = getattr(self.inner, "settle", None)
        if settle is None:
            return
        # The answer's time, pinned: tried again later, it must not move further.
        args = (scope, limit, per, expires, now if now is not None else datetime.now(timezone.utc))
        if not self._write_through(settle, args, call):
            # Busy or down: until its stored end passes, the writer thread tries again
            # (a permit that ends too soon could let one request too many through).
            self._add_chore("settle", args, expires)

    def note(self, scope: str, outcome: str, at: datetime, *, call: CallBudget | None = None) -> None:
        """Note a success or an error class locally and in the store; a failure is
        ignored (freshness is news, never a reason to fail a call)."""
        self.local.note(scope, outcome, at)
        inner: Any = self.inner
        self._write_through(inner.note, (scope, outcome, at), call)

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness from the store; while it fails, this process's copy."""
        inner: Any = self.inner
        if not self._open_until:
            try:
                answer: Freshness | None = self._bounded(inner.freshness, (scope,), None)
            except Exception as exc:
                self._failed(exc, None)
            else:
                self._succeeded()
                return answer
        return self.local.freshness(scope)

    @staticmethod
    def _local_admission(local: Callable[..., Any], args: tuple[Any, ...], fail_closed: bool) -> Any:
        if fail_closed:
            raise CooldownUnavailable("the shared cooldown store is unavailable")
        return local(*args)

    # -- health ----------------------------------------------------------------------
    @property
    def down(self) -> bool:
        """Whether the store's last operation failed (its breaker is open)."""
        return self._down

    @property
    def pending(self) -> int:
        """How many cooldowns learned during an outage wait to be written back."""
        return len(self._pending)

    def write_back(self) -> int:
        """Write every pending cooldown to the store now; return how many were written.
        Raises CooldownStoreError if the store fails (the rest stay pending)."""
        with self._lock:
            scopes = list(self._pending)
            self._epoch += 1
        try:
            return self._write(scopes)
        finally:
            with self._lock:
                self._epoch += 1

    def _write(self, scopes: list[str]) -> int:
        written = 0
        for scope in scopes:
            until = self.local.get(scope)
            if until is not None:
                written += 1
                try:
                    self.inner.extend(scope, until)
                except CooldownStoreError:
                    raise
                except Exception as exc:
                    raise CooldownStoreError(
                        f"writing back a cooldown failed: {type(exc).__name__}"
                    ) from None
            with self._lock:
                if self.local.get(scope) == until:
                    self._pending.discard(scope)
        self.written_back += written
        return written

    # -- internals -------------------------------------------------------------------
    def _fallback(self, scope: str, fail_closed: bool) -> datetime | None:
        if fail_closed:
            raise CooldownUnavailable("the shared cooldown store is unavailable")
        return self.local.get(scope)

    def _keep(self, scope: str) -> None:
        with self._lock:
            self._pending.add(scope)
            self._epoch += 1

    def _may_try(self, call: CallBudget | None) -> bool:
        """Whether this operation may touch the store while the breaker is open: only
        one probe once the back-off has passed, and never twice in one call."""
        if call is not None and call.store_failed:
            return False
        if self.monotonic() < self._open_until:
            return False
        with self._lock:
            if self._probing or not self._open_until:
                return not self._probing
            self._probing = True
            return True

    def _bounded(
        self,
        operation: Callable[..., _T],
        args: tuple[Any, ...],
        call: CallBudget | None,
        abandoned: Callable[[_T], None] | None = None,
    ) -> _T:
        """Run ``operation`` within the store's timeout and what the call has left.

        A store that bounds itself (``timeout`` declared, within what is left) is called
        directly; otherwise the operation runs on a helper thread and is abandoned (its
        effect, if any, later-wins; ``abandoned`` gets its answer should it come) when
        the bound passes."""
        limit = self.timeout
        left = call.store_time_left() if call is not None else None
        by_call = left is not None and left < limit
        if by_call:
            if left is None or left < _TOO_LITTLE:
                raise _OutOfTime  # no time to ask: not the store's fault
            limit = left
        elif self._native is not None:
            return operation(*args)
        executor = self._executor
        if executor is None:
            with self._lock:
                executor = self._executor
                if executor is None:
                    executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=8, thread_name_prefix="retry-after-store"
                    )
        future = executor.submit(operation, *args)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            if abandoned is not None:
                future.add_done_callback(_answered_late(abandoned))
            if by_call:
                raise _OutOfTime from None  # the call ran out first: no verdict on the store
            raise CooldownStoreError(
                f"the cooldown store {type(self.inner).__name__} did not answer within {limit:.3g} s"
            ) from None

    def _succeeded(self) -> bool:
        """The store answered an operation: end a busy run, close the breaker, write
        back what waits (an outage's cooldowns, or writes kept while it was busy), maybe
        end the outage. Returns whether anything was written back (an answer read
        before that may predate it). Cheap when the store is healthy."""
        if self._busy_run:
            self._busy_run = 0
        wrote = False
        if self._down or self._announced or self._generation is not None:
            wrote = self._answered()
        if self._stranded:
            wrote = self._flush() or wrote
        return wrote

    def _gave_up(self, call: CallBudget | None) -> None:
        """The call ran out of time before the store answered: it does not ask again,
        and the store is not judged (a probe it was making is released)."""
        if call is not None:
            call.store_failed = True
        with self._lock:
            self._probing = False
            if self._pending:
                self._stranded = True

    def _flush(self) -> bool:
        """Write back what was kept locally while the store was not down."""
        self._stranded = False
        try:
            return self.write_back() > 0
        except CooldownStoreError as exc:
            self._stranded = True
            self._failed(exc, None)
            return True

    def _failed(self, exc: BaseException, call: CallBudget | None) -> None:
        if isinstance(exc, _REFUSED_VALUES) and not isinstance(exc, CooldownStoreError):
            # The store refused this operation's values (a bug of a caller, or a value
            # past what it can hold): it answered, so it is not down (a probe it was is
            # over), and no other call pays for it.
            log.debug("a cooldown store operation was refused: %s", type(exc).__name__)
            with self._lock:
                self._probing = False
            return
        busy = getattr(exc, "busy", False) and not self._down
        if call is not None and not busy:
            call.store_failed = True  # a busy store may be asked again in this call
        now = self.monotonic()
        if busy:
            # Contention (a lock held past the timeout) while the store otherwise
            # answers: this operation falls back; only a run of them opens the breaker.
            with self._lock:
                self.busy += 1
                self._busy_run += 1
                if self._busy_run < BUSY_RUN:
                    self._probing = False
                    self._stranded = True
                    return
        if self._pending and self._writer is None:
            self._start_writer()
        with self._lock:
            self.failures += 1
            self._last_failure = now
            self._probing = False
            self._open_until = now + self._backoff
            cap = BREAKER_MAX_PENDING if self._pending else BREAKER_MAX
            self._backoff = min(self._backoff * 2, cap)
            self._down = True
            if self._announced:
                return
            self._announced = True
            if now - self._last_recovery_line < QUIET_PERIOD:
                self._relapsed = True  # the outage that just ended goes on: no new line
                return
            self._relapsed = False
            self._since = now
            self.outages += 1
        name = type(self.inner).__name__
        log.warning(
            "cooldown store %s failed (%s); cooldowns are kept in this process and written "
            "back when it recovers; it is skipped for %.3g s at a time until then",
            name,
            type(exc).__name__,
            BREAKER_FIRST,
            extra={"store": name, "error": type(exc).__name__},
        )

    def _answered(self) -> bool:
        """The store answered: close the breaker, write back, maybe end the outage.
        Returns whether cooldowns were written back (the answer may predate them)."""
        wrote = False
        if self._generation is not None:
            generation = getattr(self.inner, "generation", None)
            if generation != self._generation:
                wrote = self._replaced(generation)
        if not self._down and not self._announced:
            return wrote
        now = self.monotonic()
        with self._lock:
            was_down = self._down
            self._down = False
            self._open_until = 0.0
            self._backoff = BREAKER_FIRST
            self._probing = False
        if was_down and self._pending:
            try:
                wrote = self.write_back() > 0 or wrote
            except CooldownStoreError as exc:
                self._failed(exc, None)
                return True
        with self._lock:
            settle = QUIET_PERIOD if self._relapsed else SETTLE
            if not self._announced or now - self._last_failure < settle:
                return wrote
            self._announced = False
            self._relapsed = False
            self._last_recovery_line = now
            lasted = now - self._since
            failures = self.failures
            written = self.written_back
        log.info(
            "cooldown store %s recovered after %.3g s (%d failed operations so far; "
            "%d cooldowns written back so far)",
            type(self.inner).__name__,
            lasted,
            failures,
            written,
            extra={"store": type(self.inner).__name__},
        )
        return wrote

    def _replaced(self, generation: object) -> bool:
        """The store lost its data under us (a SQLite file deleted or replaced): warn
        once, and write the whole local copy back."""
        with self._lock:
            if generation == self._generation:
                return False
            self._generation = generation
            self._epoch += 1
            self._pending.update(self.local.entries())
        log.warning(
            "cooldown store %s was replaced under this process (%s); writing back the %d "
            "cooldowns this process knows",
            type(self.inner).__name__,
            getattr(self.inner, "replaced_reason", "its data is gone"),
            len(self._pending),
            extra={"store": type(self.inner).__name__},
        )
        try:
            self.write_back()
        except CooldownStoreError as exc:
            self._failed(exc, None)
        return True

    def _start_writer(self) -> None:
        """Start the writer thread if something waits to be written and none runs."""
        with self._lock:
            if self._writer is not None or not (self._pending or self._chores):
                return
            self._writer = threading.Thread(
                target=self._write_back_loop, name="retry-after-write-back", daemon=True
            )
            writer = self._writer
        writer.start()

    def _write_back_loop(self) -> None:
        """While the store is down and cooldowns wait: once the breaker lets a probe
        through, write one back; the store's answer then writes every other one back
        (see :meth:`_answered`), so other processes learn them within about
        :data:`BREAKER_MAX_PENDING` seconds of the store's recovery, whether or not this
        process calls again. (A write kept only because the store was busy is written by
        the next operation of any call.) Slots to give back and permits to settle that
        the store did not take are tried again meanwhile, while they still matter."""
        while True:
            # First a pause: the failure that started this thread is still being noted.
            wait = self._open_until - self.monotonic() if self._down else 0.0
            time.sleep(min(max(wait, WRITER_POLL), BREAKER_MAX_PENDING))
            with self._lock:
                chores, self._chores = self._chores, []
                scope = next(iter(self._pending), None) if self._down else None
                if scope is None and not chores:
                    self._writer = None
                    return
            self._do_again(chores)
            if scope is not None:
                # Its success writes every other pending cooldown back (``_answered``).
                until = self.local.get(scope)
                if until is not None:
                    self._write_through(self.inner.extend, (scope, until), None)
                else:
                    self._write_through(self.inner.get, (scope,), None)

    def _do_again(self, chores: list[tuple[str, tuple[Any, ...], datetime]]) -> None:
        """Try the writes the store did not take again; keep those that fail while they
        still matter (past its give-up time a lease has expired, a permit stopped
        counting)."""
        now = datetime.now(timezone.utc)
        for chore in chores:
            operation, args, give_up = chore
            method: Any = getattr(self.inner, operation, None)
            if give_up <= now or method is None:
                continue
            if not self._write_through(method, args, None):
                with self._lock:
                    self._chores.append(chore)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._executor = None
        self._probing = False
        self._writer = None  # the parent's thread does not exist here
        self._chores = []

    def __reduce__(self) -> tuple[Any, ...]:
        # A guard belongs to one process: a pickled or copied store gets its own.
        return (_no_guard, ())

    def __repr__(self) -> str:
        state = "down" if self._down else "healthy"
        return f"StoreGuard({self.inner!r}, {state}, pending={len(self._pending)})"

