"""A store written for version 0.x, seen through the whole :class:`~.base.Store` interface.

Version 0.x asked a store for ``get`` and ``extend`` only and discovered the rest by
name: ``acquire`` (a quota), ``admit`` and ``allow`` (admission in one operation, quota
headers spread over workers), ``lease``/``release`` (a concurrency cap), ``note``,
``freshness`` and ``freshness_entries``, ``settle``, ``entries``, ``holds`` and
``delete``. :class:`LegacyStore` is the one place that looks for them: what the store
has is used as it is, what it lacks is done without (an admission then reads the
cooldown, takes a permit and a slot in up to three operations, not atomically across
them), and :meth:`LegacyStore.supports` says which settings the store can carry.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigurationError
from .base import Admission, CooldownStore, Hold, Learn, Lease, Store
from .freshness import Freshness
from .rate import Rate


def _method(store: object, name: str) -> Any:
    method = getattr(store, name, None)
    return method if callable(method) else None


def _takes_margin(admit: Any) -> bool:
    """Whether ``admit`` has the signature of 0.5 (``margin``; ``now`` may be None)."""
    try:
        parameters = inspect.signature(admit).parameters
    except (TypeError, ValueError):
        return False
    return "margin" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _takes(method: Any, name: str) -> bool:
    """Whether ``method`` (None: not had) takes the keyword ``name``."""
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters


class LegacyStore(Store):
    """``store`` (any object with ``get`` and ``extend``) as a :class:`~.base.Store`."""

    def __init__(self, store: CooldownStore) -> None:
        self.inner = store
        self._get = store.get
        self._extend = store.extend
        self._acquire = _method(store, "acquire")
        self._admit: Any = _method(store, "admit") if _method(store, "allow") else None
        #: The store's admit stamps permits itself (``now`` None) and keeps margins.
        self._modern = bool(getattr(store, "stamps_grants", False)) and _takes_margin(self._admit)
        self._lease = _method(store, "lease")
        self._release = _method(store, "release")
        # The bound operations the interface forwards as they are (None: not had).
        self._forward = {
            name: _method(store, name)
            for name in ("allow", "settle", "note", "freshness", "freshness_entries", "entries", "holds")
        }
        #: The store's settle takes ``exact`` (it may move a permit earlier).
        self._exact = _takes(self._forward["settle"], "exact")
        self._delete = _method(store, "delete")
        self._close = _method(store, "close")
        #: ``generation`` and ``timeout`` are read by the failure layer: passed through.
        self.timeout = getattr(store, "timeout", None)

    @property
    def generation(self) -> object:
        return getattr(self.inner, "generation", None)

    @property
    def replaced_reason(self) -> str:
        return str(getattr(self.inner, "replaced_reason", "its data is gone"))

    def supports(self, feature: str) -> bool:
        """Whether the store can carry ``"quota"`` (permits), ``"leases"`` (a
        concurrency cap), ``"allowance"`` (quota headers spread over workers) or
        ``"freshness"``."""
        if feature == "quota":
            return self._acquire is not None or self._admit is not None
        if feature == "leases":
            return self._release is not None and (self._lease is not None or self._modern)
        if feature == "allowance":
            return self._admit is not None
        if feature == "freshness":
            return self._forward["note"] is not None and self._forward["freshness"] is not None
        if feature == "exact-settle":
            return self._exact
        return False

    def get(self, scope: str) -> datetime | None:
        return self._get(scope)

    def rate_answer(self, scope: str, epoch: int | None, until: datetime | None, now: datetime) -> None:
        """A store of 0.x learns no rate: nothing."""

    def rate_of(self, scope: str) -> Rate | None:
        """A store of 0.x learns no rate: None."""
        return None

    def extend(self, scope: str, until: datetime) -> datetime:
        return self._extend(scope, until)

    def admit(
        self, scope: str, now: datetime | None, limit: int | None = None, per: float | None = None,
        lease: Lease | None = None, margin: float = 0.0, batch: int = 1, hold: float = 0.0,
        learn: Learn | None = None, *, opened: float = 0.0,
    ) -> Admission:
        # A store of 0.x learns no rate (``supports("rate")`` is False: ``learn`` unused).
        # A store of 0.x has no change feed: it is never asked for a batch (one permit).
        # Nor an open permit (``supports("open-permits")`` is False): were it, the permit
        # counts that much longer, as one of 0.9 did.
        margin += opened
        if self._modern:
            answer = self._admit(scope, now, limit, per, lease, margin)
            return answer if isinstance(answer, Admission) else Admission(*answer)
        if now is None:
            now = datetime.now(timezone.utc)
        if self._admit is not None:
            # The admit of 0.4: a whole window (per + margin), a lease only when asked.
            window = per + margin if per is not None else None
            args = (scope, now, limit, window) if lease is None else (scope, now, limit, window, lease)
            return Admission(*self._admit(*args))
        return self._composed(scope, now, limit, per, lease, margin)

    def _composed(
        self, scope: str, now: datetime, limit: int | None, per: float | None, lease: Lease | None,
        margin: float,
    ) -> Admission:
        """Admission in up to three operations: the cooldown, a permit, a slot."""
        cooldown = self._get(scope)
        if cooldown is not None and cooldown > now:
            return Admission(cooldown, cooldown)
        if limit is not None and per is not None:
            if self._acquire is None:
                raise ConfigurationError(f"{type(self.inner).__name__} cannot take quota permits")
            refused = self._acquire(scope, limit, per + margin, now)
            if refused is not None:
                return Admission(cooldown, refused)
        if lease is not None and self._lease is not None:
            # As in 0.5: the permit first, then the slot (a permit taken counts anyway).
            busy = self._lease(scope, lease[0], lease[1], now, lease[2])
            if busy is not None:
                return Admission(cooldown, busy, None, True)
        return Admission(cooldown, None)

    def release(self, scope: str, token: str) -> None:
        if self._release is not None:
            self._release(scope, token)

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        settle = self._forward["settle"]
        if settle is not None:
            if exact and self._exact:
                settle(scope, limit, per, expires, now, exact=True)
            else:
                settle(scope, limit, per, expires, now)

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        allow = self._forward["allow"]
        if allow is not None:
            allow(scope, remaining, until, now, seq, limit, window)

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
        now = now if now is not None else datetime.now(timezone.utc)
        return {scope: [Hold("cooldown", until)] for scope, until in self.entries().items() if until > now}

    def delete(self, scope: str) -> bool:
        return False if self._delete is None else bool(self._delete(scope))

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def __repr__(self) -> str:
        return f"LegacyStore({self.inner!r})"


def as_store(cooldown: object) -> Store:
    """``cooldown`` as a :class:`~.base.Store`: itself, or a 0.x store adapted once (a
    subclass of a store of this package that overrides ``admit`` with the signature of
    0.4, without ``margin``, is one)."""
    if isinstance(cooldown, Store):
        return cooldown if _takes_margin(cooldown.admit) else LegacyStore(cooldown)
    if not isinstance(cooldown, CooldownStore):
        raise ConfigurationError("cooldown must be a CooldownStore (get and extend) or None")
    return LegacyStore(cooldown)
