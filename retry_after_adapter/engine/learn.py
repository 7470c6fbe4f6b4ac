"""What an attempt's answer teaches, learned before anything is decided: a valid
Retry-After of a cooldown status advances the scope's shared cooldown, quota headers
record what the server allows (nothing left: a cooldown until the reset), and the
outcome is noted in the scope's freshness record. Providers' dialects refine it
(``buckets``): a route's bucket refines its scope first, a global limit cools the
unrefined scope, a GitHub secondary limit that names no wait cools it 60 s or more; a
request to a Gemini model is scoped by the model, and its 429's wait is read from its
body (``google.rpc.RetryInfo``) when no field names one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._compat import announces_quota, header_getter, response_header
from ..cooldown.allowance import SAME_WINDOW
from ..cooldown.freshness import INVALID_HEADER, SERVER_ERROR, SUCCESS, SUCCESS_EVERY, THROTTLED, TRANSPORT
from ..dialects import (
    GEMINI_MARK,
    MS_FIELDS,
    RESET_MARGIN,
    body_needed,
    bucket_of,
    gemini_key,
    github_secondary,
    google_rpc_error,
    is_global,
    secondary_wait,
)
from ..errors import CooldownUnavailable, InvalidRetryAfter
from ..policy import TOO_LONG, Reason, beyond_bound
from ..quota import QuotaHint, bound_hint, read_quota, refill_step
from .buckets import MARK, base_scope
from .state import Heard

if TYPE_CHECKING:
    from .call import Call

__all__ = [
    "learn_cooldown",
    "learn_retry_after",
    "learn_retry_info",
    "learn_route",
    "learn_secondary",
    "note",
    "outcome_class",
    "read_quota_headers",
    "refine_call",
    "refine_gemini",
    "wants_body",
]

#: No millisecond field: ``(None, None)``, one per ``MS_FIELDS``.
_NO_MS = (None,) * len(MS_FIELDS)


#: Quota header sources whose resets are not whole seconds rounded up (buckets' times
#: to a full refill, read at their latest meaning).
_EXACT_RESETS = frozenset(("openai", "anthropic"))


def learn_retry_after(call: Call, response: Any, status: int | None) -> tuple[float | None, Reason | None]:
    """The response's valid wait in seconds (None: none) and the reason it was
    rejected (None: not rejected); a valid one of a cooldown status is learned. The
    wait is its Retry-After's, made precise or longer by ``retry-after-ms`` and
    ``x-ms-retry-after-ms`` (``Call.read_hint``, the one place they are read)."""
    raw = response_header(response, "Retry-After")
    raw_ms = tuple(response_header(response, name) for name in MS_FIELDS)
    if raw is None and raw_ms == _NO_MS:
        return None, None
    try:
        parsed = call.read_hint(raw, response_header(response, "Date"), raw_ms)
    except InvalidRetryAfter as bad:
        return None, Reason.RETRY_AFTER_TOO_LONG if bad.reason == TOO_LONG else Reason.INVALID_RETRY_AFTER
    if status in call.policy.cooldown_statuses:
        learn_cooldown(call, response, parsed.eligible_at)  # a global limit: the origin's
        if status == 429 or parsed.delay > 0:
            # A throttle: the learned rate hears (a 429's wait of 0 backs it off).
            call.plan.rate_answer(call, parsed.eligible_at)
    return parsed.delay, None


def learn_retry_info(
    call: Call, status: int | None, body: bytes | None
) -> tuple[float | None, Reason | None]:
    """A 429's wait named in its Google API error body (Gemini's ``google.rpc.RetryInfo``
    ``retryDelay``), in seconds (None: none), and the reason it was rejected (None: not
    rejected): a ``RetryInfo`` that cannot be read is an invalid Retry-After (it stops
    under ``on_invalid="stop"``), a wait beyond ``max_retry_after`` one too long. A
    valid one is learned as a Retry-After's is: on the model's scope, and on the
    project's (the unrefined scope) when a violated quota is not per model; on every
    model the violations name besides the request's own. The raw ``retryDelay`` is what
    a deferral shows as its ``retry_after``."""
    found = google_rpc_error(body) if status == 429 else None
    if found is None or found.retry_delay is None:
        return None, None
    call.heard = Heard(call.heard.status, found.retry_delay, None)
    if found.invalid or found.delay is None:
        return None, Reason.INVALID_RETRY_AFTER
    if beyond_bound(found.delay, call.policy.max_retry_after):
        return None, Reason.RETRY_AFTER_TOO_LONG
    now = call.clock.now()
    try:
        until = now + timedelta(seconds=found.delay)
    except OverflowError:  # pragma: no cover - bounded by max_retry_after above
        return None, Reason.RETRY_AFTER_TOO_LONG
    scope = call.scope
    if status in call.policy.cooldown_statuses:
        call.plan.learn(call, until)
        if scope is not None and GEMINI_MARK in scope:
            base, _, key = scope.partition(GEMINI_MARK)
            prefix = key.rpartition("/")[0] + "/" if "/" in key and not key.startswith("tunedModels/") else ""
            for model in found.models:
                other = f"{base}{GEMINI_MARK}{prefix}{model.removeprefix('models/')}"
                if other != scope:
                    _on_scope(call, other, until)
            if found.project_wide:
                _on_scope(call, base, until)
        call.plan.rate_answer(call, until)
    return found.delay, None


def read_quota_headers(
    call: Call, response: Any, get: Callable[[str], str | None] | None = None
) -> QuotaHint | None:
    """Read the quota a response announces, when its reset is ahead (within
    ``max_retry_after``): nothing left advances the shared cooldown to the reset, and
    the store records what is left (its allowance) so that every worker sharing it
    sends no more before the reset. Malformed quota fields are ignored. ``get``: the
    response's fields as ``header_getter`` reads them, when the caller made it (it
    found a quota field); else this checks and makes it."""
    get = get or _fields_of(response)
    if get is None:
        return None
    received = call.clock.monotonic()  # before `now`: each errs late, never early
    now = call.clock.now()
    hint = read_quota(get, received_at=now, date=get("date"))
    # One bound for every value a header gives, before anything is stored or obeyed.
    hint = bound_hint(hint, call.policy.max_retry_after)
    if call.progress.cost:
        _allow_tokens(call, hint, now)
    if hint is None or hint.reset is None or hint.remaining is None or hint.reset <= 0:
        return hint
    until = _reset_here(call, hint, now, received)
    if hint.refill is not None:
        hint, until = _paced(call, hint, now, received, until)
    # Whole seconds rounded up bound a window's reset from above, so the earliest such
    # reset is the tightest; the LLM APIs' limits are buckets (``hint.refill``): the
    # reset is their next unit, read at its latest, and moves with each answer.
    meter = None if hint.source in _EXACT_RESETS else call.meter
    if hint.exhausted:
        # Nothing left: a shared cooldown until the window's reset (a bucket's next unit).
        earliest = until if meter is None else meter.earliest_reset(until, now, SAME_WINDOW, hint.limit)
        call.plan.learn(call, earliest)
    elif meter is not None:
        meter.earliest_reset(until, now, SAME_WINDOW, hint.limit)
    if call.plan.allows and call.scope is not None:
        # At most `remaining` more before the reset, across every worker: the store
        # takes off what was admitted after this attempt (its admission number).
        seq = call.ticket.admission
        remaining = hint.remaining if seq is not None else _left_unseen(call, hint, until)
        # A bucket is told by a negative window: a unit back every -window seconds.
        window = -hint.refill if hint.refill else hint.window
        call.plan.allow(call, remaining, until, now, seq, hint.limit, window)
    return hint


def _fields_of(response: Any) -> Callable[[str], str | None] | None:
    """A reader of the response's fields when it announces a quota, else None."""
    if not announces_quota(response):
        return None
    return header_getter(response)  # a dozen fields read: one pass over them first


def _allow_tokens(call: Call, hint: QuotaHint | None, now: datetime) -> None:
    """Record a provider's announced token allowance (its ``tokens`` kind), which the
    declared costs of every worker's calls are weighed against; read only for a call
    that declared a cost (a fleet that declares none has no use for it)."""
    for each in hint.allowances if hint is not None else ():
        if each.kind == "tokens" and each.remaining is not None and each.reset is not None and each.reset > 0:
            until = now + timedelta(seconds=each.reset)
            remaining = each.remaining
            if call.ticket.token_seq is None and call.meter is not None:
                # The store did not count this attempt's cost (the first window it sees):
                # what is still on the wire here is not in the server's figure yet.
                remaining -= call.meter.in_flight * call.progress.cost
            call.plan.allow_tokens(call, remaining, until, now, each.limit)
            return


def _reset_here(call: Call, hint: QuotaHint, now: datetime, received: float) -> datetime:
    """When the announced reset comes on this host's clock. A reset in seconds from now
    counts from ``now``. An epoch reset is read against the server's clock as the
    scope's answers bound it (its whole-second ``Date`` learned across answers:
    ``meters.ServerClock``), at the latest time it may come, so never before the server
    allows; without a meter, against this answer's ``Date`` alone."""
    until = now + timedelta(seconds=hint.reset or 0.0)
    meter = call.meter
    if meter is None or hint.date is None:
        return until
    meter.server.observe(hint.date, call.ticket.sent_at, received)
    if hint.reset_at is None or hint.refill is not None:  # a bucket's is its full refill
        return until
    latest = meter.server.latest(hint.reset_at, received)
    if latest is None:
        return until
    # Never later than this answer alone says: its Date is one of the bounds.
    return min(until, now + timedelta(seconds=latest - received))


def _paced(
    call: Call, hint: QuotaHint, now: datetime, received: float, until: datetime
) -> tuple[QuotaHint, datetime]:
    """A bucket whose full refill is a time (Anthropic's) paced by the server's clock as
    the scope's answers bound it (``meters.ServerClock``), at the latest time the full
    refill may come: one whole-second ``Date`` alone may read it up to a second late,
    a pace slower by that share. Never a faster pace than the answer's own figures
    allow at their latest; ``until``, the next unit, follows."""
    meter = call.meter
    if meter is None or hint.reset_at is None or hint.date is None or hint.refill is None:
        return hint, until
    latest = meter.server.latest(hint.reset_at, received)
    requests = next((each for each in hint.allowances if each.kind == "requests"), None)
    if latest is None or latest <= received or requests is None or requests.limit is None:
        return hint, until
    if requests.remaining is None or requests.limit <= requests.remaining:
        return hint, until
    step = refill_step((latest - received) / (requests.limit - requests.remaining))
    if step is None or step >= hint.refill:
        return hint, until
    hint = replace(hint, refill=step, reset=step + RESET_MARGIN)
    return hint, now + timedelta(seconds=hint.reset or 0.0)


def _left_unseen(call: Call, hint: QuotaHint, until: datetime) -> int:
    """What is left of an announced quota when the store did not count the answered
    attempt (the first window a store sees of a scope): ``remaining`` less the attempts
    still on the wire here (the server did not count them yet, though it may have
    counted some whose answers are not read yet: an underestimate). With the server's
    limit known: the limit less what this process sent in the window, if more (exact
    for one process; no more than ``remaining``)."""
    assert hint.remaining is not None
    meter = call.meter
    if meter is None:
        return hint.remaining
    estimate = hint.remaining - meter.in_flight
    if hint.limit and hint.refill is None:  # a window's (a bucket has no start to count from)
        # The window began at most `window` before the reset, which is rounded up: a
        # second more is counted (what was sent in the previous window, if anything).
        start = -math.inf
        if hint.window:
            ahead = (until - call.clock.now()).total_seconds()
            start = call.clock.monotonic() + ahead - hint.window - SAME_WINDOW
        estimate = max(estimate, min(hint.limit - meter.sent_since(start), hint.remaining))
    return estimate


def note(call: Call, outcome: str) -> None:
    """Note the attempt's outcome in the scope's freshness record (a success at most
    once per ``SUCCESS_EVERY`` seconds per scope in this process, and at once after an
    error it noted)."""
    if not outcome:
        return  # a client error (404...): says nothing of the integration's health
    meter = call.meter or call.plan.meter(call.scope)
    if outcome == SUCCESS and meter is not None:
        sent = call.ticket.sent_at if call.ticket.sent_at is not None else call.clock.monotonic()
        if sent - meter.noted < SUCCESS_EVERY:
            return
        meter.noted = sent
    elif meter is not None:
        meter.noted = -math.inf  # an error noted: the next success is news at once
    call.plan.note(call, outcome)


def outcome_class(
    status: int | None,
    error: BaseException | None,
    invalid: Reason | None,
    server_delay: float | None,
    cooldown_statuses: frozenset[int],
) -> str:
    """The freshness class of one attempt ("" for a client error: nothing noted)."""
    if error is not None or status is None:
        return TRANSPORT
    if invalid is not None:
        return INVALID_HEADER
    if status == 429 or (status in cooldown_statuses and server_delay is not None):
        return THROTTLED
    if status >= 500:
        return SERVER_ERROR
    return SUCCESS if status < 400 else ""


# -- providers' dialects (the memory of them per plan: ``buckets``) ---------------------


def _on_scope(call: Call, scope: str, until: datetime) -> None:
    """Advance ``scope``'s shared cooldown (not the call's own scope) to ``until``;
    the call keeps the later of both as its own cooldown."""
    own = call.scope
    if own == scope:
        call.plan.learn(call, until)
        return
    kept = call.cooldown
    call.scope = scope
    try:
        call.plan.learn(call, until)
    finally:
        call.scope = own
    if kept is not None and (call.cooldown is None or kept > call.cooldown):
        call.cooldown = kept


def refine_call(call: Call, method: str | None, url: str | None, local_only: bool = False) -> None:
    """Before the first attempt: when the call's route has reported a bucket, admit it
    under the refined scope, held back by a running global cooldown of the unrefined
    one (read once here; ``local_only``: from this process's copy, no store operation,
    as on an event loop). A store that cannot be read now holds nothing back."""
    scope = call.scope
    dialects = call.plan.dialects
    if scope is None or not dialects.routes:
        return
    refined = dialects.refine(scope, method, url)
    if refined == scope:
        return
    _hold_for_base(call, scope, refined, local_only)


def learn_route(call: Call, get: Callable[[str], str | None], method: str | None, url: str | None) -> None:
    """A response that names its bucket (its fields read by ``get``) refines its route's
    scope, this call's too (what it says of its quota is then learned for the bucket)."""
    if call.scope is None or method is None or url is None:
        return
    bucket = bucket_of(get)
    if bucket is None:
        return
    refined = call.plan.dialects.learn(call.scope, method, url, bucket)
    if refined != call.scope:
        call.continue_on(call.plan, refined)
        call.ticket.uncounted()  # the bucket's store record did not count this attempt
        call.cooldown = None


def learn_cooldown(call: Call, response: Any, until: datetime) -> None:
    """A Retry-After's cooldown: the unrefined scope's when the response says its limit
    is global (Discord), else the call's scope's."""
    scope = call.scope
    if scope is not None and MARK in scope and is_global(lambda name: response_header(response, name)):
        _on_scope(call, base_scope(scope), until)
        return
    call.plan.learn(call, until)


def learn_secondary(call: Call, response: Any, status: int | None, body: bytes | None) -> None:
    """A GitHub secondary rate limit that names no wait: a shared cooldown of at least
    60 s on the unrefined scope, doubled while such answers repeat (at most an hour);
    not learned when longer than ``max_retry_after`` (never obeyed, never shortened)."""
    scope = call.scope
    if scope is None or not github_secondary(status, lambda name: response_header(response, name), body):
        return
    base = base_scope(scope)
    now = call.clock.now()
    wait = secondary_wait(call.plan.dialects.streak(base, now))
    if beyond_bound(wait, call.policy.max_retry_after):
        return
    _on_scope(call, base, now + timedelta(seconds=wait))


def wants_body(transport: Any, raw: Any) -> bool:
    """Whether the body of the answer ``raw`` (a 403 or a 429) must be read to be told
    apart (a GitHub 403 that names no wait; a 429 that names its wait in a JSON body
    only, as Gemini's does): the loop then reads and keeps it (bounded, as a retried
    body), so that it stays readable. Never when the caller streams the body."""
    return not transport.streams and body_needed(raw.status, lambda name: response_header(raw, name))


def refine_gemini(call: Call, url: str | None, local_only: bool = False) -> None:
    """Before the first attempt: a request to a Gemini model (its path names one in
    Google's form, ``dialects.gemini_key``) is admitted under its scope refined by the
    model (Gemini's quotas are per project and model), held back by a running cooldown
    of the unrefined scope (a quota of the whole project; read once here, or from this
    process's copy with ``local_only``). A store that cannot be read now holds nothing
    back."""
    scope = call.scope
    if scope is None or url is None or GEMINI_MARK in scope:
        return
    key = gemini_key(url)
    if key is None:
        return
    _hold_for_base(call, scope, f"{scope}|{key}", local_only)


def _hold_for_base(call: Call, scope: str, refined: str, local_only: bool) -> None:
    """Move the call to ``refined``, held back by ``scope``'s running cooldown: one
    store read, or (``local_only``: an async front end on a store that may block, whose
    event loop must not wait for it) this process's copy, no store operation."""
    call.continue_on(call.plan, refined)
    if local_only:
        reader = call.plan.cooldown_of
        until = reader(scope) if reader is not None else None
    else:
        kept = call.cooldown
        call.scope = scope
        try:
            until = call.plan.read_cooldown(call)
        except CooldownUnavailable:
            until = None
        finally:
            call.scope = refined
            call.cooldown = kept
    if until is None or until <= call.clock.now():
        return
    if call.progress.not_before is None or until > call.progress.not_before:
        call.progress.not_before = until
