"""Errors raised by retry_after_adapter.

Every error the package raises on purpose derives from :class:`RetryAfterError`, so a
caller can catch the package's errors in one place. Messages never contain request
headers, credentials or URL query strings.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from urllib3.exceptions import InvalidHeader


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


#: Every cause :func:`failure_cause` names besides a class name: a fixed set, for
#: metric attributes that must stay bounded (anything else counts as another cause).
FAILURE_CAUSES: frozenset[str] = frozenset({what for what, _, _ in _CAUSES} | {"TLS handshake timed out"})


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


def _preview(value: object, limit: int = 40) -> str:
    """A short, escaped rendering of a bad value for an error message."""
    text = value if isinstance(value, str) else repr(value)
    shown = text[:limit].encode("unicode_escape").decode("ascii")
    return repr(shown) + ("..." if len(text) > limit else "")


class InvalidDeferral(RetryAfterError, ValueError):
    """A serialised deferral (``Deferral.from_dict``) is malformed or of an unknown version."""


class CooldownUnavailable(CooldownStoreError):
    """The shared cooldown store is failing and the adapter was told to fail closed."""
