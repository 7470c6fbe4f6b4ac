"""The store interface: what every worker of a scope shares, and how it is admitted.

A store maps a scope (a short string such as ``"https://api.example.com:443"``) to an
aware UTC ``datetime`` before which no worker of that scope may send (its cooldown),
and keeps what decides each attempt's admission: the permits of a configured quota,
the allowance a server announced, the concurrency slots held. Times are wall-clock UTC
so that processes and machines agree; a cooldown's only write is an atomic *later-wins*
extend, so a shorter cooldown never replaces a longer one.

- :class:`Store` is the whole interface, one atomic operation per concern; the memory,
  SQLite and Redis stores implement all of it, and so does the failure layer that wraps
  a shared store.
- :class:`CooldownStore` is the protocol of version 0.x (``get`` and ``extend``): a
  store written for it keeps working, adapted once by ``legacy.LegacyStore``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timezone
from typing import NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigurationError
from .freshness import Freshness
from .rate import Rate


@runtime_checkable
class CooldownStore(Protocol):
    """Where workers share cooldowns. Implementations must be thread-safe.

    Errors while talking to a backend are raised as ``CooldownStoreError``; the adapter
    turns them into its failure policy (fail open with a local copy, or fail closed).
    """

    def get(self, scope: str) -> datetime | None:
        """The stored eligible time (aware UTC) for ``scope``, or None if there is none.

        A time in the past may be returned; callers compare it with their clock.
        """
        ...

    def extend(self, scope: str, until: datetime) -> datetime:
        """Atomically set ``scope``'s eligible time to the later of the stored one and
        ``until`` (aware), and return the effective (later) time in UTC."""
        ...


class _Fields(NamedTuple):
    cooldown: datetime | None
    not_before: datetime | None
    seq: int | None = None
    slot_busy: bool = False


class Admission(_Fields):
    """What a store's ``admit`` answers for one attempt.

    ``cooldown``: the scope's stored cooldown (may be past). ``not_before``: None when
    the attempt may go (what was asked for is taken: a quota permit, one of the
    announced allowance, a concurrency slot), else when to ask again (nothing taken).
    ``seq``: the attempt's admission number once the scope's quota headers are counted,
    else None. ``slot_busy``: refused only because every concurrency slot is held
    (``not_before`` is then when the earliest lease expires).

    Not among the tuple's four fields (so an Admission still unpacks and compares as
    before), set on a :class:`Granted`: ``permit``, when the quota permit taken stops
    counting (its grant + per + margin) as stored; ``extra``, how many more permits
    were taken in the same operation for this process to spend (``admit``'s
    ``batch``), each counting ``hold`` seconds longer than ``permit``; ``token``, the
    concurrency slot the attempt holds when it is not the one asked for (a slot this
    process already held); ``units``, how many more admissions of the announced
    allowance were counted for this process to spend (numbered ``seq + 1`` on) before
    ``units_until``, the server's reset; ``rate_epoch``, the learned rate's epoch the
    attempt was admitted in (None: no learned rate governs the scope), and
    ``rate_report``, whether its good answer must be told to the store
    (:meth:`Store.rate_answer`)."""

    __slots__ = ()

    #: See above: set on a :class:`Granted`.
    permit: datetime | None = None
    extra: int = 0
    token: str | None = None
    units: int = 0
    units_until: datetime | None = None
    rate_epoch: int | None = None
    rate_report: bool = False
    #: Refused by the scope's learned rate (see :class:`RateHeld`).
    by_rate = False


class RateHeld(Admission):
    """A refusal by the scope's learned rate (its limit per window spent and no probe
    admitted, a throttle's backoff, or every probe slot held: ``slot_busy``); the
    deferral's reason is ``rate``."""

    __slots__ = ()

    by_rate = True


class Granted(Admission):
    """An admission that took a quota permit; ``permit`` says when it stops counting
    (a store's ``settle`` moves that later when the attempt's answer came late)."""

    @classmethod
    def of(
        cls, permit: datetime | None, cooldown: datetime | None, seq: int | None = None, extra: int = 0,
        token: str | None = None, units: int = 0, units_until: datetime | None = None,
        rate_epoch: int | None = None, rate_report: bool = False,
    ) -> Granted:
        granted = cls(cooldown, None, seq, False)
        granted.rate_epoch = rate_epoch
        granted.rate_report = rate_report
        granted.permit = permit
        granted.extra = extra
        granted.token = token
        granted.units = units
        granted.units_until = units_until
        return granted


class Feed(ABC):
    """A store's change feed in one process (see :meth:`Store.feed`): it tells the
    process's near copy which scopes changed elsewhere (a cooldown learned or lifted, an
    allowance announced), so that an unchanged scope is admitted without a round trip."""

    @abstractmethod
    def fresh(self) -> bool:
        """Whether every change made before now has been delivered: True lets the near
        copy answer; False (the channel broke, or has not caught up) sends every
        attempt to the store until it is True again."""

    def close(self) -> None:  # noqa: B027 - a polled feed has nothing to close
        """Stop the feed (its thread and connection, if it has any)."""


#: What a feed calls with each changed scope (None: anything may have changed); the
#: second argument (a cooldown the news may carry) is not trusted: the scope is read again.
Changed = Callable[[str | None, datetime | None], None]


#: ``(slots, ttl seconds, token)``: a concurrency slot to take with an admission.
Lease = tuple[int, float, str]
#: ``(ttl seconds, token)``: admit by the scope's learned rate (see ``rate``), taking a
#: slot as ``token`` for ``ttl`` seconds at most while the rate caps what is in flight.
Learn = tuple[float, str]


class Hold(NamedTuple):
    """One thing a store holds a scope back with, and when it ends (aware UTC).

    ``kind``: ``"cooldown"`` (a Retry-After or an exhausted announcement), ``"allowance"``
    (the server's announced quota used up until its reset), ``"quota"`` (a configured
    ``Quota``'s permits all taken: ``number`` of them, its limit), ``"leases"``
    (``number`` concurrency slots held, the last until ``until``), or ``"rate"`` (the
    learned rate's backoff, or its limit, ``number``, spent for the window)."""

    kind: str
    until: datetime
    number: int = 0


def extra_permits(batch: int, free: int, limit: int) -> int:
    """How many permits beyond the first a batch admission takes: what was asked, from
    the headroom only (``free`` permits left before the first is taken, less a quarter
    of ``limit``), so that a quota near its limit is spent one permit at a time."""
    return max(0, min(batch - 1, free - 1 - limit // 4))


def free_at(closed: list[int], expected: list[int], limit: int, count: int, floor: int) -> int:
    """When a permit of a quota that holds ``count`` permits (at least ``limit``) is
    free at the earliest, in a store's unit of time: once ``count - limit + 1`` of them
    stopped counting. ``closed``: the earliest ends of the permits that are not open,
    ascending (at least ``count - limit + 1`` of them, or all); ``expected``: for each
    open permit (taken to count until its answer settles it), its grant + per + margin,
    when it ends had its answer come in time; or ``floor`` (the present + per), if that
    is later: an answer that comes now ends it then at the earliest. So an eligible
    time is never stretched by how long an unanswered permit is kept, and admission is
    looked at again then (a late answer moves the permit later)."""
    k = count - limit + 1
    ends = sorted([*closed[:k], *(max(end, floor) for end in expected)])
    return ends[min(k, len(ends)) - 1]


def check_scope(scope: object) -> str:
    """Validate a scope key: a non-empty str of at most 512 characters."""
    if not isinstance(scope, str) or not scope or len(scope) > 512:
        raise ConfigurationError("a cooldown scope must be a non-empty string of at most 512 characters")
    return scope


def check_until(until: object) -> datetime:
    """Validate an eligible time: an aware datetime; returned in UTC."""
    if not isinstance(until, datetime) or until.tzinfo is None or until.utcoffset() is None:
        raise ConfigurationError("a cooldown time must be an aware datetime")
    return until.astimezone(timezone.utc)


class Store(ABC):
    """The whole store interface. Implementations are thread-safe; a backend's errors
    are raised as ``CooldownStoreError`` (the failure layer turns them into the
    adapter's failure policy), a value the store cannot hold as ``ConfigurationError``.

    Times are aware UTC datetimes; durations are seconds. Each operation is atomic on
    its own (one lock, one SQLite transaction, one Redis script).
    """

    #: ``admit`` stamps a permit with the time it grants it (``now`` None) and keeps
    #: each quota's margin: true of every :class:`Store` (kept for stores of 0.x).
    stamps_grants = True

    # -- the cooldown ----------------------------------------------------------------
    @abstractmethod
    def get(self, scope: str) -> datetime | None:
        """The scope's stored eligible time (may be past), or None."""

    @abstractmethod
    def extend(self, scope: str, until: datetime) -> datetime:
        """Learn a cooldown: the scope's eligible time becomes the later of the stored
        one and ``until``; returns the effective (later) time."""

    # -- admission -------------------------------------------------------------------
    @abstractmethod
    def admit(
        self, scope: str, now: datetime | None, limit: int | None = None, per: float | None = None,
        lease: Lease | None = None, margin: float = 0.0, batch: int = 1, hold: float = 0.0,
        learn: Learn | None = None, *, opened: float = 0.0,
    ) -> Admission:
        """Admission for one attempt at ``now`` (None: the present, read by the store as
        it grants), all or nothing: the scope's cooldown, what the server announced is
        left, a quota permit (``limit`` per ``per`` seconds, counted ``per + margin``
        seconds from its grant) and a concurrency slot (``lease``). See
        :class:`Admission`. A refusal's ``not_before`` is the earliest time admission
        could succeed from what the store knows (see :func:`free_at`).

        ``opened`` > 0: the permit is an open one, counted ``opened`` seconds longer
        until its answer settles it (``settle`` with ``exact``); until then a refusal
        counts it as ending at its grant + per + margin (or the present + per, if later).

        ``learn``: with no ``limit`` and no announced allowance, the scope's learned rate
        (``rate.Rate``, made at its first admission) admits too: a permit of its limit
        per window, else a probe (a slot of its cap, taken as ``learn``'s token, or with
        ``lease`` under the smaller cap), else :class:`RateHeld`.

        ``batch`` > 1 asks for up to ``batch - 1`` more permits for this process to
        spend within ``hold`` seconds of the grant; each counts ``per + margin + hold``
        seconds from the grant, so an arrival at the server still falls inside what the
        store counts. The store grants extras only from headroom: at most the free
        permits less a quarter of the limit (see :func:`extra_permits`). Likewise, up to
        ``batch - 1`` more admissions of an announced allowance are counted, from what
        is left less a quarter of the server's limit (``Granted.units``)."""

    @abstractmethod
    def release(self, scope: str, token: str) -> None:
        """Give the slot taken as ``token`` back (nothing if it expired meanwhile)."""

    @abstractmethod
    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: the present): the permit counts at least until ``now + per``. ``exact``:
        it counts until ``now + per`` exactly, earlier than ``expires`` too (an open
        permit, taken to count until its answer: see ``Plan.answered``)."""

    @abstractmethod
    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        """Record that the server allows ``remaining`` more requests until ``until``
        (``limit`` per ``window`` seconds, when it said), in answer to the attempt
        admitted as ``seq`` (see ``allowance.merge_allowance``)."""

    # -- the learned rate --------------------------------------------------------------
    @abstractmethod
    def rate_answer(self, scope: str, epoch: int | None, until: datetime | None, now: datetime) -> None:
        """An attempt admitted in the learned rate's ``epoch`` (None: the current one)
        was answered at ``now``: well (``until`` None) or throttled, the scope cooling
        down until ``until`` (see ``rate.answer_rate``). Nothing when the scope has no
        learned rate."""

    @abstractmethod
    def rate_of(self, scope: str) -> Rate | None:
        """The scope's learned rate as stored (None: none)."""

    # -- freshness -------------------------------------------------------------------
    @abstractmethod
    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class of ``scope`` at ``at`` (later wins)."""

    @abstractmethod
    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness, its cooldown as ``next_eligible`` (None: nothing)."""

    @abstractmethod
    def freshness_entries(self) -> dict[str, Freshness]:
        """Every scope's freshness."""

    # -- the operator's view ---------------------------------------------------------
    @abstractmethod
    def entries(self) -> dict[str, datetime]:
        """Every stored scope and its eligible time (a few past ones may be among them)."""

    @abstractmethod
    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        """Every scope held back at ``now`` (default: the present) and by what."""

    @abstractmethod
    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back; True if there was any of it."""

    def feed(self, changed: Changed) -> Feed | None:
        """A change feed for this process's near copy (None, the default: the store
        has none, and every attempt is admitted by a store operation)."""
        return None

    def supports(self, feature: str) -> bool:
        """Whether the store can carry ``"quota"``, ``"leases"``, ``"allowance"``,
        ``"freshness"``, ``"rate"``, ``"exact-settle"`` (``settle``'s ``exact``) and
        ``"open-permits"`` (``admit``'s ``opened``): every :class:`Store` can (a 0.x
        store may not; a store written for 0.7 settles exactly only if its ``settle``
        takes ``exact``, and one written for 0.9 takes no ``opened``)."""
        parameter = {"exact-settle": ("settle", "exact"), "open-permits": ("admit", "opened")}.get(feature)
        if parameter is not None:
            try:
                parameters = inspect.signature(getattr(self, parameter[0])).parameters
            except (TypeError, ValueError):
                return False
            return parameter[1] in parameters or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
            )  # (a wrapper passing its keywords on takes it)
        return True

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Release the store's connections (nothing, unless a store holds some)."""

    # -- conveniences over admit (one path) ------------------------------------------
    def acquire(
        self, scope: str, limit: int, per: float, now: datetime | None = None, margin: float = 0.0
    ) -> datetime | None:
        """Take a quota permit: None when taken, else when to ask again (see ``admit``)."""
        return self.admit(scope, now, limit, per, None, margin).not_before

    def lease(self, scope: str, limit: int, ttl: float, now: datetime | None, token: str) -> datetime | None:
        """Take one of ``limit`` concurrency slots for ``ttl`` seconds as ``token``: None
        when taken, else when to ask again (see ``admit``)."""
        return self.admit(scope, now, None, None, (limit, ttl, token)).not_before
