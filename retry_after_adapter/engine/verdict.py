"""The verdict on one attempt: learn from its answer, count it as urllib3 does, then let
the pure policy decide (retry after a wait, defer, stop), whoever loops.

:func:`judge` serves the engine's loop and :meth:`RetryAfterRetry.increment` inside a
stock urllib3 loop alike, so there is one decision step.
"""

from __future__ import annotations

import functools
import random
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from urllib3.exceptions import MaxRetryError
from urllib3.util.retry import Retry

from .._compat import announces_quota, header_getter, response_header
from ..cooldown.freshness import SUCCESS, SUCCESS_EVERY
from ..deferral import Deferral
from ..dialects import not_processed, should_retry
from ..policy import (
    COOLDOWN_STATUSES,
    DEFER,
    RETRY,
    STOP,
    Decision,
    Reason,
    after_attempt,
    decide,
    out_of_attempts,
    retried_status,
)
from .learn import (
    learn_retry_after,
    learn_retry_info,
    learn_route,
    learn_secondary,
    note,
    outcome_class,
    read_quota_headers,
)
from .state import NOTHING_HEARD, Heard

if TYPE_CHECKING:
    from .call import Call

__all__ = ["FINAL", "RAISE", "REDIRECT", "RETURN", "Verdict", "judge", "plan_wait"]

#: A call's first answer, with nothing else heard: one value per status, made once.
_status_only = functools.lru_cache(maxsize=64)(Heard)

RETURN = "return"  #: the outcome is final: return the response
RAISE = "raise"  #: the outcome is final: raise the error as it is
REDIRECT = "redirect"  #: follow the response's redirect (when the transport follows them)

_jitter_rng = random.Random()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`judge` decided about one attempt.

    ``action`` is ``"retry"`` (wait ``wait`` seconds, then go on with counters
    ``retry``), ``"defer"`` (``deferral``), ``"stop"`` (``reason``: return the response
    without retrying), ``"return"``, ``"raise"`` or ``"redirect"``. ``exhausted`` says
    the retry budget ran out (``limit``; the deferral then has reason ``attempts``);
    ``server_delay`` is the attempt's valid Retry-After in seconds, or None. ``fits``:
    the deferral of a request not replayed (a POST) names a wait that fits the call's
    budget, which the caller's own retry (an SDK's) may wait out.
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
    fits: bool = False

    @property
    def exhausted(self) -> bool:
        return self.limit is not None


#: The verdict of the happy path: a final answer, nothing to plan.
FINAL = Verdict(RETURN)

_STOCK_IS_RETRY = Retry.is_retry
#: Statuses whose Retry-After matters even when not retried (urllib3's and ours).
_HINTED_STATUSES = frozenset(Retry.RETRY_AFTER_STATUS_CODES) | COOLDOWN_STATUSES


def _plainly_final(retry: Retry, method: str | None, status: int) -> bool:
    """Whether a status below 300 is final with nothing to read but quota headers: no
    rule retries it (urllib3's own rule retries a status without Retry-After only when
    it is in ``status_forcelist``; a subclass's own rule is asked)."""
    if status >= 300 or status in _HINTED_STATUSES:
        return False
    if type(retry).is_retry is _STOCK_IS_RETRY:
        return status not in (retry.status_forcelist or ())
    return not retry.is_retry(method or "GET", status)


def judge(
    call: Call,
    method: str | None,
    url: str | None,
    response: Any,
    error: Exception | None,
    *,
    decided: bool = False,
    stacktrace: Any = None,
    body: bytes | None = None,
) -> Verdict:
    """Judge one attempt: its ``response`` (a urllib3 response) or its ``error`` (a
    urllib3 error). ``decided=True`` is for a stock urllib3 loop, which calls only for
    outcomes it already chose to retry. ``body``: the response's body when a dialect
    needed it read (``buckets.peek_body``), else None."""
    call.progress.attempts += 1
    status = getattr(response, "status", None)
    if not isinstance(status, int):
        status = None
    if not decided and error is None and status is not None and _plainly_final(call.retry, method, status):
        return _happy(call, method, url, response, status)
    server_delay, invalid = _learn(call, method, url, response, status, error, body)
    final = _final(call, method, response, status, error, server_delay, decided, body)
    if final is not None:
        return final
    if response is not None and should_retry(lambda name: response_header(response, name)) is False:
        # The server says another attempt is pointless: the answer is final. What was
        # learned (a Retry-After's or a quota's cooldown) still holds every worker back.
        call.emit(Decision(STOP, 0.0, Reason.SERVER_SAID_NO), server_delay)
        return Verdict(STOP, reason=Reason.SERVER_SAID_NO, server_delay=server_delay)
    rule = _rule(call, method, error, invalid)
    if rule is not None:
        call.emit(rule)
        return Verdict(RAISE if error is not None else STOP, reason=rule.reason, error=error)
    return _count_and_plan(call, method, url, response, error, stacktrace, server_delay)


def _happy(call: Call, method: str | None, url: str | None, response: Any, status: int) -> Verdict:
    """The happy path: a final answer, with nothing to parse or plan but the quota
    headers."""
    heard = call.heard
    if heard.status != status:
        call.heard = _status_only(status) if heard is NOTHING_HEARD else Heard(status, *heard[1:])
    if call.policy.quota_headers and announces_quota(response):
        get = header_getter(response)  # a dozen fields read: one pass over them first
        learn_route(call, get, method, url)  # a bucket refines the route's scope
        read_quota_headers(call, response, get)
    if call.ticket.rate_report and _good(call, status):
        call.plan.rate_answer(call, None)
    meter, sent = call.meter, call.ticket.sent_at
    if meter is None or sent is None or sent - meter.noted >= SUCCESS_EVERY:
        note(call, SUCCESS)  # else noted less than SUCCESS_EVERY ago: nothing new
    return FINAL


def _rule(call: Call, method: str | None, error: Exception | None, invalid: Reason | None) -> Decision | None:
    """The rules that end a call before counting (see ``policy.after_attempt``)."""
    return after_attempt(
        failed=error is not None,
        idempotent=method is None or call.retry._is_method_retryable(method),
        connection_error=error is not None and call.retry._is_connection_error(error),
        cannot_heal=error is not None and _cannot_heal(error),
        invalid=invalid,
        on_invalid=call.policy.on_invalid,
    )


def _good(call: Call, status: int | None) -> bool:
    """Whether an answer with ``status`` is a good one for the learned rate: the server
    took the request (not a 5xx, not a 429, not a status that may carry a cooldown)."""
    if status is None or status >= 500 or status == 429:
        return False
    return status not in call.policy.cooldown_statuses


def _learn(
    call: Call,
    method: str | None,
    url: str | None,
    response: Any,
    status: int | None,
    error: Exception | None,
    body: bytes | None,
) -> tuple[float | None, Reason | None]:
    """Learn from the answer before deciding: its route's bucket, its Retry-After,
    quota headers, a secondary limit, and its outcome noted. Returns the valid
    Retry-After (seconds) and why one was rejected."""
    if call.progress.started_at is None:
        call.progress.started_at = call.clock.now()
    call.heard = Heard(status)
    policy = call.policy
    server_delay: float | None = None
    invalid: Reason | None = None
    if response is not None and policy.quota_headers:
        learn_route(call, lambda name: response_header(response, name), method, url)  # first: the bucket's
    if response is not None and policy.respect_retry_after_header:
        server_delay, invalid = learn_retry_after(call, response, status)
        if body is not None and server_delay is None and invalid is None:
            server_delay, invalid = learn_retry_info(call, status, body)  # a wait in the body (Gemini's)
    if status == 429 and server_delay is None:
        # A throttle without a usable wait (none, invalid, or not read): the learned
        # rate backs off (never 0).
        call.plan.rate_answer(call, call.clock.now())
    if response is not None and policy.quota_headers:
        _learn_quota(call, response, status, body, quiet=server_delay is None and invalid is None)
    if call.ticket.rate_report and error is None and _good(call, status):
        call.plan.rate_answer(call, None)
    note(call, outcome_class(status, error, invalid, server_delay, policy.cooldown_statuses))
    return server_delay, invalid


def _learn_quota(call: Call, response: Any, status: int | None, body: bytes | None, *, quiet: bool) -> None:
    """Quota headers (nothing left: a shared cooldown until the reset) and, for an
    answer without a Retry-After (``quiet``) of a cooldown status, a secondary limit
    (GitHub's: 60 s or more)."""
    read_quota_headers(call, response)
    if quiet and status in call.policy.cooldown_statuses:
        learn_secondary(call, response, status, body)


def _final(
    call: Call,
    method: str | None,
    response: Any,
    status: int | None,
    error: Exception | None,
    server_delay: float | None,
    decided: bool,
    body: bytes | None = None,
) -> Verdict | None:
    """A redirect to follow, or an answer no rule retries; None: judge further."""
    if error is not None:
        return None
    if response is not None and response.get_redirect_location():
        return Verdict(REDIRECT, server_delay=server_delay)
    if not decided and not call.retry.is_retry(method or "GET", status or 0, server_delay is not None):
        if server_delay is not None and method is not None and not call.retry._is_method_retryable(method):
            if _unprocessed(call, status, response, body):
                return None  # judged further as an idempotent request: replayed after the wait
            return _not_replayed(call, server_delay)
        return Verdict(RETURN, server_delay=server_delay)
    return None


def _unprocessed(call: Call, status: int | None, response: Any, body: bytes | None) -> bool:
    """Whether a request the policy does not replay (a POST) may be replayed after this
    answer's wait: the front end replays such requests (``replay_unprocessed``), its
    body can be sent again, the policy would retry the status for an idempotent
    request, and the answer's provider documents it as not processed (a 429 of OpenAI
    or Anthropic, or Gemini's quota refusal in ``body``: ``dialects.not_processed``)."""
    retry = call.retry
    return (
        call.plan.replays
        and call.progress.resendable
        and retried_status(
            status,
            forcelist=retry.status_forcelist or (),
            retry_after_statuses=Retry.RETRY_AFTER_STATUS_CODES,
            honours_retry_after=bool(retry.total and retry.respect_retry_after_header),
        )
        and not_processed(status, lambda name: response_header(response, name), body)
    )


def _not_replayed(call: Call, server_delay: float) -> Verdict:
    """A request the policy does not replay (a POST) answered with a valid Retry-After (a
    429, a 503: it set the scope's cooldown): its response comes back with a deferral
    until that cooldown ends (reason ``cooldown``), so that a caller resubmits then, not
    sooner and not blindly. Nothing is replayed. ``fits`` says whether that wait fits
    the call's budget: a caller's own retry (an SDK's, which sends any request again
    after a 429 or 503) may then wait it out and send, through admission, which holds it
    until the cooldown ends; the httpx transports leave its ``x-should-retry`` alone."""
    wait = max(server_delay, call.seconds_until(call.cooldown))
    fits = _fits(call, wait)
    deferral = call.defer(Decision(DEFER, wait, Reason.COOLDOWN), server_delay)
    return Verdict(DEFER, deferral=deferral, server_delay=server_delay, fits=fits)


def _fits(call: Call, wait: float) -> bool:
    """Whether a wait of ``wait`` seconds from now fits the call's limits."""
    terms = call.terms
    decision = decide(
        server_delay=wait,
        backoff=0.0,
        cooldown_left=0.0,
        jitter=0.0,
        elapsed=call.elapsed(),
        deadline=terms.deadline,
        max_wait=terms.max_wait,
        attempt_reserve=call.policy.attempt_reserve,
    )
    return decision.action == RETRY


def _count_and_plan(
    call: Call,
    method: str | None,
    url: str | None,
    response: Any,
    error: Exception | None,
    stacktrace: Any,
    server_delay: float | None,
) -> Verdict:
    """Count the attempt as urllib3 does, then plan the wait, or defer."""
    limit: MaxRetryError | None = None
    try:
        new = Retry.increment(call.retry, method, url, response, error, None, stacktrace)
    except MaxRetryError as out_of_retries:
        # Out of retries: still plan the next wait, so the deferral keeps the time.
        limit = out_of_retries
        new = _uncounted(call.retry, method, url, response, error)
    except Exception as raised:  # urllib3 re-raises errors it must not retry (read=False)
        call.emit(Decision(STOP, 0.0, Reason.NOT_RETRYABLE))
        return Verdict(RAISE, reason=Reason.NOT_RETRYABLE, error=raised)
    decision = plan_wait(call, server_delay, new.get_backoff_time())
    if limit is not None:
        decision = out_of_attempts(decision)
    if decision.action == DEFER:
        deferral = call.defer(decision, server_delay)
        return Verdict(DEFER, deferral=deferral, server_delay=server_delay, limit=limit)
    call.emit(decision, server_delay)
    return Verdict(RETRY, wait=decision.wait, retry=new, server_delay=server_delay)


def plan_wait(call: Call, server_delay: float | None, backoff: float, cooldown: bool = True) -> Decision:
    """The pure decision on the next wait, with what the call knows now (its elapsed
    time, its limits, the scope's cooldown when ``cooldown``, a fresh jitter sample)."""
    policy = call.policy
    return decide(
        server_delay=server_delay,
        backoff=backoff,
        cooldown_left=call.seconds_until(call.cooldown) if cooldown else 0.0,
        jitter=jitter(call) if cooldown else 0.0,
        elapsed=call.elapsed(),
        deadline=call.terms.deadline,
        max_wait=call.terms.max_wait,
        attempt_reserve=policy.attempt_reserve,
    )


def jitter(call: Call) -> float:
    """A fresh jitter sample for ``call`` (seconds, only added)."""
    return _jitter_rng.uniform(0.0, call.policy.jitter) if call.policy.jitter else 0.0


def _uncounted(retry: Retry, method: str | None, url: str | None, response: Any, error: Any) -> Retry:
    """``retry`` incremented without limits: for the backoff the next try would have."""
    unlimited = retry.new(total=None, connect=None, read=None, redirect=None, status=None, other=None)
    try:
        return Retry.increment(unlimited, method, url, response, error)
    except Exception:
        return retry


def _cannot_heal(error: BaseException) -> bool:
    """Whether another attempt cannot succeed: a certificate that failed verification."""
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen or len(seen) > 16:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        for nxt in (current.__cause__, current.__context__, getattr(current, "reason", None), *current.args):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return False
