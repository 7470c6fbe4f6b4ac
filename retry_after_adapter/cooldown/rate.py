"""A learned send rate per scope, for a server that says nothing of its quota. Pure: no
I/O, no clock (every function is given ``now``, in seconds since the epoch).

A scope with no configured ``Quota`` and no announced allowance is admitted by what the
store has learned of it, one :class:`Rate` record shared by every worker of the scope
(threads, processes, hosts), changed only inside the store's atomic operations:

- **Cold start.** A scope the store has never seen starts with one attempt in flight.
  Each good answer (not a throttle) adds one: the cap doubles with each round of good
  answers (TCP's slow start) up to :data:`SLOW_START_CAP`, then grows by one per round
  (``cap`` good answers) until :data:`OPEN_CAP`, where the cap is lifted (the server
  showed no limit so far). So 500 workers that start at once send a handful, not 500,
  into an unknown quota; an API without a limit costs a few rounds once per scope.
- **A throttle** (a 429, or a 503 or other cooldown status with a valid Retry-After)
  of an attempt admitted in the current epoch ends the epoch at the cooldown's end.
  While cold, the server has just shown what it accepts: the good answers counted in
  the epoch, ``limit``, within ``window`` = from the epoch's start to the cooldown's end
  (an upper bound on the server's window: a Retry-After is rounded up, and the epoch
  started no later than the server's window). Good answers of that epoch that arrive
  after the throttle (sent before it) still count: they were accepted too. A throttle
  while a rate is learned lowers it multiplicatively (``limit`` x :data:`BETA`), unless
  the epoch outlasted the learned window (the first epoch began inside the server's
  window, so the window was learned short): then the window grows to it instead; one
  while the cap was lifted starts a cold epoch at the cooldown's end, to count again.
  Later throttles of an epoch already ended change nothing (one decrease per epoch).
- **A learned rate** admits at most ``limit`` attempts in any ``window`` seconds (a
  sliding log in the store, like a configured ``Quota``). Each window that passes
  without a throttle raises ``limit`` half-way back to ``ceiling`` (at least one), the
  most the server has accepted in one window: never above what it has shown it
  accepts.

The rate is off for a scope whose answers carry quota headers (the announced allowance
governs) and for calls with a configured ``Quota``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..quota import MAX_COUNT, MAX_SECONDS

__all__ = [
    "BETA",
    "OPEN_CAP",
    "RATE_KEPT",
    "SLOW_START_CAP",
    "Rate",
    "answer_rate",
    "fresh_rate",
    "rate_terms",
    "roll_rate",
]

#: In flight while cold, the cap doubles per round of good answers up to this.
SLOW_START_CAP = 4
#: A cold scope whose cap reaches this many in flight without a throttle has its cap
#: lifted: no limit was found.
OPEN_CAP = 32
#: A throttle of a learned rate multiplies its limit by this (CUBIC's decrease).
BETA = 0.7
#: The shortest window learned (seconds): a Retry-After of 0 still says "a window".
MIN_WINDOW = 1.0
#: Seconds a learned rate is kept past its epoch's start and window (a scope unused
#: that long is learned again, from a cold start), and how long after its last
#: throttle's end a rate in use is learned again.
RATE_KEPT = 3600.0


class Rate(NamedTuple):
    """One scope's learned rate (see the module). Times in seconds since the epoch.

    - ``cap``: attempts in flight allowed while cold (0: no cap);
    - ``limit`` per ``window`` seconds: the learned rate (``limit`` 0: none yet);
    - ``ceiling``: the most the server accepted in one window;
    - ``epoch``: counts the epochs (a throttle or a window passed ends one);
    - ``start``: when the current epoch began;
    - ``ok``: good answers counted in the current epoch while cold;
    - ``grown``: while cold, good answers since the cap last grew (past slow start);
      with a learned rate, the windows passed since the last throttle's end;
    - ``grace``: the epoch whose late good answers still raise ``limit`` (-1: none).
    """

    cap: int
    limit: int
    window: float
    ceiling: int
    epoch: int
    start: float
    ok: int = 0
    grown: int = 0
    grace: int = -1

    @property
    def cold(self) -> bool:
        """Still learning: an in-flight cap, no rate yet; good answers are counted."""
        return self.cap > 0 and self.limit == 0

    def reports(self, epoch: int) -> bool:
        """Whether a good answer of an attempt admitted in ``epoch`` must be told to the
        store (:func:`answer_rate` changes the record with it)."""
        return (epoch == self.epoch and self.cold) or (epoch == self.grace and self.grace == self.epoch - 1)


def fresh_rate(now: float) -> Rate:
    """The record of a scope the store has never seen: one attempt in flight."""
    return Rate(1, 0, 0.0, 0, 0, now)


def rate_terms(
    rate: Rate, lease: tuple[int, float, str] | None, learn: tuple[float, str]
) -> tuple[int | None, float | None, tuple[int, float, str] | None]:
    """What an admission takes under ``rate``: ``(limit, window, lease)``, the learned
    limit per window (None: none) and the slot to take (``lease``, a configured cap,
    under the smaller of the two caps while cold; else ``learn``'s ``(ttl, token)``
    under the cold cap; None: no slot)."""
    limit = rate.limit if rate.limit > 0 else None
    window = rate.window if limit is not None else None
    if rate.cap > 0:
        if lease is not None:
            lease = (min(lease[0], rate.cap), lease[1], lease[2])
        else:
            lease = (rate.cap, learn[0], learn[1])
    return limit, window, lease


def roll_rate(record: Rate, now: float) -> Rate:
    """The record as of ``now``: with a learned rate, each whole window passed since the
    epoch began ends an epoch without a throttle, and raises ``limit`` half-way back to
    ``ceiling`` (at least one): never above what it accepted. :data:`RATE_KEPT` seconds
    after the last throttle's end, the rate is learned again from a cold start (a rate
    learned from a window that others had mostly spent would stay that low). Otherwise
    unchanged."""
    if record.limit <= 0 or record.window <= 0 or now < record.start + record.window:
        return record
    windows = math.floor((now - record.start) / record.window)
    start = record.start + windows * record.window
    if (record.grown + windows) * record.window >= RATE_KEPT:
        return Rate(1, 0, 0.0, record.ceiling, record.epoch + windows, start)
    limit, ceiling = record.limit, record.ceiling
    for _ in range(min(windows, 64)):
        if limit >= record.ceiling:
            break
        limit = min(record.ceiling, limit + max(1, (record.ceiling - limit + 1) // 2))
    return record._replace(
        limit=limit,
        ceiling=ceiling,
        epoch=record.epoch + windows,
        start=start,
        ok=0,
        grown=record.grown + windows,
        grace=-1,
    )


def answer_rate(record: Rate, epoch: int | None, until: float | None, now: float) -> Rate:
    """The record after an attempt admitted in ``epoch`` (None: the current one) was
    answered at ``now``: well (``until`` None) or throttled, with a cooldown until
    ``until`` (see the module)."""
    record = roll_rate(record, now)
    if epoch is None:
        epoch = record.epoch
    if until is None:
        return _good(record, epoch)
    if epoch != record.epoch:
        return record  # that epoch already ended (a throttle, a window): one decrease each
    window = min(max(until - record.start, MIN_WINDOW), MAX_SECONDS)
    start = max(until, now)
    if record.cold and record.ok <= 0:
        # Nothing was accepted in the epoch: the quota was spent before it (by others,
        # or a window before); that says nothing of a rate. Count again after it.
        return Rate(1, 0, 0.0, record.ceiling, epoch + 1, start)
    if record.cold:
        limit = max(1, min(record.ok, MAX_COUNT))
        return Rate(0, limit, window, limit, epoch + 1, start, 0, 0, epoch)
    if record.limit <= 0:
        # The cap was lifted: count again from the cooldown's end, one in flight.
        return Rate(1, 0, 0.0, record.ceiling, epoch + 1, start)
    # Since the last throttle's end (a reset of the server's), ``grown`` windows passed:
    # this throttle's end is the next reset, one server window after it.
    since = min(max(until - (record.start - record.grown * record.window), MIN_WINDOW), MAX_SECONDS)
    if since > record.window:
        # The server's window is longer than learned (the first epoch began inside it):
        # the count held, the window was short.
        return Rate(0, record.limit, since, record.ceiling, epoch + 1, start)
    limit = max(1, math.floor(record.limit * BETA))
    return Rate(0, limit, record.window, record.ceiling, epoch + 1, start)


def _good(record: Rate, epoch: int) -> Rate:
    """A good answer of an attempt admitted in ``epoch``."""
    if epoch == record.epoch and record.cold:
        ok = record.ok + 1
        cap, grown = record.cap, record.grown + 1
        if cap < SLOW_START_CAP or grown >= cap:
            cap, grown = cap + 1, 0
        if cap >= OPEN_CAP:
            cap = 0  # no limit found: lifted
        return record._replace(cap=cap, ok=ok, grown=grown)
    if epoch == record.grace and record.grace == record.epoch - 1 and record.limit < MAX_COUNT:
        limit = record.limit + 1  # accepted in the throttled epoch, answered after it
        return record._replace(limit=limit, ceiling=max(record.ceiling, limit))
    return record
