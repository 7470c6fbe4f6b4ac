"""The loop: admit, send exactly one attempt, judge it, then wait and go on, or end.

::

    while True:
        deferral = admit(call)                  # one store operation, or wait, or defer
                                                # (admitted(), else admit_slowly())
        if deferral: return Outcome(..., deferral)               # nothing was sent
        response, error, cause = send(call, transport)           # exactly one attempt
        verdict = judge(call, ...)              # learn, count, then the policy decides
        if verdict is FINAL: return Outcome(response)            # the happy path
        the slow path: wait and retry, follow a redirect, or end

:func:`steps` is that loop, written once: a generator that decides and asks its
driver for each wait, each transport operation and each store operation, as the typed
values of ``ops`` (``Sleep``, ``Send``, ``Keep``, ``Close``, ``Follow``; ``Admit``,
``ReadCooldown``, ``Settle``, ``Judge``): it does no I/O itself. :func:`run`
drives it here for :class:`~retry_after_adapter.RetryAfterAdapter` (each attempt
through ``HTTPAdapter.send``), :class:`~retry_after_adapter.RetryAfterPoolManager`
(``PoolManager.urlopen``; urllib3 itself never loops there) and the synchronous httpx
transport; the async httpx transport drives the same steps on an event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from urllib3.exceptions import MaxRetryError
from urllib3.util.retry import Retry

from ..deferral import Deferral
from ..deferred import DeferralLimitExceeded
from ..policy import DEFER, RETRY, STOP, Reason
from ..redact import message_url
from .admission import admit_slowly, admitted, drive, wait_steps
from .call import Call
from .learn import wants_body
from .ops import Close, Follow, Judge, Keep, Op, Send, Settle, Steps
from .verdict import FINAL, REDIRECT, Verdict, plan_wait

__all__ = [
    "SINGLE_ATTEMPT",
    "Attempts",
    "Outcome",
    "Transport",
    "judge_redirect",
    "redirect_steps",
    "run",
    "steps",
]

R = TypeVar("R")
R_in = TypeVar("R_in", contravariant=True)


class _SingleAttempt(Retry):
    """urllib3's ``Retry(0, read=False)`` that names no user info or query string in its errors."""

    def increment(self, method: str | None = None, url: str | None = None, *args: Any, **kw: Any) -> Retry:  # type: ignore[override]
        return super().increment(method, message_url(url) if url is not None else None, *args, **kw)


#: What urllib3 gets for each attempt the engine sends: one attempt, no retry, no
#: redirect, read errors raised as themselves (as ``HTTPAdapter``'s default ``Retry(0,
#: read=False)``), so each attempt fails with the error class it would have alone.
SINGLE_ATTEMPT: Retry = _SingleAttempt(
    0, read=False, redirect=False, raise_on_redirect=False, raise_on_status=False
)


class Attempts(Protocol[R_in]):
    """What :func:`steps` reads of one call's attempts itself (nothing here does I/O).

    ``transport_error`` gives the urllib3 error behind an exception the ``send``
    operation raised when it is a transport failure that a retry may heal, else None
    (the exception then propagates unchanged).
    """

    method: str
    url: str
    #: Whether :func:`steps` follows redirects (plain urllib3) or returns them (requests,
    #: httpx: they follow them with a new send that continues the same :class:`Call`).
    follows_redirects: bool
    #: Whether the caller reads the body itself (``stream=True``, ``preload_content=False``):
    #: a deferred response is then handed over unread.
    streams: bool
    #: The caller's timeout (a number, a ``(connect, read)`` pair, a urllib3 ``Timeout``,
    #: None, or the transport's own "not given"): what ``send`` gets, bounded by the
    #: deadline (:meth:`Call.attempt_timeout`).
    user_timeout: Any

    def raw(self, response: R_in) -> Any: ...

    def transport_error(self, exc: Exception) -> Exception | None: ...

    def on_done(self, response: R_in, release: Callable[[], None]) -> None:
        """Call ``release`` once the attempt is over: its body read, or the response
        closed (at once when there is no body left to read)."""
        ...


class Transport(Attempts[R], Protocol[R]):
    """:class:`Attempts` with the operations :func:`run` carries out here (an async
    driver has them as coroutines): ``send`` sends exactly one attempt (no retry, no
    redirect) and returns the transport's response, or raises the transport's own
    error."""

    def send(self, timeout: Any) -> R: ...

    def keep(self, response: R, limit: int | None, seconds: float | None) -> bytes | None:
        """Read and keep the body (at most ``limit`` bytes, within ``seconds``; past
        either the connection is dropped), so the response stays readable; return it
        (None when it cannot be had)."""
        ...

    def close(self, response: R) -> None:
        """Close the response, dropping its connection."""
        ...

    def follow(self, response: R, retry: Retry) -> None: ...


@dataclass(slots=True)
class Outcome(Generic[R]):
    """How a call ended: the last response or error, and the deferral or stop reason
    (``fits``: a request not replayed was deferred by a wait that fits its budget, see
    :class:`~.verdict.Verdict`)."""

    response: R | None = None
    error: Exception | None = None
    deferral: Deferral | None = None
    stop_reason: Reason | None = None
    exhausted: bool = False
    redirect: bool = False
    #: urllib3's ``MaxRetryError`` for an exhausted budget (see :class:`Verdict`).
    limit: MaxRetryError | None = None
    fits: bool = False


def run(call: Call, transport: Transport[R]) -> Outcome[R]:
    """Run the call to its end here, waiting on the call's clock (the synchronous
    driver of :func:`steps`)."""
    return drive(call, transport, steps(call, transport))


def steps(call: Call, transport: Attempts[R]) -> Generator[Op, Any, Outcome[R]]:
    """The loop (see the module), written once for every driver: it asks for each wait
    and each transport operation with an :data:`~.ops.Op`. ``DeferralLimitExceeded``
    ends it with no result: the last response is read and its connection given back
    first."""
    response: R | None = None
    error: Exception | None = None
    try:
        while True:
            call.ticket.slot_waited = 0.0
            if not (yield from admitted(call)):  # the common case decided without a wait
                deferral = yield from admit_slowly(call)
                if deferral is not None:
                    # Before a retry: the last attempt's response (its body kept) or error ends it.
                    return Outcome(response, error, deferral)
            if call.plan.learned_meanwhile(call):  # read here: this process's local copy
                yield Settle(None, None)  # not sent: its slot back, its permit settled
                continue  # a cooldown this process learned since the grant: admitted again
            response, error, cause = yield from send(call, transport)
            raw = transport.raw(response) if response is not None else None
            body = None
            if _body_tells(transport, raw):  # read and kept (bounded)
                body = yield from _peek(call, response)
            verdict: Verdict = yield Judge(transport.method, transport.url, raw, cause, body)
            if verdict is FINAL:
                return Outcome(response)  # the happy path: a final answer
            outcome = yield from _after(call, transport, verdict, response, error)
            if outcome is not None:
                return outcome
            if verdict.action == REDIRECT:
                response = None  # drained: a deferral before the next hop has no response
    except DeferralLimitExceeded:
        if response is not None:
            yield Keep(response, call.policy.max_retry_body, call.read_time())
        raise
    except GeneratorExit:
        raise
    except BaseException:
        if response is not None:
            yield Close(response)  # the attempt ends here: its slot is given back
        raise


def _body_tells(transport: Attempts[Any], raw: Any) -> bool:
    """Whether the answer is a 403 whose body tells whether it is GitHub's secondary
    limit, or a 429 whose body names its wait (Gemini's; see ``learn.wants_body``).
    Any other status (a 200) is not looked at further."""
    return raw is not None and getattr(raw, "status", None) in (403, 429) and wants_body(transport, raw)


def send(
    call: Call, transport: Attempts[R]
) -> Generator[Op, Any, tuple[R | None, Exception | None, Exception | None]]:
    """Exactly one attempt, its timeout bounded by the deadline: ``(response, error,
    cause)``, ``cause`` being the urllib3 failure behind ``error``. The meter counts it
    on the wire; its permit and slot are looked after once it is answered."""
    at = call.ticket.sent_at = call.clock.monotonic()
    meter = call.meter
    if meter is not None:
        meter.wire.add(id(call))
        meter.sent.append(at)
    response: R | None = None
    error = cause = None
    try:
        response = yield Send(call.attempt_timeout(transport.user_timeout, at))
    except GeneratorExit:  # closed by its driver's end (a task collected): no step is carried out now
        _off_the_wire(call)
        call.plan.answered(call, None)  # its slot back, its permit settled, here
        raise
    except BaseException as exc:
        cause = transport.transport_error(exc) if isinstance(exc, Exception) else None
        if cause is None or not isinstance(exc, Exception):  # no attempt heals it: it ends the call
            _off_the_wire(call)
            yield Settle(None, transport.on_done)
            raise
        error = exc
    if meter is not None:
        meter.wire.discard(id(call))  # off the wire (``_off_the_wire``, written out)
    ticket = call.ticket
    if ticket.permit is None and ticket.lease_token is None and ticket.weighed is None:
        return response, error, cause  # no permit, no slot: nothing to settle, no step
    try:
        yield Settle(response, transport.on_done)
    except GeneratorExit:
        raise
    except BaseException:
        if response is not None:
            yield Close(response)  # a cancel while it settled: the attempt ends here
        raise
    return response, error, cause


def _peek(call: Call, response: Any) -> Generator[Op, Any, bytes | None]:
    """The body a dialect reads before judging, kept (bounded); should that fail, a
    probe's slot goes back first (it would go back once the answer was judged)."""
    try:
        body: bytes | None = yield Keep(response, call.policy.max_retry_body, call.read_time())
    except GeneratorExit:
        raise
    except BaseException:
        yield Settle(None, None)
        raise
    return body


def _off_the_wire(call: Call) -> None:
    meter = call.meter
    if meter is not None:
        meter.wire.discard(id(call))


def _after(
    call: Call, transport: Attempts[R], verdict: Verdict, response: R | None, error: Exception | None
) -> Generator[Op, Any, Outcome[R] | None]:
    """The slow path after a verdict that is not the happy path: wait and retry (None:
    go on), follow a redirect (None: go on), or the outcome that ends the call."""
    action = verdict.action
    if action == RETRY:
        if response is not None:
            # Kept (bounded) so it stays readable should a deferral follow; the read
            # must leave time for the wait.
            left = call.time_left()
            left = None if left is None else max(0.0, left - verdict.wait)
            yield Keep(response, call.policy.max_retry_body, left)
        deferral = yield from wait_steps(call, call.clock.monotonic() + verdict.wait)
        if deferral is not None:
            return Outcome(response, error, deferral)
        assert verdict.retry is not None
        call.retry = verdict.retry
        return None
    if action == REDIRECT:
        assert response is not None
        return (yield from _redirect(call, transport, verdict, response))
    if verdict.deferral is not None and response is not None and not transport.streams:
        # A deferred answer (a 429 or 503, say) is read like a retried one.
        yield Keep(response, call.policy.max_retry_body, call.read_time())
    return Outcome(
        response,
        error,
        verdict.deferral,
        stop_reason=verdict.reason if action == STOP else None,
        exhausted=verdict.exhausted,
        limit=verdict.limit,
        fits=verdict.fits,
    )


def _redirect(
    call: Call, transport: Attempts[R], verdict: Verdict, response: R
) -> Generator[Op, Any, Outcome[R] | None]:
    """A redirect: its Retry-After waited out (or deferred); followed here when the
    transport follows redirects (None: go on), else returned to the caller."""
    deferral = yield from redirect_steps(call, verdict.server_delay)
    if deferral is not None and not transport.streams:
        # A deferred redirect ends the call: its body is read (bounded), its connection
        # and slot given back, as for any deferred answer.
        yield Keep(response, call.policy.max_retry_body, call.read_time())
    if deferral is not None or not transport.follows_redirects:
        return Outcome(response, None, deferral, redirect=True)
    try:
        call.retry = Retry.increment(call.retry, transport.method, transport.url, transport.raw(response))
    except MaxRetryError:
        return Outcome(response, redirect=True, exhausted=True)
    yield Follow(response, call.retry)
    return None


def redirect_steps(call: Call, server_delay: float | None) -> Steps:
    """A redirect that carries a Retry-After: wait it out before the next hop if it
    fits the budget; else (or when cancelled) the deferral."""
    if not server_delay or server_delay <= 0:
        return None
    decision = plan_wait(call, server_delay, 0.0, cooldown=False)
    if decision.action == DEFER:
        return call.defer(decision, server_delay)
    call.emit(decision, server_delay)
    return (yield from wait_steps(call, call.clock.monotonic() + decision.wait))


def judge_redirect(call: Call, server_delay: float | None) -> Deferral | None:
    """:func:`redirect_steps` here and now (inside a stock urllib3 loop)."""
    return drive(call, None, redirect_steps(call, server_delay))
