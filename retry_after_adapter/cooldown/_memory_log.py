"""The memory store's units and records, as pure functions: times in whole
microseconds since the epoch, when a kind of record can no longer matter, a quota's
log key and when its next permit is free, the answers admission gives."""

from __future__ import annotations

import bisect
import collections
import heapq
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import TypeVar

from ..errors import ConfigurationError
from .allowance import Allowance, roll
from .base import Admission, Hold, check_until, free_at
from .freshness import Freshness, last_noted
from .rate import PROBE_RECHECK, Rate, rate_holds, rate_kept_until

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


def _closed_ends(log: collections.deque[int], opened: dict[int, list[int]], k: int) -> list[int]:
    """The earliest ``k`` ends of ``log`` (ascending) that are not open permits'."""
    skip = {end: len(ends) for end, ends in opened.items()}
    closed: list[int] = []
    for end in log:
        if skip.get(end, 0) > 0:
            skip[end] -= 1
            continue
        closed.append(end)
        if len(closed) >= k:
            break
    return closed


def _permit_free_at(
    log: collections.deque[int], opened: dict[int, list[int]] | None, limit: int, at: int, per: int
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
    if len(log) < limit:
        return None
    if not opened:
        return log[-limit]
    expected = [when for ends in opened.values() for when in ends]
    closed = _closed_ends(log, opened, len(log) - limit + 1)
    return free_at(closed, expected, limit, len(log), at + per)


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
