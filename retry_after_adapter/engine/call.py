"""One call's state: what it may spend, what it has spent, what it knows of the server.

A :class:`Call` is made once per ``session.send`` (redirect hops included) or
``urlopen`` and passed to every step; nothing else holds it. Beside the policy, the plan
and the scope it holds four parts, each with one purpose: its :class:`Terms` (what it
may spend, set when it starts), its :class:`Progress` (what the job has spent, carried
by a resumed deferral), the attempt's :class:`Ticket` (admission to answer) and what the
server said (:class:`Heard`, and the scope's cooldown). Durations are seconds (float);
``Progress.start`` is monotonic and never leaves the process; every time stored or put in
a deferral is an aware UTC ``datetime``.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout

from ..clock import Clock
from ..cost import BUDGET
from ..deferral import Deferral
from ..deferred import DeferralLimitExceeded
from ..dialects import milliseconds, precise_wait
from ..errors import InvalidRetryAfter
from ..header import RetryAfter, parse_retry_after
from ..observe import DecisionHook, emit
from ..policy import DEFER, STOP, TOO_LONG, Decision, Reason, beyond_bound, lifetime_limit
from .override import UNSET, Override
from .plan import NO_PLAN, Plan
from .state import NOTHING_HEARD, Heard, Policy, Progress, Terms, Ticket

if TYPE_CHECKING:
    from ..cooldown.base import PartwiseStore
    from .meters import Meter

__all__ = ["MIN_ATTEMPT_TIMEOUT", "Call", "terms_of"]

#: The smallest timeout, in seconds, an attempt gets when its deadline is nearly used
#: up (a zero timeout would make the socket non-blocking). ``attempt_reserve`` raises it.
MIN_ATTEMPT_TIMEOUT = 0.1


def terms_of(policy: Policy, hooks: tuple[DecisionHook, ...]) -> Terms:
    """The terms of ``policy``'s calls with the front end's ``hooks`` added: made once
    per policy and hooks (kept on the policy, an immutable value), then shared."""
    kept = policy._terms
    if kept is not None and kept[0] is hooks:
        return kept[1]
    terms = Terms(
        policy.deadline, policy.max_wait, None, policy.on_decision + hooks if hooks else policy.on_decision
    )
    policy._terms = (hooks, terms)
    return terms


class Call:
    """One call's state (see the module). ``retry`` holds urllib3's counters (replaced by
    each retry, as urllib3 does); ``policy`` is the :class:`RetryAfterRetry` the call
    started with; ``plan`` what its adapter worked out once (store, quota, cap)."""

    # Slots, every one set in __init__: a slot read is the cheapest attribute read.
    __slots__ = (
        "clock",
        "cooldown",
        "heard",
        "meter",
        "plan",
        "policy",
        "progress",
        "retry",
        "scope",
        "store",
        "terms",
        "ticket",
    )

    def __init__(
        self,
        policy: Policy,
        plan: Plan = NO_PLAN,
        *,
        scope: str | None = None,
        hooks: tuple[DecisionHook, ...] = (),
        override: Override | None = None,
    ) -> None:
        self.policy = policy
        self.retry: Retry = policy
        clock: Clock = policy.clock
        self.clock = clock
        self.plan = plan
        self.scope = scope
        #: Its deadline, maximum wait, cancel event and hooks (see :class:`Terms`).
        kept = policy._terms  # terms_of's look, written out: every call passes here
        self.terms = kept[1] if kept is not None and kept[0] is hooks else terms_of(policy, hooks)
        #: What the job has spent so far (see :class:`Progress`), from now.
        progress = self.progress = Progress()
        progress.start = clock.monotonic()
        #: The scope's shared cooldown as last read or written.
        self.cooldown: datetime | None = None
        #: What the server said last (see :class:`Heard`).
        self.heard = NOTHING_HEARD
        #: The attempt's admission, from its grant to its answer (see :class:`Ticket`).
        self.ticket = Ticket()
        if override is not None:
            self._override(override)
        #: The store as this call talks to it (None: none): see ``Plan.store_for``.
        self.store: PartwiseStore | None = plan.store_for(self)
        #: The scope's meter in this process, for quota headers (None: not counted).
        self.meter: Meter | None = plan.meter(scope) if policy.quota_headers else None

    def continue_on(self, plan: Plan, scope: str) -> None:
        """Go on with the next hop of a redirect, sent through ``plan`` (an adapter's,
        maybe another's) to ``scope``: what was spent and learned carries over."""
        moved = plan is not self.plan or scope != self.scope
        if plan is not self.plan:
            self.plan = plan
            self.store = plan.store_for(self)
        self.scope = scope
        if moved:
            self.meter = plan.meter(scope) if self.policy.quota_headers else None

    def _override(self, override: Override) -> None:
        """Apply an enclosing ``budget()``: its limits, cancel event and resumed deferral."""
        terms = self.terms
        self.terms = Terms(
            terms.deadline if override.deadline is UNSET else override.deadline,  # type: ignore[arg-type]
            terms.max_wait if override.max_wait is UNSET else override.max_wait,  # type: ignore[arg-type]
            override.cancel,
            terms.hooks,
        )
        if override.cost is not None:
            self.progress.cost = override.cost
            self.progress.cost_from = BUDGET
        if override.priority:
            self.progress.priority = override.priority
        resume = override.resume
        if resume is None:
            return
        progress = self.progress
        progress.attempts = resume.attempts
        progress.deferrals_before = resume.deferrals
        progress.history = resume.chain()
        progress.started_at = resume.started_at
        progress.not_before = resume.eligible_at
        # A resumed job starts from what its last deferral knew of the server.
        self.heard = Heard(resume.status, resume.retry_after, resume.clock_skew)

    # -- time ---------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the call started (monotonic)."""
        return max(0.0, self.clock.monotonic() - self.progress.start)

    def time_left(self) -> float | None:
        """Seconds the call may still spend; None: no deadline."""
        if self.terms.deadline is None:
            return None
        return self.terms.deadline - self.elapsed()

    def out_of_time(self) -> bool:
        """Whether the deadline has passed."""
        deadline = self.terms.deadline
        return deadline is not None and self.clock.monotonic() - self.progress.start > deadline

    def seconds_until(self, until: datetime | None) -> float:
        """Seconds from now (wall clock) to ``until``; 0 when it is None or past."""
        if until is None:
            return 0.0
        return max(0.0, (until - self.clock.now()).total_seconds())

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` on the call's clock; False when the cancel event ended it."""
        cancel = self.terms.cancel
        if cancel is not None and cancel.is_set():
            return False
        if seconds <= 0:
            return True
        return self.clock.sleep(seconds, cancel)

    def cancelled(self) -> bool:
        return self.terms.cancel is not None and self.terms.cancel.is_set()

    def pending(self) -> datetime | None:
        """The later of the known cooldown and ``not_before``, when still ahead."""
        until = self.progress.not_before
        if self.cooldown is not None and (until is None or self.cooldown > until):
            until = self.cooldown
        return until if until is not None and until > self.clock.now() else None

    # -- what the server said ---------------------------------------------------------
    def read_hint(self, raw: str | None, date: str | None, raw_ms: tuple[str | None, ...] = ()) -> RetryAfter:
        """Parse a response's Retry-After (and Date) and its millisecond fields
        (``raw_ms``: ``retry-after-ms``, ``x-ms-retry-after-ms``) as received now, and
        remember the raw Retry-After and clock skew for a deferral. The wait is
        :func:`~retry_after_adapter.dialects.precise_wait`'s: the milliseconds when they
        agree with the whole seconds, else the longest field. A millisecond field that
        cannot be read is ignored beside a valid Retry-After and, alone, is invalid as
        a Retry-After would be; a Retry-After that cannot be read is ignored beside a
        valid millisecond field. Raises ``InvalidRetryAfter``, also for a wait beyond
        the policy's ``max_retry_after`` (reason ``"beyond_max"``)."""
        now = self.clock.now()
        parsed, waits = _read_fields(raw, date, raw_ms, now)
        if parsed is not None:
            assert raw is not None
            self.heard = Heard(self.heard.status, raw.strip(" \t"), parsed.clock_skew)
        delay = precise_wait(
            None if parsed is None else parsed.delay, parsed is None or parsed.form == "seconds", waits
        )
        assert delay is not None
        if beyond_bound(delay, self.policy.max_retry_after):
            raise InvalidRetryAfter(TOO_LONG, raw if raw is not None else str(delay))
        if parsed is not None and delay == parsed.delay:
            return parsed
        return _wait_of(delay, now, None if parsed is None else parsed.clock_skew)

    # -- decisions --------------------------------------------------------------------
    def emit(self, decision: Decision, server_delay: float | None = None) -> None:
        """Log a decision and hand it to the ``on_decision`` hooks."""
        emit(
            self.terms.hooks,
            decision,
            scope=self.scope,
            status=self.heard.status,
            attempt=self.progress.attempts,
            server_delay=server_delay,
            priority=self.progress.priority,
        )

    def defer(
        self, decision: Decision, server_delay: float | None = None, until: datetime | None = None
    ) -> Deferral:
        """The deferral for ``decision`` (a wait from now, or the exact time ``until``).

        A deferral is never eligible before the deferral this call resumed, whatever
        ended it (a cancel, a store outage). Emits the decision; raises
        ``DeferralLimitExceeded`` past ``max_deferrals`` or the lifetime cap.
        """
        now = self.clock.now()
        eligible, wait = self._eligible(now, decision.wait, until)
        if self.progress.started_at is None:
            # Deferred before any attempt was sent: the job's lifetime starts now.
            self.progress.started_at = now
        reason = decision.reason or Reason.DEADLINE
        deferral = Deferral(
            eligible_at=eligible,
            delay=max(0.0, min(wait, 1e15)),
            reason=reason,
            scope=self.scope,
            attempts=self.progress.attempts,
            deferrals=self.progress.deferrals_before + 1,
            status=self.heard.status,
            retry_after=self.heard.retry_after,
            clock_skew=self.heard.skew,
            started_at=self.progress.started_at,
            history=self.progress.history,
            priority=self.progress.priority,
        )
        policy = self.policy
        limit = lifetime_limit(
            deferral.deferrals,
            (eligible - self.progress.started_at).total_seconds(),
            policy.max_deferrals,
            policy.max_lifetime,
        )
        if limit is not None:
            self.emit(Decision(STOP, 0.0, limit))
            raise DeferralLimitExceeded(deferral, str(limit))
        self.emit(Decision(DEFER, deferral.delay, reason), server_delay)
        return deferral

    def _eligible(self, now: datetime, wait: float, until: datetime | None) -> tuple[datetime, float]:
        """When a deferral becomes eligible and its delay from ``now``."""
        if until is not None:
            eligible = until
        else:
            wait = wait if math.isfinite(wait) else 1e15
            try:
                eligible = now + timedelta(seconds=wait)
            except OverflowError:
                eligible = datetime.max.replace(tzinfo=now.tzinfo)
        resume_at = self.progress.history[-1].eligible_at if self.progress.history else None
        if resume_at is not None and eligible < resume_at:
            eligible = resume_at
        if until is not None or eligible == resume_at:
            wait = max(0.0, (eligible - now).total_seconds())
        return eligible, wait

    def attempt_timeout(self, timeout: Any, at: float | None = None) -> Any:
        """The timeout for the next attempt: ``timeout`` (a number, a ``(connect, read)``
        pair, a urllib3 ``Timeout`` or None) bounded, connect and read together, by what
        is left of the deadline at ``at`` (the clock's monotonic seconds; default now),
        so an attempt overruns it by at most ``max(MIN_ATTEMPT_TIMEOUT, attempt_reserve)``
        seconds."""
        deadline = self.terms.deadline
        if deadline is None:
            return timeout
        if at is None:
            at = self.clock.monotonic()
        left = deadline - (at - self.progress.start)
        number = type(timeout) in (int, float)  # the common case: one number for both
        if number and timeout + timeout <= left:
            return timeout  # connect + read already fit: nothing to bound
        left = max(left, MIN_ATTEMPT_TIMEOUT, self.policy.attempt_reserve)
        if number:
            if timeout + timeout <= left:
                return timeout
            value = timeout if timeout < left else left
            return Timeout(connect=value, read=value, total=left)
        connect, read, total = _timeout_parts(timeout)
        return Timeout(connect=_clamp(connect, left), read=_clamp(read, left), total=_clamp(total, left))

    def read_time(self) -> float | None:
        """Seconds the body of the response a call ends with may be read: what is left
        of the deadline, but at least an attempt's least time (as an attempt may overrun
        it); None: no deadline."""
        left = self.time_left()
        if left is None:
            return None
        return max(left, MIN_ATTEMPT_TIMEOUT, self.policy.attempt_reserve)


def _read_fields(
    raw: str | None, date: str | None, raw_ms: tuple[str | None, ...], now: datetime
) -> tuple[RetryAfter | None, tuple[float, ...]]:
    """A response's Retry-After as received at ``now`` (None: not sent, or unreadable
    beside a valid millisecond field) and the waits of its readable millisecond fields
    (seconds). Raises ``InvalidRetryAfter`` when no field can be read."""
    waits = tuple(wait for wait in map(milliseconds, raw_ms) if wait is not None)
    if raw is not None:
        try:
            return parse_retry_after(raw, received_at=now, date=date), waits
        except InvalidRetryAfter:
            if not waits:
                raise
            # A valid millisecond field beside an unreadable Retry-After: that field is
            # what the server said (never a shorter wait than it).
    if not waits:
        raise InvalidRetryAfter("malformed", next((ms for ms in raw_ms if ms is not None), raw))
    return None, waits


def _wait_of(delay: float, now: datetime, skew: float | None) -> RetryAfter:
    """A wait of ``delay`` seconds from ``now`` (an absurd one: the largest time, as
    ``header.py`` makes it), with the clock skew a Date showed (seconds; None: none)."""
    try:
        eligible = now + timedelta(seconds=delay)
    except OverflowError:
        eligible = datetime.max.replace(tzinfo=timezone.utc)
    return RetryAfter(delay, eligible, "seconds", skew)


def _timeout_parts(timeout: Any) -> tuple[Any, Any, Any]:
    """``(connect, read, total)`` of a urllib3 ``Timeout``, a pair, or one value."""
    if isinstance(timeout, Timeout):
        return timeout._connect, timeout._read, timeout.total
    if isinstance(timeout, tuple):
        if len(timeout) != 2:
            raise ValueError(
                f"Invalid timeout {timeout}. Pass a (connect, read) timeout tuple, "
                "or a single float to set both timeouts to the same value."
            )
        return timeout[0], timeout[1], None
    return timeout, timeout, None


def _clamp(value: Any, left: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return min(float(value), left)
    # None (wait forever) and urllib3's "socket default" sentinel become what is left.
    return left
