"""The decision: retry after a wait, defer with an eligible time, or stop.

Pure: every input is a plain value (seconds as floats), nothing here reads a clock,
draws a random number or does I/O, so every rule can be tested exactly.

The rules (docs/behaviour.md states them for users):

- ``wait = max(server delay, local backoff, shared cooldown left) + jitter``, where the
  jitter sample is already drawn from ``[0, jitter]`` by the caller: it only adds.
- defer with reason ``"max_wait"`` when ``wait > max_wait``;
- defer with reason ``"deadline"`` when ``elapsed + wait + attempt_reserve > deadline``;
- equality is allowed: a wait exactly at a limit is taken (compared with a
  tolerance of ``EPSILON`` seconds, so float rounding cannot defer an exact fit).
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Collection
from dataclasses import dataclass

from .errors import ConfigurationError

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` for Python 3.10: members are their string values."""

        __hash__ = str.__hash__  # hash like the plain string, as StrEnum does

        def __str__(self) -> str:
            return str(self.value)


#: Tolerance (seconds) when comparing a wait with a limit, so that float rounding
#: (0.1 + 0.2 > 0.3) never turns an exact equality into a deferral.
EPSILON = 1e-9

RETRY = "retry"
DEFER = "defer"
STOP = "stop"


class Reason(StrEnum):
    """Why a call was deferred or stopped: the one list, used by :class:`Deferral`, the
    ``on_decision`` records, the log lines and ``Counters``. Members compare equal to
    their strings (``Reason.MAX_WAIT == "max_wait"``), which is also their JSON form.
    """

    # -- deferrals: nothing more is sent now; a new attempt is eligible later
    DEADLINE = "deadline"  #: the wait would end past the call's deadline
    MAX_WAIT = "max_wait"  #: the wait is longer than ``max_wait``
    ATTEMPTS = "attempts"  #: the retry budget ran out; eligible when the next try would be
    COOLDOWN = "cooldown"  #: the scope's shared cooldown (or a resumed deferral) runs
    QUOTA = "quota"  #: no quota permit within the budget
    RATE = "rate"  #: the scope's learned send rate admits nothing more within the budget
    CONCURRENCY = "concurrency"  #: no concurrency slot within the budget
    CANCELLED = "cancelled"  #: the caller's cancel event was set
    COOLDOWN_UNKNOWN = "cooldown-unknown"  #: the shared store failed and fails closed
    # -- stops: the call ends with its last response or error, nothing is deferred
    INVALID_RETRY_AFTER = "invalid_retry_after"  #: ``on_invalid="stop"`` and a bad header
    #: ``on_invalid="stop"`` and a Retry-After longer than ``max_retry_after``
    RETRY_AFTER_TOO_LONG = "retry_after_too_long"
    NOT_IDEMPOTENT = "not_idempotent"  #: the request may have reached the server
    NOT_RETRYABLE = "not_retryable"  #: an error that another attempt cannot heal
    SERVER_SAID_NO = "server_said_no"  #: the answer says ``x-should-retry: false``
    MAX_DEFERRALS = "max_deferrals"  #: one more deferral than ``max_deferrals``
    MAX_LIFETIME = "max_lifetime"  #: the job would outlive ``max_lifetime``


#: Statuses whose valid Retry-After advances the scope's shared cooldown by default:
#: 429 and 503 (RFC 9110, RFC 6585), and 403 and 413, which providers send with
#: Retry-After for secondary rate limits (GitHub) and oversized bursts. A status in
#: this set sets the cooldown even when it is not retried.
COOLDOWN_STATUSES = frozenset({403, 413, 429, 503})

#: Statuses a :class:`~retry_after_adapter.RetryAfterRetry` retries unless its
#: ``status_forcelist`` says otherwise.
DEFAULT_STATUS_FORCELIST = frozenset({429, 502, 503, 504})

#: The longest single wait, in seconds, when ``max_wait`` is not given: a longer server
#: wait defers instead of blocking the caller.
DEFAULT_MAX_WAIT = 60.0

#: The longest Retry-After, in seconds, obeyed when ``max_retry_after`` is not given:
#: one day, enough for a daily quota. A longer one (twenty nines, a date in 9999) is
#: rejected like an invalid value: never obeyed, never shortened, never stored.
DEFAULT_MAX_RETRY_AFTER = 86_400.0

#: The reasons a call can be deferred (``Deferral.reason``).
DEFER_REASONS: tuple[Reason, ...] = (
    Reason.DEADLINE,
    Reason.MAX_WAIT,
    Reason.ATTEMPTS,
    Reason.COOLDOWN,
    Reason.QUOTA,
    Reason.RATE,
    Reason.CONCURRENCY,
    Reason.CANCELLED,
    Reason.COOLDOWN_UNKNOWN,
)

#: The reasons a call stops without deferring.
STOP_REASONS: tuple[Reason, ...] = (
    Reason.INVALID_RETRY_AFTER,
    Reason.RETRY_AFTER_TOO_LONG,
    Reason.NOT_IDEMPOTENT,
    Reason.NOT_RETRYABLE,
    Reason.SERVER_SAID_NO,
    Reason.MAX_DEFERRALS,
    Reason.MAX_LIFETIME,
)


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt (or before one, for admission).

    - ``action``: ``"retry"``, ``"defer"`` or ``"stop"``.
    - ``wait``: seconds to wait before the next attempt (retry), or until the next
      attempt becomes eligible (defer); 0 for stop.
    - ``reason``: why it defers or stops (``None`` for retry).
    """

    action: str
    wait: float
    reason: Reason | None = None


def _seconds(name: str, value: float | None, *, allow_none: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise ConfigurationError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ConfigurationError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def check_limit(name: str, value: float | None) -> float | None:
    """Validate an optional limit in seconds (``None`` means no limit)."""
    return _seconds(name, value, allow_none=True)


#: ``InvalidRetryAfter.reason`` of a value longer than ``max_retry_after``.
TOO_LONG = "beyond_max"


def beyond_bound(delay: float, max_retry_after: float | None) -> bool:
    """Whether a server's delay (seconds) is longer than the bound an operator accepts
    from one header (``None``: no bound)."""
    return max_retry_after is not None and delay > max_retry_after + EPSILON


def decide(
    *,
    server_delay: float | None,
    backoff: float,
    cooldown_left: float,
    jitter: float,
    elapsed: float,
    deadline: float | None,
    max_wait: float | None,
    attempt_reserve: float = 0.0,
) -> Decision:
    """Decide the wait before a retry, or defer it.

    All arguments are seconds. ``server_delay`` is the Retry-After delay (None when the
    response had none); ``backoff`` the local backoff; ``cooldown_left`` what is left of
    the shared cooldown; ``jitter`` the already-drawn jitter sample (>= 0); ``elapsed``
    the time used since the call started; ``deadline`` and ``max_wait`` the caller's
    limits (None for none); ``attempt_reserve`` the time kept for the next attempt
    itself.
    """
    server = _seconds("server_delay", server_delay, allow_none=True) or 0.0
    wait = max(
        server,
        _seconds("backoff", backoff) or 0.0,
        _seconds("cooldown_left", cooldown_left) or 0.0,
    ) + (_seconds("jitter", jitter) or 0.0)
    return _fit(
        wait,
        elapsed=_seconds("elapsed", elapsed) or 0.0,
        deadline=check_limit("deadline", deadline),
        max_wait=check_limit("max_wait", max_wait),
        attempt_reserve=_seconds("attempt_reserve", attempt_reserve) or 0.0,
    )


def admit(
    *,
    cooldown_left: float,
    elapsed: float,
    deadline: float | None,
    max_wait: float | None,
    attempt_reserve: float = 0.0,
) -> Decision:
    """Decide whether an attempt may start now, after waiting out a shared cooldown.

    Returns ``retry`` with the wait (0 when there is no cooldown) or ``defer`` with
    reason ``"cooldown"`` when the cooldown does not fit the limits, or ``"deadline"``
    when the deadline has already passed. Seconds throughout.
    """
    left = _seconds("cooldown_left", cooldown_left) or 0.0
    used = _seconds("elapsed", elapsed) or 0.0
    limit = check_limit("deadline", deadline)
    if limit is not None and used > limit + EPSILON:
        return Decision(DEFER, left, Reason.DEADLINE)
    if left <= 0:
        return Decision(RETRY, 0.0)
    fitted = _fit(
        left,
        elapsed=used,
        deadline=limit,
        max_wait=check_limit("max_wait", max_wait),
        attempt_reserve=_seconds("attempt_reserve", attempt_reserve) or 0.0,
    )
    if fitted.action == DEFER:
        return Decision(DEFER, left, Reason.COOLDOWN)
    return fitted


def _fit(
    wait: float, *, elapsed: float, deadline: float | None, max_wait: float | None, attempt_reserve: float
) -> Decision:
    if max_wait is not None and wait > max_wait + EPSILON:
        return Decision(DEFER, wait, Reason.MAX_WAIT)
    if deadline is not None and elapsed + wait + attempt_reserve > deadline + EPSILON:
        return Decision(DEFER, wait, Reason.DEADLINE)
    return Decision(RETRY, wait)


def after_attempt(
    *,
    failed: bool,
    idempotent: bool,
    connection_error: bool,
    cannot_heal: bool,
    invalid: Reason | None,
    on_invalid: str,
) -> Decision | None:
    """The rules that end a call before any wait is planned, or None (plan one).

    ``failed``: the attempt failed in transport; ``idempotent``: its method may be
    replayed; ``connection_error``: it failed before the request left (so nothing
    reached the server); ``cannot_heal``: another attempt cannot succeed (a certificate
    that failed verification); ``invalid``: the reason its Retry-After was rejected;
    ``on_invalid``: the policy's ``"stop"`` or ``"backoff"``.
    """
    if failed and not idempotent and not connection_error:
        return Decision(STOP, 0.0, Reason.NOT_IDEMPOTENT)  # it may have reached the server
    if failed and cannot_heal:
        return Decision(STOP, 0.0, Reason.NOT_RETRYABLE)
    if invalid is not None and on_invalid == "stop":
        return Decision(STOP, 0.0, invalid)
    return None


def retried_status(
    status: int | None,
    *,
    forcelist: Collection[int],
    retry_after_statuses: Collection[int],
    honours_retry_after: bool,
) -> bool:
    """Whether the policy retries an answer of ``status`` that carries a valid
    Retry-After, its method set aside (urllib3's ``is_retry`` without its method rule):
    ``status`` is in ``forcelist``, or in ``retry_after_statuses`` (urllib3's 413, 429,
    503) while ``honours_retry_after`` (retries left, Retry-After respected)."""
    if status is None:
        return False
    return status in forcelist or (honours_retry_after and status in retry_after_statuses)


def out_of_attempts(decision: Decision) -> Decision:
    """The retry budget ran out: defer until the next try would have been eligible."""
    return Decision(DEFER, decision.wait, Reason.ATTEMPTS)


def lifetime_limit(
    deferrals: int, lifetime: float, max_deferrals: int | None, max_lifetime: float | None
) -> Reason | None:
    """Why a job must give up rather than be deferred again (``deferrals`` so far, this
    one included; ``lifetime``: seconds from its first attempt to the new eligible
    time), or None."""
    if max_deferrals is not None and deferrals > max_deferrals:
        return Reason.MAX_DEFERRALS
    if max_lifetime is not None and lifetime > max_lifetime:
        return Reason.MAX_LIFETIME
    return None
