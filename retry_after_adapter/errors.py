"""Errors raised by retry_after_adapter.

Every error the package raises on purpose derives from :class:`RetryAfterError`, so a
caller can catch the package's errors in one place. Messages never contain request
headers, credentials or URL query strings.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from requests.exceptions import RequestException, RetryError
from urllib3.exceptions import InvalidHeader, MaxRetryError

if TYPE_CHECKING:
    from .deferral import Deferral


class RetryAfterError(Exception):
    """Root of every error raised by retry_after_adapter."""


class ConfigurationError(RetryAfterError, ValueError):
    """An argument given to the package is out of range or of the wrong kind."""


def close_keyword(keyword: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` that ``keyword`` looks like a misspelling of, or None."""
    close = difflib.get_close_matches(keyword, known, n=1, cutoff=0.8)
    return close[0] if close else None


def unknown_keyword(owner: str, keyword: str, known: Sequence[str]) -> ConfigurationError:
    """The error for a keyword ``owner`` does not take: it names the keyword and the
    one of ``known`` it looks like, or lists ``known``."""
    close = close_keyword(keyword, known)
    hint = f": did you mean {close!r}?" if close else f" (it takes: {', '.join(known)})"
    return ConfigurationError(f"{owner} got an unknown keyword {keyword!r}{hint}")


class InvalidRetryAfter(RetryAfterError, ValueError, InvalidHeader):
    """A Retry-After (or Date) value does not follow RFC 9110.

    Also a ``ValueError`` and urllib3's ``InvalidHeader`` (what stock
    ``Retry.parse_retry_after`` raises), so existing handlers keep working.

    ``reason`` is a short machine-readable word (``"empty"``, ``"repeated"``, ...);
    the raw value is kept only in truncated, escaped form in the message.
    """

    def __init__(self, reason: str, value: object = None) -> None:
        self.reason = reason
        shown = "" if value is None else f": {_preview(value)}"
        super().__init__(f"invalid Retry-After ({reason}){shown}")


class CooldownStoreError(RetryAfterError):
    """A cooldown store could not be read or written (unreachable, locked, corrupt).

    ``busy`` is True when the store works but was locked by other writers past its
    timeout (contention): the failure layer then falls back for that one operation and
    opens its circuit breaker only when several in a row are busy. ``cause`` names
    what went wrong in a few words (see :func:`failure_cause`), and ``lasting`` says
    it is a misconfiguration that will not heal by itself (a wrong password, a missing
    permission, a TLS mismatch, a file that is not a database, a full disk).
    """

    def __init__(self, *args: object, busy: bool = False, cause: str = "", lasting: bool = False) -> None:
        super().__init__(*args)
        self.busy = busy
        self.cause = cause
        self.lasting = lasting


#: ``(what, lasting, words)``: a store failure whose exception (or one in its chain)
#: has one of ``words`` in its class name or message, lower-cased, is ``what``;
#: ``lasting``: it will not heal by itself. The first that matches wins.
_CAUSES: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    ("authentication failed", True, ("authenticationerror", "wrongpass", "noauth", "invalid password",
                                     "invalid username-password", "authentication required")),
    ("permission denied", True, ("nopermission", "noperm", "no permissions", "can't run this command",
                                 "permissionerror", "permission denied", "readonly database",
                                 "read-only database", "access denied")),
    ("TLS failed", True, ("sslerror", "certificate", "[ssl", "_ssl.c", "wrong version number", "tlsv",
                          "tls handshake")),
    ("disk full", True, ("disk is full", "no space left", "enospc", "disk quota")),
    ("not a database", True, ("not a database", "malformed", "file is encrypted")),
    ("cannot open the file", True, ("unable to open database", "no such file", "is a directory")),
    ("timed out", False, ("timeout", "timed out")),
    ("connection refused", False, ("connection refused", "connectionrefused", "error 111")),
    ("locked", False, ("database is locked", "database table is locked")),
    ("connection lost", False, ("connectionerror", "connection reset", "broken pipe", "closed by server",
                                "connection closed", "eof")),
)


def failure_cause(exc: BaseException) -> tuple[str, bool]:
    """What a store failure was, in a few words, and whether it is a misconfiguration
    that will not heal by itself (see :data:`_CAUSES`): read off the exception, else
    off those in its chain, nearest first (their class names and messages: nothing is
    imported). The exception's own kind wins over what its causes say: a timeout (a
    class named for one) is "timed out" and a refused connection "connection refused",
    not lasting, whatever led to them. A TLS handshake that timed out is "TLS handshake
    timed out", not lasting: a server that does not speak TLS and one that does not
    answer look the same. Anything else is its class name, and not lasting."""
    current: BaseException | None = exc
    seen: list[BaseException] = []
    while current is not None and len(seen) < 8 and all(current is not e for e in seen):
        seen.append(current)
        found = _cause_of_one(current)
        if found is not None:
            if found[0] == "timed out" and _in_tls_handshake(current):
                return "TLS handshake timed out", False
            return found
        current = current.__cause__ or current.__context__
    return type(exc).__name__, False


def _in_tls_handshake(exc: BaseException) -> bool:
    """Whether ``exc`` or one in its chain was raised in a TLS handshake."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        text = str(current).lower()
        if "handshake" in text or "_ssl.c" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def _cause_of_one(exc: BaseException) -> tuple[str, bool] | None:
    """What ``exc`` alone says it was (see :func:`failure_cause`), or None."""
    name = type(exc).__name__.lower()
    if isinstance(exc, TimeoutError) or "timeout" in name:
        return "timed out", False
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused", False
    text = f"{name} {exc}".lower()
    for what, lasting, words in _CAUSES:
        if any(word in text for word in words):
            return what, lasting
    return None


class RetryDeferred(RetryError, RetryAfterError):
    """The call was deferred: the server's wait does not fit the caller's budget.

    ``deferral`` says when a new attempt becomes eligible; ``response`` is the last
    :class:`requests.Response` (or urllib3 response when used without requests), or
    ``None`` when nothing was received (deferred before sending, or after a
    transport error). ``reason``: why urllib3 would have stopped (the reason of its
    ``MaxRetryError`` when retries ran out), put first in the message.
    """

    def __init__(
        self, deferral: Deferral, response: Any = None, request: Any = None, reason: object = None
    ) -> None:
        self.deferral = deferral
        message = (
            f"deferred ({deferral.reason}): retry eligible at "
            f"{deferral.eligible_at.isoformat()} (in {deferral.delay:.3f} s)"
        )
        if reason is not None:
            # urllib3's own words first ("too many 503 error responses"), as a stock
            # RetryError says them: code that matches on them keeps working.
            message = f"{reason}; {message}"
        super().__init__(message, response=response, request=request)

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException pickles as type(*args), which this __init__ does not take.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))

    @classmethod
    def keeping(cls, error: RequestException, deferral: Deferral) -> RetryDeferred:
        """``error`` (what ``HTTPAdapter`` raised for the last attempt) as an exception
        of its own class *and* a ``RetryDeferred`` carrying ``deferral``: ``except
        requests.Timeout`` and ``except RetryDeferred`` both catch it."""
        if isinstance(error, RetryDeferred):
            error.deferral = deferral
            return error
        kind = _keeping_class(type(error))
        kept: RetryDeferred = kind.__new__(kind)
        RequestException.__init__(
            kept,
            *error.args,
            request=getattr(error, "request", None),
            response=getattr(error, "response", None),
        )
        kept.deferral = deferral
        return kept


def _rebuild(kind: type[RetryDeferred], args: tuple[Any, ...], state: dict[str, Any]) -> RetryDeferred:
    error: RetryDeferred = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


_KEEPING: dict[type[BaseException], type[RetryDeferred]] = {}


def _keeping_class(base: type[RequestException]) -> type[RetryDeferred]:
    """The class ``Deferred<Base>(RetryDeferred, Base)``, made once per base and kept
    in this module (so instances pickle by name)."""
    kind = _KEEPING.get(base)
    if kind is None:
        name = f"Deferred{base.__name__}"
        kind = type(name, (RetryDeferred, base), {"__module__": __name__, "__qualname__": name})
        _KEEPING[base] = kind
        globals().setdefault(name, kind)
    return kind


class MaxRetryDeferred(MaxRetryError, RetryAfterError):
    """urllib3's ``MaxRetryError`` for a deferral decided inside a *stock* urllib3 loop.

    Raised by :meth:`RetryAfterRetry.increment` when the policy is handed to a plain
    ``urllib3.PoolManager`` or to a stock ``HTTPAdapter`` (as libraries that take a
    ``retry=`` argument do): there ``requests`` turns it into the ``RetryError`` it
    raises when retries end. ``deferral`` says when to try again; ``response`` is the
    last urllib3 response, or None. :func:`~retry_after_adapter.deferral_of` finds it
    in any exception chain.
    """

    def __init__(
        self, pool: Any, url: str | None, reason: Exception | None, deferral: Deferral, response: Any = None
    ) -> None:
        super().__init__(pool, url or "", reason)
        self.deferral = deferral
        self.response = response

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (None, self.url, self.reason, self.deferral, None))


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
