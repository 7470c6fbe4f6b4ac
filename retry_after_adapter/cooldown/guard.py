"""The store failure layer: a :class:`~.base.Store` that wraps a shared store, one per
store object in a process, shared by every adapter, session and pool manager on it.

:class:`StoreGuard` gives every process one answer to "what if the store fails?":

- **One local copy.** Every cooldown read from or written to the store is mirrored in
  memory. While the store answers, it is authoritative (an operator's ``clear`` lifts
  a cooldown for everyone); while it fails, the local copy answers (fail open), and a
  cooldown learned then is kept, later-wins, never shortened.
- **Write-back** of what the store did not take (see ``_writeback``).
- **Bounded operations, a circuit breaker, one warning per outage** (see ``_health``).
- **Busy is not down.** A store that is up but busy, or a call out of time, answers an
  admission "ask again shortly": nothing is ever admitted locally while the store is up.

Whether a call goes on (``store_failure="open"``) or defers with ``cooldown-unknown``
(``"closed"``) while the store fails is each adapter's own choice, handed to each
operation in the call's :class:`StoreBudget`; the guard is shared.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from .. import _forksafe
from ..errors import ConfigurationError, CooldownStoreError, CooldownUnavailable
from ._coalesce import Coalescer, may_wait
from ._health import (
    BREAKER_FIRST,
    BREAKER_MAX,
    BREAKER_MAX_PENDING,
    BUSY_RUN,
    QUIET_PERIOD,
    SETTLE,
    STORE_TIMEOUT,
    Breaker,
    OutOfTime,
    StoreBudget,
    declared_bound,
)
from ._near import OPEN_LIFE, REFILL_WAIT, Near
from ._writeback import MAX_CHORES, RELEASE_KEPT, WRITER_POLL, WriteBack
from .base import (
    FAILURE_LAYERS,
    Admission,
    Ask,
    CallBudgets,
    Changed,
    Feed,
    Forgetful,
    Hold,
    InProcess,
    LeaseRenewal,
    LocalCopy,
    PartwiseStore,
    Replaceable,
    Weighed,
    check_scope,
)
from .completed import as_store, bare
from .freshness import Freshness
from .memory import MemoryCooldownStore
from .rate import Rate

__all__ = [
    "BREAKER_FIRST",
    "BREAKER_MAX",
    "BREAKER_MAX_PENDING",
    "BUSY_RUN",
    "DEFAULT",
    "MAX_CHORES",
    "QUIET_PERIOD",
    "RELEASE_KEPT",
    "SETTLE",
    "STORE_TIMEOUT",
    "WRITER_POLL",
    "StoreBudget",
    "StoreGuard",
    "check_store_failure",
    "guard_of",
    "shared",
]

_T = TypeVar("_T")

#: "Not given": an adapter or pool manager without ``cooldown=`` uses the process-wide
#: default store.
DEFAULT: Any = type("_Default", (), {"__repr__": lambda self: "DEFAULT"})()

#: A quota permit the store could not answer for (busy, or the call's time ran out) is
#: "not yet": asked again after this long, never granted locally while the store is up.
_PERMIT_RETRY = timedelta(milliseconds=20)

#: Seconds a call must have left for a quota's refusal to write the scope's waiting
#: settles and ask the store again (see ``StoreGuard.admit``).
REASK_LEFT = 0.1

log = logging.getLogger("retry_after_adapter")


def check_store_failure(value: object) -> str:
    """Validate a ``store_failure`` argument: ``"open"`` or ``"closed"``."""
    if value not in ("open", "closed"):
        raise ConfigurationError("store_failure must be 'open' or 'closed'")
    return str(value)


def _no_store_holds(scope: str, exc: Exception) -> None:
    """A store refused an operation's values: if it is the scope, that no store can hold
    (``check_scope``), the caller's ConfigurationError is raised, naming it; neither a
    store failure skipped nor an admission asked again (a false deferral)."""
    if isinstance(exc, (ValueError, TypeError)):
        check_scope(scope)


#: The values a store reads and makes, by the names Python's errors give them.
_VALUES = re.compile(r"\b(Ask|Admission|Answer|Lease|Learn)\b")


def _values_misread(store: PartwiseStore, exc: Exception) -> None:
    """A store of one's own read or made one of the values the old way (by position,
    as a tuple: what 0.14 allowed): a ConfigurationError that says so, rather than a
    store failure every attempt meets (each deferred, nothing said)."""
    if isinstance(exc, (TypeError, AttributeError)) and _VALUES.search(str(exc)):
        raise ConfigurationError(
            f"{type(bare(store)).__name__}.admit failed: {type(exc).__name__}: {exc}; since 0.15 Ask, "
            "Admission, Answer, Lease and Learn are frozen keyword-only dataclasses: read them by name "
            "and build them by keyword (see 'The values' in docs/stores.md)"
        ) from exc


def _local_answer_allowed(budget: StoreBudget | None) -> None:
    """The store is down: the local copy may answer, unless the call fails closed
    (then CooldownUnavailable)."""
    if budget is not None and budget.fail_closed:
        raise CooldownUnavailable("the shared cooldown store is unavailable")


class StoreGuard(PartwiseStore, LocalCopy, CallBudgets):
    """The failure layer of one store object in this process (see the module).

    Each operation takes the calling call's :class:`StoreBudget` (``budget=``; None:
    no deadline, fail open); a call talks to it through :meth:`for_call`, a view with
    the store's own interface and the call's budget bound."""

    def __init__(self, inner: PartwiseStore, owner: object = None) -> None:
        self.inner = inner
        #: The store object this guard was made for (``inner`` completes it if it lacks
        #: capabilities; a weak proxy of it when the guard is the process-wide one, see
        #: :func:`guard_of`).
        self.owner: object = inner if owner is None else owner
        self.name = self.owner.__class__.__name__  # (a proxy's class is its store's)
        #: The local copy: what the store said, and what was learned while it failed.
        self.local = MemoryCooldownStore()
        #: The store's breaker (on the guard's own monotonic clock, seconds) and the
        #: write-back of what the store did not take.
        store = bare(inner)
        self.breaker = Breaker(self.name, declared_bound(store), time.monotonic)
        replaceable = store if isinstance(store, Replaceable) else None
        self.writeback = WriteBack(inner, self.local, self.breaker, replaceable)
        #: Settles waiting to be written together (see ``_coalesce``), and how many
        #: open permits of batches were given back unspent.
        self.settles = Coalescer(self.writeback)
        self.given_back = 0
        #: The near copy, when the store has a change feed (see ``_near``).
        self.near: Near | None = None
        near = Near(self._release_now, self.local.get)
        feed = inner.feed(near.cooldowns.changed)
        if feed is not None:
            near.cooldowns.feed = feed
            near.permits.give_back_permits = self._give_back_permits
            if LeaseRenewal in inner.capabilities:
                near.slots.renew = self._renew_leases
                near.permits.renew_open = self._renew_open
            self.near = near
        _forksafe.register(self)

    def _give_back_permits(self, key: tuple[str, int, float, float], end: datetime, count: int) -> None:
        """``count`` open permits of a batch (``key``: its scope, limit, per and margin),
        stored to end at ``end``, lapsed unspent: each settled to end now (never sent:
        they need not count at all), with the other settles."""
        scope, limit, per, _ = key
        self.given_back += count
        never = datetime.now(timezone.utc) - timedelta(seconds=per)  # settled to never + per: now
        near = self.near
        if near is not None and near.permits.renew_open is not None:
            with near.permits.open_lock:  # renewed meanwhile: where the store has them now
                end = near.permits.settling((scope, limit, per, end), count)
        self.settles.add_many([(scope, limit, per, end, never, True)] * count, per)

    def _renew_leases(self, leases: list[tuple[str, str, datetime]], exact: bool = False) -> set[str]:
        """Renew the near copy's held slots in the store (see ``_near.LIFE``; ``exact``:
        to end as given, earlier too), bounded as any operation: the tokens it no
        longer holds. Not while the store is down (the breaker's probes find its
        recovery; tried again at the next pass; a slot to keep is given back instead)."""
        if self.breaker.is_down:
            raise CooldownStoreError("the store is down: renewals wait for its recovery")
        return self.breaker.bounded(self.inner.renew, (leases, None, exact), None)  # type: ignore[attr-defined]

    def _renew_open(self, permits: list[tuple[str, int, float, datetime, datetime, int]]) -> list[int]:
        """Renew the near copy's open permits in the store (see ``_near.OPEN_LIFE``),
        bounded as any operation: how many moved, each. Not while the store is down."""
        if self.breaker.is_down:
            raise CooldownStoreError("the store is down: renewals wait for its recovery")
        return self.breaker.bounded(self.inner.renew_open, (permits,), None)  # type: ignore[attr-defined]

    @property
    def capabilities(self) -> frozenset[type]:
        return self.inner.capabilities

    def for_call(
        self, deadline: float | None, monotonic: Callable[[], float], fail_closed: bool
    ) -> PartwiseStore:
        return GuardedCall(self, deadline, monotonic, fail_closed)

    def cooldown_reader(self) -> Callable[[str], datetime | None]:
        """The local copy's ``get``: what this process read from the store or learned."""
        return self.local.get

    # -- what the breaker and the write-back report ------------------------------------
    @property
    def down(self) -> bool:
        """Whether the store's last operation failed (its breaker is open)."""
        return self.breaker.is_down

    @property
    def pending(self) -> int:
        """How many cooldowns learned during an outage wait to be written back."""
        return self.writeback.pending

    @property
    def outages(self) -> int:
        return self.breaker.outages

    @property
    def failures(self) -> int:
        return self.breaker.failures

    @property
    def busy(self) -> int:
        return self.breaker.busy

    # -- the cooldown ----------------------------------------------------------------
    def get(self, scope: str, budget: StoreBudget | None = None) -> datetime | None:
        """The scope's eligible time: the store's answer (plus a pending local one), or
        while the store fails the local copy (fail open) or CooldownUnavailable."""
        if self.breaker.skipped(budget):
            return self._fallback(scope, budget)
        epoch = self.writeback.epoch
        try:
            remote = self.breaker.bounded(self.inner.get, (scope,), budget)
        except OutOfTime:
            self.breaker.gave_up(budget)
            return self.local.get(scope)
        except Exception as exc:
            _no_store_holds(scope, exc)
            self.breaker.failed(exc, budget)
            return self._fallback(scope, budget)
        return self._reconcile(scope, remote, epoch, self.writeback.succeeded(), budget)

    def _reconcile(
        self, scope: str, remote: datetime | None, epoch: int, wrote: bool, budget: StoreBudget | None = None
    ) -> datetime | None:
        """The scope's eligible time after the store answered ``remote`` (read at
        ``epoch``; ``wrote``: a write-back ran): the store's answer, mirrored into the
        local copy; or, when the answer may predate a write (a write-back, a write since
        ``epoch``, the scope's time still pending) or the store lost what it held (see
        :meth:`_lost`), the later of it and the local one."""
        if not wrote and self._lost(scope, remote, epoch, budget):
            wrote = True  # every cooldown this process holds waits to be written back
        if not wrote and self.writeback.mirror(scope, remote, epoch):
            return remote
        local = self.local.get(scope)
        if remote is None or (local is not None and local >= remote):
            return local
        # The near copy answers with the local copy: it is raised to what the store
        # holds (later wins), which covers whatever waited to be written.
        self.local.extend(scope, remote)
        self.writeback.confirmed(scope, remote)
        return remote

    def _lost(self, scope: str, remote: datetime | None, epoch: int, budget: StoreBudget | None) -> bool:
        """Whether the store's answer ``remote`` for ``scope`` (read at ``epoch``, and no
        write since: else it may predate one) is earlier than a cooldown this process
        holds, still running, that the store held (not pending), on a store
        that can lose what it holds without an error (``base.Forgetful``), and was not
        lifted by an operator: a restart nobody noticed. Then it is treated as a failure
        the process noticed: every cooldown and allowance it holds is written back (see
        ``WriteBack.lost``). Costs a store operation only when the answer is earlier."""
        inner = self.inner
        if not isinstance(inner, Forgetful) or epoch != self.writeback.epoch or self.writeback.waits(scope):
            return False
        local = self.local.get(scope)
        if local is None or (remote is not None and remote >= local) or local <= datetime.now(timezone.utc):
            return False
        try:
            lifted = self.breaker.bounded(inner.lifted, (scope,), budget)
        except OutOfTime:
            self.breaker.gave_up(budget)
            return True  # not known: the local copy is not lowered this time
        except Exception as exc:
            self.breaker.failed(exc, budget)  # a failure noticed: what is held waits
            return True
        if lifted:
            return False
        self.writeback.lost()
        return True

    def extend(self, scope: str, until: datetime, budget: StoreBudget | None = None) -> datetime:
        """Advance the scope's eligible time (later wins) in the store and the local
        copy; while the store fails, keep it locally and write it back on recovery."""
        # Kept locally and pending until the store confirms it, in one step: a read
        # that raced this write must not mirror the store's older answer over it.
        local = self.writeback.keep(scope, until)
        if self.near is not None:
            # Held back near from now on (the local copy), whatever the store does.
            self.near.cooldowns.learned(scope)
        if self.breaker.skipped(budget):
            self.writeback.start_writer()
            return local
        try:
            # A pending local time is written along: it is at least as late.
            remote = self.breaker.bounded(self.inner.extend, (scope, local), budget)
        except OutOfTime:
            self.breaker.gave_up(budget)  # still pending: the writer or the next operation writes it
            self.writeback.start_writer()
            return local
        except Exception as exc:
            _no_store_holds(scope, exc)
            self.breaker.failed(exc, budget)
            self.writeback.start_writer()
            return local
        self.writeback.succeeded()
        self.writeback.confirmed(scope, max(local, remote))
        if remote > local:
            self.local.extend(scope, remote)  # later wins: a later write may be in already
        effective = max(local, remote)
        if self.near is not None and remote > local:
            self.near.cooldowns.learned(scope)
        return effective

    # -- admission -------------------------------------------------------------------
    def admit(self, ask: Ask, budget: StoreBudget | None = None) -> Admission:
        """Admission for one attempt: from the near copy when it can answer (nothing
        changed, a permit of its batch, a slot it holds: see ``_near``), else in one
        store operation for what is still missing: the cooldown (mirrored as
        :meth:`get` does), the allowance, the quota permit and the slot. While the store
        is down, the local copy admits (fail open; its admission numbers are not the
        store's, so none is returned) or CooldownUnavailable; busy or out of time, see
        :meth:`_later`. (``batch`` and ``hold`` are the near copy's to choose.) The
        learned rate (``learn``) is the store's: while it is down, none applies.
        ``opened`` > 0: the quota permit is an open one (see ``Plan.answered``): taken
        by itself from the store, never from or for a batch, counting ``opened`` seconds
        longer there until its answer settles it exactly. (Taken from the local copy
        while the store is down, it counts ``per + margin``, as any local permit.)

        Every grant is checked against the local copy last: a cooldown this process
        learned while the grant was in flight (a slow store, a busy near copy) holds the
        attempt back, whatever the store said (the slot taken goes back; a permit
        counts). A quota's refusal while settles of the scope wait here to be written
        (``_coalesce``) writes them and asks once more: the store then knows the permits
        this process saw answered, and tells when the earliest frees."""
        answer = self._admit(ask, budget)
        if answer.not_before is not None:
            if ask.limit is None or not self.settles.holds(ask.scope) or not self._time_to_ask_again(budget):
                return answer
            # Refused while settles of the scope wait here: the store counted their
            # answered permits as open, ending ``per`` from now at the earliest
            # (``base.free_at``), so its eligible time is late by up to the whole spread
            # of the permits the settles end. Written now, the store is asked again.
            self.settles.flush(budget=budget)
            answer = self._admit(ask, budget)
            if answer.not_before is not None:
                return answer
        local = self.local.get(ask.scope)
        if local is None or local <= (ask.now if ask.now is not None else datetime.now(timezone.utc)):
            return answer
        self._undo(ask, answer)
        return Admission(cooldown=local, not_before=local)

    def _time_to_ask_again(self, budget: StoreBudget | None) -> bool:
        """Whether the call has time for a refusal's settles to be written and the store
        asked again: :data:`REASK_LEFT` left at least (both are bounded by what the call
        has left; a settle write cut short is not tried again, its permit counting
        longer, so it is not started with less)."""
        left = budget.left() if budget is not None else None
        return left is None or left >= REASK_LEFT

    def _undo(self, ask: Ask, answer: Admission) -> None:
        """A grant the local copy holds back after all (nothing will be sent): the slot
        goes back, and the permit is settled to count from ``ask.now`` (an open one would
        count ``opened`` seconds longer for nothing)."""
        scope, lease, limit, per = ask.scope, ask.lease, ask.limit, ask.per
        token = answer.token or (lease.token if lease is not None else None)
        if token is not None:
            self.release(scope, token)
        if answer.permit is not None and limit is not None and per is not None:
            try:
                self.settle(scope, limit, per, answer.permit, ask.now, exact=ask.opened > 0)
            except Exception as exc:  # it still counts until its stored end
                log.debug("settling a permit held back failed: %s", type(exc).__name__)

    def _admit(self, ask: Ask, budget: StoreBudget | None) -> Admission:
        """:meth:`admit` but for its last check."""
        scope, now, limit, per, margin = ask.scope, ask.now, ask.limit, ask.per, ask.margin
        lease, learn, weigh = ask.lease, ask.learn, ask.weigh
        present = now if now is not None else datetime.now(timezone.utc)
        if self.breaker.skipped(budget):
            return self._local_admit(ask, budget)
        near = self.near
        # An attempt that weighs tokens is admitted by the store itself (a batch holds
        # permits and admissions, not tokens), as is a reservation's holder asking again
        # (the permit it holds is given back in the same operation).
        if near is None or self.breaker.is_down or weigh is not None or ask.held is not None:
            return self._admit_store(ask, budget, present)
        if learn is not None and lease is not None and not near.cooldowns.unrated(scope):
            # The learned rate may cap the slot too: the store takes it (a slot held here
            # would pass the cold cap by, and its answers would teach the rate nothing).
            answer, _, _ = near.admit(scope, present, limit, per, margin, None)
            if answer is not None and answer.not_before is not None:
                return answer
            return self._admit_store(ask, budget, present)
        return self._admit_near(ask, budget, present, near)

    def _admit_near(self, ask: Ask, budget: StoreBudget | None, present: datetime, near: Near) -> Admission:
        """Admission by the near copy when it can answer alone; else what it did not
        give (a permit, a slot) is asked of the store, with a batch for later."""
        scope, limit, per, lease, margin = ask.scope, ask.limit, ask.per, ask.lease, ask.margin
        left = budget.left() if budget is not None else None
        wait = REFILL_WAIT if left is None else max(0.0, min(REFILL_WAIT, left))
        answer, permit, token = near.admit(scope, present, limit, per, margin, lease, wait)
        if answer is not None:
            return answer
        rest = None if permit is not None else limit
        rest_lease = None if token is not None or lease is None else near.slots.lease_for(lease)
        opened = ask.opened > 0 and rest is not None
        batch, hold = near.permits.batch(scope, rest, per, margin, claim=True, opened=opened)
        epoch = near.cooldowns.epoch
        missing = replace(ask, limit=rest, lease=rest_lease, batch=batch, hold=hold)
        # A batch's open permits (held near, for reuse) count OPEN_LIFE past per + margin,
        # renewed while unanswered; a permit taken alone, for its attempt, its full time.
        renewed = opened and batch > 1 and near.permits.renew_open is not None and ask.opened > OPEN_LIFE
        if renewed:
            missing = replace(missing, opened=OPEN_LIFE)
        granted = False
        try:
            answer = self._admit_store(missing, budget, present)
            if answer.not_before is None:
                # Before another thread spends one. Not a reservation's: its holder's
                # confirmation moves its permit (a renewal moving it first would orphan
                # it, open and unanswered: counted by every holder for seconds).
                if renewed and answer.permit is not None and answer.reserved is None:
                    self._opened(near, scope, rest, per, margin, answer, hold, ask.opened)
                ttl = lease.ttl if lease is not None else None
                near.took(scope, present, answer, epoch, rest, per, margin, hold, rest_lease, opened, ttl)
                granted = True  # took() ended the claim and woke the threads waiting for it
        finally:
            if batch > 1 and not granted:  # refused or failed: they go on (see PermitBatches.spend)
                near.permits.refilled(scope, rest, per, margin)
        if answer.not_before is not None:
            near.put_back(scope, limit, per, margin, permit, token)
            return answer
        if opened and answer.extra > 0 and answer.permit is not None:
            # Open permits of the batch not spent within ``hold`` are given back then.
            assert rest is not None and per is not None
            key, batch_end = (scope, rest, per, margin), answer.permit + timedelta(seconds=hold)
            lapse = functools.partial(near.permits.lapse_due, key, batch_end)
            self.settles.check_at(time.monotonic() + hold, lapse)
        if permit is None and token is None:
            return answer
        end = permit if permit is not None else answer.permit
        return Admission(cooldown=answer.cooldown, not_before=None, seq=answer.seq, permit=end, token=token)

    @staticmethod
    def _opened(
        near: Near, scope: str, limit: int | None, per: float | None, margin: float, answer: Admission,
        hold: float, opened: float,
    ) -> None:
        """The near copy renews the open permits ``answer`` granted (its own, and its
        batch's extra ones, ending ``hold`` later), up to ``opened`` seconds past per +
        margin in all, as an open permit taken for that long counts."""
        assert limit is not None and per is not None and answer.permit is not None
        most = opened - OPEN_LIFE
        near.permits.opened((scope, limit, per, answer.permit), 1, per + margin, most)
        extras = (scope, limit, per, answer.permit + timedelta(seconds=hold))
        near.permits.opened(extras, answer.extra, per + margin, most)

    def _admit_store(self, ask: Ask, budget: StoreBudget | None, present: datetime) -> Admission:
        """Admission of ``ask`` in one store operation (see :meth:`admit`)."""
        scope, lease, learn = ask.scope, ask.lease, ask.learn
        epoch = self.writeback.epoch
        held = lease.token if lease is not None else learn.token if learn is not None else None
        abandoned = None if held is None else self._abandoned(scope, held)
        try:
            answer = self.breaker.bounded(self.inner.admit, (ask,), budget, abandoned)
        except OutOfTime:
            self.breaker.gave_up(budget)
            return self._later(ask, present)
        except Exception as exc:
            _no_store_holds(scope, exc)
            _values_misread(self.inner, exc)
            self.breaker.failed(exc, budget)
            if self.breaker.is_down:
                return self._local_admit(ask, budget)
            return self._later(ask, present)
        cooldown = self._reconcile(scope, answer.cooldown, epoch, self.writeback.succeeded(), budget)
        if cooldown is None or cooldown == answer.cooldown:
            return answer
        return self._held_locally(ask, answer, cooldown, present)

    def _held_locally(self, ask: Ask, answer: Admission, cooldown: datetime, present: datetime) -> Admission:
        """The store's answer when a later local time (not yet written back) holds the
        attempt back: what the store granted goes back at once (see :meth:`_undo`)."""
        if cooldown > present:  # held back here: by the later local time, nothing else
            if answer.not_before is None:
                self._undo(replace(ask, now=present), answer)
            return Admission(cooldown=cooldown, not_before=cooldown, seq=answer.seq)
        # The local time has passed: the store's answer stands, with every part it
        # granted (a slot's token, the learned rate's epoch and report, the allowance's
        # units), only its cooldown the later local one.
        return replace(answer, cooldown=cooldown)

    def _abandoned(self, scope: str, token: str) -> Callable[[Admission], None]:
        """What to do with an admission the call stopped waiting for, should it come:
        a slot it granted that nobody uses is given back."""

        def abandoned(answer: Admission) -> None:
            if answer.not_before is None:
                self.release(scope, token)

        return abandoned

    def _later(self, ask: Ask, present: datetime) -> Admission:
        """"Ask again shortly": the store is up but did not answer in time (busy, or the
        call's time ran out). Nothing is admitted locally while the store is up; an
        admission that asked for a slot alone is told that a slot is missing."""
        scope, limit, lease = ask.scope, ask.limit, ask.lease
        slot_only = limit is None and lease is not None
        return Admission(
            cooldown=self.local.get(scope), not_before=present + _PERMIT_RETRY, slot_busy=slot_only
        )

    def _local_admit(self, ask: Ask, budget: StoreBudget | None) -> Admission:
        """The store is down: the local copy admits (fail open; its admission numbers are
        not the store's; no batch, no learned rate, no open permit; tokens weighed by
        what it knows) or CooldownUnavailable (fail closed)."""
        _local_answer_allowed(budget)
        local = Ask(
            scope=ask.scope, now=ask.now, limit=ask.limit, per=ask.per, margin=ask.margin, lease=ask.lease,
            weigh=ask.weigh,
        )
        answer = self.local.admit(local)
        if answer.oversized:
            return answer  # a cost the announced limit never admits: the engine's error
        # The grant's numbers dropped (not the store's): its cooldown, its refusal, its tokens kept.
        return Admission(
            cooldown=answer.cooldown, not_before=answer.not_before, slot_busy=answer.slot_busy,
            weighed=answer.weighed,
        )

    def release(self, scope: str, token: str) -> None:
        """Give a slot back, in the store and locally. A store that is busy or down
        gets it later from the writer thread, so a slot is never lost to a moment of
        contention. A slot the near copy took is kept by it for a moment (the next
        attempt of the scope may use it) and given back from there."""
        self.local.release(scope, token)
        near = self.near
        if near is not None and near.slots.park(scope, token):
            return
        self._release_now(scope, token)

    def _release_now(self, scope: str, token: str) -> None:
        if not self.breaker.open_until:
            try:
                self.breaker.bounded(self.inner.release, (scope, token), None)
                return
            except Exception as exc:
                log.debug("releasing a concurrency slot failed: %s", type(exc).__name__)
        self.writeback.give_back_later(scope, token)

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False, budget: StoreBudget | None = None,
    ) -> None:
        """Move a permit's end later in the store (see ``MemoryCooldownStore.settle``),
        within what the call has left; a failure is counted against the store but never
        the call's."""
        near = self.near
        if exact and near is not None and near.permits.renew_open is not None:
            with near.permits.open_lock:  # renewed meanwhile: where the store has it now
                expires = near.permits.settling((scope, limit, per, expires))
        # The answer's time, pinned: tried again later, it must not move further.
        at = now if now is not None else datetime.now(timezone.utc)
        args: tuple[Any, ...] = (scope, limit, per, expires, at)
        if exact:
            args += (True,)
        if now is None and may_wait(expires, at, per, exact):
            # On the real clock (an injected one writes at once): written with others,
            # within a share of per.
            self.settles.add(args, per)
            return
        if not self.writeback.write_through(self.inner.settle, args, budget) and not exact:
            # Busy or down: until its stored end passes, the writer thread tries again
            # (a permit that ends too soon could let one request too many through). An
            # exact settle is not (see ``_coalesce.Coalescer.flush``): lost, its open
            # permit counts longer.
            self.writeback.add_chore("settle", args, expires)

    def settle_weighed(
        self, scope: str, weighed: Weighed, now: datetime | None = None, budget: StoreBudget | None = None
    ) -> None:
        """Move a token permit's end later in the store (see ``Weights.settle_weighed``),
        within what the call has left, as :meth:`settle` does a quota permit's."""
        at = now if now is not None else datetime.now(timezone.utc)
        args = (scope, weighed, at)
        if not self.writeback.write_through(self.inner.settle_weighed, args, budget):
            # Busy or down: until its stored end passes, the writer thread tries again
            # (a permit that ends too soon could let tokens too many through).
            self.writeback.add_chore("settle_weighed", args, weighed.expires)

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None, budget: StoreBudget | None = None,
    ) -> None:
        """Record the server's announced allowance locally and in the store (a failure
        leaves it local: it ends by itself at the reset). The local copy counts its
        own admissions (during an outage), so it is given no admission number."""
        self.local.allow(scope, remaining, until, now, None, limit, window)
        args = (scope, remaining, until, now, seq, limit, window)
        self.writeback.write_through(self.inner.allow, args, budget)

    # -- the learned rate --------------------------------------------------------------
    @property
    def rate_kinds(self) -> bool:  # type: ignore[override]
        """What the store it guards declares (see ``LearnedRate.rate_kinds``)."""
        return self.inner.rate_kinds

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None,
        budget: StoreBudget | None = None,
    ) -> None:
        """Tell the store's learned rate of an answer (``probe``: only to a store that
        reads it); a failure is ignored (the rate is learned again from the next answers)."""
        args: tuple[Any, ...] = (scope, epoch, until, now)
        if probe is not None and self.rate_kinds:
            args += (probe,)
        self.writeback.write_through(self.inner.rate_answer, args, budget)

    def rate_of(self, scope: str) -> Rate | None:
        """The scope's learned rate from the store (None: none, or the store fails)."""
        return self._read(self.inner.rate_of, (scope,), lambda scope: None)

    # -- freshness -------------------------------------------------------------------
    def note(self, scope: str, outcome: str, at: datetime, budget: StoreBudget | None = None) -> None:
        """Note a success or an error class locally and in the store; a failure is
        ignored (freshness is news, never a reason to fail a call)."""
        self.local.note(scope, outcome, at)
        self.writeback.write_through(self.inner.note, (scope, outcome, at), budget)

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness from the store; while it fails, this process's copy."""
        return self._read(self.inner.freshness, (scope,), self.local.freshness)

    def freshness_entries(self) -> dict[str, Freshness]:
        return self._read(self.inner.freshness_entries, (), self.local.freshness_entries)

    def _read(self, operation: Callable[..., _T], args: tuple[Any, ...], local: Callable[..., _T]) -> _T:
        """A read for an operator or a report: the store's answer, else the local one."""
        if not self.breaker.open_until:
            try:
                answer = self.breaker.bounded(operation, args, None)
            except Exception as exc:
                self.breaker.failed(exc, None)
            else:
                self.writeback.succeeded()
                return answer
        return local(*args)

    # -- the operator's view: the store's own answers -----------------------------------
    def entries(self) -> dict[str, datetime]:
        return self.inner.entries()

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        return self.inner.holds(now)

    def delete(self, scope: str) -> bool:
        self.local.delete(scope)
        if self.near is not None:
            self.near.cooldowns.changed(scope)
        return self.inner.delete(scope)

    def quiesce(self) -> None:
        """The settles written, the writer threads stopped (see ``base.quiesce_guard``)."""
        self.settles.close()
        self.writeback.close()

    def close(self) -> None:
        self.quiesce()
        near = self.near
        if near is not None:
            near.slots.release_all()
            if near.cooldowns.feed is not None:
                near.cooldowns.feed.close()
        self.inner.close()

    # -- internals -------------------------------------------------------------------
    def _fallback(self, scope: str, budget: StoreBudget | None) -> datetime | None:
        _local_answer_allowed(budget)
        return self.local.get(scope)

    def _after_fork(self) -> None:
        if self.near is not None:
            self.near.after_fork()
        self.writeback.after_fork()
        self.breaker.after_fork()

    def __reduce__(self) -> tuple[Any, ...]:
        # A guard belongs to one process: a pickled or copied store gets its own.
        return (_no_guard, ())

    def __repr__(self) -> str:
        state = "down" if self.breaker.is_down else "healthy"
        return f"StoreGuard({self.owner.__repr__()}, {state}, pending={self.writeback.pending})"


def _no_guard() -> None:
    return None


class GuardedCall(StoreBudget, PartwiseStore):
    """The failure layer as one call sees it (:meth:`StoreGuard.for_call`): the store's
    interface, each operation given the call's budget, which this view is (one object
    per call: its deadline, its failure policy, whether an operation of it failed).
    It owns nothing: closing it closes nothing, and it has no feed."""

    __slots__ = ("guard",)

    def __init__(
        self, guard: StoreGuard, deadline: float | None, monotonic: Callable[[], float], fail_closed: bool
    ) -> None:
        StoreBudget.__init__(self, deadline, monotonic, fail_closed)
        self.guard = guard

    @property
    def capabilities(self) -> frozenset[type]:
        return self.guard.capabilities

    @property
    def rate_kinds(self) -> bool:  # type: ignore[override]
        return self.guard.rate_kinds

    def admit(self, ask: Ask) -> Admission:
        return self.guard.admit(ask, self)

    def get(self, scope: str) -> datetime | None:
        return self.guard.get(scope, self)

    def extend(self, scope: str, until: datetime) -> datetime:
        return self.guard.extend(scope, until, self)

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        self.guard.settle(scope, limit, per, expires, now, exact, self)

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        self.guard.settle_weighed(scope, weighed, now, self)

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        self.guard.allow(scope, remaining, until, now, seq, limit, window, self)

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        self.guard.rate_answer(scope, epoch, until, now, probe, self)

    def rate_of(self, scope: str) -> Rate | None:
        return self.guard.rate_of(scope)

    def release(self, scope: str, token: str) -> None:
        self.guard.release(scope, token)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        self.guard.note(scope, outcome, at, self)

    def freshness(self, scope: str) -> Freshness | None:
        return self.guard.freshness(scope)

    def freshness_entries(self) -> dict[str, Freshness]:
        return self.guard.freshness_entries()

    def entries(self) -> dict[str, datetime]:
        return self.guard.entries()

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        return self.guard.holds(now)

    def delete(self, scope: str) -> bool:
        return self.guard.delete(scope)

    def feed(self, changed: Changed) -> Feed | None:
        return None

    def __repr__(self) -> str:
        return f"GuardedCall({self.guard!r})"


# ------------------------------------------------------------------ one guard per store
_REGISTRY_LOCK = threading.Lock()


def _new_module_locks() -> None:
    """In a forked child: a parent thread may have held this one."""
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()


_forksafe.at_fork(_new_module_locks)


def guard_of(store: object) -> StoreGuard:
    """The process-wide :class:`StoreGuard` of ``store`` (made on first use), found by
    the store object's identity (``base.FAILURE_LAYERS``), never kept on the store.

    The guard holds its store, and lives while anything uses it: an adapter, a pool
    manager or a transport on the store, or one of its own threads with work it still
    owes the store (a cooldown to write back, slots to give back, permits to settle).
    Meanwhile every new Session or adapter on the same store object finds the same local
    copy and health state; once nothing uses it, it is collected, and the store with
    it unless the caller holds it.
    """
    guard: StoreGuard | None = FAILURE_LAYERS.find(store)
    if guard is not None:
        return guard
    with _REGISTRY_LOCK:
        guard = FAILURE_LAYERS.find(store)
        if guard is not None:
            return guard
        guard = StoreGuard(as_store(store), store)
        FAILURE_LAYERS.add(store, guard)
        return guard


def shared(cooldown: object) -> PartwiseStore | None:
    """What calls talk to for ``cooldown`` (None: no sharing): a store kept in this
    process (``InProcess``: it cannot fail) as it is, any other store through its
    process-wide guard."""
    if cooldown is None:
        return None
    if isinstance(cooldown, InProcess):
        return as_store(cooldown)
    return guard_of(cooldown)
