"""Build a cooldown store from one URL (for configuration files and environment variables).

- ``memory://``: this process only (its threads): the process-wide default store.
- ``sqlite:///cooldown.db``: every process on this host. Three slashes, then the path:
  ``sqlite:///relative/cooldown.db`` is relative to the working directory,
  ``sqlite:////var/lib/app/cooldown.db`` (four slashes in all) is absolute. The
  directory must exist. Option: ``?timeout=0.5`` (seconds to wait for a lock; default 0.25).
- ``redis://[[user]:password@]host[:port][/db]``: every process on every machine. Also
  ``rediss://`` (TLS), ``valkey://`` and ``valkeys://`` (read as ``redis://`` and
  ``rediss://``). redis-py's query options are passed on, and ``?prefix=...`` sets the
  key prefix.
"""

from __future__ import annotations

import math
import os
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError, CooldownStoreError
from ..redact import redact_url
from .base import CooldownStore
from .memory import DEFAULT_STORE
from .redis import RedisCooldownStore
from .sqlite import DEFAULT_TIMEOUT, SQLiteCooldownStore

_REDIS_SCHEMES = ("redis", "rediss", "valkey", "valkeys")


def store_from_url(text: str, *, create: bool = True) -> CooldownStore:
    """The cooldown store ``text`` names (see the module's table).

    Raises :class:`ConfigurationError` for a malformed or unknown URL; its message never
    repeats the URL's credentials or query string. ``create=False`` opens only a store
    that exists: a SQLite file that is not there raises :class:`CooldownStoreError`
    (an operator's ``status`` on a mistyped path must not make an empty store and
    report that nothing holds anything back)."""
    if not isinstance(text, str):
        raise ConfigurationError("a cooldown store URL must be a str")
    url = text.strip()
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or not scheme:
        raise ConfigurationError(
            f"not a cooldown store URL: {redact_url(url)!r} "
            "(expected memory://, sqlite:///path, redis://host or valkey://host)"
        )
    if scheme == "memory":
        if url.lower() != "memory://":
            raise ConfigurationError("a memory cooldown store URL is just 'memory://'")
        # The process-wide store every adapter shares by default, so a configured
        # memory:// and the default mean the same cooldowns.
        return DEFAULT_STORE
    if scheme == "sqlite":
        return _sqlite(url, create)
    if scheme in _REDIS_SCHEMES:
        return _redis(url)
    raise ConfigurationError(
        f"unknown cooldown store URL scheme {scheme!r} in {redact_url(url)!r} "
        "(expected memory, sqlite, redis, rediss, valkey or valkeys)"
    )


def _sqlite(url: str, create: bool = True) -> SQLiteCooldownStore:
    parts = urlsplit(url)
    if parts.netloc:
        raise ConfigurationError(
            f"a SQLite cooldown URL has no host: {redact_url(url)!r} "
            "(write sqlite:///relative.db or sqlite:////absolute/path.db)"
        )
    if not parts.path.startswith("/") or parts.path == "/":
        raise ConfigurationError(
            "a SQLite cooldown URL needs a file path: sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    path = unquote(parts.path[1:])
    timeout = DEFAULT_TIMEOUT
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name != "timeout":
            raise ConfigurationError(f"unknown SQLite cooldown URL option {name!r} (only 'timeout')")
        try:
            timeout = float(value)
        except ValueError:
            raise ConfigurationError("the SQLite cooldown URL timeout must be a number of seconds") from None
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigurationError("the SQLite cooldown URL timeout must be a number of seconds > 0")
    if not create and not os.path.exists(path):
        raise CooldownStoreError(
            f"no SQLite cooldown store at {os.path.abspath(path)!r}: the file does not exist",
            cause="no such file",
            lasting=True,
        )
    try:
        return SQLiteCooldownStore(path, timeout=timeout)
    except ConfigurationError as exc:
        if os.path.isabs(path):
            raise
        raise ConfigurationError(
            f"{exc}; note that sqlite:///{path} names a relative path, "
            f"an absolute one takes four slashes: sqlite:////{path}"
        ) from None


def _redis(url: str) -> RedisCooldownStore:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigurationError(f"malformed Redis cooldown URL {redact_url(url)!r}") from None
    database = parts.path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        # redis-py would silently fall back to database 0.
        raise ConfigurationError(
            f"the path of a Redis cooldown URL is a database number: {redact_url(url)!r}"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    rest = [(name, value) for name, value in query if name != "prefix"]
    if len(prefixes) > 1:
        raise ConfigurationError("a Redis cooldown URL takes one prefix option at most")
    client_url = urlunsplit(parts._replace(query=urlencode(rest)))
    if prefixes:
        return RedisCooldownStore.from_url(client_url, prefix=prefixes[0])
    return RedisCooldownStore.from_url(client_url)
