"""Redaction: what keeps credentials out of messages, log lines and printed URLs.

One implementation of each way the package hides a secret:

- a URL for a message: :func:`strip_query` (no query, no fragment), :func:`safe_url`
  (no user info either; :func:`message_url` without parsing a URL that has none),
  :func:`redact_url` (user info shown as ``***@``, bounded);
- free text: :func:`redact` masks every query value and every URL's user info, and
  :class:`RedactingFilter` does it to log records;
- known secrets: :func:`url_secrets`, :func:`argument_secrets` and
  :func:`client_secrets` find them, :func:`scrub` and a :class:`Redactor` (which
  collects them as they turn up) replace them with ``***``.

Pure: text in, text out. Nothing here does I/O or imports the rest of the package.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "MASK",
    "RedactingFilter",
    "Redactor",
    "argument_secrets",
    "client_secrets",
    "message_url",
    "redact",
    "redact_url",
    "safe_url",
    "scrub",
    "strip_query",
    "url_secrets",
]

#: What a secret is replaced with.
MASK = "***"

#: A :class:`Redactor` ignores secrets shorter than this (too common to look for).
MIN_SECRET = 3

_QUERY = re.compile(r"\?([^\s#'\"<>)\]]*)")
_USERINFO_IN_TEXT = re.compile(r"(?<=://)[^/@\s'\"<>]+@")
_USERINFO_IN_MESSAGE = re.compile(r"(?<=://)[^/@\s]*@")


# --------------------------------------------------------------------------- URLs
#: Schemes of store URLs: their paths never hold an ``@``, so everything up to the last
#: one is user info (a password may hold ``/``, ``?`` or ``@``).
_STORE_SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix", "sqlite", "memory")


def _userinfo(url: str) -> str:
    """The user info of ``url`` ("" when none): for a store URL everything between
    ``://`` and the last ``@``; for any other URL the part of its authority (up to the
    first ``/``) before its ``@``, so a path holding ``@`` (``/users/@me``) is none."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return ""
    if scheme.lower() in _STORE_SCHEMES:
        return rest.rpartition("@")[0]
    netloc = rest.split("/", 1)[0]
    return netloc.rsplit("@", 1)[0] if "@" in netloc else ""


def _cut_query(url: str) -> str:
    for mark in ("?", "#"):
        cut = url.find(mark)
        if cut >= 0:
            url = url[:cut]
    return url


def strip_query(url: str | None) -> str | None:
    """The URL without its query string or fragment (they may hold credentials)."""
    if url is None or ("?" not in url and "#" not in url):
        return url
    return _cut_query(url)


def message_url(url: str) -> str:
    """``url`` for what the package hands urllib3 or httpx to count or log (a retry's
    history, an error): no user info, no query, no fragment (:func:`safe_url`); as it
    is when it holds none of them (the common case, no parsing)."""
    if "@" not in url and "?" not in url and "#" not in url:
        return url
    return safe_url(url)


def safe_url(url: str) -> str:
    """``url`` without user info, query string or fragment, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if not parts.scheme or not parts.netloc:
        return _cut_query(url)
    userinfo = _userinfo(url)
    if userinfo and parts.scheme.lower() in _STORE_SCHEMES:
        # A password holding "/" or "?" cuts urlsplit's authority short: cut it whole.
        return _cut_query(f"{parts.scheme}://{url.partition('://')[2][len(userinfo) + 1 :]}")
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}"


def redact_url(url: str) -> str:
    """``url`` for a message: no credentials (everything up to the last ``@``, so a
    password holding ``@``, ``/`` or ``?`` is cut whole), no query, no fragment; at
    most 200 characters."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = MASK + "@" + rest.rpartition("@")[2]
    return (scheme + sep + _cut_query(rest))[:200]


# --------------------------------------------------------------------------- free text
def _mask_query(match: re.Match[str]) -> str:
    params = match.group(1).split("&")
    masked = [p.split("=", 1)[0] + "=" + MASK if "=" in p else (MASK if p else "") for p in params]
    return "?" + "&".join(masked)


def redact(text: str) -> str:
    """``text`` with every query value (``?token=abc&page=2`` becomes
    ``?token=***&page=***``) and every URL's user info (``https://***@host``) masked."""
    if "?" in text:
        text = _QUERY.sub(_mask_query, text)
    if "@" in text:
        text = _USERINFO_IN_TEXT.sub(MASK + "@", text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that masks query values and URL user info in a record's
    message, its traceback text and its stack text (see :func:`redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return True
        clean = redact(message)
        if clean != message:
            record.msg = clean
            record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None  # handlers that read the exception itself see nothing
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


# --------------------------------------------------------------------------- known secrets
def url_secrets(url: str) -> list[str]:
    """The user info of ``url`` (everything between ``://`` and the last ``@``) and its
    password part, to keep out of messages."""
    userinfo = url.partition("://")[2].rpartition("@")[0]
    return [part for part in (userinfo, userinfo.partition(":")[2]) if part]


def argument_secrets(argument: str) -> list[str]:
    """The user info (and its password), query string and fragment of anything that
    looks like a URL (a command-line argument, say). See :func:`_userinfo` for where
    user info ends: a path holding ``@`` (``/users/@me``) is no secret, a store
    password holding ``/`` is one whole secret."""
    found: list[str] = []
    userinfo = _userinfo(argument)
    if userinfo:
        found.append(userinfo)
        if ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    for mark in ("?", "#"):
        if mark in argument:
            found.append(argument.split(mark, 1)[1])
    return found


def client_secrets(client: Any) -> list[str]:
    """Credentials configured on a redis-py style client (the password of its pool's
    connection kwargs), longest first, to keep out of messages."""
    found: set[str] = set()
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        value = kwargs.get("password")
        if isinstance(value, str) and value:
            found.add(value)
    return sorted(found, key=len, reverse=True)


def _replace(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first, so a part never spoils the whole
    it belongs to) replaced by :data:`MASK`."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def scrub(text: str, secrets: Iterable[str]) -> str:
    """A message for a person: ``secrets`` and any URL user info masked, at most 300
    characters."""
    return _USERINFO_IN_MESSAGE.sub(MASK + "@", _replace(text, secrets))[:300]


class Redactor:
    """Collects secrets as they turn up (header values, query strings, user info) and
    removes them from text: ``redactor(text)``."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def add(self, secret: str) -> None:
        """Remember ``secret`` (stripped; one shorter than 3 characters is ignored)."""
        secret = secret.strip()
        if len(secret) >= MIN_SECRET:
            self.secrets.add(secret)

    def add_all(self, secrets: Iterable[str]) -> None:
        for secret in secrets:
            self.add(secret)

    def __call__(self, text: str) -> str:
        return _replace(text, self.secrets)
