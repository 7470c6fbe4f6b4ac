"""What a server announced is left of its quota, kept per scope in a store. Pure: no
I/O, no clock (every function is given ``now``).

A response's quota headers say ``remaining`` requests are left until a reset. The
store keeps one :class:`Allowance` record per scope and counts every admission of
the scope from the first announcement on, so that:

- an announcement answers one attempt (its admission number ``seq``): the server
  counted it and, in admission order, none admitted after it; those are taken off;
- once the server's limit and window are known (IETF ``q`` and ``w``; the window of
  ``X-RateLimit-*`` is learned from two consecutive resets), each new window starts at
  the reset with the whole limit, counted exactly by admissions: a sole client then
  never sends more than the limit in one of the server's windows, and the burst at a
  reset never overshoots;
- the reset kept for a window is the earliest announced: servers round the seconds
  up, so each announcement is a bound on the real reset and the earliest is tightest.

A provider whose limit refills continuously (OpenAI's and Anthropic's requests: a
token bucket, see ``quota.from_allowances``) is kept as a *bucket* record, told by a
negative ``window``: ``left`` as of admission ``at`` until ``until``, the bucket's next
unit, then one more every ``-window`` seconds (up to ``limit`` in all since the answer:
its full refill; past it, one probe a step). An answer that leaves fewer replaces it
(its figures hold as of the admission it answers, those admitted after it taken off);
one that leaves more does not raise it (requests overtake each other on the way).

The store applies :func:`admit_allowance` and :func:`merge_allowance` atomically (the
Redis store runs the same rules in a server-side script).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import NamedTuple, TypeVar

from ..header import MAX_SECONDS

#: Two announced resets of one scope within this many seconds are the same window
#: (delta-seconds are whole seconds: one window's resets differ by less than 1 s).
SAME_WINDOW = 1.0
#: Seconds past a reset with the server's limit known but not its window during which
#: admissions beyond the limit wait for an answer to say the next reset (after that,
#: nothing is held back: the answers may never come).
AWAIT_ANSWER = 1.0
_AWAIT_ANSWER = timedelta(seconds=AWAIT_ANSWER)
#: Seconds a record outlives its reset: the admission count goes on, so the next
#: window's announcements are exact too.
ALLOWANCE_KEPT = 3600.0


class Allowance(NamedTuple):
    """One scope's allowance: ``left`` requests as of admission ``at``, until
    ``until``; ``admitted``: admissions so far; the server's ``limit`` per ``window``
    seconds (0 when unknown); ``exact``: the window was started at its reset with the
    whole limit (announcements then only move its reset)."""

    left: int
    at: int
    until: datetime
    admitted: int
    limit: int = 0
    window: float = 0.0
    exact: bool = False

    @property
    def bucket(self) -> bool:
        """A continuously refilled limit: one unit every ``-window`` seconds."""
        return self.window < 0

    @property
    def remaining(self) -> int:
        """What is left now (may be <= 0)."""
        return self.left - (self.admitted - self.at)


def roll(record: Allowance, now: datetime) -> Allowance:
    """The record as of ``now``. Past its reset with a known limit: the server's next
    window, with the whole limit from this admission on; its end is the next reset when
    the window is known, else unknown until an answer says (the record's reset stays
    past, so nothing is held back, but the window's admissions are counted: ``exact``).
    Otherwise unchanged."""
    if record.until > now or record.limit <= 0:
        return record
    if record.window < 0:
        return _refill(record, now)
    if record.window > MAX_SECONDS:
        record = record._replace(window=0.0)  # kept by an earlier version: unknown
    if record.window <= 0:
        if record.exact:
            return record  # already counting since the reset
        return record._replace(left=record.limit, at=record.admitted, exact=True)
    periods = math.floor((now - record.until).total_seconds() / record.window) + 1
    until = record.until + timedelta(seconds=periods * record.window)
    return record._replace(left=record.limit, at=record.admitted, until=until, exact=True)


def _refill(record: Allowance, now: datetime) -> Allowance:
    """A bucket record past its next unit (``until``): one unit more for each step of
    ``-window`` seconds since, ``until`` the one after, while ``left`` is short of the
    whole ``limit`` (the pace an answer told holds up to its full refill); past that,
    one probe a step at most (its answer tells the bucket again)."""
    step = -record.window
    periods = math.floor((now - record.until).total_seconds() / step) + 1
    left = min(record.limit, record.left + periods) if record.left < record.limit else record.left
    if periods > record.limit - record.left:
        left = max(left, record.admitted - record.at + 1)  # past the full refill: a probe
    return record._replace(left=left, until=record.until + timedelta(seconds=periods * step))


def allowance_reserve(limit: int, left: int) -> int:
    """What a batch leaves of an announced allowance: a quarter of the server's limit
    (of what it announced left, while the limit is unknown)."""
    return (limit if limit > 0 else left) // 4


def admit_more(record: Allowance, now: datetime, batch: int) -> tuple[Allowance, int]:
    """After one admission was counted on ``record`` at ``now``: up to ``batch - 1``
    more, for one process to spend before the reset, from the headroom only (what is
    left less :func:`allowance_reserve`). Returns the record with them counted and how
    many; none once the reset is past (they could not be spent in this window)."""
    if batch <= 1 or record.until <= now:
        return record, 0
    reserve = allowance_reserve(record.limit, record.left)
    extra = max(0, min(batch - 1, record.remaining - reserve))
    return record._replace(admitted=record.admitted + extra), extra


def admit_allowance(
    record: Allowance, now: datetime, cost: int = 1
) -> tuple[Allowance, datetime | None]:
    """One admission at ``now``, counted as ``cost`` (a request: 1; tokens: the
    attempt's declared cost, see ``weights``): the record to keep (rolled, the cost
    counted when granted) and None (granted) or when to ask again (nothing counted):
    the reset; or, past a reset whose next window's end is unknown, once the limit is
    admitted, up to :data:`AWAIT_ANSWER` seconds past the reset, for the first answer
    to say it (those woken at the reset would otherwise all go, the limit and more). A
    cost larger than the server's whole limit is never asked for (``weights.oversized``)."""
    record = roll(record, now)
    if record.remaining < cost:
        if record.until > now:
            if record.window < 0:  # a bucket: when enough units have come back
                short = cost - record.remaining - 1
                return record, record.until + timedelta(seconds=-record.window * short)
            return record, record.until
        if record.exact and record.window <= 0 and record.limit > 0:
            held = record.until + _AWAIT_ANSWER
            if held > now:
                return record, held
    return record._replace(admitted=record.admitted + cost), None


def merge_allowance(
    current: Allowance | None,
    remaining: int,
    until: datetime,
    now: datetime,
    seq: int | None = None,
    limit: int | None = None,
    window: float | None = None,
) -> Allowance | None:
    """The record to keep after a response said ``remaining`` are left until ``until``
    (the server's ``limit`` per ``window`` seconds when it said so), in answer to the
    attempt admitted as ``seq`` (None: admitted before counting started, ``remaining``
    then holds as of now). None: keep ``current`` as it is.

    - a reset already past: nothing to learn;
    - no live record, or a later window: the new window;
    - an earlier window (a late answer from before a reset): ignored;
    - the same window: the earlier reset; and, unless the window is exact, the fewer
      of what the record and the answer leave.
    """
    if until <= now:
        return None
    if window is not None and window < 0:
        return _merge_bucket(current, remaining, until, now, seq, limit or 0, window)
    if current is not None and current.window < 0:
        # A bucket read before: this answer reads the limit as a window (a record long
        # lapsed, its admissions still counted).
        lapsed = now - timedelta(seconds=MAX_SECONDS)
        current = Allowance(0, current.admitted, lapsed, current.admitted)
    lim = _said_or_kept(limit, current.limit if current is not None else 0)
    win = _said_or_kept(window, current.window if current is not None else 0.0)
    if win > MAX_SECONDS or (until - now).total_seconds() > MAX_SECONDS:
        return None  # past every bound a header may set (see ``quota.bound_hint``)
    left = max(0, remaining)
    if current is None:
        return Allowance(left, _answered_at(seq, 0), until, 0, lim, win)
    if not win:
        win = _learned_window(current, until, now) or win
    return _merge_live(roll(current, now), left, until, now, seq, lim, win)


def _merge_bucket(
    current: Allowance | None, remaining: int, until: datetime, now: datetime, seq: int | None,
    limit: int, window: float,
) -> Allowance | None:
    """:func:`merge_allowance` of a bucket's answer (``window`` < 0: one unit every
    ``-window`` seconds, ``until`` the next), holding as of the admission after ``seq``
    (those admitted since taken off). Requests overtake each other on the way, so an
    answer may not count one admitted before it that is still coming: it replaces the
    record only when it leaves fewer (a new start for the refill, from its next unit,
    at its pace); otherwise the record stays as it is. Units come back to the record by
    its refill alone."""
    if -window > MAX_SECONDS or (until - now).total_seconds() > MAX_SECONDS or limit <= 0:
        return None
    count = current.admitted if current is not None else 0
    fresh = Allowance(max(0, min(remaining, limit)), _answered_at(seq, count), until, count, limit, window)
    if current is None or current.window >= 0:
        return fresh
    rolled = roll(current, now)
    if fresh.remaining < rolled.remaining:
        return fresh
    return None if rolled == current else rolled


_Number = TypeVar("_Number", int, float)


def _said_or_kept(said: _Number | None, kept: _Number) -> _Number:
    """What a response said of the limit or window when it said so (> 0), else what
    the record kept."""
    return said if said is not None and said > 0 else kept


def _answered_at(seq: int | None, count: int) -> int:
    """The admission an answer holds as of: the one after the attempt it answers
    (``seq``), at most the ``count`` of admissions so far; ``count`` when unknown."""
    return count if seq is None else min(seq + 1, count)


def _learned_window(current: Allowance, until: datetime, now: datetime) -> int | None:
    """The server's window learned from the reset ``until`` of the first answer of the
    window right after ``current``'s (the gap between the two resets), or None."""
    gap = (until - current.until).total_seconds()
    if gap > SAME_WINDOW and (now - current.until).total_seconds() < gap / 2:
        return round(gap)
    return None


def _merge_live(
    current: Allowance, left: int, until: datetime, now: datetime, seq: int | None, lim: int, win: float
) -> Allowance | None:
    """:func:`merge_allowance` once there is a record, rolled to ``now``."""
    count = current.admitted
    at = _answered_at(seq, count)
    if current.until <= now:
        if current.exact and lim:
            # The first answer of a window whose start was counted: exact from here on.
            return Allowance(min(left, current.remaining), count, until, count, lim, win, exact=True)
        return Allowance(left, at, until, count, lim, win)
    gap = (until - current.until).total_seconds()
    if gap > SAME_WINDOW:
        return Allowance(left, at, until, count, lim, win)
    if gap < -SAME_WINDOW:
        return None
    return _merge_same_window(current, left, at, until, lim, win)


def _merge_same_window(
    current: Allowance, left: int, at: int, until: datetime, lim: int, win: float
) -> Allowance | None:
    """An answer for ``current``'s window: the earlier reset, and the fewer of what the
    record and the answer leave (the answer holding as of admission ``at``)."""
    merged = current._replace(until=min(current.until, until), limit=lim, window=win)
    if lim:
        # The record counts every admission of the window: an answer lowers it only
        # when the server counted more than that (someone else spends the quota too).
        # Taking off admissions since the answered one would count twice those the
        # server saw first (requests overtake each other on the way).
        at = current.admitted
    if not current.exact and left - (current.admitted - at) < current.remaining:
        merged = merged._replace(left=left, at=at)
    return None if merged == current else merged
