"""A learned send rate per scope, for a server that says nothing of its quota. Pure: no
I/O, no clock (every function is given ``now``, in seconds since the epoch).

A scope with no configured ``Quota`` and no announced allowance is admitted by what the
store has learned of it, one :class:`Rate` record shared by every worker of the scope
(threads, processes, hosts), changed only inside the store's atomic operations. Time is
cut into **epochs** of ``window`` seconds, each begun at a throttle's end (the server's
reset, when its window is fixed) or a window after the last epoch began. In an epoch,
sends are of two kinds:

- **Known sends**: the first ``limit`` of the epoch, the most the server has shown it
  accepts in a window. They take nothing else and their answers are not told to the
  store.
- **Probes**: sends beyond the limit (every send, while nothing is learned), admitted
  while fewer than ``cap`` probes are in flight (a concurrency slot of the store). Each
  good answer of a probe is told to the store: it counts as accepted, and the cap grows
  as TCP's slow start grows its window (one more per good answer up to
  :data:`SLOW_START_CAP`, so it doubles per round; then one more per round of ``cap``
  good answers). A cap that reaches :data:`OPEN_CAP` is lifted with the limit: the
  scope is **open** and admission takes nothing (a near copy answers it without a store
  operation). So 500 workers that start at once send a handful, not 500, into an
  unknown quota, and an API without a limit costs a few rounds.

The states, and what moves between them:

- **Cold** (no limit, a cap): a scope the store has never seen starts so, one probe in
  flight. A throttle that follows good answers learns ``limit`` = the good answers
  counted in the epoch, within ``window`` = the time they took (from the epoch's start
  to the throttle's answer, :data:`MIN_WINDOW` at least): all a throttle says of the
  rate. Its wait is the cooldown, obeyed to its end, not a window (one sporadic 429
  may say an hour): probes go on a window after it, and a quota met again confirms
  the limit (a refused probe) or, a known send refused a window later, shows the
  window longer.
- **Learned** (a limit, a cap): each window without a throttle ends an epoch and raises
  the limit by the probes the server accepted in it, so the limit follows a quota that
  rises, and a limit pinned low by a throttle that had nothing to do with the rate (a
  sporadic 429, a deploy's 503s) recovers within a window or two: probing past the
  limit is by slow start within a window, not by one more per window. A throttle ends
  the epoch: the limit holds when the server refused a probe (that was its limit, and
  its reset, with the last throttle's end some windows before, measures the window),
  rises by the probes it accepted before refusing one (or to their number, when the
  server's window began inside the epoch: its reset is later than the epoch's end), and
  falls by :data:`BETA` (CUBIC's decrease) when it refused a known send (the quota fell,
  or the throttle was sporadic; a known send refused while the epoch's probes were
  taken or on their way keeps the limit: the server took a probe in its place, which
  the throttle's ``probe`` flag tells); probes start again from one in flight, after
  :data:`QUIET_HELD` windows without probes when the limit held (a stable quota costs
  one worker one refused probe every third window; several threads, what they have in
  flight when the limit is met) or :data:`QUIET_MOVED` when it moved.
- **Open** (no limit, no cap): a throttle starts a cold epoch at its end.

Every throttle ends the epoch at the throttle's end, before which the rate admits
nothing: the server's Retry-After, or, for a throttle without a usable one (none,
invalid, or 0), a backoff of :data:`BACKOFF` seconds doubled per throttle in a row
without a good answer between, at most :data:`MAX_BACKOFF`: never 0. Only one throttle
counts per epoch (the others of that epoch were in flight with it).

The rate is off for a scope whose answers carry quota headers (the announced allowance
governs) and for calls with a configured ``Quota``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..header import MAX_COUNT, MAX_SECONDS

__all__ = [
    "BACKOFF",
    "BETA",
    "MAX_BACKOFF",
    "OPEN_CAP",
    "OPEN_KEPT",
    "PROBE_RECHECK",
    "QUIET_HELD",
    "QUIET_MOVED",
    "RATE_KEPT",
    "SLOW_START_CAP",
    "Rate",
    "answer_rate",
    "fresh_rate",
    "rate_from_row",
    "rate_holds",
    "rate_kept_until",
    "rate_row",
    "roll_rate",
]

#: Probes in flight: the cap doubles per round of good answers up to this.
SLOW_START_CAP = 4
#: A cap that reaches this many probes in flight without a throttle is lifted with the
#: limit: no limit was found, the scope is open.
OPEN_CAP = 32
#: A throttle of a known send multiplies the limit by this (CUBIC's decrease).
BETA = 0.7
#: The shortest window learned (seconds): a Retry-After of 0 still says "a window".
MIN_WINDOW = 1.0
#: Seconds a throttle's end may lie past the server's reset: a Retry-After in
#: delay-seconds is rounded up to a whole second.
RESET_ROUNDING = 1.0
#: Windows without probes after a throttle that confirmed the limit, and after one that
#: moved it (the window after a throttle often still belongs to the server's last).
QUIET_HELD = 2
QUIET_MOVED = 1
#: Seconds a throttle without a usable Retry-After holds the scope's sends back, doubled
#: per throttle in a row without a good answer between, at most :data:`MAX_BACKOFF`.
BACKOFF = 1.0
MAX_BACKOFF = 20.0
#: Seconds within which a send refused only because every probe slot is held is looked
#: at again (a probe's answer frees its slot, usually far sooner than its lease ends).
PROBE_RECHECK = 1.0
#: A microsecond: times within it of an epoch's end are at it (see ``roll_rate``).
_TICK = 1e-6
#: Seconds a learned rate unused since its epoch's start and window is kept (a store
#: drops it then; the scope starts cold again).
RATE_KEPT = 3600.0
#: Seconds an open rate is kept past its epoch's start: admissions of an open scope
#: change nothing in the store (a near copy answers them), so its record says nothing
#: of its use; a scope open a day starts cold once more, at worst.
OPEN_KEPT = 86400.0


class Rate(NamedTuple):
    """One scope's learned rate (see the module). Times in seconds since the epoch.

    - ``cap``: probes in flight allowed (0: none; with ``limit`` 0 too, the scope is open);
    - ``limit`` per ``window`` seconds: the known sends (``limit`` 0: none learned);
    - ``epoch``: counts the epochs (a throttle or a window passed ends one);
    - ``start``: when the current epoch begins (nothing is admitted before it);
    - ``base``: when the first epoch after the last throttle began (its end);
    - ``sent``: known sends admitted in the current epoch;
    - ``ok``: good answers of probes counted in the current epoch;
    - ``grown``: good answers of probes since the cap last grew;
    - ``grace``: the epoch of the last throttle (-1: none): good answers of its probes
      that arrive after it still raise the limit;
    - ``quiet``: epochs left in which nothing is probed;
    - ``probed``: 1 once a probe was admitted in the current epoch;
    - ``fails``: throttles in a row without a good answer between (the backoff's doubling).
    """

    cap: int
    limit: int
    window: float
    epoch: int
    start: float
    base: float
    sent: int = 0
    ok: int = 0
    grown: int = 0
    grace: int = -1
    quiet: int = 0
    probed: int = 0
    fails: int = 0

    @property
    def open(self) -> bool:
        """No limit and no cap: admission takes nothing."""
        return self.cap <= 0 and self.limit <= 0

    @property
    def known(self) -> bool:
        """Whether the next send of the epoch is a known one (within the limit)."""
        return self.sent < self.limit

    @property
    def probes(self) -> bool:
        """Whether a send beyond the limit may be admitted now (under ``cap``)."""
        return self.cap > 0 and self.quiet <= 0

    @property
    def ends(self) -> float:
        """When the current epoch ends (with a limit: the next one's known sends)."""
        return self.start + self.window

    def sending(self) -> Rate:
        """The record once a known send was admitted in its epoch."""
        return self._replace(sent=self.sent + 1)

    def probing(self) -> Rate:
        """The record once a probe was admitted in its epoch."""
        return self if self.probed else self._replace(probed=1)


def fresh_rate(now: float) -> Rate:
    """The record of a scope the store has never seen: cold, one probe in flight."""
    return Rate(1, 0, 0.0, 0, now, now)


def rate_kept_until(rate: Rate) -> float:
    """Until when (seconds since the epoch) a store keeps ``rate`` unused."""
    return rate.start + rate.window + (OPEN_KEPT if rate.open else RATE_KEPT)


def rate_holds(rate: Rate, now: float) -> float | None:
    """Until when (seconds since the epoch) ``rate`` holds every send back at ``now``: a
    throttle's backoff, or the epoch's known sends spent with no probe allowed; None:
    it admits a send (the operator's view: ``Store.holds``)."""
    rate = roll_rate(rate, now)
    if rate.start - _TICK > now:
        return rate.start
    if rate.limit > 0 and not rate.known and not rate.probes:
        return rate.ends
    return None


def rate_row(rate: Rate) -> tuple[int, ...]:
    """The record as the SQLite and Redis stores keep it: whole numbers, times and the
    window in milliseconds, in the order of :class:`Rate`'s fields."""
    return (
        rate.cap, rate.limit, round(rate.window * 1000), rate.epoch, round(rate.start * 1000),
        round(rate.base * 1000), rate.sent, rate.ok, rate.grown, rate.grace, rate.quiet, rate.probed,
        rate.fails,
    )  # fmt: skip


def rate_from_row(row: tuple[int, ...]) -> Rate:
    """The record from :func:`rate_row`'s numbers."""
    cap, limit, window, epoch, start, base, sent, ok, grown, grace, quiet, probed, fails = row
    return Rate(
        cap, limit, window / 1000, epoch, start / 1000, base / 1000, sent, ok, grown, grace, quiet, probed,
        fails,
    )  # fmt: skip


def roll_rate(record: Rate, now: float) -> Rate:
    """The record as of ``now``: with a learned limit, each whole window passed since the
    epoch began ends an epoch without a throttle: the next begins a window later, with
    no known send yet; the probes accepted raise the limit, a quiet window is counted,
    a backoff's doubling is forgotten. Otherwise unchanged."""
    if record.limit <= 0 or record.window <= 0 or now < record.start + record.window - _TICK:
        return record
    # (Within a microsecond counts as there: the stores keep whole milliseconds, and a
    # sum of them in floating point may fall a hair short of the same sum in integers.)
    windows = math.floor((now - record.start + _TICK) / record.window)
    return record._replace(
        limit=min(MAX_COUNT, record.limit + record.ok),
        epoch=record.epoch + windows,
        start=round(record.start + windows * record.window, 3),  # whole ms, as stored: no drift
        sent=0,
        ok=0,
        quiet=max(0, record.quiet - windows),
        probed=0,
        fails=0,
    )


def answer_rate(
    record: Rate, epoch: int | None, until: float | None, now: float, probe: bool | None = None
) -> Rate:
    """The record after an attempt admitted in ``epoch`` (None: the current one) was
    answered at ``now``: a probe's good answer (``until`` None), or a throttle whose
    wait ends at ``until`` (at or before ``now``: no usable wait, the backoff applies)
    of a probe (``probe`` True), a known send (False) or an attempt not said (None).
    See the module."""
    record = roll_rate(record, now)
    if epoch is None:
        epoch = record.epoch
    if until is None:
        return _good(record, epoch)
    if epoch != record.epoch:
        return record  # that epoch already ended (a throttle, a window): one change each
    if until <= now:
        until = now + min(MAX_BACKOFF, BACKOFF * 2 ** min(record.fails, 16))
    until = min(until, now + MAX_SECONDS)
    if record.limit <= 0:
        if record.cap <= 0 or record.ok <= 0:
            # Open, or nothing accepted in a cold epoch (the quota was spent before it,
            # by others, or a window before: that says nothing of a rate): count again
            # from one probe in flight after the throttle.
            return _throttled(record, epoch, until, 0, 0.0, 0)
        # What the throttle says of the rate: the server took `ok` sends in the time they
        # took (from the epoch's start to this answer), then refused one. Its wait says
        # when the cooldown ends, nothing of a window (a sporadic 429 can say an hour):
        # probes go on a window after it (the first window after a throttle often still
        # belongs to the server's last), and a quota met again confirms the limit.
        window = round(min(max(now - record.start, MIN_WINDOW), MAX_SECONDS), 3)  # whole ms, as stored
        return _throttled(record, epoch, until, min(record.ok, MAX_COUNT), window, QUIET_MOVED)
    window, limit, quiet = record.window, record.limit, QUIET_MOVED
    if probe is False and (record.ok > 0 or record.probed):
        # A known send refused while the epoch's probes were taken or on their way: the
        # server took a probe in its place (requests overtake each other on the way,
        # with several threads). It took the known sends but this one and the probes
        # answered well; each probe answered well after this adds one (``_good``).
        limit = max(1, min(MAX_COUNT, record.sent - 1 + record.ok))
        window = _window_from_resets(record, epoch, until, now)
        return _throttled(record, epoch, until, limit, window, QUIET_HELD)
    if record.ok > 0 and until - RESET_ROUNDING > record.ends:
        # The server's window began inside the epoch (its reset, a whole second rounded
        # up at most, is later than the epoch's end): what it accepted in it were probes,
        # at most as many as counted.
        limit = max(limit, min(MAX_COUNT, record.ok))
    elif record.ok > 0:
        limit = min(MAX_COUNT, limit + record.ok)  # it accepted that many probes, then refused
    elif record.probed:
        quiet = QUIET_HELD  # it refused the first probe: its limit, confirmed
        window = _window_from_resets(record, epoch, until, now)
    elif epoch - record.grace >= 2 and window < until - record.base <= 2 * window + RESET_ROUNDING:
        # It refused a known send a window or more after its last reset, and its window
        # ends no more than two learned windows (and a Retry-After's rounding) after that
        # reset: the window was learned short (the first epoch began inside the
        # server's, or took less time than its window), not the limit too high.
        window = round(until - record.base, 3)
    else:
        limit = max(1, math.floor(limit * BETA))  # it refused a known send
    return _throttled(record, epoch, until, limit, window, quiet)


def _window_from_resets(record: Rate, epoch: int, until: float, now: float) -> float:
    """The window as the server's resets tell it, when it refused the first probe of
    ``epoch`` at ``now``, its limit spent, ending the wait at ``until``: the server's
    window ends there, as it ended at ``base`` (the last throttle's end) some windows
    before, one per epoch since (each reset read from a Retry-After rounded up to a whole
    second: the error of the learned window shrinks with each; a reading shorter than
    the window counts that rounding in). The window moves half-way to it, so that one
    reading's rounding moves it by a quarter second at most; unchanged before an epoch
    has passed since ``base``, and when the wait is longer than a window (and its
    rounding): that is no reset of the window learned, and a cooldown is not a rate."""
    windows = epoch - record.grace
    if record.grace < 0 or windows < 2 or until - now > record.window + RESET_ROUNDING:
        return record.window
    # In whole milliseconds, as every store keeps them, the half rounded up (as in Lua).
    since_ms = round(until * 1000) - round(record.base * 1000)
    window_ms = round(record.window * 1000)
    reading = since_ms / windows
    if reading < window_ms:
        # Shorter only as far as the resets' rounding allows: a window learned short
        # has two epochs' known sends meet one window of the server's, one learned long
        # only leaves a little unsent.
        reading = min(window_ms, (since_ms + RESET_ROUNDING * 1000) / windows)
    half_way = math.floor((window_ms + reading) / 2 + 0.5) / 1000
    return min(max(half_way, MIN_WINDOW), MAX_SECONDS)


def _throttled(record: Rate, epoch: int, until: float, limit: int, window: float, quiet: int) -> Rate:
    """The record after a throttle of ``epoch`` ending at ``until``: a new epoch begins
    then, with one probe in flight."""
    return Rate(1, limit, window, epoch + 1, until, until, 0, 0, 0, epoch, quiet, 0, record.fails + 1)


def _good(record: Rate, epoch: int) -> Rate:
    """A probe's good answer, admitted in ``epoch``."""
    if epoch > record.grace and record.cap > 0:
        ok, cap, grown = record.ok + 1, record.cap, record.grown + 1
        if cap < SLOW_START_CAP or grown >= cap:
            cap, grown = cap + 1, 0
        if cap >= OPEN_CAP:
            # No limit found: lifted, the scope is open.
            return record._replace(cap=0, limit=0, window=0.0, ok=0, grown=0, quiet=0, probed=0, fails=0)
        return record._replace(cap=cap, ok=min(ok, MAX_COUNT), grown=grown, fails=0)
    if epoch == record.grace and record.limit > 0 and epoch == record.epoch - 1:
        # Accepted in the throttled epoch, answered after the throttle.
        return record._replace(limit=min(MAX_COUNT, record.limit + 1), fails=0)
    return record
