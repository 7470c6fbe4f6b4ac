"""A thread-safe in-process cooldown store.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _forksafe
from ..errors import ConfigurationError
from .allowance import ALLOWANCE_KEPT, Allowance, admit_allowance, admit_more, merge_allowance, roll
from .base import (
    PACE_UNDER,
    RECHECK,
    Admission,
    Ask,
    Hold,
    InProcess,
    Learn,
    Lease,
    LeaseRenewal,
    Mark,
    PartwiseStore,
    Reservations,
    Weigh,
    Weighed,
    Weights,
    assembled,
    check_scope,
    check_until,
    extra_permits,
    free_in,
    holder_ends,
    paced,
    placing_ends,
    settled_mark,
    token_scope,
)
from .freshness import FRESHNESS_KEPT, Freshness, check_outcome, last_noted, merge_note
from .rate import PROBE_RECHECK, Rate, answer_rate, fresh_rate, rate_holds, rate_kept_until, roll_rate
from .weights import NO_ALLOWANCE, check_fits, oversized, too_large, weighed_free_at, with_weighed

# ------------------------------------------------------------------------------------
# The memory store's units and records, as pure functions: times in whole
# microseconds since the epoch, when a kind of record can no longer matter, a quota's
# log key and when its next permit is free, the answers admission gives.


#: The answer of ``admit`` with nothing stored and nothing to take (shared: immutable).
_ADMITTED = Admission(cooldown=None, not_before=None)

_R = TypeVar("_R")
_T = TypeVar("_T")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def _micros(at: datetime) -> int:
    """``at`` (an aware datetime) as whole microseconds since the epoch: exact, since a
    datetime holds microseconds; permits and leases are kept so (cheap to compare)."""
    try:
        return (at - _EPOCH) // _US
    except TypeError:  # naive, or not a datetime
        check_until(at)
        raise


def _as_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _permits_ended(logs: dict[tuple[int, ...], collections.deque[int]], at: int) -> bool:
    """Whether a scope's permit logs hold no permit that counts at ``at`` (each log is
    sorted: its last permit stops counting last)."""
    for log in logs.values():  # noqa: SIM110 - a loop: no generator made per look
        if log and log[-1] > at:
            return False
    return True


def _leases_ended(held: dict[str, int], at: int) -> bool:
    """Whether a scope holds no lease that runs at ``at`` (a copy of the values:
    ``release`` pops without the lock)."""
    return max(list(held.values()), default=at) <= at


def _allowance_ended(record: Allowance, stale: datetime) -> bool:
    """Whether an allowance's reset is at or before ``stale`` (the present less
    ``ALLOWANCE_KEPT``): what it counted is over."""
    return record.until <= stale


def _rate_ended(record: Rate, now: float) -> bool:
    """Whether a learned rate was unused long enough to be dropped at ``now`` (seconds
    since the epoch; see ``rate.rate_kept_until``)."""
    return rate_kept_until(record) <= now


def _freshness_ended(record: Freshness, stale: datetime) -> bool:
    """Whether a freshness record was last noted at or before ``stale`` (the present
    less ``FRESHNESS_KEPT``): news no longer."""
    noted = last_noted(record)
    return noted is None or noted <= stale


def _drop_one(marks: dict[int, list[Mark]], end: int, mark: Mark) -> None:
    """Drop one reservation's mark stored to end at ``end`` (see ``_marks``)."""
    found = marks[end]
    found.remove(mark)
    if not found:
        del marks[end]


def _permit_free_at(
    log: Sequence[int], opened: dict[int, list[int]] | None, limit: int, at: int, per: int
) -> int | None:
    """None when a permit of a quota of ``limit`` per ``per`` is free at ``at``, else the
    earliest time one could be, by the quota's ``log`` (when each permit stops counting,
    soonest first, those that stopped at ``at`` already dropped) and its ``opened``
    permits (see ``MemoryCooldownStore._opened``; an open permit counted as ending at its
    grant + per + margin, or at ``at`` + ``per`` should its answer come now: see
    ``base.free_at``); every time in microseconds. Open permits that ran out at ``at``
    are dropped."""
    if opened:
        for end in [end for end in opened if end <= at]:
            del opened[end]  # never answered (its worker stopped): it ran out
    return free_in(log, opened or {}, limit, at + per)


def _move_permit(log: collections.deque[int], old: int, new: int) -> None:
    """Move the permit of ``log`` (sorted) that stops counting at ``old`` to ``new``
    (microseconds), or put it back at ``new`` if it expired (and was dropped)
    meanwhile."""
    index = bisect.bisect_left(log, old)
    if index < len(log) and log[index] == old:
        del log[index]
    bisect.insort(log, new)


#: ``_window_micros`` of the windows seen (a few per process).
_WINDOWS: dict[float, int] = {}
#: ``_quota_key`` of the quotas seen (a few per process).
_QUOTAS: dict[tuple[int, float, float], tuple[int, int, int, timedelta]] = {}


def _quota_key(limit: int, per: float | None, margin: float) -> tuple[int, int, int, timedelta]:
    """A quota's log key ``(limit, per)`` (``key[:2]``), how long its permits count
    (``per + margin``) in whole microseconds, and that as a timedelta."""
    try:
        return _QUOTAS[(limit, per, margin)]  # type: ignore[index]
    except (KeyError, TypeError):
        pass
    if per is None:
        raise ConfigurationError("a quota needs a window (per)")
    per_us = _window_micros(per)
    counts = per_us + _window_micros(margin)
    key = (limit, per_us, counts, timedelta(microseconds=counts))
    if len(_QUOTAS) >= 1024:
        _QUOTAS.clear()
    _QUOTAS[(limit, per, margin)] = key
    return key


def _window_micros(per: float) -> int:
    """``per`` seconds in whole microseconds (as ``timedelta(seconds=per)`` rounds)."""
    try:
        return _WINDOWS[per]
    except (KeyError, TypeError):
        pass
    try:
        micros = timedelta(seconds=per) // _US
    except (TypeError, OverflowError, ValueError):
        raise ConfigurationError("a window must be a number of seconds") from None
    if len(_WINDOWS) >= 1024:
        _WINDOWS.clear()
    _WINDOWS[per] = micros
    return micros


#: ``base.RECHECK`` in microseconds.
_RECHECK_US = round(RECHECK * 1_000_000)
_PACE_UNDER_US = round(PACE_UNDER * 1_000_000)
#: ``rate.PROBE_RECHECK`` in microseconds.
_PROBE_RECHECK_US = round(PROBE_RECHECK * 1_000_000)


def _granted(cooldown: datetime | None) -> Admission:
    """Admitted, nothing to report (a cooldown that ran out may be known)."""
    return _ADMITTED if cooldown is None else Admission(cooldown=cooldown, not_before=None)


def _open(rate: Rate | None) -> bool:
    """Whether a learned rate admits without taking anything (no cap, no limit: ``Rate.open``,
    inline on the common path)."""
    return rate is not None and rate.cap <= 0 and rate.limit <= 0


# What holds each scope back, per kind of record (``now`` aware, ``at`` the same
# instant in microseconds; the store's lock held by the caller).
def _cooldown_holds(until: dict[str, datetime], now: datetime) -> Iterator[tuple[str, Hold]]:
    for scope, end in until.items():
        if end > now:
            yield scope, Hold("cooldown", end)


def _allowance_holds(allowances: dict[str, Allowance], now: datetime) -> Iterator[tuple[str, Hold]]:
    for scope, record in allowances.items():
        rolled = roll(record, now)
        if rolled.until > now and rolled.remaining <= 0:
            yield scope, Hold("allowance", rolled.until)


def _quota_holds(
    permits: dict[str, dict[tuple[int, ...], collections.deque[int]]], at: int
) -> Iterator[tuple[str, Hold]]:
    for scope, logs in permits.items():
        for (limit, *_), log in logs.items():
            live = [expires for expires in log if expires > at]
            if len(live) >= limit:
                yield scope, Hold("quota", _as_datetime(live[len(live) - limit]), limit)


def _lease_holds(leases: dict[str, dict[str, int]], at: int) -> Iterator[tuple[str, Hold]]:
    for scope, held in leases.items():
        live = [expires for expires in list(held.values()) if expires > at]
        if live:
            yield scope, Hold("leases", _as_datetime(max(live)), len(live))


def _token_holds(found: list[tuple[str, int, int]]) -> Iterator[tuple[str, Hold]]:
    for scope, end, limit in found:
        yield scope, Hold("tokens", _as_datetime(end), limit)


def _rate_holds(rates: dict[str, Rate], at: int) -> Iterator[tuple[str, Hold]]:
    for scope, rate in rates.items():
        ends = rate_holds(rate, at / 1e6)
        if ends is not None:
            yield scope, Hold("rate", _as_datetime(round(ends * 1e6)), rate.limit)


def _sweep(
    scopes: collections.deque[str],
    records: dict[str, _R],
    ended: Callable[[_R, _T], bool],
    at: _T,
    most: int,
) -> None:
    """(Lock held.) Drop the records of the scopes longest in ``scopes`` (every scope
    with a record in ``records``, in the order they got one) that ``ended`` says can no
    longer matter at ``at``, at most ``most`` of them (the store's ``_SWEEP_PER_WRITE``), up to the first that
    still matters: that one goes to the end of the queue. A write that adds one scope thus
    removes one (or more) that no longer matter or moves one that does, so the queue
    stays under twice the scopes that matter; and while every record matters (a young
    store), it costs one look. A scope gone meanwhile (``delete``) leaves the queue."""
    for _ in range(most):
        scope = scopes.popleft()
        record = records.get(scope)
        if record is None:
            continue
        if not ended(record, at):
            scopes.append(scope)
            return
        del records[scope]


def _expire(heap: list[tuple[datetime, str]], until: dict[str, datetime], now: datetime, most: int) -> None:
    """(Lock held.) Drop the cooldowns ``until`` holds that ended at ``now`` (an aware
    datetime), found from the top of ``heap`` (``(eligible time, scope)`` of every write),
    at most ``most`` heap entries looked at; an entry a later write replaced is skipped."""
    for _ in range(most):
        if not heap or heap[0][0] > now:
            return
        when, scope = heapq.heappop(heap)
        if until.get(scope) == when:
            del until[scope]

# ------------------------------------------------------------------------------------
# The memory store's admission by a scope's learned rate (see ``rate``): a mixin of
# :class:`~.memory.MemoryCooldownStore`, whose lock every ``_locked`` method runs
# under; times in whole microseconds since the epoch (``at``).


class RateAdmission:
    """What the memory store admits by, and tells, a scope's learned rate."""

    _lock: threading.Lock
    _rates: dict[str, Rate]
    _rate_scopes: collections.deque[str]

    if TYPE_CHECKING:  # the store's own

        def _refused(
            self, scope: str, key: tuple[int, int, int, timedelta] | None, limit: int | None,
            lease: Lease | None, at: int, cooldown: datetime | None,
        ) -> Admission | None: ...

        def _take_slot(self, scope: str, lease: Lease, at: int) -> int | None: ...

    def _admit_rate(
        self, scope: str, now: datetime, at: int, cooldown: datetime | None, lease: Lease | None,
        learn: Learn,
    ) -> Admission:
        """(Lock held, no cooldown running, no quota, no allowance.) Admission by the
        scope's learned rate (see ``rate``): a known send (one of its limit in the
        epoch; with probes to come, holding a probe slot until its answer), else a probe
        (a slot of its cap, every known send's answered), else refused."""
        rate = self._rate_locked(scope, at / 1e6)
        start = round(rate.start * 1e6)
        if start > at:  # a throttle's backoff
            return Admission(cooldown=cooldown, not_before=_as_datetime(start), by_rate=True)
        if rate.open or rate.known:
            refused = self._refused(scope, None, None, lease, at, cooldown)
            if refused is not None or rate.open:
                return refused or _granted(cooldown)  # (refused: every configured slot held)
            self._rates[scope] = rate.sending()
            if lease is None and rate.waits_for_known:
                # Probes follow in this epoch: this send holds a probe slot (never
                # refused for it) until its answer, so no probe races it to the server.
                self._take_slot(scope, Lease(slots=sys.maxsize, ttl=learn.ttl, token=learn.token), at)
                return Admission(cooldown=cooldown, not_before=None, token=learn.token, rate_epoch=rate.epoch)
            return Admission(cooldown=cooldown, not_before=None, rate_epoch=rate.epoch)
        ends = round(rate.ends * 1e6) if rate.limit > 0 else None
        if not rate.probes:
            assert ends is not None
            return Admission(cooldown=cooldown, not_before=_as_datetime(ends), by_rate=True)
        return self._probe_locked(scope, at, cooldown, lease, learn, rate, ends)

    def _probe_locked(
        self, scope: str, at: int, cooldown: datetime | None, lease: Lease | None, learn: Learn,
        rate: Rate, ends: int | None,
    ) -> Admission:
        """(Lock held; ``at``, ``ends`` (the epoch's end, None: no limit) in microseconds.)
        A probe of the learned ``rate``: a slot under its cap (with a configured
        ``lease``, the smaller), else held back at most ``PROBE_RECHECK`` seconds."""
        if lease is not None:
            cap = Lease(slots=min(lease.slots, rate.cap), ttl=lease.ttl, token=lease.token)
        else:
            cap = Lease(slots=rate.cap, ttl=learn.ttl, token=learn.token)
        busy = self._take_slot(scope, cap, at)
        if busy is not None and lease is not None and lease.slots <= rate.cap:
            # the configured cap binds
            return Admission(cooldown=cooldown, not_before=_as_datetime(busy), slot_busy=True)
        if busy is not None:
            again = min(busy, at + _PROBE_RECHECK_US, ends if ends is not None else busy)
            return Admission(cooldown=cooldown, not_before=_as_datetime(again), slot_busy=True, by_rate=True)
        self._rates[scope] = rate.probing()
        token = cap.token if lease is None else None
        return Admission(
            cooldown=cooldown, not_before=None, token=token, rate_epoch=rate.epoch, rate_report=True
        )

    def _rate_locked(self, scope: str, now: float) -> Rate:
        """(Lock held.) The scope's learned rate as of ``now`` (seconds since the epoch),
        made at its first admission; kept."""
        rate = self._rates.get(scope)
        if rate is None:
            if len(self._rate_scopes) > _SWEEP_AT:
                _sweep(self._rate_scopes, self._rates, _rate_ended, now, _SWEEP_PER_WRITE)
            rate = fresh_rate(now)
            self._rate_scopes.append(scope)
        else:
            rate = roll_rate(rate, now)
        self._rates[scope] = rate
        return rate

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        """See ``Store.rate_answer``."""
        at = _micros(now) / 1e6
        # The throttle's end in whole milliseconds rounded up, as the other stores keep
        # it: an epoch that begins there (and each a window on) never begins before it.
        end = None if until is None else -(-_micros(until) // 1000) / 1000
        with self._lock:
            rate = self._rates.get(scope)
            if rate is not None:
                self._rates[scope] = answer_rate(rate, epoch, end, at, probe)

    def rate_of(self, scope: str) -> Rate | None:
        """See ``Store.rate_of``."""
        return self._rates.get(scope)

# ------------------------------------------------------------------------------------
# The memory store's token permits (a configured ``Quota(..., unit="tokens")``): per
# scope and quota, a log of ``(end, cost)``, soonest end first, with the sum of its
# costs; times in whole microseconds since the epoch. Every method runs under the
# store's lock.


#: A quota's log key: (limit, per in microseconds).
_Key = tuple[int, int]


class _Log:
    """One token quota's live permits and what they weigh."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: collections.deque[tuple[int, int]] = collections.deque()
        self.total = 0

    def drop(self, at: int) -> None:
        """Drop the permits that stopped counting at ``at``."""
        entries = self.entries
        while entries and entries[0][0] <= at:
            self.total -= entries.popleft()[1]

    def put(self, end: int, cost: int) -> None:
        if not self.entries or end >= self.entries[-1][0]:
            self.entries.append((end, cost))
        else:
            bisect.insort(self.entries, (end, cost))
        self.total += cost

    def remove(self, end: int, cost: int) -> bool:
        index = bisect.bisect_left(self.entries, (end, cost))
        if index < len(self.entries) and self.entries[index] == (end, cost):
            del self.entries[index]
            self.total -= cost
            return True
        return False


class TokenLogs:
    """Every scope's token permits (the lock is the store's)."""

    def __init__(self) -> None:
        self._logs: dict[str, dict[_Key, _Log]] = {}

    @staticmethod
    def _micros(seconds: float) -> int:
        return round(seconds * 1_000_000)

    def _log(self, scope: str, limit: int, per: float) -> _Log:
        logs = self._logs.setdefault(scope, {})
        key = (limit, self._micros(per))
        log = logs.get(key)
        if log is None:
            log = logs[key] = _Log()
        return log

    def refused(self, scope: str, weigh: Weigh, at: int) -> int | None:
        """None when ``weigh``'s cost fits its quota at ``at``, else when it could."""
        log = self._log(scope, weigh.limit, weigh.per)
        log.drop(at)
        end: int | None = weighed_free_at(log.entries, log.total, weigh.cost, weigh.limit)
        return end

    def weigh(
        self, allowances: dict[str, Allowance], scope: str, weigh: Weigh, now: datetime, at: int
    ) -> tuple[Allowance | None, datetime | None]:
        """The attempt's tokens, by the announced token allowances kept in
        ``allowances`` (the store's) and this log: ``(record, None)`` when they fit (the
        announced token allowance with the cost counted, to keep on the grant;
        ``weights.NO_ALLOWANCE`` when only a configured token quota weighs them; None: nothing weighs
        them), else ``(None, when to ask again)``, or ``(the announced allowance, its
        reset)`` when the cost is above its whole limit (``weights.oversized``: never
        admitted, see ``weights.too_large``); nothing taken."""
        record = allowances.get(token_scope(scope))
        counted = None
        if record is not None:
            if oversized(record, weigh.cost):
                return record, record.until
            counted, wait = admit_allowance(record, now, weigh.cost)
            if wait is not None:
                allowances[token_scope(scope)] = counted  # rolled
                return None, wait
        if weigh.limit > 0:
            check_fits(weigh.cost, weigh.limit, weigh.per)
            refused = self.refused(scope, weigh, at)
            if refused is not None:
                return None, _as_datetime(refused)
            return counted or NO_ALLOWANCE, None
        return counted, None

    def grant(
        self, allowances: dict[str, Allowance], scope: str, weigh: Weigh, at: int, counted: Allowance,
        answer: Admission,
    ) -> Admission:
        """The grant ``answer``'s tokens, checked by :meth:`weigh` before anything was
        taken: the announced allowance ``counted`` kept (its count after the cost: what
        an answer's figure holds as of), the token quota's permit taken."""
        seq = None
        if counted is not NO_ALLOWANCE:
            allowances[token_scope(scope)] = counted
            seq = counted.admitted - 1
        end = _as_datetime(self.take(scope, weigh, at)) if weigh.limit > 0 else None
        return with_weighed(answer, end, seq)

    def take(self, scope: str, weigh: Weigh, at: int) -> int:
        """Take ``weigh``'s permit at ``at``; returns when it stops counting."""
        end = at + self._micros(weigh.per + weigh.margin)
        self._log(scope, weigh.limit, weigh.per).put(end, weigh.cost)
        self._sweep(at)
        return end

    def settle(self, scope: str, weighed: Weighed, old: int, at: int) -> None:
        """The permit stopping at ``old`` was answered at ``at``: it counts at least
        until ``at + per`` (put back if it was dropped meanwhile)."""
        new = at + self._micros(weighed.per)
        if new <= old:
            return
        log = self._log(scope, weighed.limit, weighed.per)
        log.remove(old, weighed.cost)
        log.put(new, weighed.cost)

    def _sweep(self, at: int) -> None:
        """Forget a few scopes whose permits all stopped counting (one look per take)."""
        if len(self._logs) > 64:
            scope = next(iter(self._logs))
            logs = self._logs.pop(scope)
            if any(log.entries and log.entries[-1][0] > at for log in logs.values()):
                self._logs[scope] = logs  # still counts: to the back of the queue

    def holds(self, at: int) -> list[tuple[str, int, int]]:
        """``(scope, when the quota has room again, limit)`` of each full token quota."""
        found = []
        for scope, logs in self._logs.items():
            for (limit, _), log in logs.items():
                log.drop(at)
                if log.total >= limit and log.entries:
                    found.append((scope, log.entries[0][0], limit))
        return found

    def delete(self, scope: str) -> bool:
        return self._logs.pop(scope, None) is not None

    def clear(self) -> None:
        self._logs.clear()


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


class MemoryCooldownStore(RateAdmission, PartwiseStore, Weights, LeaseRenewal, Reservations, InProcess):
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
        #: Reservations' marks (see ``base.Reservations``, ``base.Mark``), per scope and
        #: quota: the end each permit is stored to -> the marks of those stored so.
        self._marks: dict[str, dict[tuple[int, ...], dict[int, list[Mark]]]] = {}
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
                if ask.held is not None and limit is not None:  # its place is moot: given back
                    self._give_back_locked(scope, _quota_key(limit, ask.per, 0.0), _micros(ask.held))
                return Admission(cooldown=cooldown, not_before=cooldown)
            if ask.held is not None and limit is not None:
                key = _quota_key(limit, ask.per, 0.0)
                at = (now - _EPOCH) // _US
                by = None if ask.reserve_by is None else _micros(ask.reserve_by)
                span = _quota_key(limit, ask.per, ask.margin + ask.opened)[2]
                expects = _quota_key(limit, ask.per, ask.margin)[2]
                kept = self._kept_locked(
                    scope, key, limit, _micros(ask.held), at, by, span, ask.priority, expects
                )
                if kept is not None:
                    wait, end = kept
                    reserved = None if wait <= at else _as_datetime(wait)
                    permit = ask.held if end is None else _as_datetime(end)
                    return Admission(cooldown=cooldown, not_before=None, permit=permit, reserved=reserved)
            answer = self._admit_locked(
                scope, now, cooldown, limit, ask.per, lease, ask.margin, ask.batch, ask.hold, learn,
                ask.opened, weigh,
            )
            reserve_by = ask.reserve_by
            if answer.not_before is None or reserve_by is None or answer.not_before > reserve_by:
                return answer
            if limit is None or lease is not None or weigh is not None or scope in self._allowance:
                return answer  # refused by more than the quota's permit: no reservation
            per, margin, opened, rank = ask.per, ask.margin, ask.opened, ask.priority
            return self._reserve_locked(scope, now, cooldown, limit, per, margin, opened, reserve_by, rank)

    def _kept_locked(
        self, scope: str, key: tuple[int, int, int, timedelta], limit: int, end: int, at: int,
        by: int | None, span: int, priority: int = 0, expects: int = 0,
    ) -> tuple[int, int | None] | None:
        """(Lock held; times in microseconds.) A reservation's holder of ``priority``
        asks at its time (``Ask.held``: its permit stored to end at ``end``), its permit
        kept: ``(at, new end)`` when it goes now (fewer than ``limit`` others count:
        ``base.holder_ends``), its permit then counting ``span`` from now, as one
        granted now would (it goes later than its place: the server counts it from its
        arrival, not its place), and waiting no more; else ``(when to ask again, None)``
        (the earliest counted could end), if no later than ``by``. Else its permit is
        given back (None; the admission is decided again). Going, an open permit is
        expected to end ``expects`` (per + margin) after ``at``, as one granted then."""
        log = self._permits.get(scope, {}).get(key[:2])
        if not log:
            return None
        while log and log[0] <= at:
            log.popleft()
        opened = self._opened.get(scope, {}).get(key[:2]) or {}
        index = bisect.bisect_left(log, end)
        if index >= len(log) or log[index] != end:
            return None  # (given back or lapsed meanwhile)
        marks = self._marks_of(scope, key, at)
        found = [m for m in marks.get(end, ()) if not m.sent]
        mark = next((m for m in found if m.rank == priority), found[-1]) if found else None
        if mark is not None:
            _drop_one(marks, end, mark)
        pending = {stored: list(ends) for stored, ends in opened.items() if stored > at}
        mine = pending.get(end)
        expected = mine.pop() if mine else end
        others = [stored for i, stored in enumerate(log) if i != index]
        own = mark or Mark(priority, end - span)
        copies = {stored: list(ms) for stored, ms in marks.items()}
        ends = holder_ends(others, pending, copies, own, expected, at, key[1], at + _RECHECK_US)
        if len(ends) < limit:
            new_end = self._restamped(scope, key, log, index, end, at + span, at + (expects or span))
            marks.setdefault(new_end, []).append(own._replace(sent=True))  # sent from its place
            return at, new_end
        ends.sort()
        wait = ends[len(ends) - limit]
        if by is None or wait <= by:
            if mark is not None:
                marks.setdefault(end, []).append(mark)  # still waiting
            return wait, None
        self._give_back_locked(scope, key, end, mark=False)  # (its mark: dropped above)
        return None

    def _give_back_locked(self, scope: str, key: tuple[Any, ...], end: int, mark: bool = True) -> None:
        """(Lock held; ``end`` in microseconds.) A reservation stored to end at ``end``
        is given back: one permit with that end goes, with its open entry and (``mark``)
        one waiting mark with that end."""
        log = self._permits.get(scope, {}).get(key[:2])
        if log:
            index = bisect.bisect_left(log, end)
            if index < len(log) and log[index] == end:
                del log[index]
        opened = self._opened.get(scope, {}).get(key[:2])
        if opened and opened.get(end):
            opened[end].pop()
            if not opened[end]:
                del opened[end]
        marks = self._marks.get(scope, {}).get(key[:2]) if mark else None
        waiting = [m for m in marks.get(end, ()) if not m.sent] if marks else []
        if marks and waiting:
            _drop_one(marks, end, waiting[-1])

    def _marks_of(self, scope: str, key: tuple[Any, ...], at: int) -> dict[int, list[Mark]]:
        """(Lock held; ``at`` in microseconds.) The quota's reservations' marks (see
        ``_marks``), those stored to end by ``at`` dropped (their permits did)."""
        marks = self._marks.setdefault(scope, {}).setdefault(key[:2], {})
        for stored in [stored for stored in marks if stored <= at]:
            del marks[stored]
        return marks

    def _restamped(
        self, scope: str, key: tuple[int, int, int, timedelta], log: collections.deque[int], index: int,
        end: int, new_end: int, new_expected: int,
    ) -> int:
        """(Lock held; times in microseconds.) The held permit stored to end at ``end``
        (``log[index]``) counts until ``new_end`` if that is later, and an open one is
        expected to end at ``new_expected`` if that is later (not moved as much as its
        stored end: the holder's ask may keep it open longer or shorter than the
        reservation did, a batch's OPEN_LIFE against an attempt's OPEN_FOR): its end now."""
        opened = self._opened.get(scope, {}).get(key[:2])
        own = opened.get(end) if opened else None
        if new_end <= end:
            if own:
                own[-1] = max(own[-1], new_expected)
            return end
        del log[index]
        bisect.insort(log, new_end)
        if opened and own:
            expected = own.pop()
            if not own:
                del opened[end]
            opened.setdefault(new_end, []).append(max(expected, new_expected))
        return new_end

    def _reserve_locked(
        self, scope: str, now: datetime, cooldown: datetime | None, limit: int, per: float | None,
        margin: float, opened: float, reserve_by: datetime, priority: int = 0,
    ) -> Admission:
        """(Lock held, no cooldown running, a quota permit alone asked for and refused
        now.) A reservation of ``priority`` at the earliest time a permit is free,
        counting no waiting reservation of a lower priority (granted now when that is
        now), if that is no later than ``reserve_by``, else the refusal until then (see
        :class:`~.base.Reservations`)."""
        at = (now - _EPOCH) // _US
        key = _quota_key(limit, per, margin + opened)
        start = self._permit_refused(scope, key, limit, at)
        marks = self._marks_of(scope, key, at)
        if marks and start is not None:
            log = self._permits[scope][key[:2]]
            counted, out = placing_ends(log, marks, priority, at)
            if out:
                opens = self._opened.get(scope, {}).get(key[:2]) or {}
                open_ends = {end: list(ends) for end, ends in opens.items()}
                for end in out:
                    if open_ends.get(end):
                        open_ends[end].pop()
                start = _permit_free_at(counted, open_ends, limit, at, key[1])
        if start is None:
            start = at  # (not refused after all: the same lock is held)
        if marks and key[1] < _PACE_UNDER_US:
            start = paced(start, (m for ms in marks.values() for m in ms), priority, key[1] // limit)
        if start > _micros(reserve_by):
            return Admission(cooldown=cooldown, not_before=_as_datetime(start))
        expected = start + _quota_key(limit, per, margin)[2] if opened > 0 else 0
        self._take_permit(scope, key, start + key[2], expected)
        if start <= at:  # granted at once, ahead of the lower waiting ones: sent, marked so
            marks.setdefault(start + key[2], []).append(Mark(priority, start, sent=True))
            return Admission(cooldown=cooldown, not_before=None, permit=_as_datetime(start + key[2]))
        marks.setdefault(start + key[2], []).append(Mark(priority, start))
        return Admission(
            cooldown=cooldown, not_before=None, permit=_as_datetime(start + key[2]),
            reserved=_as_datetime(start),
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
            if exact:  # a reservation given back (its mark goes), or a sent one answered
                marks = self._marks.get(scope, {}).get(key[:2])
                mark = settled_mark(marks[old], at) if marks and old in marks else None
                if marks and mark is not None:
                    _drop_one(marks, old, mark)
                    if mark.sent and new > at:  # (its mark moves with its end)
                        marks.setdefault(new, []).append(mark)
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
            self._marks.clear()
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
                self._marks.pop(scope, None) and None,
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
