"""In-process counters of retry decisions, for dashboards and alerts.

:class:`Counters` is an ``on_decision`` hook: pass an instance to
``RetryAfterAdapter(..., on_decision=counters)`` or ``RetryAfterRetry(...,
on_decision=counters)`` and read :meth:`Counters.snapshot` whenever you export metrics.

Every label is bounded: actions and reasons come from fixed sets (anything else is
counted as ``"other"``), and scopes are never labels unless asked for with
``by_scope=True``, and even then at most ``max_scopes`` distinct scopes are kept (later
ones are counted under ``"other"``). Scopes are origins or hashed keys, never URLs with
paths, queries or credentials, so a snapshot is safe to publish.

All durations are in seconds.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from .errors import ConfigurationError
from .policy import DEFER, RETRY, STOP, DecisionRecord

__all__ = ["ACTIONS", "DEFER_REASONS", "OTHER", "STOP_REASONS", "Counters"]

#: The actions a decision can take.
ACTIONS: tuple[str, ...] = (RETRY, DEFER, STOP)

#: Reasons a call is deferred (see ``Deferral.reason``).
DEFER_REASONS: tuple[str, ...] = ("deadline", "max_wait", "cooldown", "cancelled", "cooldown-unknown")

#: Reasons a call stops without a further attempt.
STOP_REASONS: tuple[str, ...] = (
    "invalid_retry_after",
    "exhausted",
    "not_idempotent",
    "not_retryable",
    "max_deferrals",
    "max_lifetime",
)

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
    - ``cooldown_waits``: waits for a shared cooldown before an attempt (the first
      one included), which are not retries;
    - ``deferrals`` by reason and ``stops`` by reason (fixed sets, plus ``"other"``);
    - ``wait_seconds``: total planned wait before retries; ``cooldown_wait_seconds``:
      total planned cooldown waits; ``deferred_seconds``: total delay of deferrals
      (each capped at 1e15 s). Planned, not measured: a cancelled wait still counts
      in full.

    ``by_scope=True`` adds per-scope counts of each action, for at most ``max_scopes``
    distinct scopes (default 100); decisions of further scopes are added to ``"other"``.
    A call deferred past ``max_deferrals`` or ``max_lifetime`` is counted as a deferral
    and then as a stop with that reason, since the policy reports both decisions.
    """

    def __init__(self, *, by_scope: bool = False, max_scopes: int = 100) -> None:
        if isinstance(max_scopes, bool) or not isinstance(max_scopes, int) or max_scopes < 0:
            raise ConfigurationError(f"max_scopes must be an int >= 0, got {max_scopes!r}")
        self.by_scope = bool(by_scope)
        self.max_scopes = max_scopes
        self._lock = threading.Lock()
        self._reset_locked()

    def _reset_locked(self) -> None:
        self._decisions = 0
        self._retries = 0
        self._cooldown_waits = 0
        self._deferrals = dict.fromkeys((*DEFER_REASONS, OTHER), 0)
        self._stops = dict.fromkeys((*STOP_REASONS, OTHER), 0)
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
                if reason == "cooldown":
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
            }

        ``"scopes"`` is present only with ``by_scope=True``; ``"other"`` there collects
        the scopes past ``max_scopes``, and ``"none"`` decisions made without a scope.
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
        return data

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
