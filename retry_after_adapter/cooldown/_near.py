"""The near copy of a shared store in this process: what lets an attempt be admitted
without a store round trip while nothing has changed (owned by the failure layer).

- **Cooldowns, pushed.** A scope read once from the store is known here; its cooldown
  is the failure layer's local copy (one copy per process, mirroring every store
  answer and holding what this process learned). While the store's change feed is
  fresh (``Store.feed``: a pub/sub channel on Redis, a change log whose last number is
  read before each attempt on SQLite), a change made anywhere (a cooldown learned or
  lifted, an allowance announced, a learned rate closed) reaches this copy as "read it
  again" (never as a value to trust: see :meth:`PushedCooldowns.changed`), so an
  unchanged scope is answered here. A feed that is not fresh sends every attempt to
  the store, at once, until it is fresh again (and the copy starts over).
- **Quota permits in batches.** A process that spends a quota's permits fast enough
  takes several in one store operation (``admit``'s ``batch``) and spends them within
  ``hold`` seconds of their grant; each counts ``per + margin + hold`` seconds in the
  store, so every arrival at the server still falls inside what the store counts. The
  batch is sized to the process's rate over the last second (an open permits' batch,
  before a whole second has passed, to its rate so far: see :data:`EARLY`): what it
  spends in two thirds of the longest hold, in the whole hold for open permits, at
  most :data:`BATCH_TARGET` permits (``hold`` at most a tenth of ``per``, half of
  ``per`` for open permits); while one
  thread takes the next batch, the others wait for it rather than each asking for a permit. What is not
  spent in time lapses, and a process that dies loses at most its batch. Once threads
  of the process have waited so for a quota's batch, the next one is taken ahead
  (:data:`AHEAD`): when what is left would run out (or its hold end) within twice the
  time the last batch took to come, one thread asks for the next batch while the others
  spend what is left, and the new batch is spent after it.
  An open permit (a quota whose ``per + margin`` is shorter than ``OPEN_FOR``, on a
  store that settles exactly: see ``Plan.answered``) is batched too: each permit of the
  batch is open in the store (counting ``OPEN_FOR`` longer) until the answer of the
  attempt that spent it settles it; those not spent within ``hold`` are given back
  then (settled to end at once: never sent, they need not count), with the other
  settles (``_coalesce``). On a store that renews (:class:`~.base.LeaseRenewal`), the
  open permits of a batch count :data:`OPEN_LIFE` past their grant + per + margin,
  not ``OPEN_FOR``, and the slots' thread renews those not settled yet (all in one
  store operation) while their answers are awaited, up to ``OPEN_FOR`` in all; a
  settle finds a renewed permit by where the store has it end now
  (:meth:`PermitBatches.settling`, under ``open_lock``, which a renewal takes only to note
  what it renews and to apply the store's answer, never across the store operation).
  A process killed leaves them counting about :data:`OPEN_LIFE` past per. An open
  permit taken alone, for its attempt, counts its full ``OPEN_FOR`` (as a killed
  worker's always did): no renewal missed ever cuts it short while its request is out.
- **Concurrency slots held per process.** A slot given back by an attempt stays with
  the process for :data:`IDLE` seconds, for its next attempt on the scope (any
  thread), then goes back to the store. A slot's lease is taken a little longer than
  its attempt's ttl and reused without a store operation while at least the ttl is
  left: an attempt's slot counts its whole ttl whatever any renewal does. On a store
  that renews leases (:class:`~.base.LeaseRenewal`, a ``lease_ttl`` over
  :data:`LIFE`), a forked child (a ``multiprocessing`` or Celery prefork worker, which
  may leave by ``os._exit`` right after its call) that keeps a slot when no other
  attempt of it is under way on the scope has the slot's end set :data:`LIFE` seconds
  ahead first (one store operation, in the thread that gives it back: where a slot
  not kept would be given back), and a thread of the process renews that life while
  it keeps the slot; taken again, its end is moved to the attempt's start + ttl (one
  store operation) before the request goes. Any other process keeps a slot as it is
  (no store operation: the next attempt reuses it, or the reaper gives it back within
  :data:`IDLE`). So a forked child that makes a call and exits gives its slots back
  within about :data:`LIFE`; a process killed with attempts under way, their slots
  (and those it kept in the last :data:`IDLE` seconds) within their ttl. Otherwise (a
  store without it, a short ``lease_ttl``), a killed process's slots come back when
  their leases expire.

A scope with an announced allowance (the store counts its admissions) is always
admitted by the store. Everything here is dropped in a forked child (the parent's:
a child never uses, renews or gives back its parent's slots and permits).

Each cache is one object with its own locks and state: :class:`PushedCooldowns`,
:class:`PermitBatches` (its ``open_lock`` taken before its lock) and
:class:`HeldSlots` (whose thread also renews the open permits); :class:`Near` holds
the three and admits from them. No part's lock is taken while another part's is held.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from .. import _forksafe
from .base import ADMITTED, Admission, Feed, Lease, assembled

__all__ = ["BATCH_TARGET", "IDLE", "LIFE", "HeldSlots", "Near", "PermitBatches", "PushedCooldowns"]

log = logging.getLogger("retry_after_adapter")

#: Permits a batch aims at (one store operation per this many attempts, at most).
BATCH_TARGET = 256
#: The longest (a share of the quota's ``per``) a batch's permit may wait to be spent.
HOLD_SHARE = 0.1
#: ... and an open permit of a batch (see ``batch``).
OPEN_HOLD_SHARE = 0.5
#: Seconds of the second under way, and permits spent in them, before its rate sizes an
#: open permits' batch (a process's first second, or its first after an idle one).
EARLY = 0.02
EARLY_SPENT = 4
#: The longest (seconds) an admission of an announced allowance taken in a batch may
#: wait to be spent (never past the server's reset).
UNIT_HOLD = 0.1
#: Seconds the other threads ask for single permits while one takes a batch (or until
#: its answer comes).
REFILL_WAIT = 0.2
#: A quota's next batch is taken ahead (once threads waited for one) when what is left
#: of the batch would be spent, or its hold end, within this many times the last
#: batch's time to come (its store operation, on this process's monotonic clock).
AHEAD = 2.0
#: Seconds the reaper thread stays with nothing to give back before it ends.
REAPER_LINGER = 1.0
#: Seconds a slot given back waits in the process for another attempt of its scope.
IDLE = 0.05
#: A held slot's lease is taken this share of the ttl longer (at most
#: :data:`REUSE_MAX` seconds), and reused while at least the ttl is left (a store that
#: does not renew leases, or a ttl no longer than :data:`LIFE`).
REUSE_SHARE = 0.25
REUSE_MAX = 5.0
#: Seconds a slot this process holds stays counted in the store past its last renewal
#: (on a store that renews leases, for a ``lease_ttl`` longer than this): what a
#: process that dies costs the others.
LIFE = 1.0
#: A held slot's life is renewed once less than this share of it is left (all the
#: process's slots then, in one store operation) ...
RENEW_SHARE = 0.6
#: ... and an idle one is reused only while at least this share of it is left (the
#: renewal then has that long to land before the slot stops counting).
RESERVE_SHARE = 0.5
#: Seconds an open permit taken through the copy counts past its grant + per + margin
#: until it is renewed (on a store that renews: else the engine's ``OPEN_FOR``): it is
#: renewed while unanswered, up to ``OPEN_FOR`` past it in all.
OPEN_LIFE = LIFE
#: Scopes kept at most (past it the copy starts over: dropping is always safe).
KNOWN_MAX = 65536
_SECOND = timedelta(seconds=1)
#: An open permit this long past its end and not settled is forgotten here.
_FORGET_OPEN = timedelta(seconds=60)


class _Known(NamedTuple):
    """A scope the store answered for since its last change: whether the store counts
    its admissions (an announced allowance: then never answered here). Its cooldown is
    the failure layer's local copy's (one copy per process)."""

    counted: bool
    #: A learned rate governs the scope (or may again, after a cooldown): the store
    #: admits each attempt.
    rated: bool = False


class _Permits:
    """One quota's batch of permits in this process (or a scope's admissions of an
    announced allowance, numbered from ``seq``), and its recent rate."""

    __slots__ = (
        "asked", "claimant", "claimed", "count", "early", "end", "full", "latency", "next", "open", "rate",
        "refilling", "seq", "since", "spend_by", "spent", "waited",
    )

    def __init__(self, now: datetime) -> None:
        self.count = 0  # permits left to spend
        self.seq = 0  # the next admission number (an allowance's batch)
        #: Until when (time.monotonic()) one thread's batch is being taken: the others
        #: ask for one permit meanwhile, not a batch each.
        self.refilling = 0.0
        self.end: datetime | None = None  # when they stop counting in the store
        self.spend_by: datetime | None = None  # spent only before this
        self.rate = 0.0  # permits per second over the last whole second
        #: Permits per second so far in this second, once :data:`EARLY` seconds and
        #: :data:`EARLY_SPENT` permits of it have passed (else 0).
        self.early = 0.0
        self.since = now
        self.spent = 0
        #: The batch's permits are open (see ``Plan.answered``): those not spent are
        #: given back (``PermitBatches.give_back_permits``), else they would count ``OPEN_FOR`` longer.
        self.open = False
        #: The thread that claimed the batch being taken (``threading.get_ident()``) and
        #: when (time.monotonic()), and the permits it asked for; how long (seconds) the
        #: last batch took to come, and whether the store granted all it asked for (the
        #: quota had room for it: else none is taken ahead, a refusal would defer the
        #: thread taking it while the batch still had permits).
        self.claimant = 0
        self.claimed = 0.0
        self.asked = 0
        self.latency = 0.0
        self.full = False
        #: Threads waited for a batch of this quota: the next ones are taken ahead.
        self.waited = False
        #: A batch taken ahead, spent once this one is (its count, end, spend-by time
        #: and whether open).
        self.next: tuple[int, datetime, datetime, bool] | None = None

    def advance(self, present: datetime) -> bool:
        """(Lock held; the batch is spent or past its spend-by time.) The batch taken
        ahead becomes the one spent, if one was and it may be spent at ``present``."""
        queued, self.next = self.next, None
        if queued is None:
            return False
        self.count, self.end, self.spend_by, self.open = queued
        return present < queued[2]


def _sizing_rate(permits: _Permits, longest: float, opened: bool, per: float | None) -> tuple[float, float]:
    """The rate (permits a second) a batch is sized to, and its longest hold: the last
    whole second's; for open permits, before a whole second has passed, the second
    under way's (those not spent are given back at the hold's end; a closed batch's
    lapse and count to their end, so it waits), a guess held a tenth of ``per`` (a held
    open permit tells other processes refused meanwhile to come back ``per`` later, see
    ``base.free_at``)."""
    if not permits.rate and opened and permits.early and per is not None:
        return permits.early, min(longest, HOLD_SHARE * per)
    return permits.rate, longest


def batch_size(rate: float, longest: float, opened: bool, most: int) -> int:
    """Permits a batch asks for at ``rate`` a second with a hold of at most ``longest``
    seconds: what the process spends within two thirds of the hold (spent in time), or
    two when it spends two within it; open permits, what it spends in the whole hold
    (those left at its end are given back); at most :data:`BATCH_TARGET` and ``most``."""
    spends = rate * longest
    share = spends if opened else spends / 1.5
    return min(BATCH_TARGET, max(math.floor(share), min(2, math.floor(spends))), most)


def _reuse_margin(ttl: float) -> float:
    """Seconds a slot's lease is taken (or moved) past its attempt's ttl: how long its
    process may reuse it without a store operation."""
    return min(REUSE_MAX, ttl * REUSE_SHARE)


class _Slot(NamedTuple):
    """A slot held idle (its lease: the :class:`_Held` of its token)."""

    token: str
    idle_since: float  # time.monotonic() when it was given back
    cap: int  # the concurrency cap it was taken under


class _Held:
    """A slot this process took through the copy: its scope, the cap it was taken
    under, the lease's end (a lower bound of the store's), the life it is renewed by
    (seconds; 0: not renewed) and, while an attempt uses it, the end of that attempt's
    ttl (None: idle)."""

    __slots__ = ("cap", "expires", "life", "scope", "wire")

    def __init__(self, scope: str, expires: datetime, cap: int, life: float, wire: datetime | None) -> None:
        self.scope = scope
        self.expires = expires
        self.cap = cap
        self.life = life
        self.wire = wire

    def usable(self, present: datetime, ttl: float) -> bool:
        """Whether an attempt of ``ttl`` seconds starting at ``present`` may reuse it:
        at least the ttl left, or (a slot kept with a renewed life) at least
        :data:`RESERVE_SHARE` of its life, for the store operation that moves its end
        to cover the ttl before the attempt is sent (see :meth:`covers`)."""
        left = (self.expires - present).total_seconds()
        if self.life:
            return left >= min(ttl, RESERVE_SHARE * self.life)
        return left >= ttl

    def covers(self, present: datetime, ttl: float) -> bool:
        """Whether its lease covers an attempt of ``ttl`` seconds from ``present`` as it
        is (else the store moves its end first)."""
        return self.expires >= present + timedelta(seconds=ttl)

    def renewal(self, now: datetime) -> datetime | None:
        """The end to renew its lease to at ``now`` (None: not renewed: no life, or an
        attempt uses it: its lease was set to cover the attempt's whole ttl)."""
        if not self.life or self.wire is not None:
            return None
        until = now + timedelta(seconds=self.life)
        return until if until > self.expires else None


#: Renews leases in the store: ``(scope, token, until)`` each, later only, or (the flag
#: set) to end at ``until``, earlier too; answers the tokens the store no longer holds.
Renew = Callable[[list[tuple[str, str, datetime]], bool], Collection[str]]
#: Moves open permits' ends in the store: ``(scope, limit, per, end, until, count)``
#: each; answers how many moved, each.
RenewOpen = Callable[[list[tuple[str, int, float, datetime, datetime, int]]], list[int]]
#: ``(scope, limit, per, end)``: open permits taken together (one admission's, or a
#: batch's extra ones), by the end they were granted with.
_OpenKey = tuple[str, int, float, datetime]


class _Open:
    """Open permits of one grant not settled yet: how many, where the store has them
    end now (renewed), how long they count past the present (per + margin), and the
    latest end they are renewed to."""

    __slots__ = ("count", "cur", "most", "renewing", "tail")

    def __init__(self, count: int, cur: datetime, tail: float, most: datetime) -> None:
        self.count = count
        self.cur = cur
        self.tail = tail
        self.most = most
        #: A renewal of them is in the store (``open_lock`` not held meanwhile).
        self.renewing = False


#: ``(scope, limit, per, margin)``: one quota's batch; ``(scope, 0, 0.0, 0.0)``: the
#: scope's batch of its announced allowance.
_Quota = tuple[str, int, float, float]

class PushedCooldowns:
    """The scopes read from the store since their last change, kept while its change
    feed pushes every change (see the module): their cooldowns are the failure layer's
    local copy. Thread-safe."""

    def __init__(self, cooldown: Callable[[str], datetime | None]) -> None:
        #: A scope's cooldown as this process knows it: the failure layer's local copy,
        #: which mirrors every store answer and holds what this process learned.
        self.cooldown = cooldown
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}
        #: Goes up at every change delivered: an answer read across one is not kept.
        self.epoch = 0
        self.feed: Feed | None = None

    def changed(self, scope: str | None, until: datetime | None = None) -> None:
        """The feed's news: ``scope`` changed (None: anything may have): what the copy
        knew of it is dropped, and the next attempt reads the store. ``until`` (what the
        news said the cooldown is) is never trusted: a message anyone may publish moves
        no cooldown, it costs a round trip at most."""
        with self._lock:
            self.epoch += 1
            if scope is None:
                self._known.clear()
            else:
                self._known.pop(scope, None)

    def unrated(self, scope: str) -> bool:
        """Whether the copy knows ``scope`` and no learned rate governs it."""
        known = self._known.get(scope)
        return known is not None and not known.rated

    def counted(self, scope: str) -> bool:
        """Whether the copy knows ``scope`` and the store counts its admissions (an
        announced allowance)."""
        known = self._known.get(scope)
        return known is not None and known.counted

    def knows(self, scope: str) -> bool:
        """Whether the copy holds what the store said of ``scope``."""
        return scope in self._known

    def cooldown_of(self, scope: str) -> datetime | None:
        """The cooldown the copy answers with for ``scope`` (None: none, or not known)."""
        return self.cooldown(scope) if scope in self._known else None

    def fresh(self) -> bool:
        feed = self.feed
        return feed is not None and feed.fresh()

    def fresh_known(self, scope: str) -> _Known | None:
        """What the copy knows of ``scope`` when it may answer for it (the feed has
        delivered every change so far), else None."""
        if scope not in self._known or not self.fresh():
            return None
        return self._known.get(scope)  # the feed may just have delivered news of it

    def took(self, scope: str, answer: Admission, epoch: int) -> None:
        """The store answered for ``scope`` (read at ``epoch``): kept, unless a change
        was delivered since."""
        with self._lock:
            if epoch == self.epoch:
                if len(self._known) >= KNOWN_MAX:
                    self._known.clear()
                rated = answer.rate_epoch is not None
                self._known[scope] = _Known(answer.seq is not None, rated)

    def learned(self, scope: str) -> None:
        """This process wrote a cooldown (kept in the local copy): a learned rate may
        govern the scope again after it, so the store admits its attempts."""
        with self._lock:
            known = self._known.get(scope)
            if known is not None and not known.rated:
                self._known[scope] = known._replace(rated=True)

    def after_fork(self) -> None:
        """In a forked child: the parent's copy is not this process's (the feed is made
        again)."""
        self._lock = threading.Lock()
        self._known.clear()
        self.epoch += 1


def _nothing() -> None:
    return None


def _never() -> bool:
    return False


class PermitBatches:
    """Quota permits (and admissions of an announced allowance) taken from the store in
    batches and spent here, and the open ones renewed until settled (see the module).
    Thread-safe."""

    def __init__(self, counted: Callable[[str], bool], fresh: Callable[[], bool]) -> None:
        #: Whether the store counts a scope's admissions (an announced allowance,
        #: batched too), and whether the change feed is fresh (batches only then).
        self._counted = counted
        self._fresh = fresh
        self._lock = threading.Lock()
        #: Notified when a quota's batch came (or the thread taking it gave up).
        self._refilled = threading.Condition(self._lock)
        self._permits: dict[_Quota, _Permits] = {}
        #: Gives back ``count`` open permits of a quota's batch that ends at ``end``,
        #: never spent (set by the failure layer); and those waiting for it.
        self.give_back_permits: Callable[[_Quota, datetime, int], None] | None = None
        self._lapsed: list[tuple[_Quota, datetime, int]] = []
        #: Moves open permits' ends in the store (set by the failure layer when the
        #: store renews: see :data:`OPEN_LIFE`), the open permits taken through the
        #: copy and not settled yet, and the lock held while they are renewed in the
        #: store and while a settle reads where one ends.
        self.renew_open: RenewOpen | None = None
        self._open: dict[_OpenKey, _Open] = {}
        self.open_lock = threading.Lock()
        #: Starts the thread that renews them (the held slots': see :class:`Near`).
        self.wake: Callable[[], None] = _nothing

    def spend_unit(self, scope: str, present: datetime) -> int | None:
        """An admission of the scope's announced allowance held here, if one is left to
        spend at ``present``: its number."""
        with self._lock:
            units = self._take((scope, 0, 0.0, 0.0), present)
            if units is None:
                return None
            units.seq += 1
            return units.seq - 1

    def put_back(self, scope: str, limit: int, per: float, margin: float, permit: datetime) -> None:
        """The store refused the attempt: the permit :meth:`spend` gave goes back."""
        with self._lock:
            batch = self._permits.get((scope, limit, per, margin))
            if batch is None:
                return
            if batch.end == permit:
                batch.count += 1
                batch.spent -= 1
            elif batch.next is not None and batch.next[1] == permit:  # (spent from it meanwhile)
                count, end, spend_by, opened = batch.next
                batch.next = (count + 1, end, spend_by, opened)
                batch.spent -= 1

    def batch(
        self, scope: str, limit: int | None, per: float | None, margin: float, claim: bool = False,
        opened: bool = False,
    ) -> tuple[int, float]:
        """``(batch, hold)`` for the next store operation of the scope: its quota's
        permits (or, without a quota, the admissions of its announced allowance), one
        (no hold) until the process's rate makes a batch worth it. ``claim``: the
        caller is about to ask for it, so other threads ask for one meanwhile.
        ``opened``: the quota's permits are open, held up to :data:`OPEN_HOLD_SHARE`
        of ``per`` (each is settled by its answer, or given back unspent: holding it
        longer costs the quota nothing)."""
        if limit is not None and per is not None:
            key: _Quota = (scope, limit, per, margin)
            longest, most = (OPEN_HOLD_SHARE if opened else HOLD_SHARE) * per, max(1, limit // 4)
        else:
            if not self._counted(scope):
                return 1, 0.0
            key, longest, most = (scope, 0, 0.0, 0.0), UNIT_HOLD, BATCH_TARGET
        permits = self._permits.get(key)
        if permits is None or not self._fresh():
            self._unclaim(permits)
            return 1, 0.0
        rate, longest = _sizing_rate(permits, longest, opened, per)
        size = batch_size(rate, longest, opened, most)
        if size < 2:
            self._unclaim(permits)
            return 1, 0.0
        now = time.monotonic()
        me = threading.get_ident()
        with self._lock:
            if permits.refilling > now and permits.claimant != me:
                return 1, 0.0  # another thread is taking this quota's batch
            if claim:
                permits.refilling = now + REFILL_WAIT
                permits.claimant, permits.claimed, permits.asked = me, now, size
        # Whole milliseconds: every store keeps the extras' end exactly as computed here.
        return size, math.floor(min(longest, 1.5 * size / rate) * 1000) / 1000

    def _unclaim(self, permits: _Permits | None) -> None:
        """No batch after all: a claim this thread made ahead (see :meth:`spend`) ends,
        and the threads waiting for it go on."""
        if permits is None or permits.claimant != threading.get_ident():
            return
        with self._lock:
            if permits.claimant == threading.get_ident():
                permits.refilling, permits.claimant = 0.0, 0
                self._refilled.notify_all()

    def took(
        self, scope: str, present: datetime, answer: Admission, limit: int | None, per: float | None,
        margin: float, hold: float, opened: bool,
    ) -> None:
        """The store admitted an attempt at ``present``: the batch's extra permits
        (``opened``: open ones) and admissions of an announced allowance are kept
        (the open permits that lapsed are given back by :meth:`give_lapsed`)."""
        with self._lock:
            if limit is not None and per is not None and answer.permit is not None:
                permits = self._count(scope, limit, per, margin, present)
                if permits.claimant == threading.get_ident():
                    permits.latency = time.monotonic() - permits.claimed
                    permits.full = answer.extra + 1 >= permits.asked
                permits.refilling, permits.claimant = 0.0, 0
                self._refilled.notify_all()
                if answer.extra > 0:
                    key = (scope, limit, per, margin)
                    batch = (
                        answer.extra, answer.permit + timedelta(seconds=hold),
                        present + timedelta(seconds=hold), opened,
                    )
                    if permits.next is not None:  # two taken ahead: the older is spent first
                        self._lapse(key, permits)
                        permits.advance(present)
                    if permits.count > 0 and permits.spend_by is not None and present < permits.spend_by:
                        permits.next = batch  # taken ahead: spent after what is left
                    else:
                        self._lapse(key, permits)  # the batch it replaces
                        permits.count, permits.end, permits.spend_by, permits.open = batch
            if answer.seq is not None:
                units = self._count(scope, 0, 0.0, 0.0, present)
                units.refilling = 0.0
                if answer.units > 0 and answer.units_until is not None:
                    hold = min(UNIT_HOLD, 1.5 * answer.units / units.rate) if units.rate > 0 else UNIT_HOLD
                    units.count = answer.units
                    units.seq = answer.seq + 1
                    units.spend_by = min(present + timedelta(seconds=hold), answer.units_until)

    def _count(self, scope: str, limit: int, per: float, margin: float, present: datetime) -> _Permits:
        """(Lock held.) The quota's batch, its rate brought up to date with one more
        permit spent."""
        key = (scope, limit, per, margin)
        permits = self._permits.get(key)
        if permits is None:
            if len(self._permits) >= KNOWN_MAX:
                self._permits.clear()
            permits = self._permits[key] = _Permits(present)
        elapsed = present - permits.since
        if elapsed >= _SECOND:
            permits.rate = permits.spent / elapsed.total_seconds() if elapsed < 2 * _SECOND else 0.0
            permits.since, permits.spent = present, 0
        permits.spent += 1
        if not permits.rate:  # no whole second yet: the one under way's (see _sizing_rate)
            seconds = elapsed.total_seconds()
            early = seconds >= EARLY and permits.spent >= EARLY_SPENT
            # ``spent`` permits from the second's first: ``spent - 1`` intervals.
            permits.early = (permits.spent - 1) / seconds if early else 0.0
        return permits

    def spend(
        self, scope: str, limit: int, per: float, margin: float, present: datetime, wait: float = 0.0
    ) -> datetime | None:
        """A permit of the batch, if one is left to spend at ``present``: its end. While
        another thread takes the quota's next batch, this one waits for it (no longer
        than that thread's claim, nor ``wait`` seconds: what its call has left), rather
        than asking the store for a permit of its own. None too when this thread is to
        take the next batch ahead (see :meth:`_ahead`; only a caller that may wait,
        ``wait`` > 0, which then asks the store for a batch)."""
        key = (scope, limit, per, margin)
        started = time.monotonic()
        with self._lock:
            if wait > 0 and self._ahead(key, present, started):
                return None  # this thread takes the next batch: the others spend what is left
            permits = self._take(key, present)
            while permits is None:
                batch = self._permits.get(key)
                now = time.monotonic()
                if batch is None or batch.refilling <= now or now - started >= wait:
                    break
                batch.waited = True
                self._refilled.wait(min(batch.refilling - now, started + wait - now))
                permits = self._take(key, present + timedelta(seconds=time.monotonic() - started))
            end = None if permits is None else permits.end
        self.give_lapsed()
        return end

    def _ahead(self, key: _Quota, present: datetime, now: float) -> bool:
        """(Lock held.) Whether this thread takes the quota's next batch ahead (claimed
        for it): threads have waited for one before, the last one was granted whole,
        none is being taken or waits taken ahead, and what is left would be spent (at
        the rate a batch is sized to), or its hold end, within :data:`AHEAD` times the
        last batch's time to come."""
        permits = self._permits.get(key)
        if (
            permits is None
            or not permits.waited
            or not permits.full
            or not permits.latency
            or permits.next is not None
            or permits.refilling > now
            or permits.count <= 0
            or permits.spend_by is None
            or present >= permits.spend_by
        ):
            return False
        rate = permits.rate or permits.early
        lead = AHEAD * permits.latency
        if permits.count > rate * lead and (permits.spend_by - present).total_seconds() > lead:
            return False
        permits.refilling = now + REFILL_WAIT
        permits.claimant, permits.claimed = threading.get_ident(), now
        return True

    def refilled(self, scope: str, limit: int | None, per: float | None, margin: float) -> None:
        """The thread that claimed the quota's next batch is done (granted or not): the
        threads waiting for it go on."""
        if limit is None or per is None:
            return
        with self._lock:
            permits = self._permits.get((scope, limit, per, margin))
            if permits is not None:
                permits.refilling = 0.0
            self._refilled.notify_all()

    def _take(self, key: _Quota, present: datetime) -> _Permits | None:
        """(Lock held.) One of ``key``'s batch taken at ``present`` (its rate counted):
        the batch, or None when none is left to spend (past its spend-by time, the
        rest lapse in the store)."""
        permits = self._permits.get(key)
        if permits is None:
            return None
        if permits.count <= 0 or permits.spend_by is None or present >= permits.spend_by:
            self._lapse(key, permits)
            if not permits.advance(present):  # (a batch taken ahead, if any, is spent now)
                self._lapse(key, permits)
                return None
            if permits.count <= 0:
                return None
        permits.count -= 1
        self._count(*key, present)
        return permits

    def _lapse(self, key: _Quota, permits: _Permits) -> None:
        """(Lock held.) The batch's permits not spent lapse: open ones are given back
        (after the lock, by :meth:`give_lapsed`)."""
        if permits.count > 0 and permits.open and permits.end is not None:
            self._lapsed.append((key, permits.end, permits.count))
        permits.count = 0

    def lapse_due(self, key: _Quota, end: datetime, exiting: bool = False) -> None:
        """The batch of ``key`` ending at ``end`` reached its spend-by time (on the
        monotonic clock; or the process exits): what is left of it lapses, and is given
        back if open."""
        with self._lock:
            permits = self._permits.get(key)
            if permits is not None and permits.end == end:
                self._lapse(key, permits)
            elif permits is not None and permits.next is not None and permits.next[1] == end:
                count, _, _, opened = permits.next
                permits.next = None
                if count > 0 and opened:
                    self._lapsed.append((key, end, count))
        self.give_lapsed()

    def give_lapsed(self) -> None:
        """Give back the open permits that lapsed (``give_back_permits``: the failure
        layer's)."""
        if not self._lapsed:
            return
        with self._lock:
            lapsed, self._lapsed = self._lapsed, []
        give_back = self.give_back_permits
        if give_back is None:
            return
        for key, end, count in lapsed:
            give_back(key, end, count)

    # -- open permits renewed ----------------------------------------------------------
    def opened(self, key: _OpenKey, count: int, tail: float, most: float) -> None:
        """``count`` open permits granted to end at ``key``'s end, taken with a life of
        :data:`OPEN_LIFE` (``tail``: their per + margin, seconds): renewed while not
        settled, up to ``most`` seconds past their end as granted."""
        if count <= 0:
            return
        with self._lock:
            end = key[3]
            group = self._open.get(key)
            if group is not None and group.cur == end:  # granted in the same millisecond
                group.count += count
            else:
                self._open[key] = _Open(count, end, tail, end + timedelta(seconds=most))
        # After the lock (the thread's lock is never taken under this one): a thread
        # that saw none open before it was noted has ended, and another starts.
        self.wake()

    def settling(self, key: _OpenKey, count: int = 1) -> datetime:
        """(``open_lock`` held.) ``count`` open permits granted to end at ``key``'s end
        are settled (or given back): where the store has them end now."""
        with self._lock:
            group = self._open.get(key)
            if group is None:
                return key[3]
            group.count -= count
            if group.count <= 0:
                del self._open[key]
            return group.cur

    def pending(self) -> bool:
        """Whether open permits wait to be settled (read without the lock: the held
        slots' thread keeps running while they do)."""
        return bool(self._open)

    def renew_due(self) -> None:
        """Renew the open permits not settled whose life runs out (less than
        :data:`RENEW_SHARE` of :data:`OPEN_LIFE` left past the present + per +
        margin), all in one store operation (on the held slots' thread). ``open_lock``
        is held only to note what is renewed and to apply the answer, never across the
        store operation (callers settle under it): a settle meanwhile takes its permit
        out of the renewal (:meth:`settling`), and is written to the end it read,
        before or after the renewal; the permit's move is then found settled (see
        :meth:`_renewed_open`)."""
        renew_open = self.renew_open
        if renew_open is None or not self._open:
            return
        with self.open_lock:
            now = datetime.now(timezone.utc)
            with self._lock:
                todo = []
                for key, group in list(self._open.items()):
                    floor = now + timedelta(seconds=group.tail)
                    if group.cur <= now - _FORGET_OPEN:
                        del self._open[key]  # lapsed long ago: never settled here
                        continue
                    if group.cur <= now or group.cur >= group.most or group.renewing:
                        continue  # lapsed, as long as an open permit counts, or under way
                    if (group.cur - floor).total_seconds() < RENEW_SHARE * OPEN_LIFE:
                        until = min(floor + timedelta(seconds=OPEN_LIFE), group.most)
                        if until > group.cur:
                            group.renewing = True
                            todo.append((key, group, group.cur, until, group.count))
        if not todo:
            return
        try:
            moved = renew_open([(*key[:3], cur, until, count) for key, _, cur, until, count in todo])
        except Exception as exc:  # tried again at the next pass, while life is left
            log.debug("renewing open permits failed: %s", type(exc).__name__)
            moved = [0] * len(todo)
        with self.open_lock, self._lock:
            for (_, group, cur, until, _count), done in zip(todo, moved, strict=True):
                group.renewing = False
                if done and group.cur == cur:
                    group.cur = until

    def after_fork(self) -> None:
        """In a forked child: the parent's batches and open permits are not this
        process's (the parent's to give back, settle and renew)."""
        self._lock = threading.Lock()
        self._refilled = threading.Condition(self._lock)
        self._permits.clear()
        self._lapsed = []
        self._open.clear()
        self.open_lock = threading.Lock()


class HeldSlots:
    """Concurrency slots this process took through the copy and keeps idle for a
    moment for its next attempt on the scope, their lives renewed on a thread of their
    own, which also runs another chore (the open permits' renewals: see :class:`Near`)
    while that has work (see the module). Thread-safe."""

    def __init__(
        self, give_back: Callable[[str, str], None], chore: Callable[[], None] = _nothing,
        chore_pending: Callable[[], bool] = _never,
    ) -> None:
        #: Gives a slot back to the store (the failure layer's release).
        self._give_back = give_back
        #: Done at each pass of the thread, which lasts while ``chore_pending()``.
        self._chore = chore
        self._chore_pending = chore_pending
        self._lock = threading.Lock()
        #: Slots this process holds: per scope, the idle ones; every held token's scope.
        self._idle: dict[str, list[_Slot]] = {}
        self._held: dict[str, _Held] = {}
        #: Renews held slots' leases in the store (set by the failure layer when the
        #: store can: see :data:`LIFE`); None: leases are taken for the attempt's ttl.
        self.renew: Renew | None = None
        #: Slots to give back to the store on the reaper thread (scope, token).
        self._due: list[tuple[str, str]] = []
        self._reaper: threading.Thread | None = None
        #: Store operations that set a kept slot's end (kept, or taken again): counted.
        self.moved = 0
        #: Held by the reaper while it gives slots back (``release_all`` waits for it).
        self._giving = threading.Lock()

    def took(self, scope: str, present: datetime, lease: Lease, ttl: float | None) -> None:
        """The store gave a slot at ``present`` for ``lease`` (as taken, see
        :meth:`lease_for`; ``ttl``: the attempt's own, seconds): held here."""
        with self._lock:
            if len(self._held) >= KNOWN_MAX:
                self._held.clear()  # those slots go back to the store, not here
            wire = lease.ttl if ttl is None else ttl
            life = LIFE if self._renews(wire) else 0.0  # kept with a renewed life once parked
            held = _Held(scope, present + timedelta(seconds=lease.ttl), lease.slots, life,
                         present + timedelta(seconds=wire))
            self._held[lease.token] = held

    def lease_for(self, lease: Lease) -> Lease:
        """The lease to take from the store for a slot this process may keep: a little
        longer than the attempt's ttl (see the module), so that the process's next
        attempts may reuse it without a store operation while the ttl is left."""
        return Lease(slots=lease.slots, ttl=lease.ttl + _reuse_margin(lease.ttl), token=lease.token)

    def _renews(self, ttl: float) -> bool:
        """Whether a slot taken for an attempt of ``ttl`` seconds is kept with a renewed
        life once the attempt ends (a store that renews, a ttl longer than :data:`LIFE`)."""
        return self.renew is not None and ttl > LIFE

    def reuse(self, scope: str, present: datetime, ttl: float, cap: int) -> str | None:
        """A slot this process holds idle on ``scope``, taken under the same cap, taken
        for an attempt of ``ttl`` seconds starting at ``present`` (None: none): one with
        at least ``ttl`` seconds of lease left, or one kept with a renewed life (see
        :data:`LIFE`) whose lease the store moved to ``present + ttl`` first (one store
        operation: the attempt's slot never depends on a renewal landing in time). A
        slot taken under another cap is not reused: the store counted it against that
        cap, and an attempt under a smaller one must be counted again."""
        while True:
            with self._lock:
                found = self._pick(scope, present, ttl, cap)
            if found is None:
                return None
            token, held = found
            if not held.life or held.covers(present, ttl):
                return token
            until = present + timedelta(seconds=ttl + _reuse_margin(ttl))
            try:
                lost = self._renew_now([(scope, token, until)], False)
            except Exception as exc:  # the store admits the attempt; the slot goes back
                log.debug("taking a kept concurrency slot again failed: %s", type(exc).__name__)
                with self._lock:
                    if self._held.pop(token, None) is not None:
                        self._later(scope, token)
                return None
            with self._lock:
                if token not in lost and self._held.get(token) is held:
                    held.expires = max(held.expires, until)
                    self.moved += 1
                    return token
                self._held.pop(token, None)  # it lapsed in the store: another one, if any

    def _in_flight(self, scope: str, token: str) -> bool:
        """(Lock held.) Whether an attempt of this process other than ``token``'s uses
        a slot it holds on ``scope``."""
        return any(
            held.wire is not None and held.scope == scope and other != token
            for other, held in self._held.items()
        )

    def _pick(self, scope: str, present: datetime, ttl: float, cap: int) -> tuple[str, _Held] | None:
        """(Lock held.) :meth:`_reuse`'s choice: an idle slot's token and what is held of
        it, marked in use by an attempt of ``ttl`` seconds from ``present``; those
        found unusable on the way go back to the store."""
        idle = self._idle.get(scope)
        if not idle:
            return None
        found = None
        for slot in reversed(list(idle)):
            if slot.cap != cap:
                continue
            idle.remove(slot)
            held = self._held.get(slot.token)
            if held is not None and held.usable(present, ttl):
                held.wire = present + timedelta(seconds=ttl)
                found = (slot.token, held)
                break
            self._held.pop(slot.token, None)
            self._later(scope, slot.token)
        if not idle:
            del self._idle[scope]
        return found

    def _renew_now(self, leases: list[tuple[str, str, datetime]], exact: bool) -> Collection[str]:
        """Renew ``leases`` in the store now (in the caller's thread): the tokens it no
        longer holds."""
        renew = self.renew
        if renew is None:
            return {token for _, token, _ in leases}
        return renew(leases, exact)

    def park(self, scope: str, token: str) -> bool:
        """An attempt gave its slot back: keep it idle here for :data:`IDLE` seconds
        (True), or False for a slot this process did not take (the store gets it). A
        slot kept with a renewed life has its lease set to end :data:`LIFE` seconds
        from now first, in the store (one operation, in the caller's thread: a process
        that ends right after, even by ``os._exit``, leaves it counting that long, not
        the rest of its attempt's ``lease_ttl``); if that fails, the store gets it."""
        with self._lock:
            held = self._held.get(token)
            if held is None or held.scope != scope or held.wire is None:
                return False
            # Kept as it is (reused at once, most likely; given back within IDLE by the
            # reaper) unless this is a forked child with no other attempt under way on
            # the scope: one that may leave by ``os._exit`` right after its call.
            life = held.life if _forksafe.forked_child() and not self._in_flight(scope, token) else 0.0
        if life:
            until = datetime.now(timezone.utc) + timedelta(seconds=life)
            try:
                lost = self._renew_now([(scope, token, until)], True)
            except Exception as exc:  # given back instead (or later, by the writer)
                log.debug("keeping a concurrency slot failed: %s", type(exc).__name__)
                with self._lock:
                    self._held.pop(token, None)
                return False
            with self._lock:
                if token in lost or self._held.get(token) is not held:
                    self._held.pop(token, None)
                    return token in lost  # lapsed: nothing to give back
                held.expires = until
                self.moved += 1
        with self._lock:
            if self._held.get(token) is not held:
                return False
            held.wire = None
            self._idle.setdefault(scope, []).append(_Slot(token, time.monotonic(), held.cap))
            self._wake()
            return True

    def _later(self, scope: str, token: str) -> None:
        """(Lock held.) Give a slot back to the store on the reaper thread."""
        self._due.append((scope, token))
        self._wake()

    def wake(self) -> None:
        """Start the reaper thread unless it runs (for the chore: see :class:`Near`)."""
        with self._lock:
            self._wake()

    def _wake(self) -> None:
        """(Lock held.) Start the reaper thread unless it runs."""
        _give_back_at_exit(self)
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="retry-after-slots", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Give back the slots idle for :data:`IDLE` seconds, renew the held slots'
        lives (see :data:`LIFE`) and do the chore; ends when none was held idle, nor
        renewed, and the chore had nothing pending, for :data:`REAPER_LINGER` seconds
        (a process using slots keeps one thread)."""
        empty_since = None
        while True:
            time.sleep(IDLE / 2)
            with self._lock:
                due, self._due = self._due, []
                edge = time.monotonic() - IDLE
                for scope in list(self._idle):
                    slots = self._idle[scope]
                    keep = [slot for slot in slots if slot.idle_since > edge]
                    for slot in slots:
                        if slot.idle_since <= edge:
                            due.append((scope, slot.token))
                            self._held.pop(slot.token, None)
                    if keep:
                        self._idle[scope] = keep
                    else:
                        del self._idle[scope]
                renewals = self._renewals()
                idle = not self._idle and not due and not renewals and not self._renewed()
                if idle and not self._chore_pending():
                    now = time.monotonic()
                    if empty_since is None:
                        empty_since = now
                    if now - empty_since >= REAPER_LINGER:
                        self._reaper = None
                        return
                    continue
                empty_since = None
                self._giving.acquire()
            try:
                try:
                    self._return(due)
                    if renewals:
                        self._renew(renewals)
                finally:
                    self._giving.release()
                self._chore()
            except ReferenceError:  # the store was collected (its layer holds it weakly)
                self._reaper = None
                return

    def _renewed(self) -> bool:
        """(Lock held.) Whether a slot held is renewed (its attempt's ttl not over)."""
        return any(held.life and held.wire is None for held in self._held.values())

    def _renewals(self) -> list[tuple[str, str, datetime]]:
        """(Lock held.) When a held slot's life is running out (less than
        :data:`RENEW_SHARE` of it left), every held slot's renewal, ``(scope, token,
        until)`` (one store operation for all); else none."""
        if self.renew is None or not self._held:
            return []
        now = datetime.now(timezone.utc)
        due = False
        renewals = []
        for token, held in self._held.items():
            until = held.renewal(now)
            if until is None:
                continue
            renewals.append((held.scope, token, until))
            due = due or (held.expires - now).total_seconds() < RENEW_SHARE * held.life
        return renewals if due else []

    def _renew(self, renewals: list[tuple[str, str, datetime]]) -> None:
        """Renew ``renewals`` in the store (each ``until`` was worked out before the
        operation: a lower bound of what the store keeps); a slot the store no longer
        holds is dropped (an idle one is not reused; one in use had lapsed: logged)."""
        renew = self.renew
        if renew is None:
            return
        try:
            lost = set(renew(renewals, False))
        except Exception as exc:  # tried again at the next pass, while life is left
            log.debug("renewing held concurrency slots failed: %s", type(exc).__name__)
            return
        with self._lock:
            for scope, token, until in renewals:
                held = self._held.get(token)
                if held is None:
                    continue
                if token not in lost:
                    held.expires = max(held.expires, until)
                    continue
                del self._held[token]
                if held.wire is not None:
                    log.warning(
                        "a concurrency slot of this process lapsed in the store before it was "
                        "renewed (the process was held up for over %.1f s)", held.life,
                    )
                idle = self._idle.get(scope)
                if idle:
                    idle[:] = [slot for slot in idle if slot.token != token]
                    if not idle:
                        del self._idle[scope]

    def _return(self, due: list[tuple[str, str]]) -> None:
        for scope, token in due:
            try:
                self._give_back(scope, token)
            except Exception as exc:  # the lease still expires by itself
                log.debug("giving a held slot back failed: %s", type(exc).__name__)

    def release_all(self) -> None:
        """Give every held idle slot back now (a store being closed, the process
        exiting), after the reaper's give-backs under way: never two give-backs at once
        (at exit, one racing the reaper on the store's connection crashed the process).
        The locks are taken in the reaper's order: the copy's, then the give-backs'."""
        with self._lock:
            due = [(scope, slot.token) for scope, slots in self._idle.items() for slot in slots]
            due += self._due
            self._idle.clear()
            self._due = []
            for _, token in due:
                self._held.pop(token, None)
            self._giving.acquire()
        try:
            self._return(due)
        finally:
            self._giving.release()


    def after_fork(self) -> None:
        """In a forked child: the parent's slots are not this process's (its slots are
        the parent's to give back)."""
        self._lock = threading.Lock()
        self._giving = threading.Lock()
        self._idle.clear()
        self._held.clear()
        self._due = []
        self._reaper = None


class Near:
    """The near copy (see the module): its three parts, and admission from them.
    Thread-safe; made by the failure layer when its store has a change feed, which
    sets what the parts do in the store (``cooldowns.feed``,
    ``permits.give_back_permits`` and ``renew_open``, ``slots.renew``)."""

    __slots__ = ("cooldowns", "permits", "slots")

    def __init__(
        self, give_back: Callable[[str, str], None], cooldown: Callable[[str], datetime | None]
    ) -> None:
        #: The scopes known, kept while the feed pushes every change.
        self.cooldowns = PushedCooldowns(cooldown)
        #: The quotas' batches, and the open permits renewed on the slots' thread.
        self.permits = PermitBatches(self.cooldowns.counted, self.cooldowns.fresh)
        #: The slots held (``give_back``: the failure layer's release).
        self.slots = HeldSlots(give_back, self.permits.renew_due, self.permits.pending)
        self.permits.wake = self.slots.wake

    def admit(
        self, scope: str, present: datetime, limit: int | None, per: float | None, margin: float,
        lease: Lease | None, wait: float = 0.0,
    ) -> tuple[Admission | None, datetime | None, str | None]:
        """What this process can give at ``present`` without the store: ``(answer, None,
        None)`` when it answers alone (admitted, or held back by a known cooldown), else
        ``(None, permit, token)``: a permit's end and a held slot it took (None: the
        store must give it), to be put back with :meth:`put_back` if the store refuses.
        ``wait``: seconds it may wait for a batch another thread is taking."""
        cooldowns = self.cooldowns
        known = cooldowns.fresh_known(scope)
        cooldown = cooldowns.cooldown(scope) if known is not None else None
        if cooldown is not None and cooldown > present:
            return Admission(cooldown=cooldown, not_before=cooldown), None, None
        # A permit of the batch and a held slot serve whether or not the copy can
        # answer for the cooldown (then the store's operation checks it).
        permit = None
        if limit is not None and per is not None:
            permit = self.permits.spend(scope, limit, per, margin, present, wait)
        token = None
        if lease is not None:
            token = self.slots.reuse(scope, present, lease.ttl, lease.slots)
        if (
            known is not None
            and not known.rated  # else the store's learned rate admits
            and (limit is None or permit is not None)
            and (lease is None or token is not None)
        ):
            return self._answer_alone(scope, present, known, cooldown, permit, token)
        return None, permit, token

    def _answer_alone(
        self, scope: str, present: datetime, known: _Known, cooldown: datetime | None,
        permit: datetime | None, token: str | None,
    ) -> tuple[Admission | None, datetime | None, str | None]:
        """:meth:`admit`'s answer when the copy knows ``scope``, no learned rate governs
        it, no cooldown runs at ``present`` (an aware UTC datetime) and what it asks was
        found here: ``permit`` (the end of a batch's permit, None: no quota) and
        ``token`` (a held slot, None: no cap). A scope whose announced allowance the
        store counts needs one of its admissions held here too, else the store answers
        (``(None, permit, token)``)."""
        seq = None
        if known.counted:  # one of the announced allowance too
            seq = self.permits.spend_unit(scope, present)
            if seq is None:
                return None, permit, token
        if permit is None and token is None:
            if cooldown is None and seq is None:
                return ADMITTED, None, None  # (the common case: one value, shared)
            return Admission(cooldown=cooldown, not_before=None, seq=seq), None, None
        # (built whole, see ``assembled``: an attempt the copy admits alone makes one)
        fields = {"cooldown": cooldown, "not_before": None, "seq": seq, "permit": permit, "token": token}
        return assembled(Admission, fields), None, None

    def put_back(self, scope: str, limit: int | None, per: float | None, margin: float,
                 permit: datetime | None, token: str | None) -> None:
        """The store refused the attempt: what :meth:`admit` took goes back."""
        if permit is not None and limit is not None and per is not None:
            self.permits.put_back(scope, limit, per, margin, permit)
        if token is not None:
            self.slots.park(scope, token)

    def took(
        self, scope: str, present: datetime, answer: Admission, epoch: int, limit: int | None,
        per: float | None, margin: float, hold: float, lease: Lease | None, opened: bool = False,
        ttl: float | None = None,
    ) -> None:
        """The store admitted an attempt at ``present`` (read at the cooldowns' ``epoch``):
        keep what it said of the scope, the batch's extra permits (``opened``: open ones)
        and the slot's lease (``lease``: as taken, see :meth:`HeldSlots.lease_for`;
        ``ttl``: the attempt's own, seconds)."""
        try:
            self.cooldowns.took(scope, answer, epoch)
            self.permits.took(scope, present, answer, limit, per, margin, hold, opened)
            if lease is not None:
                self.slots.took(scope, present, lease, ttl)
        finally:
            self.permits.give_lapsed()

    def after_fork(self) -> None:
        """In a forked child: the parent's copy, batches and slots are not this
        process's (its slots are the parent's to give back); the feed is made again."""
        self.cooldowns.after_fork()
        self.permits.after_fork()
        self.slots.after_fork()


# ------------------------------------------------- slots held at exit go back at once
#: The held slots of this process's near copies, and the process the exit hooks are for.
_HOLDING: weakref.WeakSet[HeldSlots] = weakref.WeakSet()
_HOOKED = [0]


def _give_back_at_exit(slots: HeldSlots) -> None:
    """Have ``slots`` given back when this process exits normally (its
    interpreter's exit, and a multiprocessing worker's, which skips ``atexit``), so a
    short-lived process never leaves slots to their lease's expiry."""
    _HOLDING.add(slots)
    pid = os.getpid()
    if _HOOKED[0] == pid:
        return
    _HOOKED[0] = pid
    atexit.register(_release_everything)
    import multiprocessing.util  # a worker process ends through its exit function

    multiprocessing.util.Finalize(None, _release_everything, exitpriority=100)


def _release_everything() -> None:
    for slots in list(_HOLDING):
        slots.release_all()
