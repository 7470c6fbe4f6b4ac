"""Providers' rate-limit dialects: the pieces :mod:`~retry_after_adapter.quota` and the
engine read beyond the two header families. Pure: no I/O, no clock (every time is an
argument, in seconds).

What each provider sends and what is read of it (docs/dialects.md's table says what the
adapter then does):

- **IETF drafts.** 07's Dictionary (``limit=100, remaining=0, reset=30``) and the Lists of
  08 to 11 (``"default";r=0;t=30``; in 11, ``t`` is the window within which at most ``r``
  may be used, read as the seconds until the quota resets, as before). The working
  group's open rename (``a`` for ``r``, ``w`` for ``t``, a cost ``c``, a
  ``RateLimit-Partition`` field) is read guardedly, per item (:func:`ietf_item`): an item
  with ``r`` is of the published drafts and only ``r``/``t`` count (an ``a`` or ``w``
  beside it is ignored); an item without ``r`` but with ``a`` is of the rename and
  ``a``/``w`` count. An unknown parameter (``c``, ``pk``...) and the partition field are
  ignored (one attempt costs one; the scope decides what shares a quota). A value that
  cannot be read makes the item say nothing: never 0.
- **Envoy** (the older ``x-ratelimit-*`` of its rate limit filter):
  ``X-RateLimit-Limit: 10, 10;w=1;name="per-ip"``: the limit and, as a Structured
  Fields List, its policies (:func:`limit_field`); the window is the ``w`` of the
  policy whose value is the limit.
- **X-RateLimit-Reset** as epoch seconds, epoch milliseconds or seconds from now, told
  apart by magnitude (:func:`reset_seconds`) and measured against the response's own
  ``Date`` (else the receipt time).
- **Discord.** ``X-RateLimit-Bucket`` names the limit a route shares with others
  (:func:`bucket_of`); limits are per bucket *and* per top-level resource (its "major
  parameter": a channel, a guild, a webhook; :func:`major_parameter`), so one bucket
  seen on ``/channels/1`` and ``/channels/2`` is two allowances. ``X-RateLimit-Global:
  true`` or ``X-RateLimit-Scope: global`` marks a limit of the whole origin
  (:func:`is_global`); ``user`` and ``shared`` are per route.
- **GitHub** secondary rate limits (:func:`github_secondary`): a 403 or 429 that says
  nothing of when to come back (no ``Retry-After``, no ``x-ratelimit-remaining: 0``)
  waits at least :data:`SECONDARY_MIN` seconds, doubling while such answers repeat.
  A 403 is such a limit only when its body says so: a 403 is also "permission
  denied", and both carry ``x-ratelimit-*`` and ``x-github-request-id``.
- **Cloudflare** (``Ratelimit: "default";r=50;t=30``, ``Ratelimit-Policy:
  "burst";q=100;w=60``) is draft 08's List; field names are case-insensitive (urllib3's
  header lookup is), nothing more is needed.
- **Shopify**'s ``Retry-After: 2.0`` is read by :func:`~retry_after_adapter.header.parse_retry_after`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import http_sf

__all__ = [
    "EPOCH_MS_THRESHOLD",
    "EPOCH_THRESHOLD",
    "SECONDARY_MAX",
    "SECONDARY_MIN",
    "bucket_key",
    "bucket_of",
    "epoch_seconds",
    "github_secondary",
    "ietf_item",
    "is_global",
    "limit_field",
    "major_parameter",
    "reset_seconds",
    "secondary_wait",
    "sf_count",
    "sf_field",
    "wants_body",
]

#: ``get(name)``: a response's header value (repeated fields joined by ", "), or None.
Getter = Callable[[str], "str | None"]

#: An ``X-RateLimit-Reset`` at least this large is an epoch time (2001-09-09), smaller
#: is seconds from now (no API announces a window of 31 years).
EPOCH_THRESHOLD = 1_000_000_000
#: An ``X-RateLimit-Reset`` at least this large is epoch *milliseconds*: as epoch
#: seconds it would be the year 5138, as milliseconds it is 1973 onwards.
EPOCH_MS_THRESHOLD = 100_000_000_000

#: A field this dialect module parses as Structured Fields is ignored past this length.
MAX_FIELD = 256
#: A Discord bucket id longer than this (characters) is ignored.
MAX_BUCKET = 64
_BUCKET = re.compile(r"[A-Za-z0-9_.:\-]+", re.ASCII).fullmatch

#: The least wait (seconds) after a GitHub secondary rate limit that names none.
SECONDARY_MIN = 60.0
#: The longest such wait (seconds), however often the answers repeat: an hour.
SECONDARY_MAX = 3600.0
#: Phrases of GitHub's documented body for a secondary rate limit (lower case): the
#: current one, and the "abuse detection" wording it replaced.
SECONDARY_PHRASES = (b"secondary rate limit", b"abuse detection mechanism")
#: Bytes of a body searched for them.
SECONDARY_BODY = 64 * 1024


# ------------------------------------------------------------------ X-RateLimit-Reset
def epoch_seconds(value: float) -> float:
    """An epoch ``X-RateLimit-Reset`` (at least :data:`EPOCH_THRESHOLD`) in epoch
    seconds: milliseconds from :data:`EPOCH_MS_THRESHOLD` on."""
    return value / 1000.0 if value >= EPOCH_MS_THRESHOLD else value


def reset_seconds(value: float, now: float) -> float:
    """Seconds from the response until an ``X-RateLimit-Reset`` of ``value``: epoch
    milliseconds (at least :data:`EPOCH_MS_THRESHOLD`), epoch seconds (at least
    :data:`EPOCH_THRESHOLD`) or seconds from now (smaller). ``now`` is the response's
    own time in epoch seconds (its valid ``Date``, else receipt). A past epoch is 0."""
    if value >= EPOCH_THRESHOLD:
        return max(0.0, epoch_seconds(value) - now)
    return value


# ------------------------------------------------------------------- Structured Fields
def sf_field(raw: str | None, kind: str = "list") -> Any:
    """A Structured Field of ``kind`` ("list", "dictionary") parsed by ``http-sf``, or
    None when absent, longer than :data:`MAX_FIELD` or not the grammar."""
    if raw is None or len(raw) > MAX_FIELD:
        return None
    try:
        return http_sf.parse(raw.encode("ascii"), tltype=kind)
    except (http_sf.StructuredFieldError, UnicodeEncodeError, ValueError, KeyError):
        return None


def sf_count(value: object) -> int | None:
    """A Structured Fields Integer that is a count (>= 0); bool is not one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def ietf_item(params: Any) -> tuple[int | None, int | None]:
    """``(remaining, reset)`` of one ``RateLimit`` List item's parameters, in either
    generation (see the module): ``r``/``t`` when ``r`` is there, else ``a``/``w``.
    A value that is not a count is None (the item says nothing of it)."""
    if "r" in params:
        return sf_count(params.get("r")), sf_count(params.get("t"))
    if "a" in params:
        return sf_count(params.get("a")), sf_count(params.get("w"))
    return None, None


def limit_field(raw: str | None) -> tuple[int | None, float | None]:
    """``(limit, window seconds)`` of an Envoy-style ``X-RateLimit-Limit: 10,
    10;w=1;name="per-ip"``: the first member is the limit, a member whose value is the
    limit gives its window ``w`` (else the first member with a valid ``w``). A plain
    ``10`` gives ``(10, None)``; anything unreadable ``(None, None)``."""
    items = sf_field(raw)
    if not items:
        return None, None
    limit = sf_count(items[0][0])
    if limit is None:
        return None, None
    window: float | None = None
    for value, params in items:
        w = sf_count(params.get("w"))
        if not w:
            continue
        if value == limit and not isinstance(value, bool):
            return limit, float(w)
        if window is None:
            window = float(w)
    return limit, window


# ----------------------------------------------------------------------------- Discord
def bucket_of(get: Getter) -> str | None:
    """Discord's ``X-RateLimit-Bucket`` (an opaque id), or None when absent or not a
    plain token of at most :data:`MAX_BUCKET` characters."""
    raw = get("X-RateLimit-Bucket")
    if raw is None:
        return None
    text = raw.strip(" \t")
    if not text or len(text) > MAX_BUCKET or _BUCKET(text) is None:
        return None
    return text


def is_global(get: Getter) -> bool:
    """Whether the response's limit is the origin's global one: ``X-RateLimit-Global:
    true`` or ``X-RateLimit-Scope: global`` (``user`` and ``shared`` are per route)."""
    flag = get("X-RateLimit-Global")
    if flag is not None and flag.strip(" \t").lower() == "true":
        return True
    scope = get("X-RateLimit-Scope")
    return scope is not None and scope.strip(" \t").lower() == "global"


#: Discord's top-level resources: a route's limit is counted per id of these.
_MAJOR = frozenset({"channels", "guilds", "webhooks"})


def major_parameter(path: str) -> str:
    """The top-level resource of a request path (no query), as Discord counts limits:
    ``channels/<id>``, ``guilds/<id>``, or ``webhooks/<id>/<token>`` (a webhook's token
    is part of it); an ``/api`` and ``/v<n>`` prefix is skipped. "" when there is none.
    It may hold a credential (a webhook token): only ever hashed (:func:`bucket_key`)."""
    parts = [p for p in path.split("?", 1)[0].split("#", 1)[0].split("/") if p]
    if parts and parts[0] == "api":
        parts = parts[1:]
    if parts and len(parts[0]) > 1 and parts[0][0] == "v" and parts[0][1:].isdigit():
        parts = parts[1:]
    if len(parts) < 2 or parts[0] not in _MAJOR:
        return ""
    return "/".join(parts[:3] if parts[0] == "webhooks" else parts[:2])


def bucket_key(bucket: str, major: str) -> str:
    """The scope suffix of a bucket and a major parameter: a hash, since the major
    parameter may hold a webhook token (never stored, logged or put in a deferral)."""
    digest = hashlib.sha256(f"{bucket}\x00{major}".encode("utf-8", "surrogatepass")).hexdigest()
    return "bucket:" + digest[:24]


# ------------------------------------------------------------------------------ GitHub
def _github(get: Getter) -> bool:
    return get("X-GitHub-Request-Id") is not None


def _exhausted(get: Getter) -> bool:
    left = get("X-RateLimit-Remaining")
    return left is not None and left.strip(" \t") == "0" and get("X-RateLimit-Reset") is not None


def wants_body(status: int | None, get: Getter) -> bool:
    """Whether telling this answer apart needs its body: a GitHub 403 that names no
    wait (no ``Retry-After``, no ``x-ratelimit-remaining: 0`` with a reset)."""
    return status == 403 and _github(get) and get("Retry-After") is None and not _exhausted(get)


def github_secondary(status: int | None, get: Getter, body: bytes | None) -> bool:
    """Whether an answer is a GitHub secondary rate limit that names no wait: a 403 or
    429 of GitHub (it carries ``X-GitHub-Request-Id``) without ``Retry-After`` and
    without ``x-ratelimit-remaining: 0`` + reset (those are obeyed as they are); a 429
    always, a 403 only when its body says so (GitHub documents "You have exceeded a
    secondary rate limit"; a permission-denied 403 carries the same headers)."""
    if status not in (403, 429) or not _github(get) or get("Retry-After") is not None or _exhausted(get):
        return False
    if status == 429:
        return True
    if not body:
        return False
    text = body[:SECONDARY_BODY].lower()
    return any(phrase in text for phrase in SECONDARY_PHRASES)


def secondary_wait(streak: int) -> float:
    """Seconds to wait after the ``streak``-th GitHub secondary limit in a row (1: the
    first): :data:`SECONDARY_MIN` doubled each time, at most :data:`SECONDARY_MAX`."""
    if streak <= 1:
        return SECONDARY_MIN
    return min(SECONDARY_MAX, SECONDARY_MIN * 2.0 ** min(streak - 1, 16))
