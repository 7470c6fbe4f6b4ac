"""OpenTelemetry: the package's decisions as metrics and span events.

:func:`instrument` returns an ``on_decision`` hook (an :class:`OTelHook`) for any front
end (``RetryAfterRetry``, ``RetryAfterAdapter``, ``RetryAfterPoolManager``, the httpx
and httpx2 transports, the aiohttp middleware). It needs only ``opentelemetry-api``
(the ``[otel]`` extra): the application configures the SDK and its exporters, as with
any instrumentation.

Metrics (instrumentation scope ``retry_after_adapter``):

- ``retry_after.deferrals`` (counter, ``{deferral}``): calls deferred, by
  ``retry_after.reason`` (a :data:`~retry_after_adapter.policy.DEFER_REASONS` value);
- ``retry_after.wait.duration`` (histogram, seconds): each wait before an attempt, by
  ``retry_after.reason``: ``retry_after`` (a server's Retry-After), ``backoff`` (a retry
  the server gave no wait for), or what held an admission back (``cooldown``,
  ``quota``, ``rate``; ``concurrency`` is in the set, but a wait for a slot is made of
  short looks that are no decision, so only its deferral is seen);
- ``retry_after.admissions`` (counter, ``{admission}``): admissions held back, by
  ``retry_after.outcome`` (``waited``: let through after a wait; ``deferred``: not let
  through within the budget, nothing sent) and ``retry_after.reason``;
- ``retry_after.store.failures`` (counter, ``{failure}``): outages of a shared store,
  by ``retry_after.cause`` (:data:`~retry_after_adapter.errors.FAILURE_CAUSES`).

The first three also carry ``server.address`` and ``server.port`` when the scope is an
origin (the default scope); a hashed scope gives neither; and ``retry_after.priority``
(an int) for a call of a priority other than 0 (``budget(priority=...)``). On the span current when a
decision is made (the HTTP instrumentation's, or the caller's own): an event
``retry_after.wait`` per wait, ``retry_after.deferral`` per deferral, and
``http.request.resend_count`` (OpenTelemetry's HTTP conventions) before each resend.

Every attribute value is bounded and credential-free: reasons, outcomes and causes
come from fixed sets (anything else is ``other``); the scope contributes only its host
and port, never a path, query, user info or header value. Durations are seconds.
Nothing runs on the happy path: the hook is called only when a call waits, defers or
stops.
"""

from __future__ import annotations

import contextlib
import logging
import math
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

try:
    from opentelemetry import metrics, trace
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "retry_after_adapter.otel needs opentelemetry-api: pip install 'retry_after_adapter[otel]'"
    ) from missing

from .errors import FAILURE_CAUSES
from .observe import OTHER, DecisionRecord
from .policy import DEFER, DEFER_REASONS, RETRY, Reason

__all__ = [
    "ADMISSION_OUTCOMES",
    "WAIT_BUCKETS",
    "WAIT_REASONS",
    "OTelHook",
    "instrument",
]

#: The instrumentation scope's name.
SCOPE_NAME = "retry_after_adapter"

#: ``retry_after.reason`` of a wait: a server's Retry-After, a backoff without one, or
#: what held an admission back.
WAIT_REASONS: tuple[str, ...] = ("retry_after", "backoff", "cooldown", "quota", "rate", "concurrency")

#: ``retry_after.outcome`` of an admission held back.
ADMISSION_OUTCOMES: tuple[str, ...] = ("waited", "deferred")

#: The histogram's bucket bounds advised to the SDK, in seconds: a jitter of a few
#: milliseconds up to a wait of ten minutes.
WAIT_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)

#: Deferral reasons that mean an admission was refused (nothing was sent).
_ADMISSION_REASONS = frozenset(
    {Reason.COOLDOWN, Reason.QUOTA, Reason.RATE, Reason.CONCURRENCY, Reason.COOLDOWN_UNKNOWN}
)
#: Plain strings by value (a :class:`Reason` looks its value up): what an attribute holds.
_DEFER_REASONS = {str(reason): str(reason) for reason in DEFER_REASONS}
_WAIT_REASONS = {reason: reason for reason in WAIT_REASONS}
#: The largest number of seconds put in an attribute (a far-future Retry-After defers).
_MAX_SECONDS = 1e15

_REASON = "retry_after.reason"
_PRIORITY = "retry_after.priority"
_RESEND_COUNT = "http.request.resend_count"

log = logging.getLogger("retry_after_adapter")


@lru_cache(maxsize=256)
def origin_attributes(scope: str | None) -> tuple[tuple[str, Any], ...]:
    """``server.address`` and ``server.port`` of a scope that is an origin
    (``scheme://host:port``, or the ``"credential"`` scope's origin before its ``|`` and
    hash, which is left out); nothing for a hashed scope, a name, or anything with user
    info, a path, a query or a fragment (only an origin is ever read)."""
    if not scope or "://" not in scope:
        return ()
    try:
        parts = urlsplit(scope.split("|", 1)[0])
        port = parts.port
    except ValueError:
        return ()
    if parts.scheme not in ("http", "https") or "@" in parts.netloc or parts.path or parts.query:
        return ()
    if parts.fragment or not parts.hostname:
        return ()
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return (("server.address", parts.hostname), ("server.port", port))


def _seconds(value: object) -> float:
    """A duration as a finite float in [0, 1e15]; anything unusable is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return 0.0
    return float(min(max(value, 0.0), _MAX_SECONDS))


class _StoreFailures(logging.Filter):
    """Counts the store failure layer's outage warnings (records of the package's logger
    with ``store`` and ``cause``) by their cause, from a fixed set. A filter on the
    logger, not a handler: it lets every record through, and an application without
    logging set up still sees the warnings on stderr (a handler would silence them)."""

    def __init__(self, counter: Any) -> None:
        super().__init__()
        self.counter = counter

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        cause = getattr(record, "cause", None)
        if cause is None or getattr(record, "store", None) is None:
            return True
        # A metric never fails the store's own handling (nor the log line being written).
        with contextlib.suppress(Exception):
            self.counter.add(1, {"retry_after.cause": cause if cause in FAILURE_CAUSES else OTHER})
        return True


class OTelHook:
    """An ``on_decision`` hook writing each decision to OpenTelemetry (see the module).

    Made by :func:`instrument`. Thread-safe, never raises into the call. :meth:`close`
    stops the count of store failures (the decisions it is still given are recorded).
    """

    def __init__(self, meter: Any, spans: bool) -> None:
        self.deferrals = meter.create_counter(
            "retry_after.deferrals", unit="{deferral}", description="Calls deferred instead of waiting."
        )
        self.waits = meter.create_histogram(
            "retry_after.wait.duration",
            unit="s",
            description="Time waited before an attempt, for a server's wait or an admission.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.admissions = meter.create_counter(
            "retry_after.admissions",
            unit="{admission}",
            description="Admissions held back by a cooldown, quota, learned rate or concurrency cap.",
        )
        self.store_failures = meter.create_counter(
            "retry_after.store.failures", unit="{failure}", description="Outages of a shared store."
        )
        #: Whether span events and the resend count are written.
        self.spans = spans
        self._filter: _StoreFailures | None = _StoreFailures(self.store_failures)
        log.addFilter(self._filter)

    def __call__(self, record: DecisionRecord) -> None:
        """Record one decision (the ``on_decision`` hook protocol)."""
        action = record.action
        if action == RETRY:
            self._wait(record)
        elif action == DEFER:
            self._deferral(record)

    def _wait(self, record: DecisionRecord) -> None:
        reason = record.reason
        if reason is None:
            why = "backoff" if record.server_delay is None else "retry_after"
        else:
            why = _WAIT_REASONS.get(reason, OTHER)
        wait = _seconds(record.wait)
        attributes = dict(origin_attributes(record.scope))
        attributes[_REASON] = why
        if record.priority:
            attributes[_PRIORITY] = record.priority
        self.waits.record(wait, attributes)
        if reason is not None:
            self.admissions.add(1, {**attributes, "retry_after.outcome": "waited"})
        if self.spans:
            span = trace.get_current_span()
            if span.is_recording():
                event: dict[str, Any] = {_REASON: why, "retry_after.wait.duration": wait}
                _add_heard(event, record)
                span.add_event("retry_after.wait", event)
                if record.attempt > 0:
                    # The next send is a resend: the attempts sent so far count it.
                    span.set_attribute(_RESEND_COUNT, record.attempt)

    def _deferral(self, record: DecisionRecord) -> None:
        reason = record.reason
        why = _DEFER_REASONS.get(reason, OTHER) if reason is not None else OTHER
        attributes = dict(origin_attributes(record.scope))
        attributes[_REASON] = why
        if record.priority:
            attributes[_PRIORITY] = record.priority
        self.deferrals.add(1, attributes)
        if reason in _ADMISSION_REASONS:
            self.admissions.add(1, {**attributes, "retry_after.outcome": "deferred"})
        if self.spans:
            span = trace.get_current_span()
            if span.is_recording():
                event: dict[str, Any] = {_REASON: why, "retry_after.delay": _seconds(record.wait)}
                _add_heard(event, record)
                span.add_event("retry_after.deferral", event)

    def close(self) -> None:
        """Stop counting store failures (idempotent)."""
        counting, self._filter = self._filter, None
        if counting is not None:
            log.removeFilter(counting)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spans={self.spans})"


def _add_heard(event: dict[str, Any], record: DecisionRecord) -> None:
    """What the server said, on a span event: its status and Retry-After (seconds)."""
    status = record.status
    if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 999:
        event["http.response.status_code"] = status
    if record.server_delay is not None:
        event["retry_after.server_delay"] = _seconds(record.server_delay)
    event["retry_after.attempts"] = max(0, int(record.attempt))


def instrument(meter_provider: Any = None, tracer_provider: Any = None) -> OTelHook:
    """An ``on_decision`` hook that writes decisions to OpenTelemetry (see the module).

    ``meter_provider``: where the metrics go; None: the global one
    (``opentelemetry.metrics.get_meter_provider()``, a no-op until the application sets
    one). ``tracer_provider``: the hook makes no spans of its own; it writes on the span
    current when a decision is made, whichever provider made it. None or any provider
    keeps that on; a provider whose tracers are no-ops
    (``opentelemetry.trace.NoOpTracerProvider()``) turns it off. Each call makes a new
    hook counting store failures: make one per process and hand it to every front end;
    ``hook.close()`` stops its count of store failures.
    """
    from . import __version__

    meter = metrics.get_meter(SCOPE_NAME, __version__, meter_provider=meter_provider)
    tracer = trace.get_tracer(SCOPE_NAME, __version__, tracer_provider=tracer_provider)
    return OTelHook(meter, spans=not isinstance(tracer, trace.NoOpTracer))
