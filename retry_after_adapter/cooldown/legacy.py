"""Any store, seen through the whole interface (:class:`~.base.FullStore`).

The adapter talks to every store through the same operations. A store that carries
every capability is used as it is; any other is completed once, here, with what it
lacks done without:

- :class:`Completed`: a :class:`~.base.Store` with some capability mixins, or none.
  What it carries is read from its type; the rest answers "nothing" (no freshness, no
  learned rate, the cooldowns alone listed).
- :class:`LegacyStore`: a store written for version 0.x: an object with ``get`` and
  ``extend`` (:class:`~.base.CooldownStore`), perhaps with more of 0.x's operations,
  found by name (``acquire``, ``admit`` and ``allow``, ``lease`` and ``release``,
  ``settle``, ``note`` and ``freshness``, ``entries``, ``holds``, ``delete``); or a
  subclass of the ``Store`` class of 0.6-0.10, recognised by its type (it defines
  ``settle``, not ``answer``). Its ``admit`` is called as 0.4 did (``now`` given, the
  margin in the window) unless it stamps grants itself: a store that says so
  (``stamps_grants``, 0.5 on) and every subclass of ``Store`` (0.6-0.10). A permit of
  such a store is never taken open, nor settled exactly, and what it lacks is done
  without: an admission then reads the cooldown, takes a permit and a slot in up to
  three operations, not atomically across them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigurationError
from .base import (
    Admission,
    Allowances,
    Answer,
    Ask,
    Changed,
    ChangeFeed,
    CooldownStore,
    Feed,
    FreshnessLog,
    FullStore,
    Hold,
    LearnedRate,
    Leases,
    Listing,
    QuotaLogs,
    Store,
    Weighed,
)
from .freshness import Freshness
from .rate import Rate


def _method(store: object, name: str) -> Any:
    method = getattr(store, name, None)
    return method if callable(method) else None


class _Wrapper(FullStore):
    """What both completions share: the wrapped store, its failure layer's hints, the
    shorthands over ``answer`` and the listing's defaults."""

    def __init__(self, store: object, carried: frozenset[type]) -> None:
        self.inner = store
        self._carried = carried

    @property
    def capabilities(self) -> frozenset[type]:
        return self._carried

    @property
    def generation(self) -> object:
        return getattr(self.inner, "generation", None)

    @property
    def replaced_reason(self) -> str:
        return str(getattr(self.inner, "replaced_reason", "its data is gone"))

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        Store.settle(self, scope, limit, per, expires, now, exact)

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        Store.allow(self, scope, remaining, until, now, seq, limit, window)

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        Store.rate_answer(self, scope, epoch, until, now)

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        self.answer(Answer(scope=scope, now=now, weighed=weighed))

    def release(self, scope: str, token: str) -> None:
        Store.release(self, scope, token)

    def rate_of(self, scope: str) -> Rate | None:
        return None

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """No freshness kept: nothing."""

    def freshness(self, scope: str) -> Freshness | None:
        return None

    def freshness_entries(self) -> dict[str, Freshness]:
        return {}

    def entries(self) -> dict[str, datetime]:
        return {}

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        now = now if now is not None else datetime.now(timezone.utc)
        return {scope: [Hold("cooldown", until)] for scope, until in self.entries().items() if until > now}

    def delete(self, scope: str) -> bool:
        return False

    def close(self) -> None:
        close = _method(self.inner, "close")
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class Completed(_Wrapper):
    """A :class:`~.base.Store` that lacks some capabilities, completed: each mixin it
    carries is used, the rest answers "nothing"."""

    inner: Store

    def __init__(self, store: Store) -> None:
        super().__init__(store, store.capabilities)

    def get(self, scope: str) -> datetime | None:
        return self.inner.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        return self.inner.extend(scope, until)

    def admit(self, ask: Ask) -> Admission:
        return self.inner.admit(ask)

    def answer(self, answer: Answer) -> None:
        self.inner.answer(answer)

    def rate_of(self, scope: str) -> Rate | None:
        inner = self.inner
        return inner.rate_of(scope) if isinstance(inner, LearnedRate) else None

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        if isinstance(self.inner, FreshnessLog):
            self.inner.note(scope, outcome, at)

    def freshness(self, scope: str) -> Freshness | None:
        inner = self.inner
        return inner.freshness(scope) if isinstance(inner, FreshnessLog) else None

    def freshness_entries(self) -> dict[str, Freshness]:
        inner = self.inner
        return inner.freshness_entries() if isinstance(inner, FreshnessLog) else {}

    def entries(self) -> dict[str, datetime]:
        inner = self.inner
        return inner.entries() if isinstance(inner, Listing) else {}

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        inner = self.inner
        return inner.holds(now) if isinstance(inner, Listing) else super().holds(now)

    def delete(self, scope: str) -> bool:
        inner = self.inner
        return inner.delete(scope) if isinstance(inner, Listing) else False

    def feed(self, changed: Changed) -> Feed | None:
        inner = self.inner
        return inner.feed(changed) if isinstance(inner, ChangeFeed) else None


class LegacyStore(_Wrapper):
    """``store``, written for 0.x (see the module), as a :class:`~.base.FullStore`."""

    def __init__(self, store: CooldownStore, stamps_grants: bool = False) -> None:
        self._get = store.get
        self._extend = store.extend
        self._acquire = _method(store, "acquire")
        self._admit: Any = _method(store, "admit") if _method(store, "allow") else None
        #: The store's admit stamps permits itself (``now`` None) and keeps margins (0.5 on).
        stamps = stamps_grants or bool(getattr(store, "stamps_grants", False))
        self._modern = self._admit is not None and stamps
        self._lease = _method(store, "lease")
        self._release = _method(store, "release")
        # The bound operations the interface forwards as they are (None: not had).
        self._forward = {
            name: _method(store, name)
            for name in ("allow", "settle", "note", "freshness", "freshness_entries", "entries", "holds")
        }
        self._delete = _method(store, "delete")
        carried: set[type] = set()
        if self._acquire is not None or self._admit is not None:
            carried.add(QuotaLogs)
        if self._release is not None and (self._lease is not None or self._modern):
            carried.add(Leases)
        if self._admit is not None:
            carried.add(Allowances)
        if self._forward["note"] is not None and self._forward["freshness"] is not None:
            carried.add(FreshnessLog)
        if self._forward["entries"] is not None:
            carried.add(Listing)
        super().__init__(store, frozenset(carried))

    def get(self, scope: str) -> datetime | None:
        return self._get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        return self._extend(scope, until)

    def admit(self, ask: Ask) -> Admission:
        # A store of 0.x learns no rate (``learn`` unused), has no change feed (it is
        # never asked for a batch) and takes no open permit (never asked: see
        # :func:`opens_permits`; were it, the permit counts that much longer).
        scope, now, limit, per = ask.scope, ask.now, ask.limit, ask.per
        margin = ask.margin + ask.opened
        # A store of 0.x takes a lease as a tuple ``(slots, ttl, token)``.
        lease = None if ask.lease is None else (ask.lease.slots, ask.lease.ttl, ask.lease.token)
        if self._modern:
            return _admission_of(self._admit(scope, now, limit, per, lease, margin))
        if now is None:
            now = datetime.now(timezone.utc)
        if self._admit is not None:
            # The admit of 0.4: a whole window (per + margin), a lease only when asked.
            window = per + margin if per is not None else None
            args = (scope, now, limit, window) if lease is None else (scope, now, limit, window, lease)
            return _admission_of(self._admit(*args))
        return self._composed(scope, now, limit, per, lease, margin)

    def _composed(
        self, scope: str, now: datetime, limit: int | None, per: float | None, lease: Any, margin: float,
    ) -> Admission:
        """Admission in up to three operations: the cooldown, a permit, a slot."""
        cooldown = self._get(scope)
        if cooldown is not None and cooldown > now:
            return Admission(cooldown=cooldown, not_before=cooldown)
        if limit is not None and per is not None:
            if self._acquire is None:
                raise ConfigurationError(f"{type(self.inner).__name__} cannot take quota permits")
            refused = self._acquire(scope, limit, per + margin, now)
            if refused is not None:
                return Admission(cooldown=cooldown, not_before=refused)
        if lease is not None and self._lease is not None:
            # As in 0.5: the permit first, then the slot (a permit taken counts anyway).
            busy = self._lease(scope, lease[0], lease[1], now, lease[2])
            if busy is not None:
                return Admission(cooldown=cooldown, not_before=busy, slot_busy=True)
        return Admission(cooldown=cooldown, not_before=None)

    def answer(self, answer: Answer) -> None:
        # (a store of 0.x learns no rate, weighs no tokens)
        scope, now, token, permit = answer.scope, answer.now, answer.token, answer.permit
        announced = answer.announced
        settle = self._forward["settle"]
        if permit is not None and settle is not None:
            settle(scope, permit.limit, permit.per, permit.expires, now)  # never exactly
        allow = self._forward["allow"]
        if announced is not None and allow is not None:
            at = now if now is not None else datetime.now(timezone.utc)
            remaining, until, seq, limit, window = (
                announced.remaining, announced.until, announced.seq, announced.limit, announced.window
            )
            allow(scope, remaining, until, at, seq, limit, window)
        if token is not None and self._release is not None:
            self._release(scope, token)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        note = self._forward["note"]
        if note is not None:
            note(scope, outcome, at)

    def freshness(self, scope: str) -> Freshness | None:
        freshness = self._forward["freshness"]
        return None if freshness is None else freshness(scope)

    def freshness_entries(self) -> dict[str, Freshness]:
        entries = self._forward["freshness_entries"]
        return {} if entries is None else dict(entries())

    def entries(self) -> dict[str, datetime]:
        entries = self._forward["entries"]
        return {} if entries is None else dict(entries())

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        holds = self._forward["holds"]
        if holds is not None:
            found: dict[str, list[Hold]] = holds(now)
            return found
        return super().holds(now)

    def delete(self, scope: str) -> bool:
        return False if self._delete is None else bool(self._delete(scope))


def _written_for_0x(kind: type) -> bool:
    """A subclass of the ``Store`` class of 0.6-0.10: it defines ``settle`` (abstract
    then) and not ``answer`` (which replaced it)."""
    return kind.settle is not Store.settle and kind.answer is Store.answer  # type: ignore[attr-defined]


def as_store(cooldown: object) -> FullStore:
    """``cooldown`` as a :class:`~.base.FullStore`: itself, or completed once (see the
    module)."""
    if isinstance(cooldown, FullStore):
        return cooldown
    if isinstance(cooldown, Store):
        if not _written_for_0x(type(cooldown)):
            return Completed(cooldown)
        return LegacyStore(cooldown, stamps_grants=True)  # 0.6-0.10's Store stamped its grants
    if not isinstance(cooldown, CooldownStore):
        raise ConfigurationError("cooldown must be a Store or a CooldownStore (get and extend) or None")
    return LegacyStore(cooldown)


def bare(store: FullStore) -> object:
    """The store ``as_store`` made ``store`` of: the :class:`~.base.Store` a
    :class:`Completed` wraps (each of its operations is one of that store's), else
    ``store`` itself (a :class:`LegacyStore` may make several of a 0.x store's
    operations of one, so no bound of that store holds for it)."""
    return store.inner if isinstance(store, Completed) else store


def opens_permits(store: object) -> bool:
    """Whether ``store`` (a failure layer, or what it wraps) takes quota permits open
    and settles them exactly: every store but one written for 0.x."""
    inner = getattr(store, "inner", store)
    return QuotaLogs in getattr(inner, "capabilities", ()) and not isinstance(inner, LegacyStore)


def _admission_of(reply: Any) -> Admission:
    """What the admit of a store of 0.x answered, as an :class:`Admission`: one, or the
    tuple it was then, ``(cooldown, not_before[, seq[, slot_busy]])``."""
    if isinstance(reply, Admission):
        return reply
    cooldown, not_before, *rest = reply
    seq = rest[0] if rest else None
    busy = bool(rest[1]) if len(rest) > 1 else False
    return Admission(cooldown=cooldown, not_before=not_before, seq=seq, slot_busy=busy)
