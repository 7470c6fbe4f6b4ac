"""The store interface: what every worker of a scope shares, and how it is admitted.

A store maps a scope (a short string such as ``"https://api.example.com:443"``) to an
aware UTC ``datetime`` before which no worker of that scope may send (its cooldown),
and keeps what decides each attempt's admission: the permits of a configured quota,
the allowance a server announced, the concurrency slots held. Times are wall-clock UTC
so that processes and machines agree; a cooldown's only write is an atomic *later-wins*
extend, so a shorter cooldown never replaces a longer one.

- :class:`Store` is the core every store implements: ``get`` and ``extend`` (the
  cooldown), ``admit`` of one :class:`Ask` and ``answer`` of one :class:`Answer` (both
  with defaults that fit a store of the core alone).
- One mixin per capability, recognised by type: :class:`QuotaLogs`, :class:`Leases`,
  :class:`Allowances`, :class:`Weights`, :class:`LearnedRate`, :class:`FreshnessLog`,
  :class:`Listing`, :class:`ChangeFeed`, :class:`LeaseRenewal`.
  :class:`PartwiseStore` applies an answer part by part and has them all but
  :class:`Weights` and :class:`LeaseRenewal` (which the memory, SQLite and Redis stores
  add): the memory, SQLite and Redis stores, the failure layer, and what
  ``completed.as_store`` makes of any other store.
- Mixins that declare what the failure layer and the engine rely on, each checked by
  type, never by an attribute's name or a store's class: :class:`Bounded` (a store
  that bounds each of its own operations: SQLite, Redis), :class:`Forgetful` (can lose
  its data unnoticed: Redis), :class:`Replaceable` (its data can be replaced under a
  process: SQLite), :class:`InProcess` (kept in this process's memory: the memory
  store); and ``LearnedRate.rate_kinds``.
- The failure layer of each store object is found in :data:`FAILURE_LAYERS`, by the
  object's identity: nothing is set on a store.
- :class:`CooldownStore` is the shape of the core (``get`` and ``extend``), for type
  annotations; an object of that shape that is no :class:`Store` (a store of 0.x) is
  refused with a message that says what to change.
"""

from __future__ import annotations

import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from ..errors import ConfigurationError
from .freshness import Freshness
from .rate import Rate


@runtime_checkable
class CooldownStore(Protocol):
    """Where workers share cooldowns: the shape of the :class:`Store` core, for type
    annotations (the adapter takes a :class:`Store`: an object of this shape alone, a
    store of 0.x, is refused). Implementations must be thread-safe.

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


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What a store's ``admit`` answers for one attempt: a frozen value, built by keyword
    and read by name (copied with a change by ``dataclasses.replace``). Every time is an
    aware UTC datetime.

    Whether the attempt may go:

    - ``cooldown``: the scope's stored cooldown (may be past; None: none stored).
    - ``not_before``: None when the attempt may go (everything asked for is taken: a
      quota permit, one of the announced allowance, a concurrency slot, a send of the
      learned rate), else when to ask again (nothing taken): the earliest time
      admission could succeed from what the store knows (see :func:`free_at`).
    - ``slot_busy``: refused only because every concurrency slot is held
      (``not_before`` is then when the earliest lease expires).
    - ``by_rate``: refused by the scope's learned rate (its limit per window spent and
      no probe admitted, a throttle's backoff, or every probe slot held:
      ``slot_busy``); the deferral's reason is then ``rate``.
    - ``oversized``: > 0 for a refusal for good: the attempt's declared cost is more
      than the whole token limit the server announced, this many tokens, so no window
      would admit it (``weights.oversized``); ``not_before`` is the allowance's reset,
      for a layer that does not read this, and the engine raises a
      ConfigurationError instead of waiting. 0: not so.

    What a grant took (each left at its default by a refusal):

    - ``seq``: the attempt's admission number once the scope's announced allowance is
      counted (its quota headers), else None.
    - ``permit``: when the configured quota permit taken stops counting as stored (its
      grant + per + margin; ``Ask.opened`` seconds later for an open one); None: no
      permit taken. The attempt's answer settles it (``Answer.permit``).
    - ``extra``: how many more permits were taken in the same operation for this
      process to spend (``Ask.batch``), each counting ``Ask.hold`` seconds longer
      than ``permit``.
    - ``token``: the concurrency slot the attempt holds when it is not the one
      ``Ask.lease`` named (a slot this process already held), or the slot of the
      learned rate's probes it took (``Ask.learn``); None: the one asked for, or none.
    - ``units``: how many more admissions of the announced allowance were counted for
      this process to spend (numbered ``seq + 1`` on) before ``units_until``, the
      server's reset (None when ``units`` is 0).
    - ``rate_epoch``: the learned rate's epoch the attempt was admitted in (None: no
      learned rate governs the scope); ``rate_report``: whether its good answer must
      be told to the store (``Answer.rate``).
    - ``weighed``: when the token permit taken (``Ask.weigh`` with a configured token
      quota) stops counting as stored, or None (see :class:`Weigh`); ``token_seq``:
      the announced token allowance's count after this attempt's cost, less one (None:
      none counted): an answer's token figure holds as of it, as ``seq`` for requests.
    - ``reserved``: a reservation (``Ask.reserve_by``, :class:`Reservations`): the
      permit (``permit``) is granted at this later time, on the store's clock; the
      caller sleeps until then and asks once more holding it (``Ask.held``), which
      goes at once unless a permit it counted on was answered late (``not_before`` is
      None). None: a grant for now, or a refusal.
    """

    cooldown: datetime | None
    not_before: datetime | None
    slot_busy: bool = False
    by_rate: bool = False
    oversized: int = 0
    seq: int | None = None
    permit: datetime | None = None
    extra: int = 0
    token: str | None = None
    units: int = 0
    units_until: datetime | None = None
    rate_epoch: int | None = None
    rate_report: bool = False
    weighed: datetime | None = None
    token_seq: int | None = None
    reserved: datetime | None = None


#: The admission of an attempt that took nothing, on a scope with no cooldown stored
#: (one shared value: an Admission is frozen).
ADMITTED = Admission(cooldown=None, not_before=None)

_Value = TypeVar("_Value")
_new = object.__new__
_set = object.__setattr__


def assembled(cls: type[_Value], fields: dict[str, Any]) -> _Value:
    """A value of ``cls`` (:class:`Ask`, :class:`Lease`, :class:`Learn`,
    :class:`Admission`, :class:`Answer`) holding ``fields`` by name, the others at
    their defaults: what ``cls(**fields)`` makes, a few times faster, for the
    operations every attempt makes (a dataclass's generated ``__init__`` writes each
    field by one ``object.__setattr__``, the cost of a frozen value; here its
    attribute dict is set whole). ``fields`` must name every field without a default,
    and nothing else (a test checks each use against the class's own ``__init__``);
    it is owned by the value from then on."""
    value = _new(cls)
    _set(value, "__dict__", fields)
    return value


class Feed(ABC):
    """A store's change feed in one process (see :meth:`Store.feed`): it tells the
    process's near copy which scopes changed elsewhere (a cooldown learned or lifted, an
    allowance announced), so that an unchanged scope is admitted without a round trip."""

    @abstractmethod
    def fresh(self) -> bool:
        """Whether every change made before now has been delivered: True lets the near
        copy answer; False (the channel broke, or has not caught up) sends every
        attempt to the store until it is True again. Asked on the calling thread
        before each admission the near copy answers: it answers from memory, or within
        the store's declared bound (:class:`Bounded`)."""

    def close(self) -> None:  # noqa: B027 - a polled feed has nothing to close
        """Stop the feed (its thread and connection, if it has any)."""


#: What a feed calls with each changed scope (None: anything may have changed); the
#: second argument (a cooldown the news may carry) is not trusted: the scope is read again.
Changed = Callable[[str | None, datetime | None], None]


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A concurrency slot to take with an admission (``Ask.lease``, :class:`Leases`):
    one of ``slots`` slots of the scope (the cap), held as ``token`` (a string unique to
    the attempt, or to the process's held slot) for ``ttl`` seconds at most unless
    given back (``Answer.token``) or renewed (:class:`LeaseRenewal`) first."""

    slots: int
    ttl: float
    token: str


@dataclass(frozen=True, kw_only=True)
class Learn:
    """Admit by the scope's learned rate too (``Ask.learn``, :class:`LearnedRate`; see
    ``rate``): while the rate caps what is in flight (its cold start, its probes), the
    attempt takes a slot of it as ``token`` for ``ttl`` seconds at most."""

    ttl: float
    token: str


class Hold(NamedTuple):
    """One thing a store holds a scope back with, and when it ends (aware UTC).

    ``kind``: ``"cooldown"`` (a Retry-After or an exhausted announcement), ``"allowance"``
    (the server's announced quota used up until its reset), ``"quota"`` (a configured
    ``Quota``'s permits all taken: ``number`` of them, its limit), ``"leases"``
    (``number`` concurrency slots held, the last until ``until``), ``"rate"`` (the
    learned rate's backoff, or its limit, ``number``, spent for the window), or
    ``"tokens"`` (a token quota of ``number`` tokens full, until its first permit
    stops counting)."""

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
    """Validate a scope key: a non-empty str of at most 512 characters that every store
    can hold (no NUL, no lone surrogate: UTF-8 must encode it)."""
    if not isinstance(scope, str) or not scope or len(scope) > 512:
        raise ConfigurationError("a cooldown scope must be a non-empty string of at most 512 characters")
    if not scope.isascii() or "\x00" in scope:
        why = unstorable(scope)
        if why:
            raise ConfigurationError(f"a cooldown scope must not hold {why}")
    return scope


def unstorable(text: str) -> str:
    """What of ``text`` no store can hold as a scope, in a few words ("" if nothing): a
    NUL character, or a lone surrogate (not text: UTF-8 cannot encode it)."""
    if "\x00" in text:
        return "a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate"
    return ""


def check_until(until: object) -> datetime:
    """Validate an eligible time: an aware datetime; returned in UTC."""
    if not isinstance(until, datetime) or until.tzinfo is None or until.utcoffset() is None:
        raise ConfigurationError("a cooldown time must be an aware datetime")
    return until.astimezone(timezone.utc)


#: The version of what the SQLite and Redis stores keep (their tables and columns, their
#: keys, hash fields and sorted-set members, the change channel's messages): it changes
#: whenever a table, column, key or field is added, removed or changes meaning.
#: ``docs/store-format.md`` documents this version, and is updated with it.
STORE_FORMAT = 2

#: The suffix of the scope a scope's announced token allowance is kept under (an
#: allowance of that scope, announced and merged as a requests one is; see
#: :class:`Weigh`). A token quota's permits are kept under the scope itself.
TOKENS = "#tokens"


def token_scope(scope: str) -> str:
    """The scope ``scope``'s announced token allowance is kept under (see :data:`TOKENS`)."""
    return scope + TOKENS


class Weigh(NamedTuple):
    """What an attempt that declared a cost asks of the scope's tokens (:class:`Weights`):
    ``cost`` tokens (>= 1), admitted against the server's announced token allowance
    (kept as the allowance of :func:`token_scope`) when one runs, and, when ``limit``
    > 0, against a configured token quota of ``limit`` tokens per ``per`` seconds: a
    permit weighing ``cost`` that counts ``per + margin`` seconds from its grant,
    granted while the permits that count leave room for it. Both or neither, with the
    rest of the attempt's admission."""

    cost: int
    limit: int = 0
    per: float = 0.0
    margin: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Ask:
    """What one attempt asks a store to admit, all or nothing (see :meth:`Store.admit`):
    a frozen value, built by keyword and read by name. Durations are seconds.

    - ``scope``: the scope (see :func:`check_scope`).
    - ``now``: the attempt's time, an aware UTC datetime (None: the present, read by
      the store as it grants).
    - ``limit``, ``per``: a configured quota (:class:`QuotaLogs`), ``limit`` permits per
      ``per`` seconds (None, None: no quota), each permit counted ``per + margin``
      seconds from its grant (``margin``: the time from admission to the server's
      arrival).
    - ``opened``: > 0 takes the permit *open*: counted ``opened`` seconds longer, until
      its answer settles it exactly (``Permit.exact``).
    - ``batch``: > 1 asks for up to ``batch - 1`` more permits for this process to
      spend within ``hold`` seconds (each counted ``hold`` seconds longer; granted from
      headroom only, see :func:`extra_permits`); an announced allowance is counted the
      same way (``Admission.units``).
    - ``lease``: a concurrency slot to take (:class:`Lease`, :class:`Leases`; None:
      none).
    - ``learn``: admit by the scope's learned rate too (:class:`Learn`,
      :class:`LearnedRate`; None: not), ignored while a quota, an announced allowance
      or a token quota governs the attempt.
    - ``weigh``: the attempt's cost in tokens (:class:`Weigh`, :class:`Weights`; None:
      no cost declared).
    - ``reserve_by``: the latest time (aware UTC) the attempt may be sent at (its
      budget's end: ``max_wait``, the deadline), or None: admitted now or refused. A
      store with :class:`Reservations` that cannot grant the quota's permit now, but
      could at a time no later than this, grants it for then in the same operation
      (``Admission.reserved``); only for an attempt that asks for a quota permit and
      nothing else that could refuse it (no slot, no cost, no announced allowance).
    - ``held``: the stored end of a reservation the attempt holds (``Admission.permit``
      of a reservation, at or after its time): given back in the same operation, before
      the admission is decided again (:class:`Reservations`); None: none.
    - ``priority``: the attempt's place among waiters of the scope (an int, higher
      first; 0: ordinary): a reservation is placed ahead of every waiting one of a
      lower priority (:class:`Reservations`).
    """

    scope: str
    now: datetime | None = None
    limit: int | None = None
    per: float | None = None
    margin: float = 0.0
    opened: float = 0.0
    batch: int = 1
    hold: float = 0.0
    lease: Lease | None = None
    learn: Learn | None = None
    weigh: Weigh | None = None
    reserve_by: datetime | None = None
    held: datetime | None = None
    priority: int = 0


class Permit(NamedTuple):
    """An answered attempt's quota permit: of ``limit`` per ``per`` seconds, stored to
    stop counting at ``expires``. It must count at least until the answer + ``per``;
    ``exact``: exactly until then, earlier than ``expires`` too (an open permit)."""

    limit: int
    per: float
    expires: datetime
    exact: bool = False


class Announced(NamedTuple):
    """The server allows ``remaining`` more requests until ``until`` (``limit`` per
    ``window`` seconds, when it said), in answer to the attempt admitted as ``seq``. A
    negative ``window`` is a bucket (OpenAI's, Anthropic's): ``until`` is its next unit,
    one more every ``-window`` seconds after, up to ``limit`` (see
    ``allowance.merge_allowance``)."""

    remaining: int
    until: datetime
    seq: int | None = None
    limit: int | None = None
    window: float | None = None


class Weighed(NamedTuple):
    """An answered attempt's token permit (see :class:`Weigh`): ``cost`` tokens of a
    token quota of ``limit`` per ``per`` seconds, stored to stop counting at
    ``expires``; it must count at least until the answer + ``per``."""

    cost: int
    limit: int
    per: float
    expires: datetime


class RateOutcome(NamedTuple):
    """How an attempt admitted in the learned rate's ``epoch`` (None: the current one)
    was answered: well (``until`` None) or throttled, the scope cooling down until
    ``until``; ``probe``: the attempt was a probe (True), a known send (False), or not
    said (None; a store whose ``LearnedRate.rate_kinds`` is False is not told, and
    reads every throttle as before)."""

    epoch: int | None
    until: datetime | None = None
    probe: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What an answered (or finished) attempt tells a store, in one operation (see
    :meth:`Store.answer`): a frozen value, built by keyword and read by name. A part a
    store does not carry is ignored; None: nothing of that part.

    - ``scope``: the attempt's scope.
    - ``now``: the answer's time, an aware UTC datetime (None: the present).
    - ``token``: a concurrency slot to give back (``Lease.token``, or
      ``Admission.token``).
    - ``permit``: its quota permit to settle (:class:`Permit`).
    - ``announced``: the allowance its answer announced (:class:`Announced`).
    - ``rate``: its learned rate's outcome (:class:`RateOutcome`).
    - ``weighed``: its token permit to settle (:class:`Weighed`).
    """

    scope: str
    now: datetime | None = None
    token: str | None = None
    permit: Permit | None = None
    announced: Announced | None = None
    rate: RateOutcome | None = None
    weighed: Weighed | None = None


class Store(ABC):
    """The core every store implements: a scope's cooldown, read (:meth:`get`) and
    learned later-wins (:meth:`extend`); an attempt's admission (:meth:`admit`, one
    :class:`Ask`) and its answer (:meth:`answer`, one :class:`Answer`).

    A store with :meth:`get` and :meth:`extend` alone shares cooldowns: ``admit``
    then reads the cooldown and ``answer`` does nothing. Each capability beyond that is
    one mixin, recognised by its type: :class:`QuotaLogs`, :class:`Leases`,
    :class:`Allowances`, :class:`LearnedRate`, :class:`FreshnessLog`, :class:`Listing`
    and :class:`ChangeFeed`; an adapter refuses settings the store cannot carry.

    Implementations are thread-safe; a backend's errors are raised as
    ``CooldownStoreError`` (the adapter turns them into its failure policy), a value the
    store cannot hold as ``ConfigurationError``. Times are aware UTC datetimes;
    durations are seconds. Each operation is atomic on its own.
    """

    @abstractmethod
    def get(self, scope: str) -> datetime | None:
        """The scope's stored eligible time (may be past), or None."""

    @abstractmethod
    def extend(self, scope: str, until: datetime) -> datetime:
        """Learn a cooldown: the scope's eligible time becomes the later of the stored
        one and ``until``; returns the effective (later) time."""

    def admit(self, ask: Ask) -> Admission:
        """Admission for one attempt, all or nothing, in one atomic operation: the
        scope's cooldown and what the store's capabilities add (a quota permit, what
        the server announced is left, a concurrency slot, the learned rate). See
        :class:`Ask` and :class:`Admission`; a refusal's ``not_before`` is the earliest
        time admission could succeed from what the store knows (see :func:`free_at`).
        The default, for a store of the core alone: the cooldown, read."""
        cooldown = self.get(ask.scope)
        now = ask.now if ask.now is not None else datetime.now(timezone.utc)
        return Admission(
            cooldown=cooldown, not_before=cooldown if cooldown is not None and cooldown > now else None
        )

    def answer(self, answer: Answer) -> None:  # noqa: B027 - the core keeps nothing per answer
        """An attempt's answer (see :class:`Answer`), in one atomic operation: its slot
        given back, its permit settled, the allowance announced, the learned rate
        told. The default, for a store of the core alone: nothing."""

    def close(self) -> None:  # noqa: B027 - most stores have nothing to close
        """Release the store's connections (nothing, unless a store holds some)."""

    # -- shorthands over admit (one direction: admit never calls them) -------------------
    def acquire(
        self, scope: str, limit: int, per: float, now: datetime | None = None, margin: float = 0.0
    ) -> datetime | None:
        """Take a quota permit: None when taken, else when to ask again."""
        return self.admit(Ask(scope=scope, now=now, limit=limit, per=per, margin=margin)).not_before

    def lease(self, scope: str, limit: int, ttl: float, now: datetime | None, token: str) -> datetime | None:
        """Take one of ``limit`` concurrency slots for ``ttl`` seconds as ``token``: None
        when taken, else when to ask again."""
        return self.admit(Ask(
            scope=scope, now=now, lease=Lease(slots=limit, ttl=ttl, token=token)
        )).not_before

    @property
    def capabilities(self) -> frozenset[type]:
        """The capability mixins the store carries (a wrapper answers for what it wraps)."""
        return frozenset(mixin for mixin in CAPABILITIES if isinstance(self, mixin))


def quiesce_guard(store: object) -> None:
    """Before ``store`` closes: what its failure layer's threads hold (settles, writes
    tried again) is written or dropped, and they write nothing after (a write racing
    the close crashed a process)."""
    guard = FAILURE_LAYERS.find(store)
    if guard is not None:
        guard.quiesce()


# -- capabilities: one mixin each ------------------------------------------------------
class QuotaLogs(ABC):  # noqa: B024 - a capability declared by type; its work is admit's
    """``admit`` takes a configured quota's permits (``Ask.limit``, ``per``, ``margin``,
    ``batch``, ``hold``, ``opened``) and ``answer`` settles them (``Answer.permit``),
    exactly when ``Permit.exact`` says so (earlier than stored too). Every store of this
    type settles exactly: the engine takes a short quota's permits open on that promise
    (counted longer until their answer), and the conformance kit checks it."""


#: Seconds after which a reservation's holder held back by a permit not yet answered
#: asks again at the latest (see :class:`Reservations`): its answer's settle may be on
#: its way. Not sooner: with 256 threads on 2 cores, 0.25 s had most holders asking
#: every quarter second while answers came late, and the store fell behind.
RECHECK = 1.0


class Reservations(ABC):  # noqa: B024 - a capability declared by type; its work is admit's
    """``admit`` reserves a quota permit (:class:`QuotaLogs`) for a later time when
    none is free now (``Ask.reserve_by``), and keeps a *waiting* mark beside it (its
    stored end and ``Ask.priority``) until its holder goes or gives it back.

    - **Placing** (an ask of priority ``p``): the earliest time ``t`` (no earlier than
      the present, no later than ``reserve_by``) at which fewer than the limit of the
      quota's permits count, counting every permit but the waiting ones of a priority
      below ``p`` (:func:`placing_ends`), the waiting ones kept counting as from now (so
      each priority is served in the order asked, and ahead of every lower one), an
      open permit as ending at its grant + per + margin or at the present + per if
      later (as :func:`free_at`), and, for a quota whose ``per`` is under
      :data:`PACE_UNDER`, no earlier than ``per / limit`` after the latest place
      waiting at ``p`` or higher (:func:`paced`: permits freed in a burst are spent
      spread out, so a later priority call finds one free within ``per / limit``).
      At ``t`` = the present it is granted at once (no reservation); else the permit
      is taken in the same operation to count from ``t`` for ``per + margin`` (+
      ``opened``), marked waiting with its priority and place, and
      ``Admission.reserved`` is ``t``. A refusal's ``not_before`` is the reservation it would have got.
    - **Going** (at its time the holder asks once more with ``Ask.held``, its permit's
      stored end, and its ``Ask.priority``): it goes at once (``Admission.reserved``
      None, its waiting mark dropped) when fewer than the limit of the others count
      (:func:`holder_ends`): every permit sent (an unanswered one as ending within
      :data:`RECHECK`), and the waiting ones ahead of it (a higher priority, or the same
      one reserved no later); the waiting ones behind it count on it and are left out.
      Else it keeps its place and is told when to ask again (``reserved``: when the
      earliest counted could end), so a waiting one ahead of it, or a permit answered
      late (its request may have arrived late), holds it back as it holds any attempt.
      Past ``reserve_by`` its permit is given back and the admission decided again.
    - **Giving back:** a reservation not used is given back by an exact settle answered
      ``per`` before the present (its permit then ends now, its waiting mark goes); one
      never given back counts until its stored end: it costs throughput, never the
      quota."""


class Mark(NamedTuple):
    """A reservation's mark (see :class:`Reservations`), kept beside its permit until
    the permit's stored end, or until an exact settle ends it (:func:`settled_mark`):
    the ``rank`` (``Ask.priority``) it was placed with, its
    ``place`` (when its holder may send, in the store's unit of time), and whether it
    was ``sent`` (its holder went; a priority call granted at once too), or still
    waits."""

    rank: int
    place: int
    sent: bool = False


def settled_mark(marks: Sequence[Mark], answered: int) -> Mark | None:
    """Which of the marks of a permit's stored end an exact settle answered at
    ``answered`` is about (see :class:`Reservations`): a waiting one whose place is
    still after the answer (a reservation given back, answered ``per`` before the
    present, before it could go: the mark goes), else a sent one (its answer: the mark
    moves with its permit's end), else none (an unmarked permit's answer). Times in any
    one unit."""
    waiting = [m for m in marks if not m.sent and m.place > answered]
    if waiting:
        return waiting[-1]
    sent = [m for m in marks if m.sent]
    return sent[-1] if sent else None


def placing_ends(
    log: Sequence[int], marks: dict[int, list[Mark]], priority: int, now: int
) -> tuple[list[int], list[int]]:
    """For placing a reservation of ``priority`` (see :class:`Reservations`): the
    stored ends of the quota's ``log`` that count (ascending, as ``log``), and those
    left out: the waiting ones of a lower priority (each of them, going, then counts
    every permit sent: see :func:`holder_ends`). ``marks``: stored end -> the marks with
    that end. ``now`` is the present (unused; the same unit). Times in any one unit."""
    lower = {end: sum(1 for m in ms if not m.sent and m.rank < priority) for end, ms in marks.items()}
    if not any(lower.values()):
        return list(log), []
    kept: list[int] = []
    out: list[int] = []
    for end in log:
        if lower.get(end, 0) > 0:
            lower[end] -= 1
            out.append(end)
        else:
            kept.append(end)
    return kept, out


#: Seconds: a quota whose ``per`` is shorter has its reservations paced (:func:`paced`);
#: a longer one's waiters go as soon as permits free, all at once if they free so (an
#: hour's quota spread over its hour would hold a burst's tail back for most of it).
PACE_UNDER = 10.0


def paced(start: int, marks: Iterable[Mark], priority: int, interval: int) -> int:
    """A reservation of ``priority``'s place: no earlier than ``start`` (when a permit is
    free), nor than ``interval`` (the quota's per / limit) after the latest place of
    the reservations marked at ``priority`` or higher (waiting or sent), so the quota's
    permits are spent spread out, not in the bursts they freed in. Times in any one
    unit."""
    last = max((m.place for m in marks if m.rank >= priority), default=None)
    return start if last is None else max(start, last + interval)


def free_in(log: Sequence[int], opened: dict[int, list[int]], limit: int, floor: int) -> int | None:
    """None when fewer than ``limit`` of the quota's ``log`` (its stored ends, ascending,
    those ended dropped) count, else when a permit is free at the earliest
    (:func:`free_at`; ``opened``: stored end -> when each open permit with it would end
    had it been answered in time; ``floor``: the present + per). Times in any one unit."""
    count = len(log)
    if count < limit:
        return None
    expected = [when for ends in opened.values() for when in ends]
    if not expected:
        return log[count - limit]
    skip = {end: len(ends) for end, ends in opened.items()}
    closed: list[int] = []
    for end in log:
        if skip.get(end, 0) > 0:
            skip[end] -= 1
        else:
            closed.append(end)
            if len(closed) > count - limit:
                break
    return free_at(closed, expected, limit, count, floor)


def holder_ends(
    others: Sequence[int], pending: dict[int, list[int]], marks: dict[int, list[Mark]], mine: Mark,
    expected: int, now: int, per: int, recheck: int,
) -> list[int]:
    """For a reservation's holder (marked ``mine``; its permit, if open, would end at
    ``expected`` had it been answered in time) asking at ``now``: the ends of the
    ``others`` (the quota's other stored ends) that count against it (see
    :class:`Reservations`). Left out, as they count on it: a waiting one behind it (a
    lower priority, or the same one placed later), and, unless a permit of a higher
    priority is among the others (it may have been placed leaving this one out), one
    sent from a later place at its priority or a lower one and an open one unmarked
    granted after its place (its expected end later). Counted: every other, an open
    one (``pending``: stored end -> when each would end had it been answered in time)
    as ending at that time or at
    ``now + per`` if later, within ``recheck`` (the present + :data:`RECHECK`) at the
    latest; a waiting one ahead of it whose place has passed as going no earlier than
    now (its ends moved as much: held back, it goes late). The lists of ``pending``
    and ``marks`` are consumed. Times in any one unit."""
    ends: list[int] = []
    rank, place = mine.rank, mine.place
    floor = now + per
    # A higher priority among them may have been placed leaving this one out: then
    # what counted on this one may not be left out (it and the higher one could both go).
    overtaken = any(m.rank > rank for stored in set(others) for m in marks.get(stored, ()))
    for stored in others:
        found = marks.get(stored)
        mark = found.pop() if found else None
        opens = pending.get(stored)
        when = opens.pop() if opens else None
        late = 0
        if mark is not None:
            if not mark.sent:
                if mark.rank < rank or (mark.rank == rank and mark.place > place):
                    continue  # waiting behind it
                late = max(0, now - mark.place)
            elif mark.rank <= rank and mark.place > place and not overtaken:
                continue  # sent from a later place: it counted on this one
        elif when is not None and when > expected and not overtaken:
            continue  # granted after its place: it counted on this one
        if when is None:
            ends.append(stored + late)
        else:
            ends.append(min(max(when + late, floor), recheck))
    return ends


class Leases(ABC):  # noqa: B024 - a capability declared by type; its work is admit's
    """``admit`` takes a concurrency slot (``Ask.lease``) and ``answer`` gives it back
    (``Answer.token``)."""


class LeaseRenewal(ABC):
    """``renew`` moves held concurrency slots' leases later, and ``renew_open`` open
    quota permits' ends, so that a process may take its slots and open permits with a
    short life and renew them while it holds them: a process that dies gives them back
    within that life (see ``_near.LIFE``)."""

    @abstractmethod
    def renew(
        self, leases: Sequence[tuple[str, str, datetime]], now: datetime | None = None, exact: bool = False
    ) -> set[str]:
        """For each ``(scope, token, until)``: a lease still held at ``now`` (None: the
        present) is made to end no earlier than ``until`` (``exact``: to end at
        ``until``, earlier too: a slot an attempt no longer uses, kept for the next
        one, counts only a short life from then); one that expired or was given back
        is not taken again. In as few operations as the store can (one transaction, one
        pipeline). Returns the tokens not held."""

    @abstractmethod
    def renew_open(
        self, permits: Sequence[tuple[str, int, float, datetime, datetime, int]], now: datetime | None = None
    ) -> list[int]:
        """For each ``(scope, limit, per, end, until, count)``: up to ``count`` open
        permits of the quota (``limit`` per ``per`` seconds) stored to end at ``end``,
        still counting at ``now`` (None: the present), are moved to end at ``until``
        (later only), each with its entry among the open permits (see
        ``QuotaLogs``). In as few operations as the store can. Returns how many moved,
        for each."""


class Allowances(ABC):  # noqa: B024 - a capability declared by type; its work is admit's
    """``answer`` records what the server announced is left (``Answer.announced``) and
    ``admit`` spreads it over every worker (``Admission.seq``, ``Admission.units``)."""


class Weights(ABC):
    """``admit`` weighs an attempt's declared cost in tokens (``Ask.weigh``) against
    the scope's announced token allowance and a configured token quota, and ``answer``
    settles a token permit (``Answer.weighed``) with :meth:`settle_weighed`."""

    @abstractmethod
    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        """The attempt whose token permit is ``weighed`` was answered at ``now`` (None:
        the present): the permit counts at least until ``now + per`` (put back if it
        expired meanwhile)."""


class LearnedRate(ABC):
    """``admit`` admits by the scope's learned rate (``Ask.learn``, see ``rate``) and
    ``answer`` tells it how attempts were answered (``Answer.rate``)."""

    #: Whether ``rate_answer`` takes ``probe``, the kind of attempt answered (see
    #: :class:`RateOutcome`): declared by a store that reads it (the package's own); one
    #: that does not is called as before, with four arguments.
    rate_kinds = False

    @abstractmethod
    def rate_of(self, scope: str) -> Rate | None:
        """The scope's learned rate as stored (None: none)."""


class FreshnessLog(ABC):
    """A scope's health: its last success, next eligible time and last error class."""

    @abstractmethod
    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class of ``scope`` at ``at`` (later wins)."""

    @abstractmethod
    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness, its cooldown as ``next_eligible`` (None: nothing)."""

    @abstractmethod
    def freshness_entries(self) -> dict[str, Freshness]:
        """Every scope's freshness."""


class Listing(ABC):
    """The operator's view: what is stored, what holds each scope back, and lifting it."""

    @abstractmethod
    def entries(self) -> dict[str, datetime]:
        """Every stored scope and its eligible time (a few past ones may be among them)."""

    @abstractmethod
    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        """Every scope held back at ``now`` (default: the present) and by what."""

    @abstractmethod
    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back; True if there was any of it."""


class Bounded(ABC):
    """A store that bounds each of its own operations, and says by how much.

    Not a capability the adapter needs for a setting, but a promise the failure layer
    relies on: a store of this type is called directly on the calling thread while the
    call has at least :meth:`operation_timeout` seconds left; any other store's
    operations (and this one's when the call has less left) run on a helper thread
    that the call stops waiting for at its bound. Only this type is read: an attribute
    of a store (a ``timeout`` of its own meaning) never is. The conformance kit checks
    the promise against a handle whose backend does not answer (its ``hung_store``)."""

    @abstractmethod
    def operation_timeout(self) -> float | None:
        """The most (seconds, finite and > 0) one operation of this store takes, a
        backend that does not answer included: it then fails with
        ``CooldownStoreError`` within that time. None: not known for this store (its
        operations are then bounded on a helper thread)."""


class ChangeFeed(ABC):
    """A change feed for each process's near copy, so that an unchanged scope is
    admitted without a store operation."""

    @abstractmethod
    def feed(self, changed: Changed) -> Feed | None:
        """A feed calling ``changed`` with each scope changed elsewhere (None: none
        this time, and every attempt is admitted by a store operation)."""


class Forgetful(ABC):
    """A store that can lose what it holds without an error to notice between two
    operations (a Redis without persistence restarted while its client reconnects at
    once, a failover to a replica that had not caught up). Its :meth:`Listing.delete`
    marks what it lifts, so that a cooldown missing from it is told apart: lifted by an
    operator, or lost. A lost one is treated as a failure the process noticed: every
    cooldown it holds is written back (not in :data:`CAPABILITIES`: the failure layer
    asks it of the store it wraps)."""

    @abstractmethod
    def lifted(self, scope: str) -> bool:
        """Whether ``scope``'s cooldown was lifted by ``delete`` recently enough that a
        process may still hold it (True), rather than lost with the store's data."""


class Replaceable(ABC):
    """A store whose data can be replaced under a running process without an error to
    notice (the SQLite store: its file deleted or replaced, and reopened). The failure
    layer compares :attr:`generation` after each answer, and writes back every cooldown
    the process holds when it went up (not in :data:`CAPABILITIES`: it asks nothing of
    the adapter)."""

    @property
    @abstractmethod
    def generation(self) -> int:
        """How many times this process found the store's data replaced (0: never)."""

    @property
    @abstractmethod
    def replaced_reason(self) -> str:
        """Why the data was last found replaced, in a few words for a log ("": never)."""


class LocalCopy(ABC):
    """A store whose cooldowns this process also holds in its own memory (the memory
    store; the failure layer's local copy): a scope's cooldown is read without an
    operation, right before an attempt goes out (not in :data:`CAPABILITIES`: a store
    of one's own is given one by the failure layer)."""

    @abstractmethod
    def cooldown_reader(self) -> Callable[[str], datetime | None]:
        """A function that reads a scope's stored cooldown (may be past; None: none)
        from memory, with no lock and no store operation: called before attempts."""


class InProcess(LocalCopy):
    """A store kept in this process's memory (the memory store): it cannot fail, so the
    failure layer does not wrap it, and its operations never block (an async front end
    runs them on the event loop). Not in :data:`CAPABILITIES`: it asks nothing of the
    adapter."""


class CallBudgets(ABC):
    """A store whose operations each call bounds by its own deadline and failure policy
    (the failure layer): the engine asks it for a view of itself per call, with the
    store's interface, and talks to that view only. Not in :data:`CAPABILITIES`: a
    store of one's own declares its bound with :class:`Bounded` instead."""

    @abstractmethod
    def for_call(
        self, deadline: float | None, monotonic: Callable[[], float], fail_closed: bool
    ) -> PartwiseStore:
        """The store as one call sees it: each operation bounded by ``deadline`` (on
        ``monotonic``, seconds; None: none), and, when the store is down, failing closed
        (``CooldownUnavailable``) or answering from the local copy (open)."""


class FailureLayers:
    """The failure layer (``guard.StoreGuard``) of each store object in this process,
    found by the store's identity, never by an attribute of the store (so a store that
    is unhashable, compares equal to another, or takes no attributes is served too).

    The layer holds its store; an entry holds both weakly, so it lasts while anything
    uses the layer (an adapter, a pool manager, a transport, or a thread of the layer
    with work it still owes the store: a cooldown to write back, slots to give back,
    permits to settle) and ends with it: a store nobody uses is then collected with its
    layer, never before the layer's work is done. A store that cannot be weakly
    referenced is kept by its entry until the layer ends. A copy or an unpickled store
    is another object: it gets a layer of its own."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Callable[[], object], Callable[[], object]]] = {}

    def find(self, store: object) -> Any:
        """The layer made for ``store`` (this very object) that is still in use, or None."""
        entry = self._entries.get(id(store))
        if entry is None or entry[0]() is not store:
            return None
        return entry[1]()

    def add(self, store: object, layer: Any) -> bool:
        """Keep ``layer`` as ``store``'s while it is in use; returns whether the store
        is held weakly by the entry (False: it cannot be weakly referenced, and the
        entry holds it until the layer ends)."""
        key = id(store)
        entries = self._entries

        def ended(_: object) -> None:
            entry = entries.get(key)
            if entry is not None and (entry[0]() is None or entry[1]() is None):
                del entries[key]

        layer_ref: Callable[[], object] = weakref.ref(layer, ended)
        try:
            ref: Callable[[], object] = weakref.ref(store, ended)
        except TypeError:
            entries[key] = ((lambda: store), layer_ref)
            return False
        entries[key] = (ref, layer_ref)
        return True


#: Every store object's failure layer in this process (see :class:`FailureLayers`).
FAILURE_LAYERS = FailureLayers()


#: Every capability mixin, in the order the docs list them.
CAPABILITIES: tuple[type, ...] = (
    QuotaLogs, Leases, Allowances, Weights, LearnedRate, FreshnessLog, Listing, ChangeFeed, LeaseRenewal,
    Reservations,
)


class PartwiseStore(Store, QuotaLogs, Leases, Allowances, LearnedRate, FreshnessLog, Listing, ChangeFeed):
    """A store that applies each part of an :class:`Answer` by an operation of its own,
    and carries every capability the adapter's settings may need but :class:`Weights`
    and :class:`LeaseRenewal`: the memory, SQLite and Redis stores (which add those
    two), the failure layer, and what ``completed.as_store`` makes of any other
    :class:`Store`. ``answer`` calls ``settle``, ``settle_weighed``, ``allow``,
    ``rate_answer`` and ``release`` (each atomic on its own), in that order; they never
    call ``answer`` (one direction). Called ``FullStore`` until 0.14 (a deprecated
    alias): it never had every mixin."""

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        """A store without :class:`Weights` took no token permit: nothing to settle."""

    def answer(self, answer: Answer) -> None:
        scope, now, token, permit = answer.scope, answer.now, answer.token, answer.permit
        announced, rate, weighed = answer.announced, answer.rate, answer.weighed
        if permit is not None:
            self.settle(scope, permit.limit, permit.per, permit.expires, now, permit.exact)
        if weighed is not None:
            self.settle_weighed(scope, weighed, now)
        if announced is not None or rate is not None:
            at = now if now is not None else datetime.now(timezone.utc)
            if announced is not None:
                self.allow(
                    scope, announced.remaining, announced.until, at, announced.seq, announced.limit,
                    announced.window,
                )
            if rate is not None:
                if rate.probe is None or not self.rate_kinds:
                    self.rate_answer(scope, rate.epoch, rate.until, at)
                else:
                    self.rate_answer(scope, rate.epoch, rate.until, at, rate.probe)
        if token is not None:
            self.release(scope, token)

    def feed(self, changed: Changed) -> Feed | None:
        return None

    @abstractmethod
    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None: ...

    @abstractmethod
    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None: ...

    @abstractmethod
    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None: ...

    @abstractmethod
    def release(self, scope: str, token: str) -> None:
        """Give the slot taken as ``token`` back (nothing if it expired meanwhile)."""

    def settle_many(self, settles: Sequence[tuple[Any, ...]]) -> None:
        """Several settles (each :meth:`settle`'s arguments) in as few operations as the
        store can (this one: one each; SQLite: one transaction; Redis: one pipeline)."""
        for args in settles:
            self.settle(*args)

    @abstractmethod
    def admit(self, ask: Ask) -> Admission: ...


def renamed(module: str, name: str) -> Any:
    """``module``'s attribute ``name`` when it is a name of an older version (with a
    DeprecationWarning: ``FullStore``, 0.11-0.14's name of :class:`PartwiseStore`), else
    the AttributeError a module raises (a module ``__getattr__``'s answer)."""
    if name == "FullStore":
        warnings.warn(
            "retry_after_adapter.cooldown.FullStore is now PartwiseStore (the same class)",
            DeprecationWarning,
            stacklevel=3,
        )
        return PartwiseStore
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    return renamed(__name__, name)
