"""RetryAfterRetry: urllib3's retry loop, deciding with :mod:`policy` instead of sleeping.

urllib3 stops its retry loop only when ``increment`` raises (or ``is_retry`` is false);
``sleep`` cannot prevent the next attempt. So the whole decision (retry after a wait,
defer, stop) is made in :meth:`RetryAfterRetry.increment`, and :meth:`sleep` only waits
out the planned time on the injected clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from types import TracebackType
from typing import Any

from urllib3.exceptions import MaxRetryError, ResponseError
from urllib3.util.retry import Retry

from ._call import CURRENT, CallState, Halt, current_override, wait_out
from ._compat import response_header, response_status
from .clock import DEFAULT_CLOCK, Clock
from .errors import ConfigurationError, CooldownUnavailable, InvalidRetryAfter
from .header import parse_retry_after
from .policy import DEFER, RETRY, STOP, Decision, DecisionRecord, check_limit, decide

#: Statuses whose valid Retry-After advances the scope's shared cooldown.
COOLDOWN_STATUSES = frozenset({429, 503})

#: Retried statuses unless ``status_forcelist`` says otherwise.
DEFAULT_STATUS_FORCELIST = frozenset({429, 502, 503, 504})

#: The longest single wait, in seconds, when ``max_wait`` is not given: a longer
#: server wait defers instead of blocking the caller.
DEFAULT_MAX_WAIT = 60.0

_ON_INVALID = ("stop", "backoff")
_jitter_rng = random.Random()

DecisionHook = Callable[[DecisionRecord], None]


def _strip_query(url: str | None) -> str | None:
    """The URL without its query string or fragment (they may hold credentials)."""
    if url is None:
        return None
    for mark in ("?", "#"):
        cut = url.find(mark)
        if cut >= 0:
            url = url[:cut]
    return url


def as_hooks(on_decision: DecisionHook | Collection[DecisionHook] | None) -> tuple[DecisionHook, ...]:
    """Normalise an ``on_decision`` argument to a tuple of callables."""
    if on_decision is None:
        hooks: tuple[DecisionHook, ...] = ()
    elif callable(on_decision):
        hooks = (on_decision,)
    elif isinstance(on_decision, Collection):
        hooks = tuple(on_decision)
    else:
        raise ConfigurationError("on_decision must be a callable or a collection of callables")
    if not all(callable(hook) for hook in hooks):
        raise ConfigurationError("on_decision must be a callable or a collection of callables")
    return hooks


class RetryAfterRetry(Retry):
    """A urllib3 ``Retry`` that never shortens a server's Retry-After.

    Every urllib3 argument works as in ``urllib3.util.Retry`` (``total``, ``connect``,
    ``read``, ``status``, ``backoff_factor``, ``allowed_methods``, ...), with
    ``status_forcelist`` defaulting to 429, 502, 503, 504. Extra keyword arguments
    (all times in seconds):

    - ``deadline``: the whole call, waits included, may take at most this long
      (``None``: no deadline). No wait starts that would end past it.
    - ``max_wait``: the longest single wait (default 60; ``None``: no limit).
    - ``jitter``: up to this many seconds are added at random to each retry wait
      (never subtracted).
    - ``attempt_reserve``: time kept for the next attempt itself when checking that a
      wait fits the deadline.
    - ``on_invalid``: what an invalid Retry-After does: ``"stop"`` (default; no retry,
      the response is returned) or ``"backoff"`` (treated as absent).
    - ``max_deferrals`` / ``max_lifetime``: give up with ``DeferralLimitExceeded`` when
      a job would be deferred more than this many times, or would become eligible
      more than this many seconds after its first attempt.
    - ``clock``: the :class:`Clock` to read and sleep on (tests pass a ``FakeClock``).
    - ``on_decision``: a callable receiving every decision as a ``DecisionRecord``.

    When a wait does not fit, the call is deferred: with the adapter, the response is
    returned with ``.deferral`` set; with plain urllib3, ``RetryDeferred`` is raised.
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
        max_deferrals: int | None = None,
        max_lifetime: float | None = None,
        clock: Clock | None = None,
        on_decision: DecisionHook | Collection[DecisionHook] | None = None,
        _call: CallState | None = None,
        **kwargs: Any,
    ) -> None:
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
        if max_deferrals is not None and (
            isinstance(max_deferrals, bool) or not isinstance(max_deferrals, int) or max_deferrals < 0
        ):
            raise ConfigurationError(f"max_deferrals must be an int >= 0 or None, got {max_deferrals!r}")
        self.max_deferrals = max_deferrals
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigurationError("clock must have now(), monotonic() and sleep(seconds, cancel)")
        self.clock: Clock = clock if clock is not None else DEFAULT_CLOCK
        self.on_decision = as_hooks(on_decision)
        self._call = _call
        #: Monotonic time (seconds) before which the next attempt must not start.
        self._plan: float | None = None

    # -- urllib3 plumbing -------------------------------------------------------------
    def new(self, **kw: Any) -> RetryAfterRetry:
        """A copy with urllib3's counters updated; carries every extra setting along."""
        ours: dict[str, Any] = {
            "deadline": self.deadline,
            "max_wait": self.max_wait,
            "jitter": self.jitter,
            "attempt_reserve": self.attempt_reserve,
            "on_invalid": self.on_invalid,
            "max_deferrals": self.max_deferrals,
            "max_lifetime": self.max_lifetime,
            "clock": self.clock,
            "on_decision": self.on_decision,
            "_call": self._call,
        }
        ours.update(kw)
        new: RetryAfterRetry = super().new(**ours)
        return new

    def call_state(
        self,
        *,
        scope: str | None = None,
        store: Any = None,
        adapter_mode: bool = False,
        on_decision: tuple[DecisionHook, ...] = (),
    ) -> CallState:
        """A fresh per-call budget from this policy and the enclosing ``budget()``."""
        return CallState(
            clock=self.clock,
            deadline=self.deadline,
            max_wait=self.max_wait,
            attempt_reserve=self.attempt_reserve,
            jitter=self.jitter,
            max_deferrals=self.max_deferrals,
            max_lifetime=self.max_lifetime,
            on_decision=self.on_decision + on_decision if on_decision else self.on_decision,
            scope=scope,
            store=store,
            adapter_mode=adapter_mode,
            override=current_override(),
        )

    def _state(self) -> CallState:
        call = CURRENT.get()
        if call is not None:
            return call
        if self._call is not None:
            return self._call
        # Plain urllib3: the first increment of a call starts its budget.
        return self.call_state()

    def parse_retry_after(self, retry_after: str) -> float:
        """Seconds to wait for a Retry-After value (strict; never capped).

        Raises ``InvalidRetryAfter`` (a ``ValueError``) for an invalid value.
        """
        return parse_retry_after(retry_after, received_at=self.clock.now()).delay

    # -- the decision -------------------------------------------------------------------
    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: TracebackType | None = None,
    ) -> RetryAfterRetry:
        """Count the attempt, then decide: retry after a wait, defer, or stop."""
        call = self._state()
        call.note_attempt()
        call.last_status = response_status(response) if response is not None else None
        call.last_retry_after = None
        call.last_skew = None
        url = _strip_query(url)

        server_delay: float | None = None
        cooldown_left: float | None = None
        invalid = False
        if response is not None and self.respect_retry_after_header:
            raw = response_header(response, "Retry-After")
            if raw is not None:
                try:
                    parsed = call.read_hint(raw, response_header(response, "Date"))
                except InvalidRetryAfter:
                    invalid = True
                else:
                    server_delay = parsed.delay
                    if call.last_status in COOLDOWN_STATUSES:
                        cooldown_left = call.extend_cooldown(parsed.eligible_at)
                        call.recorded = response

        if (
            error is not None
            and method is not None
            and not self._is_method_retryable(method)
            and not self._is_connection_error(error)
        ):
            # The request may have reached the server: never replay a non-idempotent one.
            call.emit(Decision(STOP, 0.0, "not_idempotent"))
            raise error.with_traceback(_stacktrace)

        if invalid and self.on_invalid == "stop":
            call.emit(Decision(STOP, 0.0, "invalid_retry_after"))
            if call.adapter_mode:
                raise Halt(response, None, "invalid_retry_after")
            raise MaxRetryError(_pool, url, ResponseError("invalid Retry-After header"))

        try:
            new = super().increment(method, url, response, error, _pool, _stacktrace)
        except MaxRetryError:
            call.emit(Decision(STOP, 0.0, "exhausted"))
            raise
        except Exception:
            call.emit(Decision(STOP, 0.0, "not_retryable"))
            raise
        if CURRENT.get() is None:
            new._call = call

        redirect = error is None and response is not None and bool(response.get_redirect_location())
        try:
            if cooldown_left is None:
                cooldown_left = call.cooldown_left()
        except CooldownUnavailable:
            from ._call import UNKNOWN_COOLDOWN_RETRY

            raise call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, "cooldown-unknown"), response) from None
        decision = decide(
            server_delay=server_delay,
            backoff=0.0 if redirect else new.get_backoff_time(),
            cooldown_left=cooldown_left,
            jitter=_jitter_rng.uniform(0.0, self.jitter) if self.jitter and not redirect else 0.0,
            elapsed=call.elapsed(),
            deadline=call.deadline,
            max_wait=call.max_wait,
            attempt_reserve=call.attempt_reserve,
        )
        if decision.action == DEFER:
            raise call.defer(decision, response, server_delay)
        call.emit(decision, server_delay)
        assert decision.action == RETRY
        target = call.clock.monotonic() + decision.wait
        if redirect:
            # urllib3's PoolManager follows redirects without calling sleep(): wait here,
            # so the redirected request never goes out before the 3xx's Retry-After.
            wait_out(call, target, response)
        else:
            new._plan = target
        return new

    # -- the wait -----------------------------------------------------------------------
    def sleep(self, response: Any = None) -> None:
        """Wait out the time planned by :meth:`increment` (and any shared cooldown)."""
        call = CURRENT.get() or self._call
        if call is None or self._plan is None:
            return
        wait_out(call, self._plan, response)

    def sleep_for_retry(self, response: Any) -> bool:
        """urllib3 calls this after a redirect; the redirect's wait was already taken in
        :meth:`increment`, so this only waits out a plan that is still pending."""
        self.sleep(response)
        return True

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total={self.total}, connect={self.connect}, read={self.read}, "
            f"redirect={self.redirect}, status={self.status}, deadline={self.deadline}, "
            f"max_wait={self.max_wait})"
        )
