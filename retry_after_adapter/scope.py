"""Scopes: which requests share one cooldown (and, later, one quota).

A scope is a short string: by default the request's origin (``scheme://host:port``).
``"credential"`` adds a hash of the request's credential. What a scope *function*
returns is hashed (``sha256:...``) before it is stored, logged, put in a deferral or
used as a metric label, since it is easily built from a token or an account key.
Wrap the function in :func:`public_scope` to keep its results readable; even then a
result that contains any credential material of the request (a header's token or
cookie value, a query value, URL user info, or a long enough piece of one) is hashed.

A scope function takes a request object with ``.url`` (str) and ``.headers`` (a
mapping): a ``requests.PreparedRequest`` in the adapter, a :class:`RequestInfo` in
:class:`~retry_after_adapter.RetryAfterPoolManager`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

from .cooldown.base import unstorable
from .errors import ConfigurationError
from .redact import (
    redact_url,
    strip_query,  # re-exported: its home before redact.py
)

__all__ = [
    "PublicScope",
    "RequestInfo",
    "ScopeFunction",
    "credential_scope",
    "hash_scope",
    "origin_scope",
    "public_scope",
    "resolve_scope",
    "strip_query",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SECRET_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "X-Goog-Api-Key")

#: ``callable(request) -> str``: the request has ``.url`` and ``.headers``.
ScopeFunction = Callable[[Any], str]


@dataclass(frozen=True)
class RequestInfo:
    """What a scope function (and a ``cost=`` function) sees of a plain urllib3
    request: method, URL, headers, and its ``body`` as given (None: none, or not at
    hand)."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: Any = None


@lru_cache(maxsize=1024)
def _origin(scheme: str, netloc: str) -> str:
    parts = urlsplit(f"{scheme}://{netloc}")
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme.lower(), 0)
    return f"{scheme.lower()}://{host}:{port}"


def origin_scope(request: Any) -> str:
    """The default scope: the request's origin as ``scheme://host:port``.

    Any user info (``user:password@``) and the path and query are left out.
    """
    url = request.url or ""
    scope = _ORIGIN_OF_URL.get(url)
    if scope is not None:
        return scope  # a URL seen lately (polling sends the same URLs again and again)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError("cannot derive a cooldown scope from a URL without a scheme")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    scope = _origin(scheme, netloc)
    if "@" not in netloc:  # user info (a credential) is never kept
        if len(_ORIGIN_OF_URL) >= _ORIGIN_CACHE_SIZE:
            _ORIGIN_OF_URL.clear()
        _ORIGIN_OF_URL[url] = scope
    return scope


#: The origin scope of recently seen URLs without user info (bounded: cleared when full).
_ORIGIN_OF_URL: dict[str, str] = {}
_ORIGIN_CACHE_SIZE = 512


def hash_scope(text: str) -> str:
    """A stable, non-reversible scope key for a credential-derived value."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def credential_scope(request: Any) -> str:
    """Origin plus a hash of the request's credential (Authorization, or API key header:
    ``X-Api-Key``, ``Api-Key``, Google's ``X-Goog-Api-Key``).

    For providers whose quota is per account or per credential.
    """
    origin = origin_scope(request)
    headers = request.headers or {}
    for name in _SECRET_HEADERS:
        value = headers.get(name)
        if value:
            return f"{origin}|{hash_scope(name.lower() + ':' + str(value))}"
    return origin


#: Header names (lower case) whose values are credentials, besides ``_SECRET_HEADERS``.
_SECRET_NAME_PARTS = ("auth", "token", "key", "secret", "session", "password", "cookie", "signature")
#: Pieces of a credential shorter than this are too common to look for.
_MIN_PIECE = 4
#: A scope sharing this many consecutive characters with a credential is hashed.
_WINDOW = 8


def _secret_header(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_NAME_PARTS)


def _pieces(value: str) -> set[str]:
    """A credential value and its parts: ``Bearer abc`` gives ``abc``; a cookie header
    its values; Basic credentials their decoded ``user:password`` and password."""
    found = {value}
    for word in value.replace(",", " ").split():
        found.add(word)
        if "=" in word:
            found.add(word.split("=", 1)[1].rstrip(";"))
    for crumb in value.split(";"):
        if "=" in crumb:
            found.add(crumb.split("=", 1)[1].strip())
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() == "basic" and rest:
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8", "replace")
        except (ValueError, binascii.Error):
            decoded = ""
        if decoded:
            found.update({decoded, decoded.partition(":")[2]})
    return found


def _secrets_of(request: Any) -> list[str]:
    """Credential material of ``request``: credential header values and their parts,
    query values (raw and decoded), and URL user info (whole and its password)."""
    headers = request.headers or {}
    found: set[str] = set()
    try:
        items = list(headers.items())
    except Exception:  # a mapping without items(): the well-known names only
        items = [(name, headers.get(name)) for name in _SECRET_HEADERS]
    for name, value in items:
        if value and (name in _SECRET_HEADERS or _secret_header(str(name))):
            found |= _pieces(str(value))
    url = request.url or ""
    if "?" in url:
        query = url.split("?", 1)[1].split("#", 1)[0]
        for part in query.split("&"):
            value = part.split("=", 1)[1] if "=" in part else part
            found.update({value, unquote(value), unquote_plus(value)})
    netloc = url.partition("://")[2].split("/", 1)[0]
    if "@" in netloc:
        userinfo = netloc.rsplit("@", 1)[0]
        password = userinfo.partition(":")[2]
        found.update({userinfo, unquote(userinfo), password, unquote(password)})
    return sorted((s for s in found if len(s) >= _MIN_PIECE), key=len, reverse=True)


def holds_credential(text: str, request: Any) -> bool:
    """Whether ``text`` contains credential material of ``request``: a whole piece (at
    least 4 characters), or 8 consecutive characters of a longer one."""
    for secret in _secrets_of(request):
        if secret in text:
            return True
        if len(secret) > _WINDOW and len(text) >= _WINDOW:
            for start in range(len(secret) - _WINDOW + 1):
                if secret[start : start + _WINDOW] in text:
                    return True
    return False


def _valid(value: object, function: Callable[[Any], object], request: Any) -> str:
    """A public scope function's result for ``request``, if it is a scope every store
    can hold (a non-empty str, no NUL, no lone surrogate); else a ConfigurationError
    naming the function and the value (see :func:`_refused`). A private function's
    result is never checked so: it is hashed, whatever it holds, and never shown."""
    if isinstance(value, str) and value and not unstorable(value):
        return value
    raise _refused(value, function, request)


def _refused(value: object, function: Callable[[Any], object], request: Any) -> ConfigurationError:
    """The error for a scope function's result no store can hold: it names the function
    (its qualname) and the value (its repr, as an origin is shown in a message: no user
    info, query or fragment; a value that holds the request's credential material is not
    shown at all) and what is wrong with it."""
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    if not isinstance(value, str):
        return ConfigurationError(
            f"the scope function {name} returned {type(value).__name__}, not a non-empty string"
        )
    if not value:
        return ConfigurationError(f"the scope function {name} returned an empty string")
    shown = "a value that holds the request's credentials" if holds_credential(value, request) else (
        repr(redact_url(value))
    )
    return ConfigurationError(
        f"the scope function {name} returned {shown}, which holds {unstorable(value)}: no store can "
        "hold it as a scope"
    )


def _checked(value: object, function: Callable[[Any], object], request: Any) -> str:
    """A public scope function's result: in clear unless it is long or holds any
    credential material of the request."""
    text = _valid(value, function, request)
    if len(text) > 256 or holds_credential(text, request):
        return hash_scope(text)
    return text


class PublicScope:
    """A scope function whose results may be shown in clear (see :func:`public_scope`)."""

    __slots__ = ("function",)

    def __init__(self, function: ScopeFunction) -> None:
        if not callable(function):
            raise ConfigurationError("public_scope needs a callable(request) -> str")
        self.function = function

    def __call__(self, request: Any) -> str:
        return self.function(request)

    def __repr__(self) -> str:
        return f"public_scope({self.function!r})"


def public_scope(function: ScopeFunction) -> PublicScope:
    """Mark a scope function's results as safe to show: they are stored, logged and
    put in deferrals and metric labels as returned (``"tenant-42"``), not hashed.

    A result that holds any credential material of the request is still hashed, so a
    mistake cannot leak a token: ``scope=public_scope(lambda r: r.headers["X-Tenant"])``.
    """
    return PublicScope(function)


_NAMED_SCOPES: Mapping[str, ScopeFunction] = {"origin": origin_scope, "credential": credential_scope}


def resolve_scope(scope: str | ScopeFunction | None) -> Callable[[Any], str]:
    """The function that gives a request's scope for an adapter's ``scope`` argument:
    ``"origin"`` (or None), ``"credential"``, a callable (its result hashed), or a
    :func:`public_scope` (its result in clear unless it holds credential material)."""
    if scope is None:
        return origin_scope
    if isinstance(scope, str):
        if scope not in _NAMED_SCOPES:
            raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
        return _NAMED_SCOPES[scope]
    if isinstance(scope, PublicScope):
        public = scope.function

        def checked(request: Any) -> str:
            return _checked(public(request), public, request)

        return checked
    if callable(scope):
        private = scope

        def hashed(request: Any) -> str:
            value = private(request)
            if isinstance(value, str) and value:  # any text: its hash is what is stored
                return hash_scope(value)
            raise _refused(value, private, request)

        return hashed
    raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
