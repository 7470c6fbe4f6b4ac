"""Errors raised by retry_after_adapter.

Every error the package raises on purpose derives from :class:`RetryAfterError`, so a
caller can catch the package's errors in one place. Messages never contain request
headers, credentials or URL query strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from requests.exceptions import RetryError

if TYPE_CHECKING:
    from .deferral import Deferral


class RetryAfterError(Exception):
    """Root of every error raised by retry_after_adapter."""


class ConfigurationError(RetryAfterError, ValueError):
    """An argument given to the package is out of range or of the wrong kind."""


class InvalidRetryAfter(RetryAfterError, ValueError):
    """A Retry-After (or Date) value does not follow RFC 9110.

    ``reason`` is a short machine-readable word (``"empty"``, ``"repeated"``, ...);
    the raw value is kept only in truncated, escaped form in the message.
    """

    def __init__(self, reason: str, value: object = None) -> None:
        self.reason = reason
        shown = "" if value is None else f": {_preview(value)}"
        super().__init__(f"invalid Retry-After ({reason}){shown}")


class CooldownStoreError(RetryAfterError):
    """A cooldown store could not be read or written (unreachable, locked, corrupt)."""


class RetryDeferred(RetryError, RetryAfterError):
    """The call was deferred: the server's wait does not fit the caller's budget.

    ``deferral`` says when a new attempt becomes eligible; ``response`` is the last
    :class:`requests.Response` (or urllib3 response when used without requests), or
    ``None`` when nothing was received (deferred before sending, or after a
    transport error).
    """

    def __init__(self, deferral: Deferral, response: Any = None, request: Any = None) -> None:
        self.deferral = deferral
        message = (
            f"deferred ({deferral.reason}): retry eligible at "
            f"{deferral.eligible_at.isoformat()} (in {deferral.delay:.3f} s)"
        )
        super().__init__(message, response=response, request=request)


class DeferralLimitExceeded(RetryAfterError):
    """A call would be deferred more often than ``max_deferrals`` (or past its lifetime).

    ``deferral`` is the deferral that went over the limit; ``chain`` is every deferral
    of the job, oldest first, that one included.
    """

    def __init__(self, deferral: Deferral, limit: str) -> None:
        self.deferral = deferral
        self.limit = limit
        self.chain = deferral.chain()
        super().__init__(
            f"gave up after {deferral.deferrals} deferrals and {deferral.attempts} attempts "
            f"({limit}); last reason {deferral.reason}"
        )


def _preview(value: object, limit: int = 40) -> str:
    """A short, escaped rendering of a bad value for an error message."""
    text = value if isinstance(value, str) else repr(value)
    shown = text[:limit].encode("unicode_escape").decode("ascii")
    return repr(shown) + ("..." if len(text) > limit else "")


class InvalidDeferral(RetryAfterError, ValueError):
    """A serialised deferral (``Deferral.from_dict``) is malformed or of an unknown version."""


class CooldownUnavailable(CooldownStoreError):
    """The shared cooldown store is failing and the adapter was told to fail closed."""
