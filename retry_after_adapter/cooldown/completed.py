"""Any store, seen through the whole interface (:class:`~.base.PartwiseStore`).

The failure layer and the engine talk to every store through the same operations. A
:class:`~.base.PartwiseStore` (the package's own stores) is used as it is; any other
:class:`~.base.Store` is completed once, here (:class:`Completed`): each capability
mixin it carries is used, read from its type; the rest answers "nothing" (no
freshness, no learned rate, the cooldowns alone listed).

A store written for 0.x is refused by :func:`as_store` with a
:class:`~..errors.ConfigurationError` that says what to change: an object with ``get``
and ``extend`` that is no :class:`~.base.Store` (0.1-0.5, found by name until 0.14),
or a subclass of the ``Store`` of 0.6-0.10 (it defines ``settle`` and not ``answer``).
Both become a store of this interface by subclassing :class:`~.base.Store` (its
``admit`` and ``answer`` default to the cooldown alone) and the mixin of each
capability they carry.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ..errors import ConfigurationError
from .base import (
    Admission,
    Announced,
    Answer,
    Ask,
    Changed,
    ChangeFeed,
    Feed,
    FreshnessLog,
    Hold,
    LearnedRate,
    Listing,
    PartwiseStore,
    Permit,
    RateOutcome,
    Store,
    Weighed,
)
from .freshness import Freshness
from .rate import Rate


class Completed(PartwiseStore):
    """A :class:`~.base.Store` that lacks some capabilities (or applies an answer in
    one operation), completed: each mixin it carries is used, the rest answers
    "nothing"; each part of an answer goes to its ``answer``, as one :class:`Answer`."""

    def __init__(self, store: Store) -> None:
        self.inner = store
        self._carried = store.capabilities

    @property
    def capabilities(self) -> frozenset[type]:
        return self._carried

    @property
    def rate_kinds(self) -> bool:  # type: ignore[override]
        """What the store declares (see ``LearnedRate.rate_kinds``)."""
        inner = self.inner
        return isinstance(inner, LearnedRate) and inner.rate_kinds

    def get(self, scope: str) -> datetime | None:
        return self.inner.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        return self.inner.extend(scope, until)

    def admit(self, ask: Ask) -> Admission:
        return self.inner.admit(ask)

    def answer(self, answer: Answer) -> None:
        self.inner.answer(answer)

    # -- each part of an answer, as an answer of its own -------------------------------
    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        self.inner.answer(Answer(scope=scope, now=now, permit=Permit(limit, per, expires, exact)))

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        self.inner.answer(Answer(scope=scope, now=now, weighed=weighed))

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        self.inner.answer(Answer(
            scope=scope, now=now, announced=Announced(remaining, until, seq, limit, window)
        ))

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        self.inner.answer(Answer(scope=scope, now=now, rate=RateOutcome(epoch, until, probe)))

    def release(self, scope: str, token: str) -> None:
        self.inner.answer(Answer(scope=scope, token=token))

    # -- what the store may not carry ------------------------------------------------
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
        if isinstance(inner, Listing):
            return inner.holds(now)
        now = now if now is not None else datetime.now(timezone.utc)
        return {scope: [Hold("cooldown", until)] for scope, until in self.entries().items() if until > now}

    def delete(self, scope: str) -> bool:
        inner = self.inner
        return inner.delete(scope) if isinstance(inner, Listing) else False

    def feed(self, changed: Changed) -> Feed | None:
        inner = self.inner
        return inner.feed(changed) if isinstance(inner, ChangeFeed) else None

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


def _written_for_0_10(kind: type) -> bool:
    """A subclass of the ``Store`` of 0.6-0.10: it defines ``settle`` (abstract then)
    and not ``answer`` (which replaced it in 0.11). Read from the class's own
    definitions, only to refuse it with a message that says what to change."""
    ours = __name__.split(".")[0] + "."
    theirs = [klass for klass in kind.__mro__ if not klass.__module__.startswith(ours)]
    defined = {name for klass in theirs for name in vars(klass)}
    return "settle" in defined and "answer" not in defined


def as_store(cooldown: object) -> PartwiseStore:
    """``cooldown`` as a :class:`~.base.PartwiseStore`: itself, or completed once (see
    the module). A store of 0.x is refused with a ConfigurationError that names the
    change."""
    if isinstance(cooldown, PartwiseStore):
        return cooldown
    if isinstance(cooldown, Store):
        kind = cooldown.__class__  # (a weak proxy's is its store's)
        if _written_for_0_10(kind):
            raise ConfigurationError(
                f"{kind.__name__} was written for the Store of 0.6-0.10 (it defines settle(), not "
                "answer()), no longer adapted: write admit(ask) taking one Ask and answer(answer) "
                "taking one Answer, and subclass the mixin of each capability it carries "
                "(see docs/stores.md, 'A store of your own')"
            )
        return Completed(cooldown)
    raise ConfigurationError(
        f"cooldown must be a retry_after_adapter.cooldown.Store or None, not {cooldown.__class__.__name__}: "
        "a store written for 0.x (get and extend, found by name) is no longer adapted; subclass "
        "Store (its admit and answer default to the cooldown alone) and the mixin of each "
        "capability it carries (see docs/stores.md, 'A store of your own')"
    )


def bare(store: PartwiseStore) -> object:
    """The store ``as_store`` made ``store`` of: the :class:`~.base.Store` a
    :class:`Completed` wraps (each of its operations is one of that store's), else
    ``store`` itself."""
    return store.inner if isinstance(store, Completed) else store
