"""Times as whole UTC epoch milliseconds, as the SQLite and Redis stores keep them.

A stored time is rounded *up* (a cooldown never ends earlier than asked) and the
present *down* (compared with a stored time, a cooldown runs until the real present
reaches it), so machines and processes agree to the millisecond. An end reckoned from
the present (a quota permit's grant + its window, a settled permit's answer + per) is
a stored time: the present is then rounded *up* (``to_epoch_ms``), or the permit would
stop counting up to a millisecond before the request it admitted leaves the server's
window.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_MAX_MS = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)
_MIN_MS = (datetime.min.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)


def to_epoch_ms(until: datetime) -> int:
    """An aware datetime as UTC epoch milliseconds, rounded *up* (never earlier)."""
    micros = (until - _EPOCH) // _US
    return -(-micros // 1000)


def now_epoch_ms(now: datetime) -> int:
    """The present as UTC epoch milliseconds, rounded *down*."""
    return ((now - _EPOCH) // _US) // 1000


def from_epoch_ms(ms: int) -> datetime:
    """UTC epoch milliseconds as an aware UTC datetime (clamped to datetime's range)."""
    if ms > _MAX_MS:  # datetime.max rounded up to a whole millisecond
        return datetime.max.replace(tzinfo=timezone.utc)
    if ms < _MIN_MS:
        return datetime.min.replace(tzinfo=timezone.utc)
    return _EPOCH + timedelta(milliseconds=ms)


def window_ms(seconds: float) -> int:
    """A window or lease length in whole milliseconds, rounded up, at least 1."""
    return max(1, math.ceil(seconds * 1000))
