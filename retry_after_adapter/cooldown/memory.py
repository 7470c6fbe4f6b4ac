"""A thread-safe in-process cooldown store."""

from __future__ import annotations

import bisect
import collections
import heapq
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from .. import _forksafe
from ._memory_log import (  # time in microseconds, and what the store's records say
    _ADMITTED,
    _EPOCH,
    _US,
    _allowance_ended,
    _allowance_holds,
    _as_datetime,
    _cooldown_holds,
    _expire,
    _freshness_ended,
    _lease_holds,
    _leases_ended,
    _micros,
    _move_permit,
    _open,
    _permit_free_at,
    _permits_ended,
    _quota_holds,
    _quota_key,
    _rate_holds,
    _sweep,
    _token_holds,
)
from ._memory_rate import RateAdmission
from ._memory_weights import TokenLogs
from .allowance import ALLOWANCE_KEPT, Allowance, admit_allowance, admit_more, merge_allowance
from .base import (
    Admission,
    Ask,
    Hold,
    InProcess,
    Learn,
    Lease,
    LeaseRenewal,
    PartwiseStore,
    Weigh,
    Weighed,
    Weights,
    assembled,
    check_scope,
    check_until,
    extra_permits,
    token_scope,
)
from .freshness import FRESHNESS_KEPT, Freshness, check_outcome, merge_note
from .rate import Rate
from .weights import too_large

#: Expired entries are dropped only while the store holds at least this many scopes, so
#: a small store never forgets a time (tests on a fake clock keep theirs).
_EXPIRE_AT = 4096
#: At most this many heap entries are looked at per ``extend``: expiry is spread over
#: the writes, never one long pause under the lock.
_EXPIRE_PER_EXTEND = 64
#: A scope's other records (quota permits, concurrency leases, an announced allowance,
#: freshness) are dropped once they can no longer matter, but only while the store
#: keeps that kind of record for more than this many scopes: a small store forgets
#: nothing (tests on a fake clock keep theirs), a large one stays as small as the
#: scopes that still matter.
_SWEEP_AT = 1024
#: At most this many scopes are looked at per write of a kind of record (see ``_sweep``),
#: each in O(1): never a scan of the store.
_SWEEP_PER_WRITE = 4

_FRESHNESS_KEPT = timedelta(seconds=FRESHNESS_KEPT)
_ALLOWANCE_KEPT = timedelta(seconds=ALLOWANCE_KEPT)


class MemoryCooldownStore(RateAdmission, PartwiseStore, Weights, LeaseRenewal, InProcess):
    """Cooldowns shared by every thread of one process.

    ``get`` is one dict lookup, without the lock (a single dict read is atomic).
    ``extend`` takes the lock for a dict write and a heap push: O(log n) in the number
    of scopes. Entries are expired from the heap's top, a few per ``extend``, once the
    store holds more than a few thousand scopes, so memory stays bounded by the live
    scopes and no call ever scans the whole store. A scope's other records (permits,
    leases, an announced allowance, freshness) go the same way once they can no longer
    matter: a few scopes are looked at per write of each kind, in a store that keeps
    that kind for more than ``_SWEEP_AT`` scopes.
    """

    #: ``rate_answer`` reads what kind of attempt was answered (``LearnedRate.rate_kinds``).
    rate_kinds = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}
        #: (eligible time, scope) of every write; entries a later write replaced are
        #: skipped when they surface.
        self._heap: list[tuple[datetime, str]] = []
        #: Quota permits: per scope and quota (``_quota_key``), when each permit granted
        #: stops counting (microseconds since the epoch, see ``_micros``), soonest first.
        self._permits: dict[str, dict[tuple[int, ...], collections.deque[int]]] = {}
        #: Open permits (see ``Store.admit``'s ``opened``), per scope and quota: the end
        #: each counts until as stored -> when each would end had it been answered in
        #: time (its grant + per + margin), a few per scope (the attempts in flight).
        self._opened: dict[str, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        #: Concurrency leases: per scope, token -> when the lease expires (microseconds).
        self._leases: dict[str, dict[str, int]] = {}
        #: What servers announced, per scope (see ``Allowance``).
        self._allowance: dict[str, Allowance] = {}
        #: Freshness per scope (see ``freshness.Freshness``; next_eligible not kept).
        self._fresh: dict[str, Freshness] = {}
        #: Learned rates per scope (see ``rate.Rate``).
        self._rates: dict[str, Rate] = {}
        #: Token permits of configured token quotas (see ``Weigh``).
        self._tokens = TokenLogs()
        #: The scopes with a record of each kind, in the order they got it, for
        #: ``_sweep`` (a scope written again keeps its place).
        self._permit_scopes: collections.deque[str] = collections.deque()
        self._lease_scopes: collections.deque[str] = collections.deque()
        self._allowance_scopes: collections.deque[str] = collections.deque()
        self._fresh_scopes: collections.deque[str] = collections.deque()
        self._rate_scopes: collections.deque[str] = collections.deque()
        _forksafe.register(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a parent thread may have held it during fork
        # The parent's threads' attempts are not this process's: their slots are free.
        self._leases.clear()
        self._lease_scopes.clear()

    def get(self, scope: str) -> datetime | None:
        return self._until.get(scope)

    def cooldown_reader(self) -> Callable[[str], datetime | None]:
        """The cooldowns' table's own ``get`` (see ``InProcess``): one dict read."""
        return self._until.get

    def extend(self, scope: str, until: datetime) -> datetime:
        check_scope(scope)
        until = check_until(until)
        with self._lock:
            current = self._until.get(scope)
            if current is not None and current >= until:
                return current
            self._put_locked(scope, until)
            return until

    def _permit_refused(
        self, scope: str, key: tuple[int, int, int, timedelta], limit: int, at: int
    ) -> int | None:
        """(Lock held; times in microseconds.) None when a permit of the quota ``key`` is
        free at ``at``, else the earliest time one could be (an open permit counted as
        ending at its grant + per + margin, or at ``at`` + per should its answer come
        now: see ``base.free_at``); permits that expired are dropped (and a few other
        scopes' that all did, in a large store)."""
        if len(self._permit_scopes) > _SWEEP_AT:
            _sweep(self._permit_scopes, self._permits, _permits_ended, at, _SWEEP_PER_WRITE)
        logs = self._permits.get(scope)
        if logs is None:
            check_scope(scope)  # a scope new to the store: checked once
            logs = self._permits[scope] = {}
            self._permit_scopes.append(scope)
            self._opened.pop(scope, None)  # of permits swept with the scope's
        log = logs.get(key[:2])  # one log per quota (limit, per), whatever each margin
        if log is None:
            log = logs[key[:2]] = collections.deque()
        while log and log[0] <= at:
            log.popleft()
        opened = self._opened.get(scope, {}).get(key[:2]) if self._opened else None
        if opened or len(log) >= limit:
            return _permit_free_at(log, opened, limit, at, key[1])
        return None  # (the usual case: no open permit, one free)

    def _take_permit(
        self, scope: str, key: tuple[int, int, int, timedelta], expires: int, expected: int = 0
    ) -> None:
        """(Lock held; times in microseconds.) Take a permit of the quota ``key`` that
        counts until ``expires``; ``expected`` > 0: an open one, that would have ended
        then had its answer come in time."""
        logs = self._permits.get(scope)
        if logs is None:  # dropped since ``_permit_refused`` looked (another scope's write)
            logs = self._permits[scope] = {}
            self._permit_scopes.append(scope)
        log = logs.get(key[:2])
        if log is None:
            log = logs[key[:2]] = collections.deque()
        if not log or expires >= log[-1]:
            log.append(expires)  # the usual order: no search
        else:
            bisect.insort(log, expires)  # a permit of a smaller margin
        if expected:
            opened = self._opened.setdefault(scope, {}).setdefault(key[:2], {})
            opened.setdefault(expires, []).append(expected)

    def _take_slot(self, scope: str, lease: Lease, at: int) -> int | None:
        """(Lock held; times in microseconds.) Take one of ``lease``'s slots at ``at``
        for its ttl (None), or say when the earliest lease expires (nothing taken).
        Expired leases (a killed worker's) are dropped when every slot looks held (and
        a few other scopes' that all expired, in a large store)."""
        slots, ttl, token = lease.slots, lease.ttl, lease.token
        if len(self._lease_scopes) > _SWEEP_AT:
            _sweep(self._lease_scopes, self._leases, _leases_ended, at, _SWEEP_PER_WRITE)
        held = self._leases.get(scope)
        if held is None:
            check_scope(scope)  # a scope new to the store: checked once
            held = self._leases[scope] = {}
            self._lease_scopes.append(scope)
        if len(held) >= slots:
            for key, expires in list(held.items()):  # a copy: release() pops without the lock
                if expires <= at:
                    held.pop(key, None)
            if len(held) >= slots:
                return min(held.values(), default=at)
        # The lease's end need not be exact to the microsecond: no cached conversion.
        held[token] = at + round(ttl * 1_000_000)
        return None

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        """Record that the server allows ``remaining`` more requests of ``scope`` until
        ``until`` (``limit`` per ``window`` seconds when it said so), in answer to the
        attempt admitted as ``seq`` (see ``allowance.merge_allowance``)."""
        check_scope(scope)
        until = check_until(until)
        now = check_until(now)
        with self._lock:
            if len(self._allowance_scopes) > _SWEEP_AT:
                stale = now - _ALLOWANCE_KEPT
                _sweep(self._allowance_scopes, self._allowance, _allowance_ended, stale, _SWEEP_PER_WRITE)
            current = self._allowance.get(scope)
            merged = merge_allowance(current, remaining, until, now, seq, limit, window)
            if merged is not None:
                if current is None:
                    self._allowance_scopes.append(scope)
                self._allowance[scope] = merged

    def allowances(self, now: datetime) -> dict[str, Allowance]:
        """Every announced allowance whose reset is still ahead at ``now`` (an aware UTC
        datetime), by scope (a token allowance under its ``#tokens`` scope)."""
        with self._lock:
            return {scope: record for scope, record in self._allowance.items() if record.until > now}

    def admit(self, ask: Ask) -> Admission:
        """Admission for one attempt at ``now`` (None: the present, read once the lock
        is held, so a permit's time is when it is granted), atomically and all or
        nothing: the scope's cooldown, what the server announced is left, a quota permit
        (``limit`` per ``per`` seconds, when given) and a concurrency slot (``lease`` =
        (slots, ttl seconds, token), when given). See :class:`~.base.Admission`.

        A permit counts for ``per + margin`` seconds from its grant (``margin``: the
        time from admission to the server's arrival). Each quota (``limit`` per
        ``per``) has its own log, so two quotas on one scope each hold; a permit keeps
        its own expiry, so workers with different margins never drop each other's.
        ``batch`` and ``hold``: extra permits; ``opened``: an open permit; ``learn``: the
        learned rate, see ``Store.admit``."""
        scope, now, limit, lease, learn = ask.scope, ask.now, ask.limit, ask.lease, ask.learn
        weigh = ask.weigh
        if limit is None and lease is None and weigh is None and scope not in self._allowance and (
            learn is None or _open(self._rates.get(scope))
        ):
            # Nothing to take (the common case): as lock-free as ``get``.
            cooldown = self._until.get(scope)
            if cooldown is None:
                return _ADMITTED
            if now is None:
                now = datetime.now(timezone.utc)
            return Admission(cooldown=cooldown, not_before=cooldown if cooldown > now else None)
        if type(scope) is not str:
            check_scope(scope)  # raises (a str's length is checked when first stored)
        if now is not None:
            _micros(now)  # checked before the lock: a naive time raises here
        with self._lock:
            if now is None:
                now = datetime.now(timezone.utc)  # the grant's time: the lock is ours
            cooldown = self._until.get(scope)
            if cooldown is not None and cooldown > now:
                return Admission(cooldown=cooldown, not_before=cooldown)
            return self._admit_locked(
                scope, now, cooldown, limit, ask.per, lease, ask.margin, ask.batch, ask.hold, learn,
                ask.opened, weigh,
            )

    def _admit_locked(
        self, scope: str, now: datetime, cooldown: datetime | None, limit: int | None,
        per: float | None, lease: Lease | None, margin: float, batch: int = 1, hold: float = 0.0,
        learn: Learn | None = None, opened: float = 0.0, weigh: Weigh | None = None,
    ) -> Admission:
        """(Lock held, no cooldown running.) The allowance, the tokens, the permit and
        the slot: refused (nothing taken) while the announced allowance is used up, the
        attempt's tokens do not fit, or a permit or a slot is not free; by the learned
        rate when it governs; else granted."""
        at = (now - _EPOCH) // _US
        record = self._allowance.get(scope)
        rolled = None
        if record is not None:
            rolled, wait = admit_allowance(record, now)
            if wait is not None:
                self._allowance[scope] = rolled
                return Admission(cooldown=cooldown, not_before=wait)
        tokens = None
        if weigh is not None:
            tokens, wait = self._tokens.weigh(self._allowance, scope, weigh, now, at)
            if wait is not None:
                if tokens is None:
                    return Admission(cooldown=cooldown, not_before=wait)
                return too_large(cooldown, tokens, now)
        if learn is not None and limit is None and record is None and tokens is None:
            return self._admit_rate(scope, now, at, cooldown, lease, learn)
        key = None if limit is None else _quota_key(limit, per, margin + opened)
        refused = self._refused(scope, key, limit, lease, at, cooldown)
        if refused is not None:
            return refused
        # An open permit: when it would stop counting had its answer come in time.
        expected = at + _quota_key(limit, per, margin)[2] if limit is not None and opened > 0 else 0
        answer = self._grant_locked(scope, now, at, cooldown, rolled, key, limit, expected, batch, hold)
        if tokens is None or weigh is None:
            return answer
        return self._tokens.grant(self._allowance, scope, weigh, at, tokens, answer)

    def _grant_locked(
        self, scope: str, now: datetime, at: int, cooldown: datetime | None, rolled: Allowance | None,
        key: tuple[int, int, int, timedelta] | None, limit: int | None, expected: int, batch: int,
        hold: float,
    ) -> Admission:
        """(Lock held, nothing refused; ``at``: ``now`` in microseconds.) The grant: the
        announced allowance ``rolled`` counts one admission (up to ``batch``), the quota
        ``key`` a permit (``expected``: see ``_take_permit``) and up to ``batch - 1``
        extra ones, held ``hold`` seconds longer."""
        seq = None
        units = 0
        if rolled is not None:
            seq = rolled.admitted - 1
            rolled, units = admit_more(rolled, now, batch)
            self._allowance[scope] = rolled
        if key is not None:
            self._take_permit(scope, key, at + key[2], expected)
            extra = 0
            if batch > 1 and limit is not None:
                log = self._permits[scope][key[:2]]
                extra = extra_permits(batch, limit - len(log) + 1, limit)
                later = at + key[2] + round(hold * 1_000_000)
                # Open too when this one is: each settled by its own answer, or given back.
                later_expected = expected + round(hold * 1_000_000) if expected else 0
                for _ in range(extra):
                    self._take_permit(scope, key, later, later_expected)
            until = rolled.until if units and rolled is not None else None
            # now + key[3]: the same instant as at + key[2]
            # (built whole, see ``assembled``: every grant of a quota makes one)
            fields = {"cooldown": cooldown, "not_before": None, "seq": seq, "permit": now + key[3]}
            fields["extra"], fields["units"], fields["units_until"] = extra, units, until
            return assembled(Admission, fields)
        if units:
            assert rolled is not None
            return Admission(
                cooldown=cooldown, not_before=None, seq=seq, units=units, units_until=rolled.until
            )
        if seq is None:
            return _ADMITTED if cooldown is None else Admission(cooldown=cooldown, not_before=None)
        return Admission(cooldown=cooldown, not_before=None, seq=seq)

    def _refused(
        self, scope: str, key: tuple[int, int, int, timedelta] | None, limit: int | None,
        lease: Lease | None, at: int, cooldown: datetime | None,
    ) -> Admission | None:
        """(Lock held; ``at`` in microseconds.) None when a permit of the quota ``key``
        (None: none asked) is free and the slot of ``lease`` (None: none) is taken, else
        the refusal (nothing taken)."""
        if key is not None and limit is not None:
            refused = self._permit_refused(scope, key, limit, at)
            if refused is not None:
                return Admission(cooldown=cooldown, not_before=_as_datetime(refused))
        if lease is not None:
            busy = self._take_slot(scope, lease, at)
            if busy is not None:
                return Admission(cooldown=cooldown, not_before=_as_datetime(busy), slot_busy=True)
        return None

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        """The attempt that took the permit of ``limit`` per ``per`` seconds stopping at
        ``expires`` was answered at ``now`` (None: the present): it reached the server by
        then, so the permit counts at least until ``now + per`` (put back if it expired
        meanwhile, or was dropped since, as the SQLite and Redis stores do); ``exact``:
        until then exactly, earlier than ``expires`` too (see ``Store.settle``)."""
        key = _quota_key(limit, per, 0.0)
        old = _micros(expires)
        with self._lock:
            at = _micros(now if now is not None else datetime.now(timezone.utc))
            new = at + key[1]
            opened = self._opened.get(scope, {}).get(key[:2])
            if opened and old in opened:  # answered: open no more
                opened[old].pop()
                if not opened[old]:
                    del opened[old]
            if new == old or (new < old and not exact):
                return  # the stored end already covers the answer
            logs = self._permits.get(scope)
            if logs is None:  # every permit of the scope expired and was dropped
                check_scope(scope)
                logs = self._permits[scope] = {}
                self._permit_scopes.append(scope)
            _move_permit(logs.setdefault(key[:2], collections.deque()), old, new)

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        """See ``Weights.settle_weighed``."""
        old = _micros(weighed.expires)
        with self._lock:
            at = _micros(now if now is not None else datetime.now(timezone.utc))
            self._tokens.settle(scope, weighed, old, at)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class of ``scope`` at ``at`` (later wins)."""
        check_scope(scope)
        check_outcome(outcome)
        at = check_until(at)
        with self._lock:
            if len(self._fresh_scopes) > _SWEEP_AT:
                stale = at - _FRESHNESS_KEPT
                _sweep(self._fresh_scopes, self._fresh, _freshness_ended, stale, _SWEEP_PER_WRITE)
            current = self._fresh.get(scope)
            if current is None:
                self._fresh_scopes.append(scope)
            self._fresh[scope] = merge_note(current, outcome, at)

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

    def release(self, scope: str, token: str) -> None:
        """Give ``token``'s slot of ``scope`` back (nothing if it expired meanwhile).
        Without the lock: one ``dict.pop`` is atomic, and a slot given back early is
        never one too many (``_take_slot`` scans a copy)."""
        held = self._leases.get(scope)
        if held is not None:
            held.pop(token, None)

    def renew(
        self, leases: Sequence[tuple[str, str, datetime]], now: datetime | None = None, exact: bool = False
    ) -> set[str]:
        """Move held leases later, or (``exact``) to the end given (see
        ``LeaseRenewal.renew``): one lock."""
        at = _micros(now if now is not None else datetime.now(timezone.utc))
        ends = [(scope, token, _micros(until)) for scope, token, until in leases]
        lost = set()
        with self._lock:
            for scope, token, until in ends:
                held = self._leases.get(scope)
                expires = held.get(token) if held is not None else None
                if held is None or expires is None or expires <= at:
                    lost.add(token)
                elif until > expires or exact:
                    held[token] = until
        return lost

    def renew_open(
        self, permits: Sequence[tuple[str, int, float, datetime, datetime, int]], now: datetime | None = None
    ) -> list[int]:
        """Move open permits' ends later (see ``LeaseRenewal.renew_open``): one lock."""
        at = _micros(now if now is not None else datetime.now(timezone.utc))
        moved = []
        with self._lock:
            for scope, limit, per, end, until, count in permits:
                key = _quota_key(limit, per, 0.0)[:2]
                old, new = _micros(end), _micros(until)
                log = self._permits.get(scope, {}).get(key)
                opened = self._opened.get(scope, {}).get(key)
                done = 0
                while log is not None and done < count and at < old < new:
                    index = bisect.bisect_left(log, old)
                    if index >= len(log) or log[index] != old:
                        break
                    del log[index]
                    bisect.insort(log, new)
                    if opened and opened.get(old):
                        opened.setdefault(new, []).append(opened[old].pop())
                        if not opened[old]:
                            del opened[old]
                    done += 1
                moved.append(done)
        return moved

    def entries(self) -> dict[str, datetime]:
        """A copy of every stored scope and its time (expired ones not yet dropped
        included)."""
        with self._lock:
            return dict(self._until)

    def clear(self) -> None:
        """Forget every cooldown and everything else kept (tests, and an operator lifting
        them), learned rates included."""
        with self._lock:
            self._until.clear()
            self._heap.clear()
            self._permits.clear()
            self._opened.clear()
            self._leases.clear()
            self._allowance.clear()
            self._fresh.clear()
            self._permit_scopes.clear()
            self._lease_scopes.clear()
            self._allowance_scopes.clear()
            self._fresh_scopes.clear()
            self._rates.clear()
            self._rate_scopes.clear()
            self._tokens.clear()

    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back (an operator clearing it): its
        cooldown, announced allowance, quota permits and concurrency leases; True if
        there was any of them."""
        with self._lock:
            found = [
                self._until.pop(scope, None),
                self._allowance.pop(scope, None),
                self._permits.pop(scope, None),
                self._allowance.pop(token_scope(scope), None),
                self._tokens.delete(scope) or None,
                self._opened.pop(scope, None) and None,
                self._leases.pop(scope, None),
                self._rates.pop(scope, None),
            ]
        return any(value is not None for value in found)

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        """Every scope held back at ``now`` (default: the present) and by what (see
        :class:`~.base.Hold`): its cooldown, an announced allowance used up, a quota
        whose permits are all taken, its concurrency leases."""
        now = now if now is not None else datetime.now(timezone.utc)
        at = _micros(now)
        found: dict[str, list[Hold]] = {}
        with self._lock:
            for scope, hold in (
                *_cooldown_holds(self._until, now),
                *_allowance_holds(self._allowance, now),
                *_quota_holds(self._permits, at),
                *_lease_holds(self._leases, at),
                *_rate_holds(self._rates, at),
                *_token_holds(self._tokens.holds(at)),
            ):
                found.setdefault(scope, []).append(hold)
        return found

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
            _expire(heap, self._until, datetime.now(timezone.utc), _EXPIRE_PER_EXTEND)
        if len(heap) > 4 * len(self._until) + _EXPIRE_AT:
            # Mostly replaced entries (one scope written many times): rebuilding costs
            # O(n) once per 3n writes, O(1) amortized.
            self._heap = [(value, key) for key, value in self._until.items()]
            heapq.heapify(self._heap)

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
