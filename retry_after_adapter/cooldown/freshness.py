"""Freshness per scope: when an integration last worked, and how it last failed.

Seed 003 asks workers to "record last successful retrieval, next eligible attempt and
the integration error class". A store that supports it (every store of this package)
keeps one record per scope next to the cooldown; the engine writes it after attempts
(a success at most once per :data:`SUCCESS_EVERY` seconds per scope and process, so
the happy path costs no store write), and it is read by
:meth:`RetryAfterAdapter.freshness`, ``retry-after-adapter status`` and
:class:`~retry_after_adapter.Counters`.

Pure: no I/O, no clock. Times are aware UTC datetimes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

#: The error classes a record holds.
THROTTLED: Final = "throttled"  #: a 429, or a 403/413/503 that carried a Retry-After
SERVER_ERROR: Final = "server_error"  #: a 5xx without a Retry-After
TRANSPORT: Final = "transport"  #: no response: connect, read or protocol error
INVALID_HEADER: Final = "invalid_header"  #: a Retry-After that could not be trusted
ERROR_CLASSES: Final = (THROTTLED, SERVER_ERROR, TRANSPORT, INVALID_HEADER)
#: What a success is noted as.
SUCCESS: Final = "success"

#: A scope's success is written to the store at most once per this many seconds by one
#: process (errors are written every time): a store round trip each, on a call's thread.
SUCCESS_EVERY = 5.0
#: Seconds a scope's record is kept after its last note (30 days): then it is news no
#: longer, and every store may forget it.
FRESHNESS_KEPT = 30 * 24 * 3600.0


@dataclass(frozen=True)
class Freshness:
    """One scope's freshness: ``last_success`` (the last 2xx/3xx answer), the
    ``last_error`` class (one of :data:`ERROR_CLASSES`) and when (``last_error_at``),
    and ``next_eligible``: the scope's cooldown when one runs (else None)."""

    last_success: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    next_eligible: datetime | None = None

    def seconds_since_success(self, now: datetime) -> float | None:
        """Seconds from the last success to ``now`` (None: never succeeded)."""
        if self.last_success is None:
            return None
        return max(0.0, (now - self.last_success).total_seconds())

    def to_dict(self) -> dict[str, str | None]:
        """JSON-ready: times as ISO 8601 strings."""
        return {
            "last_success": _iso(self.last_success),
            "last_error": self.last_error,
            "last_error_at": _iso(self.last_error_at),
            "next_eligible": _iso(self.next_eligible),
        }


def merge_note(current: Freshness | None, outcome: str, at: datetime) -> Freshness:
    """The record after ``outcome`` (``SUCCESS`` or an error class) at ``at``; later
    news wins, an older note changes nothing."""
    record = current if current is not None else Freshness()
    if outcome == SUCCESS:
        if record.last_success is None or at > record.last_success:
            return replace(record, last_success=at)
        return record
    if record.last_error_at is None or at >= record.last_error_at:
        return replace(record, last_error=outcome, last_error_at=at)
    return record


def last_noted(record: Freshness) -> datetime | None:
    """When ``record`` was last noted (its last success or error), or None."""
    success, error = record.last_success, record.last_error_at
    if success is None or (error is not None and error > success):
        return error
    return success


def check_outcome(outcome: object) -> str:
    """Validate a note's outcome (``SUCCESS`` or one of ``ERROR_CLASSES``)."""
    from ..errors import ConfigurationError

    if outcome != SUCCESS and outcome not in ERROR_CLASSES:
        raise ConfigurationError(f"a freshness note is 'success' or one of {', '.join(ERROR_CLASSES)}")
    return str(outcome)


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()
