"""The plan: what every call of one adapter (or pool manager) needs that does not change
per call, worked out once, and the store operations a call makes through it.

A plan holds the store calls talk to (a memory store as it is, any other store behind
its failure layer), the quota's limits as the store takes them, the concurrency cap,
``max_waiting``, and the meters of the store object. Per attempt, a call makes one
store operation for its admission (:meth:`Plan.admit_once`), and one more when its
answer settles a quota permit (:meth:`Plan.answered`); everything else here is the
slow path or news (a cooldown learned, an allowance announced, freshness).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from .. import _forksafe
from ..cooldown.base import (
    Allowances,
    Ask,
    CallBudgets,
    FreshnessLog,
    InProcess,
    Learn,
    LearnedRate,
    Lease,
    LocalCopy,
    PartwiseStore,
    QuotaLogs,
    Reservations,
    Weigh,
    Weighed,
    Weights,
    token_scope,
)
from ..cooldown.weights import token_quota
from ..cost import cost_error
from ..quota import Quota
from .buckets import Dialects
from .meters import Meter, Meters, meters_of
from .state import CallState, Slot

__all__ = ["NO_PLAN", "OPEN_FOR", "Plan"]

# What ``cooldown.base.assembled`` does, inlined on the path every attempt takes.
_new = object.__new__
_set = object.__setattr__

log = logging.getLogger("retry_after_adapter")

#: Seconds an open permit counts beyond ``per + margin`` in the store until its answer
#: settles it (see ``Plan.answered``): a worker stalled longer than that between its
#: grant and its settle (or a store that cannot take the settle for that long) is not
#: covered; a permit whose admission was lost (the store took it, its answer never
#: reached the worker) or whose worker was killed counts that long more. A quota whose
#: ``per + margin`` is at least this long covers such a stall without it: its permits
#: are not taken open. A refusal never waits for it: the store counts an open permit
#: as ending at its grant + per + margin, or when its answer could end it (``free_at``).
OPEN_FOR = 10.0

#: The longest reservation (seconds ahead) a call with neither ``max_wait`` nor a
#: deadline asks for (see :class:`~..cooldown.base.Reservations`).
RESERVE_MOST = 3600.0


def _new_tokens() -> Iterator[str]:
    """Lease tokens unique across processes and hosts: a random prefix per process and
    a counter, cheaper than a UUID per attempt; ``next()`` of it runs no Python frame."""
    return map((secrets.token_hex(8) + "-").__add__, map(str, itertools.count()))


_lease_tokens = _new_tokens()


def _redraw_tokens() -> None:
    """In a forked child: a prefix of its own (the parent's counter would repeat)."""
    global _lease_tokens
    _lease_tokens = _new_tokens()


_forksafe.at_fork(_redraw_tokens)

#: No new slot, no probe: an attempt whose call holds a slot already.
_NO_TOKENS: tuple[Lease | None, Learn | None] = (None, None)


def _carries(store: PartwiseStore | None, capability: type) -> bool:
    return store is not None and capability in store.capabilities


def _opens(store: PartwiseStore | None, quota: Quota | None) -> bool:
    """Whether every permit of ``quota`` is taken open: the store can settle a permit
    exactly (earlier too), and ``per + margin`` alone is shorter than :data:`OPEN_FOR`."""
    return (
        quota is not None
        and quota.window < OPEN_FOR
        and _carries(store, QuotaLogs)
    )


def _cooldown_reader(store: PartwiseStore | None) -> Callable[[str], datetime | None] | None:
    """How a scope's cooldown is read without a store operation: the store's copy in
    this process's memory (a memory store's own table; the failure layer's local copy
    of a shared store), or None: not at all."""
    return store.cooldown_reader() if isinstance(store, LocalCopy) else None


class Plan:
    """What calls of one adapter share (see the module). Immutable once made."""

    __slots__ = (
        "allows",
        "asked",
        "blocking",
        "cooldown_of",
        "dialects",
        "fail_closed",
        "learns",
        "limit",
        "margin",
        "max_waiting",
        "meters",
        "notes",
        "opens",
        "per",
        "per_call",
        "rate_kinds",
        "release_slot",
        "replays",
        "reserves",
        "slots",
        "store",
        "tokens",
        "ttl",
        "weighs",
    )

    def __init__(
        self,
        store: PartwiseStore | None = None,
        *,
        fail_closed: bool = False,
        quota: Quota | None = None,
        slots: int | None = None,
        ttl: float = 60.0,
        max_waiting: int | None = None,
        learn_rate: bool = False,
        tokens: Quota | None = None,
        replays: bool = False,
    ) -> None:
        self.store = store
        #: How a call gets its view of the store (``CallBudgets.for_call``: bounded by
        #: the call's deadline, failing as the adapter says), or None: calls talk to the
        #: store itself (see :meth:`store_for`).
        self.per_call = store.for_call if isinstance(store, CallBudgets) else None
        #: Whether a store operation may block (any store not kept in this process's
        #: memory): an async front end runs it off the event loop.
        self.blocking = store is not None and not isinstance(store, InProcess)
        self.fail_closed = fail_closed
        #: The quota as the store takes it (limit and per None: no quota).
        self.limit = quota.limit if quota is not None else None
        self.per = quota.per if quota is not None else None
        self.margin = quota.margin if quota is not None else 0.0
        #: Whether every quota permit is taken open (see :meth:`answered` and
        #: :func:`_opens`).
        self.opens = _opens(store, quota)
        #: The fields of every attempt's :class:`Ask` that the plan fixes (the quota,
        #: taken open or not), each attempt's own set on a copy (see ``admit_once``).
        opened = OPEN_FOR if self.limit is not None and self.opens else 0.0
        self.asked = vars(Ask(scope="", limit=self.limit, per=self.per, margin=self.margin, opened=opened))
        #: Whether a refused quota permit is reserved for later in the same operation
        #: (``Ask.reserve_by``): a store with Reservations, a quota, no cap and no
        #: ``max_waiting`` (a reservation's sleeper waits without a queue's place).
        self.reserves = (
            self.limit is not None and slots is None and max_waiting is None and _carries(store, Reservations)
        )
        #: The concurrency cap: slots per scope, each a lease of ``ttl`` seconds at most.
        self.slots = slots
        self.ttl = ttl
        self.max_waiting = max_waiting
        self.meters: Meters | None = meters_of(store) if store is not None else None
        #: Whether the store records announced allowances and freshness (a store of
        #: your own may not: it is then not asked).
        self.allows = _carries(store, Allowances)
        self.notes = _carries(store, FreshnessLog)
        #: Whether calls are admitted by the scope's learned rate too (no quota
        #: configured, and a store that learns one).
        self.learns = learn_rate and quota is None and tokens is None and _carries(store, LearnedRate)
        #: Whether the store reads the kind of attempt a throttle refused (``LearnedRate.rate_kinds``).
        self.rate_kinds = self.learns and store is not None and store.rate_kinds
        #: Whether the store weighs a call's declared cost in tokens (``cost=``), and the
        #: token quota it is weighed against besides the server's announced one.
        self.weighs = _carries(store, Weights)
        self.tokens = tokens
        #: How a slot goes back (bound once).
        self.release_slot: Callable[[str, str], None] | None = store.release if store is not None else None
        #: The scope's cooldown as this process knows it, without a store operation (see
        #: :func:`_cooldown_reader`); bound once.
        self.cooldown_of = _cooldown_reader(store)
        #: What providers' dialects taught this adapter: routes refined by their
        #: bucket, secondary-limit streaks (bounded, in memory; see ``buckets``).
        self.dialects = Dialects()
        #: Whether a request the policy does not replay (a POST) is sent again after a
        #: 429 its provider documents as not processed, once the wait that fits has
        #: passed (``replay_unprocessed``; see ``verdict``).
        self.replays = replays

    # -- per call ------------------------------------------------------------------
    def store_for(self, call: CallState) -> PartwiseStore | None:
        """The store as ``call`` talks to it: a view bounded by the call's deadline and
        failing as the adapter says (see :attr:`per_call`), else the store itself."""
        per_call = self.per_call
        if per_call is None:
            return self.store
        end = None if call.terms.deadline is None else call.progress.start + call.terms.deadline
        return per_call(end, call.clock.monotonic, self.fail_closed)

    def meter(self, scope: str | None) -> Meter | None:
        """The scope's meter in this process (None: no store, no scope)."""
        if self.meters is None or scope is None:
            return None
        return self.meters[scope]

    # -- per attempt: one store operation ---------------------------------------------
    def admit_once(self, call: CallState) -> datetime | None:
        """Admit the next attempt now, in one store operation: None when it may go (a
        quota permit, one of the server's announced allowance and a concurrency slot
        taken, as the plan needs), else when to ask again (``call.cooldown`` holds the
        scope's cooldown; ``call.ticket.slot_busy`` says only a slot was missing). May raise
        CooldownUnavailable (a shared store failing closed)."""
        store = call.store
        assert store is not None and call.scope is not None
        # A real clock is read by the store itself as it grants (inside its lock): a
        # permit's time is then its grant's, however long the lock took.
        now = None if call.policy.real_clock else call.clock.now()
        ticket = call.ticket
        # New tokens: a slot's, a probe's (none while one is held).
        lease, learn = self._new_tokens() if ticket.lease_token is None else _NO_TOKENS
        if self.limit is not None:
            ticket.admitted_at = call.clock.monotonic()  # before the grant: its lower bound
            ticket.permit_open = self.opens
        else:
            ticket.permit_open = False
        weigh = self._weigh(call) if call.progress.cost and self.weighs else None
        # The plan's Ask with the attempt's own fields (built whole: see ``assembled``).
        fields = self.asked.copy()
        fields["scope"], fields["now"], fields["lease"], fields["learn"] = call.scope, now, lease, learn
        fields["weigh"] = weigh
        if self.reserves:
            fields["reserve_by"] = self._reserve_by(call)
            if call.progress.priority:
                fields["priority"] = call.progress.priority
            if ticket.held is not None:
                fields["held"], ticket.held = ticket.held, None
        ask = _new(Ask)
        _set(ask, "__dict__", fields)
        answer = store.admit(ask)
        if answer.oversized and weigh is not None:
            limit = f"the server's announced token limit of {answer.oversized}"
            raise cost_error(weigh.cost, call.progress.cost_from, limit)
        # Keep on the call what the answer says.
        call.cooldown = answer.cooldown
        not_before = answer.not_before
        ticket.admission = answer.seq
        ticket.slot_busy = answer.slot_busy
        ticket.rate_held = answer.by_rate
        # Only a configured quota's permit is settled (the learned rate counts sends, no permit).
        ticket.permit = answer.permit if self.limit is not None else None
        ticket.reserved = answer.reserved
        ticket.rate_epoch = answer.rate_epoch
        ticket.rate_report = answer.rate_report
        if weigh is not None:
            ticket.weighed = answer.weighed
            ticket.token_seq = answer.token_seq
        if not_before is None:
            if lease is not None:
                ticket.lease_token = answer.token or lease.token  # a slot this process held, or the new one
            elif answer.token is not None:
                ticket.lease_token = answer.token  # a slot of the learned rate's probes
        return not_before

    def _reserve_by(self, call: CallState) -> datetime | None:
        """The latest time the attempt may be sent at, for a reservation: within
        ``max_wait`` and before the deadline less ``attempt_reserve`` (None: no time
        left to wait)."""
        terms = call.terms
        most = RESERVE_MOST if terms.max_wait is None else terms.max_wait
        if terms.deadline is not None:
            elapsed = call.clock.monotonic() - call.progress.start
            most = min(most, terms.deadline - elapsed - call.policy.attempt_reserve)
        if most <= 0:
            return None
        return call.clock.now() + timedelta(seconds=most)

    def give_back(self, call: CallState) -> None:
        """The attempt's reservation (``ticket.reserved``) will not be used: nothing was
        sent, so its permit is settled exactly as answered ``per`` before now (it ends
        now); one store operation. Never raises (unsent, it costs throughput only)."""
        ticket = call.ticket
        expires, ticket.permit, ticket.reserved = ticket.permit, None, None
        ticket.permit_open = False
        store, scope = call.store, call.scope
        if expires is None or store is None or scope is None or self.per is None or self.limit is None:
            return
        at = call.clock.now() - timedelta(seconds=self.per)
        try:
            store.settle(scope, self.limit, self.per, expires, at, True)
        except Exception as exc:  # it counts until its stored end: throughput, not the quota
            log.debug("giving a reservation back failed: %s", type(exc).__name__)

    def _new_tokens(self) -> tuple[Lease | None, Learn | None]:
        """A concurrency slot to take (with the cap) and the learned rate's probe (when
        it governs), each with a new token (one for both)."""
        if self.slots is None and not self.learns:
            return _NO_TOKENS
        # (each built whole: see ``assembled``)
        token = next(_lease_tokens)
        lease = None
        if self.slots is not None:
            lease = _new(Lease)
            _set(lease, "__dict__", {"slots": self.slots, "ttl": self.ttl, "token": token})
        if not self.learns:
            return lease, None
        learn = _new(Learn)
        _set(learn, "__dict__", {"ttl": self.ttl, "token": token})
        return lease, learn

    def _weigh(self, call: CallState) -> Weigh:
        """What the attempt's declared cost asks of the scope's tokens: the server's
        announced token allowance, and the token quota when one is configured (a cost
        it could never admit is a ConfigurationError)."""
        cost, tokens = call.progress.cost, self.tokens
        if tokens is None:
            return Weigh(cost)
        if cost > tokens.limit:
            raise cost_error(cost, call.progress.cost_from, token_quota(tokens.limit, tokens.per))
        call.ticket.admitted_at = call.clock.monotonic()  # before the grant: its lower bound
        return Weigh(cost, tokens.limit, tokens.per, tokens.margin)

    def answered(
        self, call: CallState, response: Any, on_done: Callable[[Any, Slot], None] | None = None
    ) -> None:
        """The attempt is answered (or failed, ``response`` None): its permit counts
        until at least its answer + per; its slot is given back when the attempt is
        over (``on_done(response, slot)``: its body read or the response closed).

        A permit counts ``per + margin`` from its grant, which covers the arrival only
        when it came within the margin; else the answer moves it to ``answer + per``,
        which covers it only if the move reaches the store before the permit stopped
        counting. Whether it will is not known when the permit is taken: a worker
        descheduled between its grant and its settle, a busy server that counts the
        request when it gets to it, or a busy store that takes the move late can each
        take longer than ``per + margin``, right after answers that all came within the
        margin, and others' permits would be let in while the request still counts at
        the server. So on a store that can settle exactly, every permit of a quota
        whose ``per + margin`` is shorter than :data:`OPEN_FOR` is taken open: it counts
        :data:`OPEN_FOR` seconds longer in the store, and its answer always settles it
        exactly to ``answer + per``, earlier too (one more store operation per
        attempt). Any other permit (a longer window already gives the move that long; a
        store that cannot settle exactly) is moved only when its answer came later than
        the margin."""
        ticket = call.ticket
        if ticket.weighed is not None:
            self._settle_weighed(call)
        if ticket.permit is not None:
            late = call.clock.monotonic() - ticket.admitted_at > self.margin
            if late or ticket.permit_open:
                self._settle(call)  # open, or answered later than the margin: it moves
            else:
                ticket.permit = None  # its stored end already covers the arrival
        token = ticket.lease_token
        if token is not None:
            ticket.lease_token = None
            assert self.release_slot is not None and call.scope is not None
            slot = Slot(self.release_slot, call.scope, token)
            if response is None:
                slot()
            elif self.slots is None:
                # No configured cap: the slot is a learned rate's probe, which counts
                # requests the server has not answered yet, not bodies still read. It
                # goes back once the answer is judged (:meth:`judged`), so that a
                # throttle reaches the store before another probe takes the slot.
                ticket.probe = slot
            else:
                assert on_done is not None  # a response has a way to be done with
                on_done(response, slot)

    def learned_meanwhile(self, call: CallState) -> bool:
        """Right before an admitted attempt goes out: whether this process learned a
        cooldown of the scope since the grant (another thread received a 429 while this
        one was on its way to the wire), read in this process's memory (no store
        operation). Then nothing is sent: the caller gives back what the admission took
        (a ``Settle`` step: its slot; its permit counts), and the call is admitted again."""
        if self.cooldown_of is None or call.scope is None:
            return False
        until = self.cooldown_of(call.scope)
        return until is not None and until > call.clock.now()

    @staticmethod
    def judged(call: CallState) -> None:
        """The attempt's answer was judged (what it taught is learned): a probe's slot
        goes back."""
        ticket = call.ticket
        probe = ticket.probe
        if probe is not None:
            ticket.probe = None
            probe()

    def _settle(self, call: CallState) -> None:
        """The attempt that took a quota permit was answered (or failed): it reached the
        server by now, so the permit must count until ``now + per``: exactly, for an open
        permit; at least, for one answered later than the margin (one more store
        operation)."""
        ticket = call.ticket
        expires, ticket.permit = ticket.permit, None
        exact, ticket.permit_open = ticket.permit_open, False
        store, scope = call.store, call.scope
        assert expires is not None and self.per is not None and self.limit is not None
        assert store is not None and scope is not None
        now = call.clock.now()
        if not exact and (expires - now).total_seconds() >= self.per:
            return  # the stored end already covers the answer
        at = None if call.policy.real_clock else now
        try:
            store.settle(scope, self.limit, self.per, expires, at, exact)
        except Exception as exc:  # the permit still counts until its stored end
            log.debug("settling a quota permit failed: %s", type(exc).__name__)

    def _settle_weighed(self, call: CallState) -> None:
        """The attempt that took a token permit was answered (or failed): answered later
        than the token quota's margin, the permit counts until at least ``now + per``
        (one more store operation), as a quota permit that is not open does."""
        ticket = call.ticket
        expires, ticket.weighed = ticket.weighed, None
        tokens, store, scope = self.tokens, call.store, call.scope
        assert expires is not None and tokens is not None and store is not None and scope is not None
        if call.clock.monotonic() - ticket.admitted_at <= tokens.margin:
            return  # its stored end already covers the arrival
        now = call.clock.now()
        weighed = Weighed(call.progress.cost, tokens.limit, tokens.per, expires)
        at = None if call.policy.real_clock else now
        try:
            store.settle_weighed(scope, weighed, at)
        except Exception as exc:  # the permit still counts until its stored end
            log.debug("settling a token permit failed: %s", type(exc).__name__)

    # -- the slow path and news ---------------------------------------------------
    def read_cooldown(self, call: CallState) -> datetime | None:
        """The scope's stored cooldown (no store: the call's own). May raise
        CooldownUnavailable (a shared store failing closed)."""
        if call.store is None or call.scope is None:
            return call.cooldown
        call.cooldown = call.store.get(call.scope)
        return call.cooldown

    def learn(self, call: CallState, until: datetime) -> None:
        """Advance the scope's shared cooldown to ``until`` (later wins); never raises
        for a store that fails (the failure layer keeps it)."""
        if call.store is None or call.scope is None:
            call.cooldown = until if call.cooldown is None or until > call.cooldown else call.cooldown
            return
        call.cooldown = call.store.extend(call.scope, until)

    def rate_answer(self, call: CallState, until: datetime | None) -> None:
        """Tell the scope's learned rate how the attempt was answered: well (``until``
        None; only a probe's answer, ``Ticket.rate_report``) or throttled until ``until``
        (at or before now: no usable wait, the rate backs off). Never raises (the rate
        is news)."""
        ticket = call.ticket
        if until is None and not ticket.rate_report:
            return
        if not self.learns or call.store is None or call.scope is None:
            return
        # A throttle says which kind of attempt it refused (a probe reports its answers)
        # to a store that reads it: with several threads a probe may overtake a known send.
        told = until is not None and ticket.rate_epoch is not None and self.rate_kinds
        kind = (ticket.rate_report,) if told else ()
        ticket.rate_report = False  # once per attempt
        try:
            now = call.clock.now()
            call.store.rate_answer(call.scope, ticket.rate_epoch, until, now, *kind)
        except Exception as exc:
            log.debug("telling the learned rate failed: %s", type(exc).__name__)

    def allow(self, call: CallState, *args: Any) -> None:
        """Record the server's announced allowance (``Store.allow``'s arguments after
        the scope)."""
        if self.allows and call.store is not None and call.scope is not None:
            call.store.allow(call.scope, *args)

    def allow_tokens(
        self, call: CallState, remaining: int, until: datetime, now: datetime, limit: int | None
    ) -> None:
        """Record the server's announced token allowance (kept as the allowance of the
        scope's ``token_scope``: what every worker's declared costs are weighed against),
        as of the attempt's cost counted (``Ticket.token_seq``; None: as of now)."""
        if self.weighs and call.store is not None and call.scope is not None:
            tokens, seq = token_scope(call.scope), call.ticket.token_seq
            call.store.allow(tokens, remaining, until, now, seq, limit)

    def note(self, call: CallState, outcome: str) -> None:
        """Note an attempt's outcome in the scope's freshness record; never raises
        (freshness is news, never a reason to fail a call)."""
        if not self.notes or call.store is None or call.scope is None:
            return
        try:
            call.store.note(call.scope, outcome, call.clock.now())
        except Exception as exc:
            log.debug("noting freshness failed: %s", type(exc).__name__)


#: The plan of a call made without a store (a policy used alone).
NO_PLAN = Plan()
