"""Instrumentation: what the package tells the outside about its decisions.

- :class:`DecisionRecord`: one frozen record per decision (retry, defer, stop).
- the ``on_decision`` hook protocol: any ``callable(DecisionRecord)``; several may be
  given as a collection. A hook that raises is logged and ignored.
- the ``retry_after_adapter`` logger: a DEBUG line per retry, an INFO line per deferral,
  with structured ``extra`` fields.
- :class:`Counters`: a ready hook that counts decisions for dashboards and alerts.
- :func:`redact_urllib3_logs`: an opt-in filter that masks query values and URL user
  info in what urllib3 itself logs.

Every value here is bounded and credential-free: scopes are origins or hashed keys,
never URLs with paths, queries or credentials; reasons come from :class:`Reason`.
All durations are in seconds.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from . import _forksafe
from .errors import ConfigurationError
from .policy import DEFER, DEFER_REASONS, RETRY, STOP, STOP_REASONS, Decision, Reason
from .redact import RedactingFilter, redact  # re-exported: their home before redact.py

__all__ = [
    "ACTIONS",
    "DEFER_REASONS",
    "OTHER",
    "STOP_REASONS",
    "Counters",
    "DecisionHook",
    "DecisionRecord",
    "RedactingFilter",
    "as_hooks",
    "emit",
    "redact",
    "redact_logs",
    "redact_urllib3_logs",
]

log = logging.getLogger("retry_after_adapter")

#: Reasons of a ``retry`` record that is a wait before an attempt, not a retry.
_ADMISSION_WAITS = frozenset({"cooldown", "quota", "rate", "concurrency"})


@dataclass(frozen=True)
class DecisionRecord:
    """One decision as the ``on_decision`` hooks see it.

    Holds only bounded, credential-free values: ``scope`` is an origin or a hashed key,
    never a URL path or query. ``action`` is ``"retry"``, ``"defer"`` or ``"stop"``;
    ``reason`` a :class:`Reason` (None for a plain retry); ``wait`` is in seconds;
    ``attempt`` counts requests sent in the job so far; ``status`` is the last HTTP
    status or None after a transport error; ``server_delay`` is the parsed Retry-After
    in seconds, or None; ``priority`` is the call's (``budget(priority=...)``; 0:
    ordinary).
    """

    action: str
    reason: Reason | None
    wait: float
    scope: str | None
    status: int | None
    attempt: int
    server_delay: float | None = None
    priority: int = 0


DecisionHook = Callable[[DecisionRecord], None]


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


def emit(
    hooks: tuple[DecisionHook, ...],
    decision: Decision,
    *,
    scope: str | None,
    status: int | None,
    attempt: int,
    server_delay: float | None = None,
    priority: int = 0,
) -> None:
    """Log one decision and hand it to ``hooks`` (a failing hook never fails the call)."""
    if decision.action == DEFER or log.isEnabledFor(logging.DEBUG):
        reason = decision.reason
        log.log(
            logging.INFO if decision.action == DEFER else logging.DEBUG,
            "%s%s: wait %.3f s (scope %s, status %s, attempt %d)",
            decision.action,
            f" ({reason})" if reason else "",
            decision.wait,
            scope,
            status,
            attempt,
            extra={
                "scope": scope,
                "status": status,
                "reason": None if reason is None else str(reason),
                "planned_delay": decision.wait,
                "attempt": attempt,
                "action": decision.action,
            },
        )
    if not hooks:
        return
    record = DecisionRecord(
        action=decision.action,
        reason=decision.reason,
        wait=decision.wait,
        scope=scope,
        status=status,
        attempt=attempt,
        server_delay=server_delay,
        priority=priority,
    )
    for hook in hooks:
        try:
            hook(record)
        except Exception:
            log.exception("on_decision hook failed; the call goes on")


#: The actions a decision can take.
ACTIONS: tuple[str, ...] = (RETRY, DEFER, STOP)

#: The label for a reason outside the fixed sets, or a scope past ``max_scopes``.
OTHER = "other"

#: The label for decisions made without a scope (plain urllib3, no adapter).
NO_SCOPE = "none"

#: Largest wait, in seconds, added to a total: a far-future Retry-After (which defers)
#: must not turn a sum into infinity. Same cap as the largest reported delay.
_MAX_WAIT = 1e15


def _seconds(value: object) -> float:
    """A wait as a finite float in [0, _MAX_WAIT]; anything unusable counts as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return 0.0
    return float(min(max(value, 0.0), _MAX_WAIT))


class Counters:
    """Thread-safe counts of the decisions it is given, usable as an ``on_decision`` hook.

    Counts (see :meth:`snapshot` for the exact shape):

    - ``retries``: retries planned after a response or a transport error (and waits
      before following a redirect that carries Retry-After);
    - ``cooldown_waits``: waits before an attempt (the first one included) for a
      shared cooldown or a quota permit, which are not retries;
    - ``deferrals`` by reason and ``stops`` by reason (fixed sets, plus ``"other"``);
    - ``wait_seconds``: total planned wait before retries; ``cooldown_wait_seconds``:
      total planned cooldown waits; ``deferred_seconds``: total delay of deferrals
      (each capped at 1e15 s). Planned, not measured: a cancelled wait still counts
      in full.

    ``by_scope=True`` adds per-scope counts of each action, for at most ``max_scopes``
    distinct scopes (default 100); decisions of further scopes are added to ``"other"``.
    A call deferred past ``max_deferrals`` or ``max_lifetime`` is counted as a deferral
    and then as a stop with that reason, since the policy reports both decisions.

    ``freshness=store`` (a store that keeps freshness records: every store of this
    package) adds ``"seconds_since_success"``: per scope, seconds since the last
    success any worker sharing the store noted, read from the store at each snapshot,
    for the ``max_scopes`` most recently successful scopes (bounded labels).
    """

    def __init__(self, *, by_scope: bool = False, max_scopes: int = 100, freshness: Any = None) -> None:
        if isinstance(max_scopes, bool) or not isinstance(max_scopes, int) or max_scopes < 0:
            raise ConfigurationError(f"max_scopes must be an int >= 0, got {max_scopes!r}")
        from .cooldown.base import FreshnessLog  # (the stores, only when one is given)

        if freshness is not None and not isinstance(freshness, FreshnessLog):
            raise ConfigurationError("freshness must be a store that keeps freshness records, or None")
        self.freshness: Any = freshness
        self.by_scope = bool(by_scope)
        self.max_scopes = max_scopes
        self._lock = threading.Lock()
        _forksafe.register(self)
        self._reset_locked()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def _reset_locked(self) -> None:
        self._decisions = 0
        self._retries = 0
        self._cooldown_waits = 0
        # Plain strings as keys: a snapshot is JSON and label material as it is.
        self._deferrals = dict.fromkeys((*map(str, DEFER_REASONS), OTHER), 0)
        self._stops = dict.fromkeys((*map(str, STOP_REASONS), OTHER), 0)
        self._other_actions = 0
        self._wait_seconds = 0.0
        self._cooldown_wait_seconds = 0.0
        self._deferred_seconds = 0.0
        self._scopes: dict[str, dict[str, int]] = {}

    def __call__(self, record: DecisionRecord) -> None:
        """Count one decision (the ``on_decision`` hook protocol). Never raises."""
        action = getattr(record, "action", None)
        reason = getattr(record, "reason", None)
        wait = _seconds(getattr(record, "wait", 0.0))
        with self._lock:
            self._decisions += 1
            if action == RETRY:
                if reason in _ADMISSION_WAITS:
                    self._cooldown_waits += 1
                    self._cooldown_wait_seconds += wait
                else:
                    self._retries += 1
                    self._wait_seconds += wait
            elif action == DEFER:
                key = reason if reason in self._deferrals else OTHER
                self._deferrals[key] += 1
                self._deferred_seconds += wait
            elif action == STOP:
                key = reason if reason in self._stops else OTHER
                self._stops[key] += 1
            else:
                self._other_actions += 1
            if self.by_scope:
                self._count_scope(getattr(record, "scope", None), action)

    def _count_scope(self, scope: object, action: object) -> None:
        label = scope if isinstance(scope, str) and scope else NO_SCOPE
        counts = self._scopes.get(label)
        if counts is None:
            if len(self._scopes) >= self.max_scopes and label != OTHER:
                label = OTHER
                counts = self._scopes.get(OTHER)
            if counts is None:
                counts = self._scopes[label] = dict.fromkeys((*ACTIONS, OTHER), 0)
        counts[action if action in ACTIONS else OTHER] += 1

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of every count, as plain JSON-ready values.

        Shape::

            {
              "decisions": int,              # every decision seen
              "retries": int,
              "cooldown_waits": int,
              "deferrals": {reason: int},    # every DEFER_REASONS key, plus "other"
              "stops": {reason: int},        # every STOP_REASONS key, plus "other"
              "other_actions": int,          # decisions with an unknown action
              "wait_seconds": float,
              "cooldown_wait_seconds": float,
              "deferred_seconds": float,
              "scopes": {scope: {"retry": int, "defer": int, "stop": int, "other": int}},
              "seconds_since_success": {scope: float},
            }

        ``"scopes"`` is present only with ``by_scope=True``; ``"other"`` there collects
        the scopes past ``max_scopes``, and ``"none"`` decisions made without a scope.
        ``"seconds_since_success"`` is present only with ``freshness=``; a store that
        fails leaves it empty (never raises).
        """
        with self._lock:
            data: dict[str, Any] = {
                "decisions": self._decisions,
                "retries": self._retries,
                "cooldown_waits": self._cooldown_waits,
                "deferrals": dict(self._deferrals),
                "stops": dict(self._stops),
                "other_actions": self._other_actions,
                "wait_seconds": self._wait_seconds,
                "cooldown_wait_seconds": self._cooldown_wait_seconds,
                "deferred_seconds": self._deferred_seconds,
            }
            if self.by_scope:
                data["scopes"] = {scope: dict(counts) for scope, counts in self._scopes.items()}
        if self.freshness is not None:
            data["seconds_since_success"] = self._since_success()
        return data

    def _since_success(self) -> dict[str, float]:
        try:
            entries = self.freshness.freshness_entries()
        except Exception:  # a snapshot never fails on a store outage
            return {}
        now = datetime.now(timezone.utc)
        known = sorted(
            ((record.last_success, scope) for scope, record in entries.items() if record.last_success),
            reverse=True,
        )[: self.max_scopes]
        return {scope: round(max(0.0, (now - when).total_seconds()), 3) for when, scope in known}

    def reset(self) -> None:
        """Set every count back to zero (and forget the scopes seen)."""
        with self._lock:
            self._reset_locked()

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"{type(self).__name__}(decisions={self._decisions}, retries={self._retries}, "
                f"deferrals={sum(self._deferrals.values())}, stops={sum(self._stops.values())}, "
                f"by_scope={self.by_scope})"
            )


# ------------------------------------------------------------- other libraries' logs
#: The loggers :func:`redact_logs` filters (and every logger under one of
#: :data:`REDACTED_FAMILIES` that exists when it is called).
REDACTED_LOGGERS = (
    "urllib3",
    "urllib3.connectionpool",
    "urllib3.connection",
    "urllib3.poolmanager",
    "urllib3.response",
    "urllib3.util.retry",
    "urllib3.util.ssl_",
    "requests",
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpx2",
)
#: The families of loggers whose every member :func:`redact_logs` filters.
REDACTED_FAMILIES = ("urllib3.", "httpx.", "httpcore.", "httpx2.")

_INSTALLED = RedactingFilter()


def redact_logs() -> RedactingFilter:
    """Mask query values and URL user info in every record urllib3, requests, httpx
    (with httpcore) and httpx2 log.

    urllib3 prints the request target *with its query string* at DEBUG
    (``"GET /items?token=... HTTP/1.1" 200``) and, when it retries on its own, at
    WARNING; httpx prints the whole URL, user info and query included, at INFO
    (``HTTP Request: GET https://user:...@host/items?token=...``). One call installs a
    :class:`RedactingFilter` on those loggers (idempotent); returns it, so
    ``logging.getLogger(name).removeFilter(f)`` undoes it. A logger of theirs made
    after the call (a library imported later) is not covered: call it again then.
    """
    names = set(REDACTED_LOGGERS)
    names.update(
        name
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith(REDACTED_FAMILIES) and isinstance(logger, logging.Logger)
    )
    for name in sorted(names):
        logger = logging.getLogger(name)
        if _INSTALLED not in logger.filters:
            logger.addFilter(_INSTALLED)
    return _INSTALLED


#: The name of :func:`redact_logs` before it covered httpx (kept: it does the same).
redact_urllib3_logs = redact_logs
