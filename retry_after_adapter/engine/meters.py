"""What this process knows of each scope's attempts: which are on the wire and when the
last ones were sent, for quota headers the store did not count (the first window a
store sees of a scope). One map per store object, shared by every adapter on it.
"""

from __future__ import annotations

import collections
import math
import threading
import weakref
from datetime import datetime

from .. import _forksafe

__all__ = ["Meter", "meters_of"]

#: Send times kept per scope (for the first window a server announces).
SENT_KEPT = 4096
#: Beyond this many scopes of one store, idle meters are dropped.
MAX_METERS = 4096


class Meter:
    """One scope's attempts in this process: which are on the wire, when the last ones
    were sent (the call clock's monotonic seconds), and when (monotonic) a success was
    last noted in the store. Updated without a lock: adding to a set, discarding from
    it and appending to a bounded deque are each atomic."""

    __slots__ = ("noted", "reset", "sent", "wire")

    def __init__(self) -> None:
        #: ``id()`` of every call with an attempt on the wire (a call has one at a time).
        self.wire: set[int] = set()
        self.sent: collections.deque[float] = collections.deque(maxlen=SENT_KEPT)
        self.noted = -math.inf
        #: The earliest reset announced for the server's current window, as answers
        #: here read it, and the limit it was announced with (see :meth:`earliest_reset`).
        self.reset: tuple[datetime | None, int | None] = (None, None)

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
