"""The engine: the one loop that runs a call, and the one step that judges an attempt.

::

    call = Call(policy, scope=..., store=..., hooks=...)     # explicit state
    while True:
        deferral = admit(call)            # cooldown / resumed deferral: wait if it fits, else defer
        if deferral: return Outcome(deferral=deferral)        # nothing was sent
        response, error = transport.send(attempt_timeout(...))  # exactly one attempt
        verdict = judge(call, ...)        # policy.py decides; counts come from urllib3's Retry
        if verdict is RETRY: wait(verdict.wait); continue
        return Outcome(response, error, verdict)

:func:`run` is that loop, for :class:`~retry_after_adapter.RetryAfterAdapter` (each
attempt through ``HTTPAdapter.send``) and :class:`~retry_after_adapter.RetryAfterPoolManager`
(each attempt through ``PoolManager.urlopen``); urllib3 itself never loops there.
:func:`judge` is also what :meth:`RetryAfterRetry.increment` runs when the policy is
handed to a *stock* urllib3 loop, so there is one decision step whoever loops.

The call's state is a :class:`Call` passed along; the only context variable is the
set of user overrides that :func:`budget` installs. Durations are seconds (float);
``Call.start`` is monotonic and never leaves the process; every time stored or put in
a deferral is an aware UTC ``datetime``.
"""

from __future__ import annotations

import collections
import contextvars
import itertools
import logging
import math
import random
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from urllib3.exceptions import MaxRetryError
from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout

from . import _forksafe
from ._compat import announces_quota, response_header
from .clock import Clock
from .cooldown.allowance import SAME_WINDOW
from .cooldown.freshness import INVALID_HEADER, SERVER_ERROR, SUCCESS, SUCCESS_EVERY, THROTTLED, TRANSPORT
from .cooldown.guard import Shared, all_meters, meters_of
from .deferral import Deferral
from .errors import ConfigurationError, CooldownUnavailable, DeferralLimitExceeded, InvalidRetryAfter
from .header import RetryAfter, parse_retry_after
from .observe import DecisionHook, emit
from .policy import (
    COOLDOWN_STATUSES,
    DEFER,
    RETRY,
    STOP,
    TOO_LONG,
    Decision,
    Reason,
    beyond_bound,
    check_limit,
    decide,
)
from .policy import (
    admit as admit_decision,
)
from .quota import Quota, QuotaHint, bound_hint, read_quota
from .scope import strip_query

if TYPE_CHECKING:
    from .retry import RetryAfterRetry

__all__ = ["Call", "Outcome", "Transport", "Verdict", "admit", "budget", "judge", "run"]

#: The smallest timeout, in seconds, an attempt gets when its deadline is nearly used
#: up (a zero timeout would make the socket non-blocking). ``attempt_reserve`` raises it.
MIN_ATTEMPT_TIMEOUT = 0.1

#: Seconds after which a call deferred with ``cooldown-unknown`` may try again.
UNKNOWN_COOLDOWN_RETRY = 1.0

#: How often admission re-reads a cooldown that other workers keep extending.
_MAX_ADMIT_ROUNDS = 16

_jitter_rng = random.Random()
log = logging.getLogger("retry_after_adapter")


class _SingleAttempt(Retry):
    """urllib3's ``Retry(0, read=False)`` that names no query string in its errors."""

    def increment(self, method: str | None = None, url: str | None = None, *args: Any, **kw: Any) -> Retry:  # type: ignore[override]
        return super().increment(method, strip_query(url), *args, **kw)


#: What urllib3 gets for each attempt the engine sends: one attempt, no retry, no
#: redirect, read errors raised as themselves (as ``HTTPAdapter``'s default ``Retry(0,
#: read=False)``), so each attempt fails with the error class it would have alone.
SINGLE_ATTEMPT: Retry = _SingleAttempt(
    0, read=False, redirect=False, raise_on_redirect=False, raise_on_status=False
)


# ----------------------------------------------------------------------------- budget
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


@contextmanager
def budget(
    *,
    deadline: float | _Unset | None = UNSET,
    max_wait: float | _Unset | None = UNSET,
    cancel: threading.Event | None = None,
    resume: Deferral | None = None,
) -> Iterator[None]:
    """Override the retry budget of every call made inside the ``with`` block.

    - ``deadline``: seconds each call may take from its start, waits and redirects
      included (``None`` removes the policy's deadline).
    - ``max_wait``: the longest single wait in seconds (``None``: no limit).
    - ``cancel``: a ``threading.Event``; setting it ends a running wait at once and the
      call returns a deferral with reason ``"cancelled"``.
    - ``resume``: a :class:`Deferral` this call continues: its attempt and deferral
      counts and history carry over, and nothing is sent before its ``eligible_at``.

    Unset arguments keep the value of an enclosing ``budget`` or of the policy.
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


#: ``current_override()``: the overrides of the innermost enclosing :func:`budget`, or
#: None (the context variable's own ``get``: no Python frame on the hot path).
current_override = _OVERRIDE.get


# ------------------------------------------------------------------------------- Call
class Call:
    """One call's state: what it may spend, what it has spent, what it knows.

    Made once per ``session.send`` (redirect hops included) or ``urlopen``, and passed
    to every step. ``retry`` holds urllib3's counters (replaced by each retry, as
    urllib3 does); ``policy`` is the :class:`RetryAfterRetry` the call started with.
    """

    # Slots, every one set in __init__: the engine reads a call's state many times per
    # attempt, and a slot read is the cheapest attribute read there is.
    __slots__ = (
        "admission",
        "attempts",
        "cancel",
        "clock",
        "concurrency",
        "cooldown",
        "deadline",
        "deferrals_before",
        "gated",
        "history",
        "hooks",
        "last_retry_after",
        "last_skew",
        "last_status",
        "lease_token",
        "limits",
        "max_wait",
        "max_waiting",
        "meter",
        "not_before",
        "permit",
        "policy",
        "queued",
        "quota",
        "retry",
        "scope",
        "sent_at",
        "slot_busy",
        "slot_waited",
        "start",
        "started_at",
        "store",
        "store_failed",
    )

    def __init__(
        self,
        policy: RetryAfterRetry,
        *,
        scope: str | None = None,
        store: Shared | None = None,
        hooks: tuple[DecisionHook, ...] = (),
        override: Override | None = None,
    ) -> None:
        self.policy = policy
        self.retry: Retry = policy
        clock: Clock = policy.clock
        self.clock = clock
        #: When the call started (the clock's monotonic seconds).
        self.start = clock.monotonic()
        self.scope = scope
        self.store = store
        self.hooks = policy.on_decision + hooks if hooks else policy.on_decision
        self.deadline: float | None = policy.deadline
        self.max_wait: float | None = policy.max_wait
        self.cancel: threading.Event | None = None
        self.attempts = 0
        self.deferrals_before = 0
        self.history: tuple[Deferral, ...] = ()
        self.started_at: datetime | None = None
        #: No attempt before this: the eligible time of the deferral this call resumes.
        self.not_before: datetime | None = None
        #: The scope's shared cooldown as last read or written.
        self.cooldown: datetime | None = None
        self.last_status: int | None = None
        self.last_retry_after: str | None = None
        self.last_skew: float | None = None
        #: A store operation failed during this call: it does not touch the store again.
        self.store_failed = False
        #: The scope's quota: a permit is taken before every attempt.
        self.quota: Quota | None = None
        #: ``(limit, per, margin)`` of ``quota`` as the store takes them (limit and per
        #: None: no quota); None: not worked out yet.
        self.limits: tuple[int, float, float] | tuple[None, None, float] | None = None
        #: Whether admission takes something before each attempt (see ``_gated``); set
        #: by :func:`run` for the store the call runs on.
        self.gated = False
        #: ``(slots, lease seconds)``: a concurrency slot is held during every attempt.
        self.concurrency: tuple[int, float] | None = None
        #: The slot this call holds while an attempt is on the wire.
        self.lease_token: str | None = None
        #: When the quota permit of the attempt on the wire stops counting, as stored.
        self.permit: datetime | None = None
        #: At most this many calls of a scope wait before an attempt in this process.
        self.max_waiting: int | None = None
        self.queued = False
        #: The admission number of the attempt on the wire (``admit``), for quota headers.
        self.admission: int | None = None
        #: The scope's ``_Meter`` in this process, once looked up.
        self.meter: _Meter | None = None
        #: When (the clock's monotonic seconds) the last attempt was sent; None: none yet.
        self.sent_at: float | None = None
        #: Seconds this attempt has waited for a concurrency slot (0: none so far).
        self.slot_waited = 0.0
        #: The last admission was refused only for want of a concurrency slot.
        self.slot_busy = False
        if override is not None:
            self._override(override)

    def _override(self, override: Override) -> None:
        """Apply an enclosing ``budget()``: its limits, cancel event and resumed deferral."""
        if not isinstance(override.deadline, _Unset):
            self.deadline = override.deadline
        if not isinstance(override.max_wait, _Unset):
            self.max_wait = override.max_wait
        self.cancel = override.cancel
        resume = override.resume
        if resume is None:
            return
        self.attempts = resume.attempts
        self.deferrals_before = resume.deferrals
        self.history = resume.chain()
        self.started_at = resume.started_at
        self.not_before = resume.eligible_at
        # A resumed job starts from what its last deferral knew of the server.
        self.last_status = resume.status
        self.last_retry_after = resume.retry_after
        self.last_skew = resume.clock_skew

    # -- time ---------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the call started (monotonic)."""
        return max(0.0, self.clock.monotonic() - self.start)

    def seconds_until(self, until: datetime | None) -> float:
        """Seconds from now (wall clock) to ``until``; 0 when it is None or past."""
        if until is None:
            return 0.0
        return max(0.0, (until - self.clock.now()).total_seconds())

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` on the call's clock; False when the cancel event ended it."""
        cancel = self.cancel
        if cancel is not None and cancel.is_set():
            return False
        if seconds <= 0:
            return True
        return self.clock.sleep(seconds, cancel)

    # -- what the server said ---------------------------------------------------------
    def read_hint(self, raw: str, date: str | None) -> RetryAfter:
        """Parse a response's Retry-After (and Date) as received now, and remember the
        raw value and clock skew for a deferral. Raises ``InvalidRetryAfter``, also for
        a delay beyond the policy's ``max_retry_after`` (reason ``"beyond_max"``)."""
        parsed = parse_retry_after(raw, received_at=self.clock.now(), date=date)
        self.last_retry_after = raw.strip(" \t")
        self.last_skew = parsed.clock_skew
        if beyond_bound(parsed.delay, self.policy.max_retry_after):
            raise InvalidRetryAfter(TOO_LONG, raw)
        return parsed

    def read_quota(self, response: Any) -> QuotaHint | None:
        """Read the quota a response announces, when its reset is ahead (within
        ``max_retry_after``): nothing left advances the shared cooldown to the reset, and
        the store records what is left (its allowance) so that every worker sharing it
        sends no more before the reset. Malformed quota fields are ignored."""
        if not announces_quota(response):
            return None
        now = self.clock.now()
        date = response_header(response, "Date")
        hint = read_quota(lambda name: response_header(response, name), received_at=now, date=date)
        # One bound for every value a header gives, before anything is stored or obeyed.
        hint = bound_hint(hint, self.policy.max_retry_after)
        if hint is None or hint.reset is None or hint.remaining is None or hint.reset <= 0:
            return hint
        until = now + timedelta(seconds=hint.reset)
        if hint.exhausted:
            self.learn_cooldown(until)
        if self.store is not None and self.scope is not None and self.store.admits:
            # At most `remaining` more before the reset, across every worker: the store
            # takes off what was admitted after this attempt (its admission number).
            seq = self.admission
            remaining = hint.remaining if seq is not None else _left_unseen(self, hint, until)
            self.store.allow(self.scope, remaining, until, now, seq, hint.limit, hint.window, self)
        return hint

    # -- the shared store -------------------------------------------------------------
    def store_time_left(self) -> float | None:
        """Seconds the call may still spend (on a store operation); None: no deadline."""
        if self.deadline is None:
            return None
        return self.deadline - self.elapsed()

    def read_cooldown(self) -> datetime | None:
        """The later of the scope's stored cooldown and ``not_before`` (aware UTC).

        May raise ``CooldownUnavailable`` when the store fails and fails closed.
        """
        stored = None
        if self.store is not None and self.scope is not None:
            stored = self.cooldown = self.store.read(self.scope, self)
        until = self.not_before
        if stored is not None and (until is None or stored > until):
            return stored
        return until

    def learn_cooldown(self, until: datetime) -> None:
        """Advance the scope's shared cooldown to ``until`` (later wins)."""
        if self.store is None or self.scope is None:
            self.cooldown = until if self.cooldown is None or until > self.cooldown else self.cooldown
            return
        self.cooldown = self.store.learn(self.scope, until, self)

    # -- decisions --------------------------------------------------------------------
    def emit(self, decision: Decision, server_delay: float | None = None) -> None:
        """Log a decision and hand it to the ``on_decision`` hooks."""
        emit(
            self.hooks,
            decision,
            scope=self.scope,
            status=self.last_status,
            attempt=self.attempts,
            server_delay=server_delay,
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
        wait = decision.wait
        if until is not None:
            eligible = until
        else:
            wait = wait if math.isfinite(wait) else 1e15
            try:
                eligible = now + timedelta(seconds=wait)
            except OverflowError:
                eligible = datetime.max.replace(tzinfo=now.tzinfo)
        resume_at = self.history[-1].eligible_at if self.history else None
        if resume_at is not None and eligible < resume_at:
            eligible = resume_at
        if until is not None or eligible == resume_at:
            wait = max(0.0, (eligible - now).total_seconds())
        if self.started_at is None:
            # Deferred before any attempt was sent: the job's lifetime starts now.
            self.started_at = now
        reason = decision.reason or Reason.DEADLINE
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
        policy = self.policy
        if policy.max_deferrals is not None and deferral.deferrals > policy.max_deferrals:
            self.emit(Decision(STOP, 0.0, Reason.MAX_DEFERRALS))
            raise DeferralLimitExceeded(deferral, "max_deferrals")
        if policy.max_lifetime is not None:
            lifetime = (eligible - self.started_at).total_seconds()
            if lifetime > policy.max_lifetime:
                self.emit(Decision(STOP, 0.0, Reason.MAX_LIFETIME))
                raise DeferralLimitExceeded(deferral, "max_lifetime")
        self.emit(Decision(DEFER, deferral.delay, reason), server_delay)
        return deferral

    def attempt_timeout(self, timeout: Any, at: float | None = None) -> Any:
        """The timeout for the next attempt: ``timeout`` (a number, a ``(connect, read)``
        pair, a urllib3 ``Timeout`` or None) bounded, connect and read together, by what
        is left of the deadline at ``at`` (the clock's monotonic seconds; default now),
        so an attempt overruns it by at most ``max(MIN_ATTEMPT_TIMEOUT, attempt_reserve)``
        seconds."""
        deadline = self.deadline
        if deadline is None:
            return timeout
        if at is None:
            at = self.clock.monotonic()
        left = deadline - (at - self.start)
        number = type(timeout) in (int, float)  # the common case: one number for both
        if number and timeout + timeout <= left:
            return timeout  # connect + read already fit: nothing to bound
        left = max(left, MIN_ATTEMPT_TIMEOUT, self.policy.attempt_reserve)
        if number:
            if timeout + timeout <= left:
                return timeout
            value = timeout if timeout < left else left
            return Timeout(connect=value, read=value, total=left)
        if isinstance(timeout, Timeout):
            connect, read, total = timeout._connect, timeout._read, timeout.total
        elif isinstance(timeout, tuple):
            if len(timeout) != 2:
                raise ValueError(
                    f"Invalid timeout {timeout}. Pass a (connect, read) timeout tuple, "
                    "or a single float to set both timeouts to the same value."
                )
            connect, read, total = timeout[0], timeout[1], None
        else:
            connect = read = timeout
            total = None
        return Timeout(connect=_clamp(connect, left), read=_clamp(read, left), total=_clamp(total, left))


def _clamp(value: Any, left: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return min(float(value), left)
    # None (wait forever) and urllib3's "socket default" sentinel become what is left.
    return left


# ------------------------------------------------------------------------- admission
def admit(call: Call) -> Deferral | None:
    """Before an attempt (the first and every retry): wait out the scope's cooldown and
    a pending ``not_before``, then take what the call needs (a quota permit, one of the
    server's announced allowance, a concurrency slot), if that fits the budget; else
    defer without sending (``cooldown``, ``quota``, ``concurrency``).

    Returns None when the attempt may go now. The common case (nothing pending, nothing
    stored) costs one store operation.
    """
    store, scope = call.store, call.scope
    if call.cancel is None and call.not_before is None and store is not None and scope is not None:
        deadline = call.deadline
        if deadline is not None and call.clock.monotonic() - call.start > deadline:
            pass  # out of time: the rounds below defer with reason "deadline"
        elif not call.gated:
            try:
                stored = call.cooldown = store.read(scope, call)
            except CooldownUnavailable:
                pass  # the rounds below read again and apply the failure policy
            else:
                if stored is None or stored <= call.clock.now():
                    return None  # the happy path: nothing to wait for (one store read)
        else:
            try:
                wait = _permit(call)
            except CooldownUnavailable:
                pass  # the rounds below apply the failure policy
            else:
                if wait is None:
                    return None  # nothing to wait for, a permit taken: one store operation
    rounds = 0
    left, why = 0.0, Reason.COOLDOWN
    while rounds < _MAX_ADMIT_ROUNDS:
        rounds += 1
        cancel = call.cancel
        if cancel is not None and cancel.is_set():
            return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=_pending(call))
        try:
            until = call.read_cooldown()
        except CooldownUnavailable:
            return call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, Reason.COOLDOWN_UNKNOWN))
        left = call.seconds_until(until)
        why = Reason.COOLDOWN
        if left <= 0:
            if call.deadline is not None and call.elapsed() > call.deadline:
                return call.defer(Decision(DEFER, 0.0, Reason.DEADLINE))
            if not _gated(call):
                return None
            try:
                until = _permit(call)
            except CooldownUnavailable:
                return call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, Reason.COOLDOWN_UNKNOWN))
            if until is None:
                return None
            if call.slot_busy:
                # Only a concurrency slot is missing: look again shortly (not a round).
                deferral = _wait_for_slot(call, until)
                if deferral is not None:
                    return deferral
                rounds -= 1
                continue
            left = call.seconds_until(until)
            if call.cooldown is None or until != call.cooldown:
                why = Reason.QUOTA  # else a cooldown learned meanwhile: wait for it
        if call.policy.jitter:
            # Workers held back by one cooldown would all wake at its end: spread them.
            left += _jitter_rng.uniform(0.0, call.policy.jitter)
        decision = admit_decision(
            cooldown_left=left,
            elapsed=call.elapsed(),
            deadline=call.deadline,
            max_wait=call.max_wait,
            attempt_reserve=call.policy.attempt_reserve,
        )
        if decision.action == DEFER:
            if decision.reason == Reason.COOLDOWN:
                decision = Decision(DEFER, decision.wait, why)
            return call.defer(decision, until=until)
        if not _queue(call):  # max_waiting calls already wait on this scope here
            return call.defer(Decision(DEFER, left, why), until=until)
        try:
            call.emit(Decision(RETRY, left, why))
            slept = call.sleep(left)
        finally:
            _unqueue(call)
        if not slept:
            return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=until)
    # Still not admitted after every round (others keep taking what frees up): defer
    # for what held it back last, no earlier than one more such wait from now.
    try:
        until = call.read_cooldown()
    except CooldownUnavailable:
        return call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, Reason.COOLDOWN_UNKNOWN))
    soonest = call.clock.now() + timedelta(seconds=max(left, MIN_ATTEMPT_TIMEOUT))
    if until is None or until < soonest:
        until = soonest
    return call.defer(Decision(DEFER, call.seconds_until(until), why), until=until)


#: Seconds between looks for a free concurrency slot while waiting for one.
SLOT_POLL = 0.05


def admit_slot(call: Call) -> Deferral | None:
    """Take a concurrency slot for the next attempt (``max_concurrency``) from a store
    that cannot admit in one operation (no ``admit``), waiting for one while that fits
    the budget (see :func:`_wait_for_slot`). None: the slot is held (``call.lease_token``)."""
    assert call.concurrency is not None and call.store is not None and call.scope is not None
    slots, ttl = call.concurrency
    token = _lease_token()
    while True:
        try:
            busy_until = call.store.hold(call.scope, slots, ttl, call.clock.now(), token, call)
        except CooldownUnavailable:
            return call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, Reason.COOLDOWN_UNKNOWN))
        if busy_until is None:
            call.lease_token = token
            return None
        deferral = _wait_for_slot(call, busy_until)
        if deferral is not None:
            return deferral


def _wait_for_slot(call: Call, busy_until: datetime) -> Deferral | None:
    """Every slot is held until ``busy_until`` at the latest: wait ``SLOT_POLL`` seconds
    (or less) before looking again, while the whole wait for a slot fits the budget
    (``call.slot_waited`` adds up); else the deferral with reason ``concurrency``,
    eligible when the earliest lease expires (by when a slot is free at the latest)."""
    step = min(SLOT_POLL, max(call.seconds_until(busy_until), 0.001))
    waited = call.slot_waited
    decision = admit_decision(
        cooldown_left=waited + step,
        elapsed=call.elapsed(),
        deadline=call.deadline,
        max_wait=call.max_wait,
        attempt_reserve=call.policy.attempt_reserve,
    )
    over = call.max_wait is not None and waited + step > call.max_wait
    # Out of budget, or max_waiting calls already wait on this scope here.
    if decision.action == DEFER or over or not _queue(call):
        left = call.seconds_until(busy_until)
        return call.defer(Decision(DEFER, left, Reason.CONCURRENCY), until=busy_until)
    try:
        slept = call.sleep(step)
    finally:
        _unqueue(call)
    if not slept:
        return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=busy_until)
    call.slot_waited = waited + step
    return None


def _new_tokens() -> Iterator[str]:
    """Lease tokens unique across processes and hosts: a random prefix per process and
    a counter, cheaper than a UUID per attempt; ``next()`` of it runs no Python frame."""
    return map((secrets.token_hex(8) + "-").__add__, map(str, itertools.count()))


_lease_tokens = _new_tokens()


def _redraw_tokens() -> None:
    """In a forked child: a prefix of its own (the parent's counter would repeat)."""
    global _lease_tokens
    _lease_tokens = _new_tokens()


_forksafe.at_fork(_redraw_tokens)


def _lease_token() -> str:
    """A new lease token (see :func:`_new_tokens`)."""
    return next(_lease_tokens)


#: Calls waiting before an attempt, per (bound, scope), in this process.
_WAITING: dict[tuple[int, str], int] = {}
_WAITING_LOCK = threading.Lock()


def _new_module_locks() -> None:
    """In a forked child: a parent thread may have held one of these; and the calls the
    parent's threads had waiting or on the wire are not this process's."""
    global _WAITING_LOCK, _METERS_LOCK
    _WAITING_LOCK = threading.Lock()
    _METERS_LOCK = threading.Lock()
    _WAITING.clear()
    for meters in list(all_meters()):
        for meter in list(meters.values()):
            meter.wire.clear()


_forksafe.at_fork(_new_module_locks)


def _queue(call: Call) -> bool:
    """Count the call as waiting on its scope; False (not counted) when ``max_waiting``
    calls already wait there: it defers at once instead of tying up a worker."""
    bound = call.max_waiting
    if bound is None or call.scope is None:
        return True
    key = _waiting_key(call)
    with _WAITING_LOCK:
        waiting = _WAITING.get(key, 0)
        if waiting >= bound:
            return False
        _WAITING[key] = waiting + 1
    call.queued = True
    return True


def _underlying(call: Call) -> object:
    """The store object behind the call's view, shared by every adapter on it: a
    Direct view's store (an empty one is falsy: compared with None), a Guarded view's
    guard, else the view itself."""
    view = call.store
    underlying = getattr(view, "store", None)
    if underlying is None:
        underlying = getattr(view, "guard", None)
    return view if underlying is None else underlying


def _waiting_key(call: Call) -> tuple[int, str]:
    """The store object behind the call's view, and the scope."""
    return id(_underlying(call)), call.scope or ""


def _unqueue(call: Call) -> None:
    if not call.queued or call.scope is None:
        return
    call.queued = False
    key = _waiting_key(call)
    with _WAITING_LOCK:
        waiting = _WAITING.get(key, 0) - 1
        if waiting > 0:
            _WAITING[key] = waiting
        else:
            _WAITING.pop(key, None)


def _cooled_meanwhile(call: Call) -> bool:
    """Whether the scope's cooldown runs now (read again after waiting for a slot)."""
    try:
        until = call.read_cooldown()
    except CooldownUnavailable:
        return True  # admit() applies the failure policy on the next round
    return until is not None and until > call.clock.now()


def _settle(call: Call) -> None:
    """The attempt that took a quota permit has been answered (or failed): it reached
    the server by now, so the permit must count until at least ``now + per``. Stored,
    it counts until its grant + per + margin; only when the answer came later than the
    margin (a loaded host, a slow server) is it moved, in one more store operation."""
    expires, call.permit = call.permit, None
    assert expires is not None and call.limits is not None and call.store is not None and call.scope
    limit, per, _ = call.limits
    assert limit is not None and per is not None
    now = call.clock.now()
    if (expires - now).total_seconds() >= per:
        return  # answered within the margin: the stored end already covers it
    direct, store = call.store.direct, call.store
    at = None if call.policy.real_clock else now
    try:
        if direct is not None:
            direct.settle(call.scope, limit, per, expires, at)
        else:
            store.settle(call.scope, limit, per, expires, at, call)
    except Exception as exc:  # the permit still counts until its stored end
        log.debug("settling a quota permit failed: %s", type(exc).__name__)


class _Slot:
    """Gives one concurrency slot back, once, when called (the attempt it covered has
    ended); a second call does nothing."""

    __slots__ = ("free", "scope", "token")

    def __init__(self, call: Call, token: str) -> None:
        store, scope = call.store, call.scope
        assert store is not None and scope is not None  # a lease was taken
        direct = store.direct
        self.free: Callable[[str, str], None] = direct.release if direct is not None else store.free
        self.scope = scope
        self.token: str | None = token

    def __call__(self) -> None:
        token = self.token
        if token is not None:
            self.token = None
            self.free(self.scope, token)


def release_slot(call: Call) -> None:
    """Give the call's concurrency slot back (the attempt has ended)."""
    token = call.lease_token
    if token is not None and call.store is not None and call.scope is not None:
        call.lease_token = None
        _Slot(call, token)()


def _permit(call: Call) -> datetime | None:
    """Admit the next attempt now: None when it may go (a quota permit, one of the
    server's announced allowance and a concurrency slot taken, as the call needs), else
    when to ask again (the cooldown's end if one runs, which ``call.cooldown`` then
    holds; ``call.slot_busy`` when only a slot is missing). One store operation where
    the store admits in one (``admit``), else a read and a permit."""
    store, scope = call.store, call.scope
    assert store is not None and scope is not None
    quota = call.quota
    if store.admits:
        # A real clock is read by the store itself as it grants (inside its lock):
        # a permit's time is then its grant's, however long the lock took.
        now = None if call.policy.real_clock else call.clock.now()
        limits = call.limits
        if limits is None:
            limits = call.limits = (
                (quota.limit, quota.per, quota.margin) if quota is not None else (None, None, 0.0)
            )
        concurrency = call.concurrency
        lease = None
        if concurrency is not None and call.lease_token is None:
            lease = (concurrency[0], concurrency[1], next(_lease_tokens))
        direct = store.direct
        if direct is not None:
            answer = direct.admit(scope, now, limits[0], limits[1], lease, limits[2])
        else:
            answer = store.admit(scope, now, limits[0], limits[1], lease, call, limits[2])
        call.cooldown, not_before, call.admission, call.slot_busy = answer
        call.permit = answer.permit
        if not_before is None and lease is not None:
            call.lease_token = lease[2]
        return not_before
    call.slot_busy = False
    now = call.clock.now()
    cooldown = call.cooldown = store.read(scope, call)
    if cooldown is not None and cooldown > now:
        return cooldown
    if quota is None:
        return None  # the slot, if any, is taken by admit_slot
    return store.take(scope, quota.limit, quota.window, now, call)


# ------------------------------------------------------------ the announced allowance
class _Meter:
    """One scope's attempts in this process: which are on the wire, when the last ones
    were sent (the call clock's monotonic seconds; for quota headers the store did not
    count), and when (monotonic) a success was last noted in the store. Updated without
    a lock: adding to a set, discarding from it and appending to a bounded deque are
    each atomic."""

    __slots__ = ("noted", "sent", "wire")

    def __init__(self) -> None:
        #: ``id()`` of every call with an attempt on the wire (a call has one at a time).
        self.wire: set[int] = set()
        self.sent: collections.deque[float] = collections.deque(maxlen=_SENT_KEPT)
        self.noted = -math.inf

    @property
    def in_flight(self) -> int:
        """Attempts of the scope on the wire in this process."""
        return len(self.wire)

    def sent_since(self, start: float) -> int:
        """Attempts sent at or after ``start`` (monotonic seconds), at most ``_SENT_KEPT``."""
        count = 0
        for at in reversed(self.sent):
            if at < start:
                break
            count += 1
        return count


#: Send times kept per scope (for the first window a server announces).
_SENT_KEPT = 4096


def _left_unseen(call: Call, hint: QuotaHint, until: datetime) -> int:
    """What is left of an announced quota when the store did not count the answered
    attempt (the first window a store sees of a scope): ``remaining`` less the attempts
    still on the wire here (the server did not count them yet, though it may have
    counted some whose answers are not read yet: an underestimate). With the server's
    limit known: the limit less what this process sent in the window, if more (exact
    for one process; no more than ``remaining``)."""
    assert hint.remaining is not None
    meter = _meter(call)
    estimate = hint.remaining - meter.in_flight
    if hint.limit:
        # The window began at most `window` before the reset, which is rounded up: a
        # second more is counted (what was sent in the previous window, if anything).
        start = -math.inf
        if hint.window:
            ahead = (until - call.clock.now()).total_seconds()
            start = call.clock.monotonic() + ahead - hint.window - SAME_WINDOW
        estimate = max(estimate, min(hint.limit - meter.sent_since(start), hint.remaining))
    return estimate


#: Beyond this many scopes of one store, idle meters are dropped.
_MAX_METERS = 4096
_METERS_LOCK = threading.Lock()


def _meter(call: Call) -> _Meter:
    meter = call.meter
    if meter is not None:
        return meter
    meter = call.meter = _find_meter(call)
    return meter


def _find_meter(call: Call) -> _Meter:
    """The scope's meter in the map every view of the call's store object shares."""
    view = call.store
    meters: dict[str, Any] | None = getattr(view, "meters", None)
    if meters is None:  # a store view of someone else's making
        meters = meters_of(_underlying(call))
    scope = call.scope or ""
    meter = meters.get(scope)
    if meter is None:
        with _METERS_LOCK:
            meter = meters.get(scope)
            if meter is None:
                if len(meters) >= _MAX_METERS:
                    for old in [k for k, m in meters.items() if not m.wire]:
                        del meters[old]
                meter = meters[scope] = _Meter()
    return meter


def _note(call: Call, outcome: str) -> None:
    """Note the attempt's outcome in the scope's freshness record (a success at most
    once per ``SUCCESS_EVERY`` seconds per scope in this process)."""
    store, scope = call.store, call.scope
    if store is None or scope is None or not store.notes:
        return
    if not outcome:
        return  # a client error (404...): says nothing of the integration's health
    if outcome == SUCCESS:
        meter = call.meter
        if meter is None:
            meter = _meter(call)
        now = call.sent_at  # the attempt's send time: no clock read per success
        if now is None:
            now = call.clock.monotonic()
        if now - meter.noted < SUCCESS_EVERY:
            return
        meter.noted = now
    try:
        store.note(scope, outcome, call.clock.now(), call)
    except Exception as exc:  # freshness is news: never a reason to fail a call
        log.debug("noting freshness failed: %s", type(exc).__name__)


def _gated(call: Call) -> bool:
    """Whether admission takes something before each attempt: a quota permit, or one
    of the allowance the server announced (any worker may have read its headers)."""
    if call.quota is not None:
        return True
    store = call.store
    if store is None or not store.admits:
        return False
    return call.policy.quota_headers or call.concurrency is not None


def _pending(call: Call) -> datetime | None:
    """The later of the known cooldown and ``not_before``, when still ahead."""
    until = call.not_before
    if call.cooldown is not None and (until is None or call.cooldown > until):
        until = call.cooldown
    return until if until is not None and until > call.clock.now() else None


def wait_until(call: Call, target: float) -> Deferral | None:
    """Wait until monotonic time ``target``; a cancel ends it with a deferral."""
    if call.sleep(target - call.clock.monotonic()):
        return None
    return call.defer(Decision(DEFER, max(0.0, target - call.clock.monotonic()), Reason.CANCELLED))


# ------------------------------------------------------------------------ the verdict
RETURN = "return"  #: the outcome is final: return the response
RAISE = "raise"  #: the outcome is final: raise the error as it is
REDIRECT = "redirect"  #: follow the response's redirect (when the transport follows them)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`judge` decided about one attempt.

    ``action`` is ``"retry"`` (wait ``wait`` seconds, then go on with counters
    ``retry``), ``"defer"`` (``deferral``), ``"stop"`` (``reason``: return the response
    without retrying), ``"return"``, ``"raise"`` or ``"redirect"``. ``exhausted`` says
    the retry budget ran out (``limit``; the deferral then has reason ``attempts``);
    ``server_delay`` is the attempt's valid Retry-After in seconds, or None.
    """

    action: str
    wait: float = 0.0
    retry: Retry | None = None
    deferral: Deferral | None = None
    reason: Reason | None = None
    server_delay: float | None = None
    error: BaseException | None = None
    #: urllib3's own ``MaxRetryError`` when the retry budget ran out (its ``reason``
    #: says why: "too many 503 error responses", the last transport error...).
    limit: MaxRetryError | None = None

    @property
    def exhausted(self) -> bool:
        return self.limit is not None


_FINAL = Verdict(RETURN)


def judge(
    call: Call,
    method: str | None,
    url: str | None,
    response: Any,
    error: Exception | None,
    *,
    decided: bool = False,
    stacktrace: Any = None,
) -> Verdict:
    """Judge one attempt: its ``response`` (a urllib3 response) or its ``error`` (a
    urllib3 error).

    Learns from it first (the Retry-After of a 429/503 advances the shared cooldown,
    whatever happens next), then asks urllib3's counting (``Retry.increment``) and the
    pure :func:`~retry_after_adapter.policy.decide`. ``decided=True`` is for a stock
    urllib3 loop, which calls only for outcomes it already chose to retry.
    """
    policy = call.policy
    retry = call.retry
    call.attempts += 1
    status = getattr(response, "status", None)
    if not isinstance(status, int):
        status = None
    if (
        not decided
        and status is not None
        and error is None
        and status < 300
        and status not in _HINTED_STATUSES
        and (
            # urllib3's own rule retries a status without Retry-After only when it is
            # in status_forcelist (answered here, unless a subclass has its own rule).
            (type(retry).is_retry is _STOCK_IS_RETRY and status not in (retry.status_forcelist or ()))
            or not retry.is_retry(method or "GET", status)
        )
    ):
        # The happy path: a final answer that no rule retries (not a redirect, no
        # status whose Retry-After counts): nothing to parse or plan but its quota.
        call.last_status = status
        if policy.quota_headers and announces_quota(response):
            call.read_quota(response)
        meter, sent = call.meter, call.sent_at
        if meter is None or sent is None or sent - meter.noted >= SUCCESS_EVERY:
            _note(call, SUCCESS)  # else noted less than SUCCESS_EVERY ago: nothing new
        return _FINAL
    if call.started_at is None:
        call.started_at = call.clock.now()
    call.last_status = status
    call.last_retry_after = None
    call.last_skew = None

    server_delay: float | None = None
    invalid: Reason | None = None
    if response is not None and policy.respect_retry_after_header:
        raw = response_header(response, "Retry-After")
        if raw is not None:
            try:
                parsed = call.read_hint(raw, response_header(response, "Date"))
            except InvalidRetryAfter as bad:
                invalid = (
                    Reason.RETRY_AFTER_TOO_LONG if bad.reason == TOO_LONG else Reason.INVALID_RETRY_AFTER
                )
            else:
                server_delay = parsed.delay
                if status in policy.cooldown_statuses:
                    call.learn_cooldown(parsed.eligible_at)
    if response is not None and policy.quota_headers:
        call.read_quota(response)  # nothing left: a shared cooldown until the reset
    _note(call, _outcome(status, error, invalid, server_delay, policy.cooldown_statuses))

    if error is None:
        if response is not None and response.get_redirect_location():
            return Verdict(REDIRECT, server_delay=server_delay)
        if not decided and not retry.is_retry(method or "GET", status or 0, server_delay is not None):
            return Verdict(RETURN, server_delay=server_delay)
    else:
        if (
            method is not None
            and not retry._is_method_retryable(method)
            and not retry._is_connection_error(error)
        ):
            # The request may have reached the server: never replay a non-idempotent one.
            call.emit(Decision(STOP, 0.0, Reason.NOT_IDEMPOTENT))
            return Verdict(RAISE, reason=Reason.NOT_IDEMPOTENT, error=error)
        if _cannot_heal(error):
            call.emit(Decision(STOP, 0.0, Reason.NOT_RETRYABLE))
            return Verdict(RAISE, reason=Reason.NOT_RETRYABLE, error=error)

    if invalid is not None and policy.on_invalid == "stop":
        call.emit(Decision(STOP, 0.0, invalid))
        return Verdict(STOP, reason=invalid)

    limit: MaxRetryError | None = None
    try:
        new = Retry.increment(retry, method, url, response, error, None, stacktrace)
    except MaxRetryError as out_of_retries:
        # Out of retries: still plan the next wait, so the deferral keeps the time.
        limit = out_of_retries
        new = _uncounted(retry, method, url, response, error)
    except Exception as raised:  # urllib3 re-raises errors it must not retry (read=False)
        call.emit(Decision(STOP, 0.0, Reason.NOT_RETRYABLE))
        return Verdict(RAISE, reason=Reason.NOT_RETRYABLE, error=raised)

    decision = decide(
        server_delay=server_delay,
        backoff=new.get_backoff_time(),
        cooldown_left=call.seconds_until(call.cooldown),
        jitter=_jitter_rng.uniform(0.0, policy.jitter) if policy.jitter else 0.0,
        elapsed=call.elapsed(),
        deadline=call.deadline,
        max_wait=call.max_wait,
        attempt_reserve=policy.attempt_reserve,
    )
    if limit is not None:
        decision = Decision(DEFER, decision.wait, Reason.ATTEMPTS)
    if decision.action == DEFER:
        deferral = call.defer(decision, server_delay)
        return Verdict(DEFER, deferral=deferral, server_delay=server_delay, limit=limit)
    call.emit(decision, server_delay)
    return Verdict(RETRY, wait=decision.wait, retry=new, server_delay=server_delay)


def _outcome(
    status: int | None,
    error: BaseException | None,
    invalid: Reason | None,
    server_delay: float | None,
    cooldown_statuses: frozenset[int],
) -> str:
    """The freshness class of one attempt."""
    if error is not None or status is None:
        return TRANSPORT
    if invalid is not None:
        return INVALID_HEADER
    if status == 429 or (status in cooldown_statuses and server_delay is not None):
        return THROTTLED
    if status >= 500:
        return SERVER_ERROR
    return SUCCESS if status < 400 else ""


_STOCK_IS_RETRY = Retry.is_retry
#: Statuses whose Retry-After matters even when not retried (urllib3's and ours).
_HINTED_STATUSES = frozenset(Retry.RETRY_AFTER_STATUS_CODES) | COOLDOWN_STATUSES


def judge_redirect(call: Call, server_delay: float | None) -> Deferral | None:
    """A redirect that carries a Retry-After: wait it out before the next hop if it
    fits the budget; else (or when cancelled) the deferral."""
    if not server_delay or server_delay <= 0:
        return None
    decision = decide(
        server_delay=server_delay,
        backoff=0.0,
        cooldown_left=0.0,
        jitter=0.0,
        elapsed=call.elapsed(),
        deadline=call.deadline,
        max_wait=call.max_wait,
        attempt_reserve=call.policy.attempt_reserve,
    )
    if decision.action == DEFER:
        return call.defer(decision, server_delay)
    call.emit(decision, server_delay)
    return wait_until(call, call.clock.monotonic() + decision.wait)


def _uncounted(retry: Retry, method: str | None, url: str | None, response: Any, error: Any) -> Retry:
    """``retry`` incremented without limits: for the backoff the next try would have."""
    unlimited = retry.new(total=None, connect=None, read=None, redirect=None, status=None, other=None)
    try:
        return Retry.increment(unlimited, method, url, response, error)
    except Exception:
        return retry


def _cannot_heal(error: BaseException) -> bool:
    """Whether another attempt cannot succeed: a certificate that failed verification."""
    import ssl

    seen: set[int] = set()
    stack: list[BaseException] = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen or len(seen) > 16:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        for nxt in (current.__cause__, current.__context__, getattr(current, "reason", None), *current.args):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return False


# --------------------------------------------------------------------------- the loop
R = TypeVar("R")


def _last_read_time(call: Call) -> float | None:
    """Seconds the body of the response a call ends with may be read: what is left of
    the deadline, but at least an attempt's least time (as an attempt may overrun it);
    None: no deadline."""
    left = call.store_time_left()
    if left is None:
        return None
    return max(left, MIN_ATTEMPT_TIMEOUT, call.policy.attempt_reserve)


class Transport(Protocol[R]):
    """How :func:`run` sends one attempt and reads its outcome.

    ``send`` sends exactly one attempt (no retry, no redirect) and returns the
    transport's response, or raises the transport's own error. ``transport_error``
    gives the urllib3 error behind an exception ``send`` raised when it is a transport
    failure that a retry may heal, else None (the exception then propagates unchanged).
    """

    method: str
    url: str
    #: Whether :func:`run` follows redirects (plain urllib3) or returns them (requests,
    #: which follows them with a new ``send`` that continues the same :class:`Call`).
    follows_redirects: bool
    #: Whether the caller reads the body itself (``stream=True``, ``preload_content=False``):
    #: a deferred response is then handed over unread.
    streams: bool
    #: The caller's timeout (a number, a ``(connect, read)`` pair, a urllib3 ``Timeout``,
    #: None, or the transport's own "not given"): what ``send`` gets, bounded by the
    #: deadline (:meth:`Call.attempt_timeout`).
    user_timeout: Any

    def send(self, timeout: Any) -> R: ...

    def raw(self, response: R) -> Any: ...

    def transport_error(self, exc: Exception) -> Exception | None: ...

    def keep(self, response: R, limit: int | None, seconds: float | None) -> None:
        """Read and keep the body (at most ``limit`` bytes, within ``seconds``; past
        either the connection is dropped), so the response stays readable."""
        ...

    def on_done(self, response: R, release: Callable[[], None]) -> None:
        """Call ``release`` once the attempt is over: its body read, or the response
        closed (at once when there is no body left to read)."""
        ...

    def close(self, response: R) -> None:
        """Close the response, dropping its connection."""
        ...

    def follow(self, response: R, retry: Retry) -> None: ...


@dataclass(slots=True)
class Outcome(Generic[R]):
    """How a call ended: the last response or error, and the deferral or stop reason."""

    response: R | None = None
    error: Exception | None = None
    deferral: Deferral | None = None
    stop_reason: Reason | None = None
    exhausted: bool = False
    redirect: bool = False
    #: urllib3's ``MaxRetryError`` for an exhausted budget (see :class:`Verdict`).
    limit: MaxRetryError | None = None


def run(call: Call, transport: Transport[R]) -> Outcome[R]:
    """The loop: admit, send one attempt, judge it, then wait and go on, or end.

    ``DeferralLimitExceeded`` ends the call with no result: the last response is read
    and its connection given back to the pool first.
    """
    response: R | None = None
    error: Exception | None = None
    store = call.store
    # The attempts on the wire and when they were sent, for the quota headers.
    meter = None
    if call.policy.quota_headers and store is not None and store.admits and call.scope is not None:
        meter = call.meter
        if meter is None:
            meters = getattr(store, "meters", None)  # a view of someone else's may have none
            meter = meters.get(call.scope) if meters is not None else None
            if meter is None:
                meter = _find_meter(call)
            call.meter = meter
    key = id(call)
    call.gated = call.quota is not None or (  # as _gated(call)
        store is not None and store.admits and (call.policy.quota_headers or call.concurrency is not None)
    )
    # A concurrency slot taken apart from admission (a store without admit()).
    apart = call.concurrency is not None and store is not None and not store.admits
    try:
        while True:
            call.slot_waited = 0.0
            admitted_at = call.clock.monotonic()  # before the grant: its lower bound
            deferral = admit(call)
            if deferral is None and apart and call.lease_token is None:
                # A store that cannot admit in one operation: the slot is taken apart.
                deferral = admit_slot(call)
                if deferral is None and call.slot_waited and _cooled_meanwhile(call):
                    release_slot(call)  # a cooldown was learned while waiting for the slot
                    continue
            if deferral is not None:
                # Before a retry: the last attempt's response (its body kept) or error ends it.
                return Outcome(response, error, deferral)
            response = error = None
            cause: Exception | None = None
            at = call.sent_at = call.clock.monotonic()
            if meter is not None:
                meter.wire.add(key)
                meter.sent.append(at)
            timeout = transport.user_timeout
            deadline = call.deadline
            if deadline is not None and not (
                type(timeout) in (int, float) and timeout + timeout <= deadline - (at - call.start)
            ):
                timeout = call.attempt_timeout(timeout, at)  # else it already fits the deadline
            try:
                response = transport.send(timeout)
            except Exception as exc:
                cause = transport.transport_error(exc)
                if cause is None:
                    raise
                error = exc
            finally:
                if meter is not None:
                    meter.wire.discard(key)
                if call.permit is not None:
                    limits = call.limits
                    assert limits is not None
                    if call.clock.monotonic() - admitted_at > limits[2]:
                        _settle(call)  # answered later than the margin: the permit moves
                    else:
                        call.permit = None  # its stored end already covers the arrival
                token = call.lease_token
                if token is not None:
                    # The slot covers the attempt until its body is read or the
                    # response closed; with no response, the attempt is over now.
                    call.lease_token = None
                    slot = _Slot(call, token)
                    if response is None:
                        slot()
                    else:
                        transport.on_done(response, slot)
            raw = transport.raw(response) if response is not None else None
            verdict = judge(call, transport.method, transport.url, raw, cause)
            if verdict is _FINAL:
                return Outcome(response)  # the happy path: a final answer
            action = verdict.action
            if action == RETRY:
                if response is not None:
                    # Kept (bounded) so it stays readable should a deferral follow.
                    left = call.store_time_left()  # the read must leave time for the wait
                    left = None if left is None else max(0.0, left - verdict.wait)
                    transport.keep(response, call.policy.max_retry_body, left)
                deferral = wait_until(call, call.clock.monotonic() + verdict.wait)
                if deferral is not None:
                    return Outcome(response, error, deferral)
                assert verdict.retry is not None
                call.retry = verdict.retry
                continue
            if action == REDIRECT:
                assert response is not None
                deferral = judge_redirect(call, verdict.server_delay)
                if deferral is not None or not transport.follows_redirects:
                    return Outcome(response, None, deferral, redirect=True)
                try:
                    call.retry = Retry.increment(call.retry, transport.method, transport.url, raw)
                except MaxRetryError:
                    return Outcome(response, redirect=True, exhausted=True)
                transport.follow(response, call.retry)
                response = None  # drained: a deferral before the next hop has no response
                continue
            if verdict.deferral is not None and response is not None and not transport.streams:
                # A deferred answer (a 429 or 503, say) is read like a retried one.
                transport.keep(response, call.policy.max_retry_body, _last_read_time(call))
            return Outcome(
                response,
                error,
                verdict.deferral,
                stop_reason=verdict.reason if action == STOP else None,
                exhausted=verdict.exhausted,
                limit=verdict.limit,
            )
    except DeferralLimitExceeded:
        if response is not None:
            transport.keep(response, call.policy.max_retry_body, _last_read_time(call))
        raise
    except BaseException:
        if response is not None:
            transport.close(response)  # the attempt ends here: its slot is given back
        raise
