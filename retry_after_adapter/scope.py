"""Scopes: which requests share one cooldown (and, later, one quota).

A scope is a short string: by default the request's origin (``scheme://host:port``).
``"credential"`` adds a hash of the request's credential; a callable may return
anything, and whatever it returns is hashed when it contains credential material, so
a scope is always safe to store, log, put in a deferral or use as a metric label.

A scope function takes a request object with ``.url`` (str) and ``.headers`` (a
mapping): a ``requests.PreparedRequest`` in the adapter, a :class:`RequestInfo` in
:class:`~retry_after_adapter.RetryAfterPoolManager`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import ConfigurationError

__all__ = [
    "RequestInfo",
    "ScopeFunction",
    "credential_scope",
    "hash_scope",
    "origin_scope",
    "resolve_scope",
    "strip_query",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SECRET_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key")

#: ``callable(request) -> str``: the request has ``.url`` and ``.headers``.
ScopeFunction = Callable[[Any], str]


@dataclass(frozen=True)
class RequestInfo:
    """What a scope function sees of a plain urllib3 request (method, URL, headers)."""

    method: str
    url: str
    headers: Mapping[str, str]


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
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError("cannot derive a cooldown scope from a URL without a scheme")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return _origin(scheme, netloc)


def hash_scope(text: str) -> str:
    """A stable, non-reversible scope key for a credential-derived value."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def credential_scope(request: Any) -> str:
    """Origin plus a hash of the request's credential (Authorization, or API key header).

    For providers whose quota is per account or per credential.
    """
    origin = origin_scope(request)
    headers = request.headers or {}
    for name in _SECRET_HEADERS:
        value = headers.get(name)
        if value:
            return f"{origin}|{hash_scope(name.lower() + ':' + str(value))}"
    return origin


def strip_query(url: str | None) -> str | None:
    """The URL without its query string or fragment (they may hold credentials)."""
    if url is None or ("?" not in url and "#" not in url):
        return url
    for mark in ("?", "#"):
        cut = url.find(mark)
        if cut >= 0:
            url = url[:cut]
    return url


def _secrets_of(request: Any) -> list[str]:
    """Credential material of ``request``: secret header values, query values, userinfo."""
    headers = request.headers or {}
    found = [str(v) for name in _SECRET_HEADERS if (v := headers.get(name))]
    url = request.url or ""
    if "?" in url:
        query = url.split("?", 1)[1].split("#", 1)[0]
        for part in query.split("&"):
            if "=" in part:
                value = part.split("=", 1)[1]
                found.extend({value, unquote(value)})
    netloc = url.partition("://")[2].split("/", 1)[0]
    if "@" in netloc:
        found.append(netloc.rsplit("@", 1)[0])
    return [s for s in found if len(s) >= 4]


def _checked(value: object, request: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError("a scope function must return a non-empty string")
    if len(value) > 256 or any(secret in value for secret in _secrets_of(request)):
        return hash_scope(value)
    return value


_NAMED_SCOPES: Mapping[str, ScopeFunction] = {"origin": origin_scope, "credential": credential_scope}


def resolve_scope(scope: str | ScopeFunction | None) -> Callable[[Any], str]:
    """The function that gives a request's scope for an adapter's ``scope`` argument:
    ``"origin"`` (or None), ``"credential"``, or a callable whose result is checked."""
    if scope is None:
        return origin_scope
    if isinstance(scope, str):
        if scope not in _NAMED_SCOPES:
            raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
        return _NAMED_SCOPES[scope]
    if callable(scope):
        user = scope

        def checked(request: Any) -> str:
            return _checked(user(request), request)

        return checked
    raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
