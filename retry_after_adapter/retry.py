"""RetryAfterRetry: the retry policy, as a urllib3 ``Retry`` that never shortens a wait.

The policy is a value, like urllib3's ``Retry``: ``new()`` copies it with every setting
of ours carried along. :class:`~retry_after_adapter.RetryAfterAdapter` and
:class:`~retry_after_adapter.RetryAfterPoolManager` read it and run the engine's loop
(:mod:`retry_after_adapter.engine`).

Handed to a *stock* urllib3 loop instead (``urllib3.PoolManager(retries=...)``, or a
stock ``HTTPAdapter(max_retries=...)`` as libraries with a ``retry=`` argument mount
it), it still defers instead of shortening: urllib3 stops its loop only when
``increment`` raises, so ``increment`` runs the engine's decision step and raises
:class:`~retry_after_adapter.MaxRetryDeferred` (a ``MaxRetryError``) for a deferral;
``sleep`` only waits out what ``increment`` planned. There is no admission before the
first attempt in that mode: that needs the engine.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from urllib3.exceptions import MaxRetryError, ResponseError

from ._compat import RETRY_KEYWORDS, response_header
from .body import DEFAULT_MAX_RETRY_BODY
from .clock import DEFAULT_CLOCK, Clock, SystemClock
from .deferral import Deferral
from .deferred import DeferralLimitExceeded, MaxRetryDeferred
from .engine import (
    REDIRECT,
    Call,
    Heard,
    Policy,
    Terms,
    current_override,
    judge,
    judge_redirect,
    plan_wait,
    wait_until,
)
from .errors import ConfigurationError, InvalidRetryAfter, unknown_keyword
from .header import parse_retry_after
from .observe import DecisionHook, as_hooks
from .policy import (
    COOLDOWN_STATUSES,
    DEFAULT_MAX_RETRY_AFTER,
    DEFAULT_MAX_WAIT,
    DEFAULT_STATUS_FORCELIST,
    DEFER,
    RETRY,
    STOP,
    TOO_LONG,
    Reason,
    beyond_bound,
    check_limit,
)
from .scope import strip_query

if TYPE_CHECKING:
    from .engine import Verdict

__all__ = ["COOLDOWN_STATUSES", "DEFAULT_MAX_WAIT", "DEFAULT_STATUS_FORCELIST", "RetryAfterRetry"]

_ON_INVALID = ("stop", "backoff")


@dataclass(frozen=True)
class _StockLoop:
    """What a stock urllib3 loop's next ``increment`` and ``sleep`` must know of the
    call so far, carried from one ``Retry`` value to the next (a value, as urllib3's
    own history): when the call started (monotonic), its first attempt (UTC), the
    attempts judged, the cooldown learned, what the server last said (status,
    Retry-After, clock skew), and when (monotonic) the planned wait ends (None: waited
    already)."""

    start: float
    started_at: datetime | None
    attempts: int
    cooldown: datetime | None
    last: Heard
    wake: float | None

    @classmethod
    def of(cls, call: Call, wake: float | None) -> _StockLoop:
        progress = call.progress
        return cls(progress.start, progress.started_at, progress.attempts, call.cooldown, call.heard, wake)


def _refuse_unknown(kwargs: dict[str, Any]) -> None:
    """A ``ConfigurationError`` for a keyword neither this class nor urllib3's ``Retry``
    takes, naming it and the keyword it looks like (``max_wiat``: ``max_wait``)."""
    ours = set(inspect.signature(RetryAfterRetry.__init__).parameters) - {"self", "args", "kwargs", "_stock"}
    known = sorted(ours | RETRY_KEYWORDS)
    for keyword in kwargs:
        if keyword not in RETRY_KEYWORDS:
            raise unknown_keyword("RetryAfterRetry", keyword, known)


def _count_or_none(name: str, value: object, unit: str) -> int | None:
    """``value`` if it is None or an int >= 0 (``unit`` names what it counts)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigurationError(f"{name} must be an int >= 0{unit} or None, got {value!r}")
    return value


def _clock(clock: object) -> Clock:
    """The policy's clock: ``clock``, or the system's when None."""
    if clock is None:
        return DEFAULT_CLOCK
    if not isinstance(clock, Clock):
        raise ConfigurationError("clock must have now(), monotonic() and sleep(seconds, cancel)")
    return clock


class RetryAfterRetry(Policy):
    """A urllib3 ``Retry`` that never shortens a server's Retry-After.

    Every urllib3 argument works as in ``urllib3.util.Retry`` (``total``, ``connect``,
    ``read``, ``status``, ``backoff_factor``, ``allowed_methods``, ``raise_on_status``,
    ...), with ``status_forcelist`` defaulting to 429, 502, 503, 504. Extra keyword
    arguments (all times in seconds):

    - ``deadline``: the whole call, waits and redirects included, may take at most this
      long (``None``: no deadline). No wait starts that would end past it.
    - ``max_wait``: the longest single wait (default 60; ``None``: no limit).
    - ``jitter``: up to this many seconds are added at random to each wait (never
      subtracted).
    - ``attempt_reserve``: time kept for the next attempt itself when checking that a
      wait fits the deadline.
    - ``on_invalid``: what an invalid Retry-After does: ``"stop"`` (default; no retry,
      the response is returned with ``stop_reason``) or ``"backoff"`` (treated as absent).
    - ``cooldown_statuses``: statuses whose Retry-After sets the scope's shared cooldown
      (default 403, 413, 429, 503), retried or not.
    - ``quota_headers``: read what the server says is left of its quota (IETF
      ``RateLimit``, ``X-RateLimit-*``, OpenAI's and Anthropic's per-kind fields;
      default True): nothing left with a reset ahead sets the shared cooldown until
      the reset, before any 429.
    - ``max_retry_after``: the longest Retry-After obeyed (default 86400, one day;
      ``None``: no bound). A longer one is rejected like an invalid value (stop reason
      ``retry_after_too_long``): never obeyed, never shortened, never stored as a
      cooldown, so one absurd header cannot shut a host out for every worker.
    - ``max_retry_body``: bytes of a response's body read before it is retried (default
      1 MiB; ``None``: no bound). It is read within what is left of the deadline too;
      past either bound the connection is dropped, and the response (should the call
      end with it) keeps what was read.
    - ``max_deferrals`` / ``max_lifetime``: give up with ``DeferralLimitExceeded`` when
      a job would be deferred more than this many times, or would become eligible
      more than this many seconds after its first attempt.
    - ``clock``: the :class:`Clock` to read and sleep on (tests pass a ``FakeClock``).
    - ``on_decision``: a callable receiving every decision as a ``DecisionRecord``.

    When retries run out on a retryable outcome the call is deferred with reason
    ``attempts`` (the eligible time the next try would have had); ``raise_on_status``
    (default True, as in urllib3) then raises it, False returns the last response.
    """

    def __init__(
        self,
        total: bool | int | None = 10,
        *args: Any,
        deadline: float | None = None,
        max_wait: float | None = DEFAULT_MAX_WAIT,
        jitter: float = 0.0,
        attempt_reserve: float = 0.0,
        on_invalid: str = "stop",
        max_retry_after: float | None = DEFAULT_MAX_RETRY_AFTER,
        cooldown_statuses: Collection[int] = COOLDOWN_STATUSES,
        quota_headers: bool = True,
        max_retry_body: int | None = DEFAULT_MAX_RETRY_BODY,
        max_deferrals: int | None = None,
        max_lifetime: float | None = None,
        clock: Clock | None = None,
        on_decision: DecisionHook | Collection[DecisionHook] | None = None,
        _stock: _StockLoop | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs and not RETRY_KEYWORDS.issuperset(kwargs):
            _refuse_unknown(kwargs)
        if "status_forcelist" not in kwargs and len(args) < 7:
            kwargs["status_forcelist"] = DEFAULT_STATUS_FORCELIST
        super().__init__(total, *args, **kwargs)
        self.deadline = check_limit("deadline", deadline)
        self.max_wait = check_limit("max_wait", max_wait)
        self.jitter = check_limit("jitter", jitter) or 0.0
        self.attempt_reserve = check_limit("attempt_reserve", attempt_reserve) or 0.0
        self.max_lifetime = check_limit("max_lifetime", max_lifetime)
        if on_invalid not in _ON_INVALID:
            raise ConfigurationError(f"on_invalid must be 'stop' or 'backoff', got {on_invalid!r}")
        self.on_invalid = on_invalid
        self.max_retry_after = check_limit("max_retry_after", max_retry_after)
        self.cooldown_statuses = _statuses(cooldown_statuses)
        self.quota_headers = bool(quota_headers)
        self.max_deferrals = _count_or_none("max_deferrals", max_deferrals, "")
        self.max_retry_body = _count_or_none("max_retry_body", max_retry_body, " (bytes)")
        self.clock: Clock = _clock(clock)
        #: The clock reads the real present: a store may then read it itself when it
        #: grants a permit (inside its lock), rather than be handed a time read before.
        self.real_clock = type(self.clock).now is SystemClock.now
        self.on_decision = as_hooks(on_decision)
        # Stock-loop mode only: the call so far (set by increment).
        self._stock = _stock
        # The terms its calls share (``engine.call.terms_of``), with the hooks they were made for.
        self._terms: tuple[tuple[DecisionHook, ...], Terms] | None = None

    # -- the value ------------------------------------------------------------------
    def new(self, **kw: Any) -> RetryAfterRetry:
        """A copy with urllib3's counters updated; carries every extra setting along."""
        ours: dict[str, Any] = {
            "deadline": self.deadline,
            "max_wait": self.max_wait,
            "jitter": self.jitter,
            "attempt_reserve": self.attempt_reserve,
            "on_invalid": self.on_invalid,
            "max_retry_after": self.max_retry_after,
            "cooldown_statuses": self.cooldown_statuses,
            "quota_headers": self.quota_headers,
            "max_retry_body": self.max_retry_body,
            "max_deferrals": self.max_deferrals,
            "max_lifetime": self.max_lifetime,
            "clock": self.clock,
            "on_decision": self.on_decision,
            "_stock": self._stock,
        }
        ours.update(kw)
        new: RetryAfterRetry = super().new(**ours)
        return new

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_stock"] = None  # a running loop never travels with a copy
        state["_terms"] = None  # made again where it lands
        return state

    # -- Retry-After, as stock urllib3 reads it (strict, never capped) ---------------
    def parse_retry_after(self, retry_after: str) -> float:
        """Seconds to wait for a Retry-After value: an int for delay-seconds, a float
        for an HTTP-date (as stock urllib3). Never capped.

        Raises ``InvalidRetryAfter`` (a ``ValueError`` and urllib3's ``InvalidHeader``),
        also for a value longer than ``max_retry_after`` (reason ``"beyond_max"``).
        """
        parsed = parse_retry_after(retry_after, received_at=self.clock.now())
        if beyond_bound(parsed.delay, self.max_retry_after):
            raise InvalidRetryAfter(TOO_LONG, retry_after)
        return int(parsed.delay) if parsed.form == "seconds" else parsed.delay

    def get_retry_after(self, response: Any) -> float | None:
        """The response's Retry-After in seconds (see :meth:`parse_retry_after`), or None."""
        raw = response_header(response, "Retry-After")
        if raw is None:
            return None
        return self.parse_retry_after(raw)

    # -- the decision, inside a stock urllib3 loop ---------------------------------
    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: TracebackType | None = None,
    ) -> RetryAfterRetry:
        """Count the attempt, then decide: retry after a wait, defer, or stop.

        A deferral raises :class:`MaxRetryDeferred`; an invalid Retry-After (with
        ``on_invalid="stop"``) raises urllib3's ``MaxRetryError``.
        """
        call = self._loop_call()
        url = strip_query(url)
        try:
            verdict = judge(call, method, url, response, error, decided=True, stacktrace=_stacktrace)
        except DeferralLimitExceeded:
            if response is not None:  # give the connection back before giving up
                with contextlib.suppress(Exception):
                    response.drain_conn()
            raise
        if verdict.action == REDIRECT:
            # urllib3's PoolManager follows redirects without sleeping: wait here, so the
            # redirected request never goes out before the 3xx's Retry-After.
            new: RetryAfterRetry = super().increment(method, url, response, error, _pool, _stacktrace)
            deferral = judge_redirect(call, verdict.server_delay)
            if deferral is not None:
                raise self._deferred(_pool, url, deferral, response, error)
            new._stock = _StockLoop.of(call, None)  # waited already: sleep must not wait again
            return new
        if verdict.action == RETRY:
            retry = verdict.retry
            assert isinstance(retry, RetryAfterRetry)
            retry._stock = _StockLoop.of(call, call.clock.monotonic() + verdict.wait)
            return retry
        self._raise_final(verdict, _pool, url, response, error, _stacktrace)

    def _raise_final(
        self, verdict: Verdict, pool: Any, url: str | None, response: Any, error: Exception | None,
        stacktrace: TracebackType | None,
    ) -> NoReturn:
        """What ends the call: a deferral, a stop (urllib3's ``MaxRetryError``) or the
        error itself, raised."""
        if verdict.action == DEFER:
            assert verdict.deferral is not None
            # Out of retries: urllib3's own reason ("too many 503 error responses").
            why = verdict.limit.reason if verdict.limit is not None else error
            raise self._deferred(pool, url, verdict.deferral, response, why)
        if verdict.action == STOP:
            said_no = verdict.reason == Reason.SERVER_SAID_NO
            stopped = "x-should-retry: false" if said_no else "invalid Retry-After header"
            raise MaxRetryError(pool, url or "", ResponseError(stopped))
        if verdict.error is not None and verdict.error is not error:
            raise verdict.error  # urllib3 re-raised it (read=False, say)
        assert error is not None
        raise error.with_traceback(stacktrace)

    def _loop_call(self) -> Call:
        """The call of a stock urllib3 loop, as far as this value says it has come."""
        call = Call(self, override=current_override())
        stock = self._stock
        if stock is not None:
            call.progress.start = stock.start
            call.progress.started_at = stock.started_at
            call.progress.attempts = stock.attempts
            call.cooldown = stock.cooldown
            call.heard = stock.last
        return call

    @staticmethod
    def _deferred(
        pool: Any, url: str | None, deferral: Deferral, response: Any, error: Any
    ) -> MaxRetryDeferred:
        reason = error if error is not None else ResponseError(f"deferred ({deferral.reason})")
        return MaxRetryDeferred(pool, url, reason, deferral, response)

    # -- the wait -----------------------------------------------------------------------
    def sleep(self, response: Any = None) -> None:
        """Wait out the time :meth:`increment` planned (cancellable), or, called
        directly, at least ``response``'s Retry-After (else the backoff), on the
        policy's clock. A wait longer than ``max_wait`` is not shortened: it raises
        :class:`MaxRetryDeferred`."""
        if self._stock is not None:
            if self._stock.wake is not None:
                deferral = wait_until(self._loop_call(), self._stock.wake)
                if deferral is not None:
                    raise self._deferred(None, None, deferral, response, None)
            return
        if self.respect_retry_after_header and response is not None and self.sleep_for_retry(response):
            return
        self._wait(self.get_backoff_time(), None, response)

    def sleep_for_retry(self, response: Any = None) -> bool:
        """Wait for ``response``'s Retry-After, as stock: True when it had one that
        asked for a wait (waited in full, never shortened), else False."""
        if self._stock is not None:
            self.sleep(response)
            return True
        seconds = self.get_retry_after(response) if response is not None else None
        if not seconds:
            return False
        self._wait(float(seconds), float(seconds), response)
        return True

    def _wait(self, seconds: float, server_delay: float | None, response: Any) -> None:
        if seconds <= 0:
            return
        call = Call(self, override=current_override())
        decision = plan_wait(call, server_delay, seconds, cooldown=False)
        if decision.action == DEFER:
            raise self._deferred(None, None, call.defer(decision, server_delay), response, None)
        deferral = wait_until(call, call.clock.monotonic() + decision.wait)
        if deferral is not None:
            raise self._deferred(None, None, deferral, response, None)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total={self.total}, connect={self.connect}, read={self.read}, "
            f"redirect={self.redirect}, status={self.status}, deadline={self.deadline}, "
            f"max_wait={self.max_wait})"
        )


def _statuses(value: object) -> frozenset[int]:
    """Validate ``cooldown_statuses``: a collection of HTTP status codes (100-599)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise ConfigurationError("cooldown_statuses must be a collection of status codes")
    statuses = frozenset(value)
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigurationError(f"cooldown_statuses holds {status!r}, not a status code (100-599)")
    return statuses
