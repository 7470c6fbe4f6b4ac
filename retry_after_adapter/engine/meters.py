"""What this process knows of each scope's attempts: which are on the wire and when the
last ones were sent, for quota headers the store did not count (the first window a
store sees of a scope), and what its answers' ``Date`` tell of the server's clock
(:class:`ServerClock`). One map per store object, shared by every adapter on it.
"""

from __future__ import annotations

import collections
import math
import threading
import weakref
from datetime import datetime

from .. import _forksafe

__all__ = ["BOUND_KEPT", "DRIFT", "Meter", "ServerClock", "meters_of"]

#: Send times kept per scope (for the first window a server announces).
SENT_KEPT = 4096
#: Beyond this many scopes of one store, idle meters are dropped.
MAX_METERS = 4096


#: How fast (seconds per second) a bound learned on the server's clock is let go: the
#: server's clock and this host's monotonic clock may drift apart by this much (100
#: ppm, past what NTP lets a clock run off), so a bound learned ``s`` seconds ago is
#: taken as ``DRIFT * s`` looser.
DRIFT = 1e-4
#: Seconds a bound on a server's clock is kept at most: a step of its clock smaller
#: than the bounds' width goes unnoticed (its answers still fit), and this bounds how
#: long a bound learned before it is used.
BOUND_KEPT = 300.0


class ServerClock:
    """Bounds on one scope's server clock, learned from the ``Date`` of its answers:
    ``offset`` = the server's epoch seconds less this process's monotonic seconds.

    A ``Date`` is whole seconds, truncated (and a server that caches it, as Node does,
    is never ahead of its own clock), so an answer with ``Date`` D sent at monotonic
    ``s`` and received at ``r`` says the server read D to D + 1 while the answer was
    made, between ``s`` and ``r``: ``D - r <= offset < D + 1 - s``. Each answer bounds
    the offset within a second plus its round trip; answers whose ``Date`` just ticked
    narrow it to a few milliseconds, and the intersection keeps the tightest bounds.
    They are let go at :data:`DRIFT`, and kept :data:`BOUND_KEPT` seconds at most;
    when a new answer falls outside them (a server's clock stepped, or this host's),
    they start again from that answer alone.

    The answers of one scope are read as from one clock: servers behind one scope must
    keep theirs together (as NTP does, within milliseconds), or a reset may be read
    early by as much as they differ. Memory is constant; updated without a lock (one
    tuple assigned at once: two answers read at once may lose one's bound, never mix
    them)."""

    __slots__ = ("bounds", "restarts")

    def __init__(self) -> None:
        #: ``(low, low_at, high, high_at)``: the offset's bounds and the monotonic times
        #: of the answers that set them; None before any answer.
        self.bounds: tuple[float, float, float, float] | None = None
        #: How many times the bounds started again (an answer outside them).
        self.restarts = 0

    def observe(self, date: float, sent: float | None, received: float) -> None:
        """An answer whose valid ``Date`` is ``date`` (epoch seconds), sent at monotonic
        ``sent`` (None: unknown, no upper bound) and received at ``received``."""
        low_now = date - received
        high_now = math.inf if sent is None else date + 1.0 - sent
        kept = self.bounds
        if kept is None:
            self.bounds = (low_now, received, high_now, received)
            return
        low, low_at, high, high_at = kept
        # The kept bounds as of this answer, let go for the time since they were set.
        low_then = _aged(low, received - low_at, -1.0)
        high_then = _aged(high, received - high_at, 1.0)
        if low_now > low_then:
            low, low_at, low_then = low_now, received, low_now
        if high_now < high_then:
            high, high_at, high_then = high_now, received, high_now
        if low_then > high_then:
            # Nothing fits every answer: a clock stepped. Start again from this one.
            self.restarts += 1
            low, low_at, high, high_at = low_now, received, high_now, received
        self.bounds = (low, low_at, high, high_at)

    def latest(self, epoch: float, at: float) -> float | None:
        """The latest monotonic time at which the server's clock may read ``epoch``
        (epoch seconds), as known at monotonic ``at``; None before any answer. An
        attempt sent then or later reaches the server at or after ``epoch``."""
        kept = self.bounds
        if kept is None:
            return None
        low = _aged(kept[0], at - kept[1], -1.0)
        return None if low == -math.inf else epoch - low

    def width(self) -> float | None:
        """How wide the offset's bounds are as they were set (seconds); None before any
        answer."""
        kept = self.bounds
        return None if kept is None else kept[2] - kept[0]


def _aged(bound: float, age: float, sign: float) -> float:
    """A bound on a server's clock ``age`` seconds after it was set: looser by
    :data:`DRIFT` per second (``sign`` -1 for a lower bound, 1 for an upper one), and
    none past :data:`BOUND_KEPT`."""
    if age > BOUND_KEPT:
        return sign * math.inf
    return bound + sign * DRIFT * max(0.0, age)


class Meter:
    """One scope's attempts in this process: which are on the wire, when the last ones
    were sent (the call clock's monotonic seconds), and when (monotonic) a success was
    last noted in the store. Updated without a lock: adding to a set, discarding from
    it and appending to a bounded deque are each atomic."""

    __slots__ = ("noted", "reset", "sent", "server", "wire")

    def __init__(self) -> None:
        #: ``id()`` of every call with an attempt on the wire (a call has one at a time).
        self.wire: set[int] = set()
        self.sent: collections.deque[float] = collections.deque(maxlen=SENT_KEPT)
        self.noted = -math.inf
        #: The earliest reset announced for the server's current window, as answers
        #: here read it, and the limit it was announced with (see :meth:`earliest_reset`).
        self.reset: tuple[datetime | None, int | None] = (None, None)
        #: What the scope's answers told of the server's clock.
        self.server = ServerClock()

    def earliest_reset(
        self, until: datetime, now: datetime, same_window: float, limit: int | None
    ) -> datetime:
        """The earliest reset announced for the window an answer at ``now`` saying
        ``until`` (of a quota of ``limit``) belongs to. Every announcement of a window
        bounds its real reset from above (servers round the seconds up), so the
        earliest is the tightest. Two resets are one window's only when they are within
        ``same_window`` seconds, of the same limit, and the one kept is more than
        ``same_window`` seconds ahead: a kept reset that close to now may already be
        past at the server (it is rounded up by less than that), and the answer be the
        next window's."""
        kept, kept_limit = self.reset
        if (
            kept is None
            or kept_limit != limit
            or (kept - now).total_seconds() <= same_window
            or abs((until - kept).total_seconds()) >= same_window
            or until < kept
        ):
            self.reset = (until, limit)
            return until
        return kept

    @property
    def in_flight(self) -> int:
        """Attempts of the scope on the wire in this process."""
        return len(self.wire)

    def sent_since(self, start: float) -> int:
        """Attempts sent at or after ``start`` (monotonic seconds), at most ``SENT_KEPT``."""
        count = 0
        for at in reversed(self.sent):
            if at < start:
                break
            count += 1
        return count


class Meters(dict[str, Meter]):
    """The meters of one store object's scopes in this process: ``meters[scope]``
    (made on first use).

    Past :data:`MAX_METERS` scopes, a new one drops every idle meter (no attempt on the
    wire) first: one pass over the meters per that many new scopes, O(1) amortized. The
    next pass waits until the meters kept (busy ones) have doubled, so thousands of
    attempts on the wire never make every new scope pay for a pass."""

    __slots__ = ("limit",)

    def __init__(self) -> None:
        super().__init__()
        #: How many meters make the next new scope drop the idle ones.
        self.limit = MAX_METERS

    def __missing__(self, scope: str) -> Meter:
        with _LOCK:
            meter = self.get(scope)
            if meter is None:
                if len(self) >= self.limit:
                    for old in [k for k, m in self.items() if not m.wire]:
                        del self[old]
                    self.limit = max(MAX_METERS, 2 * len(self))
                meter = self[scope] = Meter()
            return meter


_METERS: weakref.WeakKeyDictionary[object, Meters] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def meters_of(store: object) -> Meters:
    """The meters of a store object in this process (made on first use)."""
    with _LOCK:
        meters = _METERS.get(store)
        if meters is None:
            meters = _METERS[store] = Meters()
        return meters


def _after_fork() -> None:
    """In a forked child: a parent thread may have held the lock, and the attempts the
    parent's threads had on the wire are not this process's."""
    global _LOCK
    _LOCK = threading.Lock()
    for meters in list(_METERS.values()):
        for meter in list(meters.values()):
            meter.wire.clear()


_forksafe.at_fork(_after_fork)
