"""Retry-After and HTTP-date parsing (RFC 9110 section 10.2.3). Pure: no I/O, no clock.

STUB: the real implementation is being written; the signature below is the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from .errors import InvalidRetryAfter

MAX_LENGTH = 128


@dataclass(frozen=True)
class RetryAfter:
    """A parsed Retry-After value.

    - ``delay``: seconds to wait from the receipt of the response (float, >= 0).
    - ``eligible_at``: aware UTC time before which no retry may be sent.
    - ``form``: ``"seconds"`` or ``"date"``.
    - ``clock_skew``: seconds, local receipt time minus the server's ``Date`` header,
      or None when no valid Date was given.
    """

    delay: float
    eligible_at: datetime
    form: str
    clock_skew: float | None = None


def parse_retry_after(value: str, *, received_at: datetime, date: str | None = None) -> RetryAfter:
    """Parse one Retry-After field value received at ``received_at`` (aware)."""
    if received_at.tzinfo is None or received_at.utcoffset() is None:
        raise InvalidRetryAfter("naive received_at")
    v = value.strip(" \t")
    if v and v.isascii() and v.isdigit():
        delay = float(int(v))
        return RetryAfter(delay, received_at.astimezone(timezone.utc) + timedelta(seconds=delay), "seconds")
    raise InvalidRetryAfter("malformed", value)
