"""Clocks: where the package reads time and sleeps.

All durations are in seconds (float). ``now()`` is wall-clock time as an aware UTC
``datetime``; ``monotonic()`` is a process-local monotonic reading in seconds, used
only for a running call's own deadline and never stored or shared. ``sleep`` waits in
a thread; ``asleep`` (of :class:`SystemClock` and :class:`FakeClock`) waits on the
running event loop, which reads the same monotonic clock.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable

from . import _forksafe
from .errors import ConfigurationError

#: Seconds between looks at a cancel event that cannot be waited on where the wait
#: runs (a ``threading.Event`` in async code, an ``asyncio.Event`` in a thread).
CANCEL_POLL = 0.05


class Event(Protocol):
    """A cancel event: ``threading.Event`` or ``asyncio.Event`` (what is asked of it)."""

    def is_set(self) -> bool: ...


@runtime_checkable
class Clock(Protocol):
    """The time source the retry policy uses."""

    def now(self) -> datetime:
        """Wall-clock time, an aware datetime in UTC."""
        ...

    def monotonic(self) -> float:
        """Monotonic time in seconds (process-local; only differences matter)."""
        ...

    def sleep(self, seconds: float, cancel: Event | None = None) -> bool:
        """Wait ``seconds``; return early when ``cancel`` is set.

        Returns True when the full wait elapsed, False when it was cancelled.
        """
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and an interruptible wait."""

    def __init__(self) -> None:
        # The engine reads the clock a few times per attempt: an instance reads through
        # the C functions themselves, without a Python frame (unless a subclass has its
        # own reading).
        cls = type(self)
        if cls.now is SystemClock.now:
            self.now = functools.partial(datetime.now, timezone.utc)  # type: ignore[method-assign]
        if cls.monotonic is SystemClock.monotonic:
            self.monotonic = time.monotonic  # type: ignore[method-assign]

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, cancel: Event | None = None) -> bool:
        if seconds <= 0:
            return not (cancel is not None and cancel.is_set())
        if cancel is None:
            time.sleep(seconds)
            return True
        if isinstance(cancel, threading.Event):
            return not cancel.wait(seconds)
        end = time.monotonic() + seconds  # an asyncio.Event set from its loop: looked at
        while not cancel.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(CANCEL_POLL, left))
        return False

    async def asleep(self, seconds: float, cancel: Event | None = None) -> bool:
        """:meth:`sleep` on the running event loop (no thread waits)."""
        import asyncio

        if seconds <= 0 or cancel is None:
            if seconds > 0:
                await asyncio.sleep(seconds)
            return not (cancel is not None and cancel.is_set())
        if isinstance(cancel, asyncio.Event):
            try:
                await asyncio.wait_for(cancel.wait(), seconds)
            except asyncio.TimeoutError:
                return not cancel.is_set()
            return False
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds  # a threading.Event: looked at every CANCEL_POLL
        while not cancel.is_set():
            left = end - loop.time()
            if left <= 0:
                return True
            await asyncio.sleep(min(CANCEL_POLL, left))
        return False

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that only moves when told to, or when something sleeps on it.

    ``sleep(s)`` (and ``await asleep(s)``) advances both readings by ``s`` at once and returns, so tests (the
    package's and its users') never really wait. Thread-safe. ``sleeps`` records
    every requested sleep in seconds, in order.
    """

    def __init__(self, start: datetime | None = None, monotonic: float = 1000.0) -> None:
        if start is None:
            start = datetime(2026, 1, 1, tzinfo=timezone.utc)
        if start.tzinfo is None or start.utcoffset() is None:
            raise ConfigurationError("FakeClock start must be an aware datetime")
        self._lock = threading.Lock()
        _forksafe.register(self)
        self._now = start.astimezone(timezone.utc)
        self._mono = float(monotonic)
        self.sleeps: list[float] = []

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds`` (must be >= 0)."""
        if not seconds >= 0:
            raise ConfigurationError("FakeClock cannot go backwards")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def set_now(self, when: datetime) -> None:
        """Jump the wall clock (only) to ``when``, to simulate local clock skew."""
        if when.tzinfo is None or when.utcoffset() is None:
            raise ConfigurationError("FakeClock.set_now needs an aware datetime")
        with self._lock:
            self._now = when.astimezone(timezone.utc)

    def sleep(self, seconds: float, cancel: Event | None = None) -> bool:
        if cancel is not None and cancel.is_set():
            return False
        seconds = max(0.0, float(seconds))
        with self._lock:
            self.sleeps.append(seconds)
        self.advance(seconds)
        return True

    async def asleep(self, seconds: float, cancel: Event | None = None) -> bool:
        """:meth:`sleep`, then one turn of the event loop (other tasks run)."""
        import asyncio

        done = self.sleep(seconds, cancel)
        await asyncio.sleep(0)
        return done

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now.isoformat()}, monotonic={self._mono})"


DEFAULT_CLOCK: Clock = SystemClock()
