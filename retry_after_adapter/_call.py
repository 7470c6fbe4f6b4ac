"""The per-call budget: what one call may spend, and what it has spent so far.

``requests`` hard-codes ``retries=self.max_retries`` when it calls urllib3, so the
per-call state reaches the Retry object through a context variable that the adapter
(or :func:`budget`) sets. Context variables are per thread and per task, so one Session
per thread, or one shared Session, both work.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from .clock import Clock
from .cooldown.base import CooldownStore
from .deferral import Deferral
from .errors import ConfigurationError, CooldownUnavailable, DeferralLimitExceeded, RetryDeferred
from .header import RetryAfter, parse_retry_after
from .policy import DEFER, Decision, DecisionRecord, admit, check_limit

log = logging.getLogger("retry_after_adapter")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


@dataclass(frozen=True)
class Override:
    """Limits set by :func:`budget` for the calls made inside it (seconds)."""

    deadline: float | _Unset | None = UNSET
    max_wait: float | _Unset | None = UNSET
    cancel: threading.Event | None = None
    resume: Deferral | None = None


_OVERRIDE: contextvars.ContextVar[Override | None] = contextvars.ContextVar(
    "retry_after_adapter_budget", default=None
)
CURRENT: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "retry_after_adapter_call", default=None
)


@contextmanager
def budget(
    *,
    deadline: float | _Unset | None = UNSET,
    max_wait: float | _Unset | None = UNSET,
    cancel: threading.Event | None = None,
    resume: Deferral | None = None,
) -> Iterator[None]:
    """Override the retry budget of every call made inside the ``with`` block.

    - ``deadline``: seconds each call may take from its start, waits included
      (``None`` removes the Retry object's deadline).
    - ``max_wait``: the longest single wait in seconds (``None``: no limit).
    - ``cancel``: a ``threading.Event``; setting it ends a running wait at once and the
      call returns a deferral with reason ``"cancelled"``.
    - ``resume``: a :class:`Deferral` this call continues: its attempt and deferral
      counts and history carry over, and nothing is sent before its ``eligible_at``.

    Unset arguments keep the value of an enclosing ``budget`` or of the Retry object.
    """
    if not isinstance(deadline, _Unset):
        check_limit("deadline", deadline)
    if not isinstance(max_wait, _Unset):
        check_limit("max_wait", max_wait)
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise ConfigurationError("cancel must be a threading.Event (or have is_set() and wait())")
    if resume is not None and not isinstance(resume, Deferral):
        raise ConfigurationError("resume must be a Deferral (use Deferral.from_dict on stored JSON)")
    outer = _OVERRIDE.get()
    merged = Override(
        deadline=deadline if not isinstance(deadline, _Unset) or outer is None else outer.deadline,
        max_wait=max_wait if not isinstance(max_wait, _Unset) or outer is None else outer.max_wait,
        cancel=cancel if cancel is not None or outer is None else outer.cancel,
        resume=resume if resume is not None or outer is None else outer.resume,
    )
    token = _OVERRIDE.set(merged)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def current_override() -> Override | None:
    return _OVERRIDE.get()


class Halt(Exception):
    """Internal: ends urllib3's retry loop from inside the Retry object (adapter mode).

    Not an ``OSError`` or urllib3 ``HTTPError``, so neither urllib3 nor requests
    catches it; the adapter turns it into the returned response or ``RetryDeferred``.
    """

    def __init__(self, response: Any, deferral: Deferral | None, stop_reason: str | None) -> None:
        super().__init__(stop_reason or (deferral.reason if deferral else "halt"))
        self.response = response
        self.deferral = deferral
        self.stop_reason = stop_reason


class CallState:
    """What one call (one ``session.send``, or one urllib3 ``urlopen``) may spend.

    ``start`` is on the monotonic clock (seconds) and never leaves the process; wall
    clock times (``started_at``, cooldowns, deferrals) are aware UTC.
    """

    __slots__ = (
        "adapter_mode",
        "attempt_reserve",
        "attempts",
        "cancel",
        "clock",
        "deadline",
        "deferrals_before",
        "history",
        "jitter",
        "last_retry_after",
        "last_skew",
        "last_status",
        "max_deferrals",
        "max_lifetime",
        "max_wait",
        "on_decision",
        "recorded",
        "resume_at",
        "scope",
        "start",
        "started_at",
        "store",
    )

    def __init__(
        self,
        *,
        clock: Clock,
        deadline: float | None,
        max_wait: float | None,
        attempt_reserve: float,
        max_deferrals: int | None,
        jitter: float = 0.0,
        max_lifetime: float | None,
        on_decision: tuple[Callable[[DecisionRecord], None], ...],
        scope: str | None = None,
        store: CooldownStore | None = None,
        adapter_mode: bool = False,
        override: Override | None = None,
    ) -> None:
        self.clock = clock
        self.start = clock.monotonic()
        self.deadline = deadline
        self.max_wait = max_wait
        self.cancel: threading.Event | None = None
        resume: Deferral | None = None
        if override is not None:
            if not isinstance(override.deadline, _Unset):
                self.deadline = override.deadline
            if not isinstance(override.max_wait, _Unset):
                self.max_wait = override.max_wait
            self.cancel = override.cancel
            resume = override.resume
        self.attempt_reserve = attempt_reserve
        self.jitter = jitter
        self.max_deferrals = max_deferrals
        self.max_lifetime = max_lifetime
        self.on_decision = on_decision
        self.scope = scope
        self.store = store
        self.adapter_mode = adapter_mode
        self.attempts = resume.attempts if resume else 0
        self.deferrals_before = resume.deferrals if resume else 0
        self.history: tuple[Deferral, ...] = resume.chain() if resume else ()
        self.started_at: datetime | None = resume.started_at if resume else None
        self.resume_at: datetime | None = resume.eligible_at if resume else None
        # A resumed job starts from what its last deferral knew of the server.
        self.last_status: int | None = resume.status if resume else None
        self.last_retry_after: str | None = resume.retry_after if resume else None
        self.last_skew: float | None = resume.clock_skew if resume else None
        self.recorded: object = None

    # -- time ---------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the call started (monotonic)."""
        return max(0.0, self.clock.monotonic() - self.start)

    def remaining(self) -> float | None:
        """Seconds left before the deadline, or None without one."""
        if self.deadline is None:
            return None
        return self.deadline - self.elapsed()

    def note_attempt(self) -> None:
        """Count a request that was sent (or tried)."""
        self.attempts += 1
        if self.started_at is None:
            self.started_at = self.clock.now()

    # -- shared cooldown ------------------------------------------------------------
    def cooldown_until(self) -> datetime | None:
        """When the scope's shared cooldown (and a resumed deferral) ends, aware UTC.

        None when neither is set. May raise ``CooldownUnavailable`` when the store fails
        and fails closed.
        """
        until = self.resume_at
        if self.store is not None and self.scope is not None:
            stored = self.store.get(self.scope)
            if stored is not None and (until is None or stored > until):
                until = stored
        return until

    def cooldown_left(self) -> float:
        """Seconds until :meth:`cooldown_until` (0 when it is past or unset)."""
        return self.seconds_until(self.cooldown_until())

    def seconds_until(self, until: datetime | None) -> float:
        """Seconds from now (wall clock) to ``until``; 0 when it is None or past."""
        if until is None:
            return 0.0
        return max(0.0, (until - self.clock.now()).total_seconds())

    def read_hint(self, raw: str, date: str | None) -> RetryAfter:
        """Parse a response's Retry-After (and Date) as received now, and remember the
        raw value and clock skew for the deferral. Raises ``InvalidRetryAfter``."""
        parsed = parse_retry_after(raw, received_at=self.clock.now(), date=date)
        self.last_retry_after = raw.strip(" \t")
        self.last_skew = parsed.clock_skew
        return parsed

    def extend_cooldown(self, until: datetime) -> float:
        """Advance the scope's shared cooldown to ``until`` (later wins); seconds left."""
        if self.store is None or self.scope is None:
            return max(0.0, (until - self.clock.now()).total_seconds())
        effective = self.store.extend(self.scope, until)
        return max(0.0, (effective - self.clock.now()).total_seconds())

    # -- decisions ------------------------------------------------------------------
    def emit(self, decision: Decision, server_delay: float | None = None) -> None:
        """Log a decision and hand it to the ``on_decision`` hooks."""
        record = DecisionRecord(
            action=decision.action,
            reason=decision.reason,
            wait=decision.wait,
            scope=self.scope,
            status=self.last_status,
            attempt=self.attempts,
            server_delay=server_delay,
        )
        if log.isEnabledFor(logging.DEBUG) or decision.action == DEFER:
            log.log(
                logging.INFO if decision.action == DEFER else logging.DEBUG,
                "%s%s: wait %.3f s (scope %s, status %s, attempt %d)",
                decision.action,
                f" ({decision.reason})" if decision.reason else "",
                decision.wait,
                self.scope,
                self.last_status,
                self.attempts,
                extra={
                    "scope": self.scope,
                    "status": self.last_status,
                    "reason": decision.reason,
                    "planned_delay": decision.wait,
                    "attempt": self.attempts,
                    "action": decision.action,
                },
            )
        for hook in self.on_decision:
            try:
                hook(record)
            except Exception:
                log.exception("on_decision hook failed; the call goes on")

    def deferral(self, wait: float, reason: str, until: datetime | None = None) -> Deferral:
        """The deferral for a wait of ``wait`` seconds from now (or until ``until``).

        A deferral is never eligible before the deferral this call resumed, whatever
        ended it (a cancel, a store outage). Raises ``DeferralLimitExceeded`` past
        ``max_deferrals`` or the lifetime cap.
        """
        now = self.clock.now()
        if until is not None:
            eligible = until
        else:
            wait = wait if math.isfinite(wait) else 1e15
            try:
                eligible = now + timedelta(seconds=wait)
            except OverflowError:
                eligible = datetime.max.replace(tzinfo=now.tzinfo)
        if self.resume_at is not None and eligible < self.resume_at:
            eligible = self.resume_at
        if until is not None or eligible == self.resume_at:
            wait = max(0.0, (eligible - now).total_seconds())
        if self.started_at is None:
            # Deferred before any attempt was sent: the job's lifetime starts now.
            self.started_at = now
        deferral = Deferral(
            eligible_at=eligible,
            delay=max(0.0, min(wait, 1e15)),
            reason=reason,
            scope=self.scope,
            attempts=self.attempts,
            deferrals=self.deferrals_before + 1,
            status=self.last_status,
            retry_after=self.last_retry_after,
            clock_skew=self.last_skew,
            started_at=self.started_at,
            history=self.history,
        )
        if self.max_deferrals is not None and deferral.deferrals > self.max_deferrals:
            self.emit(Decision("stop", 0.0, "max_deferrals"))
            raise DeferralLimitExceeded(deferral, "max_deferrals")
        if self.max_lifetime is not None and self.started_at is not None:
            lifetime = (eligible - self.started_at).total_seconds()
            if lifetime > self.max_lifetime:
                self.emit(Decision("stop", 0.0, "max_lifetime"))
                raise DeferralLimitExceeded(deferral, "max_lifetime")
        return deferral

    def defer(
        self,
        decision: Decision,
        response: Any,
        server_delay: float | None = None,
        until: datetime | None = None,
    ) -> Exception:
        """The exception that ends the call with a deferral (to be raised by the caller).

        ``until`` is the exact eligible time when the caller knows it (a stored cooldown),
        so that two clock readings cannot move it.
        """
        try:
            deferral = self.deferral(decision.wait, decision.reason or "deadline", until)
        except DeferralLimitExceeded:  # recorded as a stop, not as one more deferral
            release(response)
            raise
        self.emit(decision, server_delay)
        if self.adapter_mode:
            return Halt(response, deferral, None)
        return RetryDeferred(deferral, response=response)


_jitter_rng = random.Random()

#: Seconds after which a call deferred with "cooldown-unknown" may try again.
UNKNOWN_COOLDOWN_RETRY = 1.0
_MAX_COOLDOWN_ROUNDS = 16


def wait_out(call: CallState, target: float, response: Any) -> None:
    """Wait until monotonic time ``target``, then until the scope's cooldown is over.

    Another worker may extend the shared cooldown while this one waits: the store is
    read again after each wait, and a further cooldown is waited out if it fits the
    budget, else the call is deferred with reason ``"cooldown"``. A set cancel event
    ends the wait at once with reason ``"cancelled"``. Raises the ending exception
    (``Halt``/``RetryDeferred``); returns when the next attempt may be sent.
    """
    clock = call.clock
    for _ in range(_MAX_COOLDOWN_ROUNDS):
        cancel = call.cancel
        left = target - clock.monotonic()
        if cancel is not None and cancel.is_set():
            raise call.defer(Decision(DEFER, max(0.0, left), "cancelled"), response)
        if left > 0 and not clock.sleep(left, cancel):
            raise call.defer(Decision(DEFER, max(0.0, target - clock.monotonic()), "cancelled"), response)
        try:
            until = call.cooldown_until()
        except CooldownUnavailable:
            raise call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, "cooldown-unknown"), response) from None
        extra = call.seconds_until(until)
        if extra <= 0:
            return
        if call.jitter:
            # Workers held back by one cooldown would all wake at its end: spread them.
            extra += _jitter_rng.uniform(0.0, call.jitter)
        decision = admit(
            cooldown_left=extra,
            elapsed=call.elapsed(),
            deadline=call.deadline,
            max_wait=call.max_wait,
            attempt_reserve=call.attempt_reserve,
        )
        if decision.action == DEFER:
            raise call.defer(decision, response, until=until)
        call.emit(Decision(decision.action, extra, "cooldown"))
        target = clock.monotonic() + extra
    until = call.cooldown_until()
    raise call.defer(Decision(DEFER, call.seconds_until(until), "cooldown"), response, until=until)


def release(response: Any) -> None:
    """Give a urllib3 response's connection back to its pool, body discarded."""
    drain = getattr(response, "drain_conn", None)
    if drain is None:
        return
    try:
        drain()
    except Exception:  # the connection is discarded by urllib3 in that case
        log.debug("could not drain a response before giving up")
