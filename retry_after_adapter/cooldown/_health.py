"""The failure layer's health of one store: the circuit breaker, the bound on each
operation, and one warning per outage.

- **Bounded operations.** One operation takes at most the bound the store declares
  (``base.Bounded``: its ``operation_timeout()``, seconds; else :data:`STORE_TIMEOUT`)
  and never more than the call has left (its :class:`StoreBudget`). Only a store of
  that type is called directly on the calling thread; any other operation runs on a
  helper thread the call stops waiting for at its bound. No attribute of a store is
  read for this (a ``timeout`` of its own meaning is not a promise).
- **A circuit breaker.** An operation that fails or times out opens the breaker: the
  store is skipped for a back-off interval (0.5 s, doubling on each failed probe to
  5 s; at most 0.5 s after the last failure while cooldowns wait to be written back)
  and then tried by one probe, so no call pays a store timeout twice and a hung store
  costs a fleet one timeout per interval. Operations in flight when the breaker opened
  fail as part of the same failure: they do not lengthen the back-off.
- **Contention is not an outage.** A store that answers "busy" (locks held by other
  writers past its timeout) makes that operation fall back; only :data:`BUSY_RUN` busy
  answers in a row open the breaker. A store that refuses an operation's values
  (``ValueError``, ``ConfigurationError``...) answered: it is not down.
- **One health state and one warning per outage** (a WARNING when it starts, an INFO
  line once the store has answered for :data:`SETTLE` seconds without a failure), with
  hysteresis: a store that fails again within :data:`QUIET_PERIOD` of recovering
  continues the same outage, so a flapping store logs a few lines a minute at most.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import ConfigurationError, CooldownStoreError, failure_cause
from .base import Bounded

_T = TypeVar("_T")

#: Seconds one store operation may take when the store does not say (a store says by
#: type, ``base.Bounded``: the SQLite store waits 0.25 s for a lock by default, a Redis
#: store built from a URL 0.1 s to connect plus 0.1 s for a reply).
STORE_TIMEOUT = 0.25
#: The first back-off (seconds) of the circuit breaker after a failure; it doubles on
#: each failed probe up to :data:`BREAKER_MAX` (:data:`BREAKER_MAX_PENDING` while
#: cooldowns wait to be written back: other processes do not know them yet), and resets
#: when the store answers.
BREAKER_FIRST = 0.5
BREAKER_MAX = 5.0
BREAKER_MAX_PENDING = 0.5
#: Seconds of health that end an outage that flapped, and within which a new failure
#: after a recovery continues the same outage (no new warning).
QUIET_PERIOD = 30.0
#: Busy answers in a row (locks held by other writers past the store's timeout, with no
#: success in between) that open the breaker; fewer only make that operation fall back.
BUSY_RUN = 8
#: Seconds without a failure before the line that ends an outage is logged (operations
#: that were in flight when the store broke can still succeed after the first failure).
SETTLE = 1.0
#: Less than this (seconds) left in a call: the store is not asked at all.
TOO_LITTLE = 0.001

#: Errors by which a store refuses an operation's values rather than fails: they never
#: open the breaker (an absurd value must not shut out every other scope).
_REFUSED_VALUES = (ConfigurationError, ValueError, TypeError, OverflowError)

log = logging.getLogger("retry_after_adapter")


#: What calls do during an outage, as its warning says it: by the store_failure of the
#: call that noticed it (True: closed), or both when no call did (a read for a report,
#: a write in the background); calls of an adapter of the other kind do theirs.
_OUTAGE_DOES: dict[bool | None, str] = {
    False: "cooldowns are kept in this process and written back when it recovers",
    True: (
        "calls that fail closed (store_failure='closed') are deferred with reason cooldown-unknown "
        "until it recovers"
    ),
    None: (
        "cooldowns are kept in this process and written back when it recovers, and calls that fail closed "
        "(store_failure='closed') are deferred with reason cooldown-unknown meanwhile"
    ),
}


class StoreBudget:
    """What one call may spend on store operations, and how it fails.

    The engine makes one per call of a guarded store: ``deadline`` is the call's end on
    ``monotonic`` (seconds; None: no deadline), ``fail_closed`` the adapter's failure
    policy. The failure layer sets ``failed`` once an operation of the call failed or
    ran out of the call's time: the call does not touch the store again.
    """

    __slots__ = ("deadline", "fail_closed", "failed", "monotonic")

    def __init__(self, deadline: float | None, monotonic: Callable[[], float], fail_closed: bool) -> None:
        self.deadline = deadline
        self.monotonic = monotonic
        self.fail_closed = fail_closed
        self.failed = False

    def left(self) -> float | None:
        """Seconds the call may still spend (None: no deadline)."""
        return None if self.deadline is None else self.deadline - self.monotonic()


class OutOfTime(Exception):
    """A store operation was cut short by the call's own deadline, not the store's."""


def _cause_of(exc: BaseException) -> tuple[str, bool]:
    """What a failure was and whether it will not heal by itself: as the store's error
    named it, else read off the exception (``errors.failure_cause``)."""
    cause = getattr(exc, "cause", "")
    if isinstance(exc, CooldownStoreError) and cause:
        return str(cause), bool(getattr(exc, "lasting", False))
    return failure_cause(exc)


def declared_bound(store: object) -> float | None:
    """The bound (seconds) ``store`` declares on each of its operations: its
    ``operation_timeout()`` when it is a :class:`~.base.Bounded` store, else None (its
    operations are bounded on a helper thread). A declared bound that is not a finite
    number of seconds > 0 is a ConfigurationError naming the store."""
    if not isinstance(store, Bounded):
        return None
    value = store.operation_timeout()
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ConfigurationError(
            f"{store.__class__.__name__}.operation_timeout() must return a finite number of seconds > 0 "
            f"or None, not {value!r}"
        )
    return float(value)


def _answered_late(abandoned: Callable[[Any], None]) -> Callable[[concurrent.futures.Future[Any]], None]:
    """A done-callback handing an abandoned operation's answer, if any, to ``abandoned``."""

    def done(future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        try:
            abandoned(future.result())
        except Exception as exc:  # housekeeping: the lease expires by itself
            log.debug("giving back an abandoned slot failed: %s", type(exc).__name__)

    return done


class Waiting(Protocol):
    """What the breaker asks of the write-back it works with."""

    written_back: int

    @property
    def pending(self) -> int:
        """How many cooldowns wait to be written back."""

    def strand(self, only_if_pending: bool) -> None:
        """A write was kept locally while the store was not down: the next success
        writes it back (``only_if_pending``: only if cooldowns wait)."""

    def failing(self) -> None:
        """The store failed: what this process holds waits to be written back (the
        store may come back empty); start the writer if something waits."""


#: An operation for a helper thread: its future, the operation and its arguments.
_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]
#: Helper threads per store and process that run the operations of a store that does
#: not bound its own (each abandoned at its call's bound, see :meth:`Breaker.bounded`).
HELPER_THREADS = 8


class HelperThreads:
    """At most ``size`` daemon threads running submitted operations, each answered
    through a :class:`concurrent.futures.Future`. Not a ``ThreadPoolExecutor``: the
    interpreter joins those at exit, so a store whose backend never answers would keep
    the process from ever exiting; a daemon thread stuck in a hung operation does not."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0

    def submit(self, operation: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        """Run ``operation(*args)`` on a helper thread (one more is started while more
        operations wait than threads are idle, up to ``size``); its answer or error in
        the future."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._lock:
            self._pending += 1
            start = self._pending > self._idle and self._threads < self._size
            if start:
                self._threads += 1
        self._queue.put((future, operation, args))
        if start:
            threading.Thread(target=self._run, name=f"{self._name}-{self._threads}", daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, operation, args = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(operation(*args))
                except BaseException as exc:  # handed to the caller, who may have gone
                    future.set_exception(exc)


class Breaker:
    """The breaker and outage state of one store, owned by its failure layer; it works
    with the layer's write-back (``waiting``, set once both are made)."""

    waiting: Waiting

    def __init__(self, name: str, bound: float | None, monotonic: Callable[[], float]) -> None:
        #: The store's class name, for messages (the store's own, not its completion's).
        self.name = name
        self.monotonic = monotonic
        self._lock = threading.Lock()
        #: The bound the store declares on its operations (see :func:`declared_bound`).
        self._native = bound
        #: Bound (seconds) of one operation: the store's declared one, else STORE_TIMEOUT.
        self.timeout = self._native if self._native is not None else STORE_TIMEOUT
        self.open_until = 0.0  # the breaker is open until then (0: closed)
        self._backoff = BREAKER_FIRST
        self._probing = False
        self.is_down = False
        self.announced = False  # an outage warning is outstanding
        self._relapsed = False  # ...and the store failed again soon after recovering
        self._since = 0.0  # when the announced outage started
        self._last_failure = -math.inf
        self._last_recovery_line = -math.inf
        self._executor: HelperThreads | None = None
        #: Outages announced with a warning; failed operations; busy answers.
        self.outages = 0
        self.failures = 0
        self.busy = 0
        #: Busy answers in a row (a success ends the run).
        self.busy_run = 0

    def skipped(self, budget: StoreBudget | None) -> bool:
        """Whether this operation skips the store: the breaker is open (and this is not
        the one probe it lets through), or the call's store operations already failed."""
        if not (self.open_until or (budget is not None and budget.failed)):
            return False
        return not self._may_try(budget)

    def _may_try(self, budget: StoreBudget | None) -> bool:
        """Whether this operation may touch the store while the breaker is open: only
        one probe once the back-off has passed, and never twice in one call."""
        if budget is not None and budget.failed:
            return False
        if self.monotonic() < self.open_until:
            return False
        with self._lock:
            if self._probing or not self.open_until:
                return not self._probing
            self._probing = True
            return True

    def bounded(
        self,
        operation: Callable[..., _T],
        args: tuple[Any, ...],
        budget: StoreBudget | None,
        abandoned: Callable[[_T], None] | None = None,
    ) -> _T:
        """Run ``operation`` within the store's bound and what the call has left.

        A store that declares it bounds itself (:class:`~.base.Bounded`, its bound
        within what is left) is called directly; otherwise the operation runs on a
        helper thread and is abandoned (its effect, if any, later-wins; ``abandoned``
        gets its answer should it come) when the bound passes."""
        limit = self.timeout
        left = budget.left() if budget is not None else None
        by_call = left is not None and left < limit
        if by_call:
            if left is None or left < TOO_LITTLE:
                raise OutOfTime  # no time to ask: not the store's fault
            limit = left
        elif self._native is not None:
            return operation(*args)
        future = self._pool().submit(operation, *args)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            if abandoned is not None:
                future.add_done_callback(_answered_late(abandoned))
            if by_call:
                raise OutOfTime from None  # the call ran out first: no verdict on the store
            raise CooldownStoreError(
                f"the cooldown store {self.name} did not answer within {limit:.3g} s", cause="timed out"
            ) from None

    def _pool(self) -> HelperThreads:
        executor = self._executor
        if executor is None:
            with self._lock:
                executor = self._executor
                if executor is None:
                    executor = self._executor = HelperThreads(HELPER_THREADS, "retry-after-store")
        return executor

    def gave_up(self, budget: StoreBudget | None) -> None:
        """The call ran out of time before the store answered: it does not ask again,
        and the store is not judged (a probe it was making is released)."""
        if budget is not None:
            budget.failed = True
        with self._lock:
            self._probing = False
        self.waiting.strand(only_if_pending=True)

    def failed(self, exc: BaseException, budget: StoreBudget | None) -> None:
        """An operation failed: count it, open the breaker, warn once per outage."""
        if isinstance(exc, _REFUSED_VALUES) and not isinstance(exc, CooldownStoreError):
            # The store refused this operation's values: it answered, so it is not down
            # (a probe it was is over), and no other call pays for it.
            log.debug("a cooldown store operation was refused: %s", type(exc).__name__)
            with self._lock:
                self._probing = False
            return
        busy = getattr(exc, "busy", False) and not self.is_down
        if budget is not None and not busy:
            budget.failed = True  # a busy store may be asked again in this call
        if busy and self._busy_once():
            return
        self._open()
        if self._announce():
            name = self.name
            cause, lasting = _cause_of(exc)
            what = _OUTAGE_DOES[None if budget is None else budget.fail_closed]
            log.warning(
                "cooldown store %s failed: %s (%s)%s; %s; it is skipped for %.3g s at a time until then",
                name,
                cause,
                type(exc).__name__,
                "; this looks like a misconfiguration, which will not heal by itself" if lasting else "",
                what,
                BREAKER_FIRST,
                extra={"store": name, "error": type(exc).__name__, "cause": cause, "lasting": lasting},
            )

    def _busy_once(self) -> bool:
        """Contention while the store otherwise answers: True when this operation only
        falls back (fewer than :data:`BUSY_RUN` busy answers in a row)."""
        with self._lock:
            self.busy += 1
            self.busy_run += 1
            if self.busy_run >= BUSY_RUN:
                return False
            self._probing = False
        self.waiting.strand(only_if_pending=False)
        return True

    def _open(self) -> None:
        """Open the breaker for the back-off, and double it. A failure while the breaker
        is already open is an operation that was in flight when the store broke: the
        same outage, which neither lengthens the back-off nor moves the next probe (a
        fleet's burst of failures costs one back-off, not ten)."""
        self.waiting.failing()
        with self._lock:
            now = self.monotonic()
            self.failures += 1
            self._last_failure = now
            self._probing = False
            self.is_down = True
            if now < self.open_until:
                return
            self.open_until = now + self._backoff
            cap = BREAKER_MAX_PENDING if self.waiting.pending else BREAKER_MAX
            self._backoff = min(self._backoff * 2, cap)

    def hurry(self) -> None:
        """A cooldown now waits to be written back: the breaker, opened for a long
        back-off while nothing did, lets a probe through within
        :data:`BREAKER_MAX_PENDING` seconds of the last failure (other processes do not
        know the cooldown yet)."""
        with self._lock:
            if self.open_until:
                self.open_until = min(self.open_until, self._last_failure + BREAKER_MAX_PENDING)
                self._backoff = min(self._backoff, BREAKER_MAX_PENDING)

    def _announce(self) -> bool:
        """Whether this failure starts an outage to warn about (not one that goes on,
        nor one that relapsed soon after recovering)."""
        with self._lock:
            if self.announced:
                return False
            self.announced = True
            if self._last_failure - self._last_recovery_line < QUIET_PERIOD:
                self._relapsed = True  # the outage that just ended goes on: no new line
                return False
            self._relapsed = False
            self._since = self._last_failure
            self.outages += 1
            return True

    def close(self) -> bool:
        """The store answered: close the breaker; True if it was down."""
        with self._lock:
            was_down = self.is_down
            self.is_down = False
            self.open_until = 0.0
            self._backoff = BREAKER_FIRST
            self._probing = False
        return was_down

    def maybe_recovered(self) -> None:
        """Log the end of the outage once the store has stayed healthy long enough."""
        now = self.monotonic()
        with self._lock:
            settle = QUIET_PERIOD if self._relapsed else SETTLE
            if not self.announced or now - self._last_failure < settle:
                return
            self.announced = False
            self._relapsed = False
            self._last_recovery_line = now
            lasted = now - self._since
            failures = self.failures
        log.info(
            "cooldown store %s recovered after %.3g s (%d failed operations so far; "
            "%d cooldowns written back so far)",
            self.name,
            lasted,
            failures,
            self.waiting.written_back,
            extra={"store": self.name},
        )

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._executor = None
        self._probing = False
