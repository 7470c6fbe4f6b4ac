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
- **OpenAI** (and **Azure OpenAI**): ``x-ratelimit-{limit,remaining,reset}-requests``
  and ``-tokens`` (:func:`openai_allowances`), each reset a Go duration
  (:func:`go_duration`: ``6m0s``, ``12ms``); the wait in milliseconds,
  ``retry-after-ms`` and Azure's ``x-ms-retry-after-ms`` (:func:`milliseconds`), read
  with ``Retry-After`` by :func:`precise_wait`: precise when they agree with its whole
  seconds, else the longest; and ``x-should-retry`` (:func:`should_retry`).
- **What a 429 means** (:func:`not_processed`): OpenAI's and Anthropic's 429 is a
  request their rate limits refused before any work on it, which their own SDKs send
  again after the wait whatever its method. The answer is recognised by the fields only
  these providers send (:data:`UNPROCESSED_FIELDS`), not by the host; Gemini's by its
  body: a ``RESOURCE_EXHAUSTED`` status naming the quota that refused it.
- **Anthropic**: ``anthropic-ratelimit-<kind>-{limit,remaining,reset}`` for requests,
  tokens, input and output tokens (:func:`anthropic_allowances`), each reset an RFC 3339
  time (:func:`rfc3339_epoch`), measured against the response's ``Date`` or receipt.
  An :class:`Allowance` per kind; :func:`~retry_after_adapter.quota.from_allowances`
  makes the quota hint of them (token figures are kept; the `tokens` kind is what
  declared costs are admitted against).
- **Gemini** (Google's Generative Language API, and Vertex AI): a 429
  ``RESOURCE_EXHAUSTED`` names its wait in its JSON body, not in a field: a
  ``google.rpc.RetryInfo`` detail's ``retryDelay``, a protobuf Duration in JSON
  (:func:`proto_duration`: ``"2s"``, ``"37.5s"``), and which quotas refused it, a
  ``google.rpc.QuotaFailure`` detail's violations (``quotaId``, ``quotaDimensions``
  ``model`` and ``location``). :func:`google_rpc_error` reads such a body;
  :func:`wants_google_body` says when a 429 is to be read at all (no wait in its
  fields, a JSON body). Gemini's quotas are per project and per model: a request whose
  path names a model in Google's form (``/v1beta/models/gemini-2.0-flash:generateContent``,
  ``.../projects/p/locations/l/publishers/google/models/m:predict``) is keyed by it
  (:func:`gemini_key`). The API key (``x-goog-api-key``, ``?key=``) is never part of
  a key: the project is the caller's scope.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import http_sf

__all__ = [
    "ANTHROPIC_KINDS",
    "EPOCH_MS_THRESHOLD",
    "EPOCH_THRESHOLD",
    "GEMINI_MARK",
    "MAX_GO_DURATION",
    "MAX_VALUE",
    "MS_FIELDS",
    "OPENAI_KINDS",
    "REFILL_STEP",
    "RESET_MARGIN",
    "SECONDARY_MAX",
    "SECONDARY_MIN",
    "UNPROCESSED_FIELDS",
    "Allowance",
    "GoogleError",
    "anthropic_allowances",
    "body_needed",
    "bucket_key",
    "bucket_of",
    "count",
    "epoch_seconds",
    "gemini_key",
    "github_secondary",
    "go_duration",
    "go_duration_latest",
    "google_client",
    "google_rpc_error",
    "google_status",
    "ietf_item",
    "is_global",
    "limit_field",
    "major_parameter",
    "milliseconds",
    "not_processed",
    "openai_allowances",
    "precise_wait",
    "proto_duration",
    "reset_seconds",
    "rfc3339_epoch",
    "rfc3339_latest",
    "secondary_wait",
    "sf_count",
    "sf_field",
    "should_retry",
    "wants_body",
    "wants_google_body",
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


# ------------------------------------------------------------- counts and durations
#: A provider's count, duration or time field longer than this (characters) is ignored.
MAX_VALUE = 64
_COUNT = re.compile(r"[0-9]{1,18}", re.ASCII).fullmatch
_MILLISECONDS = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,9})?", re.ASCII).fullmatch


def _trimmed(raw: str | None) -> str | None:
    """``raw`` without surrounding spaces and tabs, or None when absent or longer than
    :data:`MAX_VALUE`."""
    if raw is None or len(raw) > MAX_VALUE:
        return None
    return raw.strip(" \t")


def count(raw: str | None) -> int | None:
    """A count field (``x-ratelimit-remaining-requests: 59``): ASCII digits, at most 18;
    None for anything else (a sign, a decimal, a list): never 0."""
    text = _trimmed(raw)
    if text is None or _COUNT(text) is None:
        return None
    return int(text)


def milliseconds(raw: str | None) -> float | None:
    """A wait in milliseconds (``retry-after-ms: 1200``, ``x-ms-retry-after-ms``) as
    **seconds**: ASCII digits (at most 18) with an optional fraction (at most 9 digits);
    None for anything else (a sign, an exponent, a list, non-ASCII digits)."""
    text = _trimmed(raw)
    if text is None or _MILLISECONDS(text) is None:
        return None
    return float(text) / 1000.0


# Go's time.ParseDuration, without a sign: a number (digits, an optional fraction; "5."
# and ".5" are Go's too) and a unit, concatenated ("1h2m3.5s"), or a lone "0".
_GO_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_GO_NUMBER_UNIT = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_GO = re.compile(f"(?:{_GO_NUMBER_UNIT})+|0").fullmatch
_GO_PARTS = re.compile(_GO_NUMBER_UNIT).findall
#: Go's own range: a duration is at most 2**63 - 1 nanoseconds (about 292 years).
MAX_GO_NANOSECONDS = 2**63 - 1
#: The same, in seconds.
MAX_GO_DURATION = MAX_GO_NANOSECONDS / 1e9


def _go_unit(text: str) -> float:
    """Seconds of one unit of the last digit printed in a valid Go duration ``text``
    (``5s``: 1 s, ``1.5s``: 0.1 s, ``12ms``: 1 ms, ``6m0s``: 1 s); 0 for a lone ``0``."""
    parts = _GO_PARTS(text)
    if not parts:
        return 0.0
    number, unit = parts[-1]
    _, dot, fraction = number.partition(".")
    digits = len(fraction) if dot else 0
    return _GO_UNITS[unit] / 1e9 / float(10**digits)


def go_duration_latest(raw: str | None) -> float | None:
    """A Go duration (:func:`go_duration`) at the latest time its text can mean, in
    **seconds**: one unit of its last printed digit added (a printed ``5s`` may be
    anything from 5 s to just under 6 s, rounded or truncated: 6 s; ``12ms``: 13 ms;
    ``1.5s``: 1.6 s; ``6m0s``: 361 s). None for anything that is not a duration."""
    seconds = go_duration(raw)
    if seconds is None:
        return None
    text = _trimmed(raw)
    assert text is not None
    return seconds + _go_unit(text)


def go_duration(raw: str | None) -> float | None:
    """A Go duration (``1s``, ``6m0s``, ``12ms``, ``1h2m3.5s``, ``0s``, as OpenAI's
    ``x-ratelimit-reset-*`` send) in **seconds**; None for anything else: never 0.

    Units ``h``, ``m``, ``s``, ``ms``, ``us`` (or ``µs``, ``μs``), ``ns``, case-sensitive;
    each number ASCII digits with an optional fraction; numbers and units concatenated,
    nothing between them. A sign, a space inside, a bare number (but ``0``), an unknown
    unit, more than :data:`MAX_VALUE` characters or more than Go's range
    (:data:`MAX_GO_DURATION`, about 292 years) is not a duration. A fraction of a
    nanosecond counts as a whole one (never shorter). A long but valid value is left
    to :func:`~retry_after_adapter.quota.bound_hint`, the bound every quota header passes.
    """
    text = _trimmed(raw)
    if not text or _GO(text) is None:
        return None
    nanoseconds = 0
    for number, unit in _GO_PARTS(text):
        scale = _GO_UNITS[unit]
        whole, _, fraction = number.partition(".")
        nanoseconds += int(whole or "0") * scale
        if fraction:
            nanoseconds += -(-int(fraction) * scale // 10 ** len(fraction))  # rounded up
    if nanoseconds > MAX_GO_NANOSECONDS:
        return None
    return nanoseconds / 1e9


_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII,
).fullmatch
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def rfc3339_epoch(raw: str | None) -> float | None:
    """An RFC 3339 date-time (``2026-12-03T20:15:30Z``, ``2026-12-03T21:15:30.25+01:00``,
    as Anthropic's ``anthropic-ratelimit-*-reset`` send) in epoch **seconds**; None for
    anything else: never 0.

    Aware times only: a ``Z`` or an offset (``+hh:mm``, ``-hh:mm``; ``-00:00`` is UTC) is
    required, since a local time says nothing of when. ``T`` and ``Z`` in either case, a
    space is not a separator; no such day, hour 24 and on, an offset past 23:59 and more
    than :data:`MAX_VALUE` characters are not a time. Second 60 (a leap second) is read
    as the next second, never earlier; a fraction is kept to the microsecond, rounded up.
    """
    text = _trimmed(raw)
    m = None if text is None else _RFC3339(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in m.group(1, 2, 3, 4, 5, 6))
    fraction, sign, offset_hours, offset_minutes = m.group(7, 8, 9, 10)
    leap = second == 60
    try:
        moment = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=timezone.utc)
    except ValueError:
        return None
    offset = 0
    if sign is not None:
        hours, minutes = int(offset_hours), int(offset_minutes)
        if hours > 23 or minutes > 59:
            return None
        offset = (hours * 60 + minutes) * 60 * (-1 if sign == "-" else 1)
    micro = 0 if not fraction else -(-int(fraction) * 1_000_000 // 10 ** len(fraction))
    step = timedelta(seconds=int(leap) - offset, microseconds=micro)
    return ((moment - _EPOCH) + step).total_seconds()


def rfc3339_latest(raw: str | None) -> float | None:
    """An RFC 3339 date-time (:func:`rfc3339_epoch`) at the latest time its text can
    mean, in epoch **seconds**: one unit of its last printed digit added (whole seconds,
    as Anthropic sends: 1 s; ``.25``: 0.01 s). None for anything that is not one."""
    epoch = rfc3339_epoch(raw)
    if epoch is None:
        return None
    text = _trimmed(raw)
    m = None if text is None else _RFC3339(text)
    assert m is not None
    fraction = m.group(7)
    return epoch + (10.0 ** -len(fraction) if fraction else 1.0)


# ------------------------------------------------------------------- OpenAI, Anthropic
#: Seconds added to the time a provider's bucket refills its next unit, beyond the
#: latest meaning of its reset: the request admitted then still has to reach the
#: server (as ``Quota.margin``).
RESET_MARGIN = 0.05
#: The finest refill step (seconds) an announced bucket is kept at: every store keeps
#: it in whole milliseconds, rounded up (never a faster pace than announced).
REFILL_STEP = 0.001

#: OpenAI's (and Azure OpenAI's) limit kinds: ``x-ratelimit-{limit,remaining,reset}-<kind>``.
OPENAI_KINDS = ("requests", "tokens")
#: Anthropic's: ``anthropic-ratelimit-<kind>-{limit,remaining,reset}``.
ANTHROPIC_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


@dataclass(frozen=True)
class Allowance:
    """One limit a provider announces, of one ``kind`` (``"requests"``, ``"tokens"``,
    ``"input-tokens"``, ``"output-tokens"``); None: not said, or said badly.

    - ``limit``, ``remaining``: counts of the kind (requests, or tokens).
    - ``reset``: seconds from the response until the allowance is *fully* replenished
      (both providers document a limit refilled continuously, a token bucket), read at
      the latest time its text can mean (:func:`go_duration_latest`,
      :func:`rfc3339_latest`).
    - ``reset_at``: that reset in epoch seconds of the server's clock, when the provider
      named a time (Anthropic); None for a duration (OpenAI).
    """

    kind: str
    limit: int | None
    remaining: int | None
    reset: float | None
    reset_at: float | None = None

    @property
    def spent(self) -> bool:
        """Nothing left, and a reset still ahead."""
        return self.remaining == 0 and self.reset is not None and self.reset > 0

    @property
    def refill(self) -> float | None:
        """Seconds in which one unit refills, at the latest: ``reset / (limit -
        remaining)`` (the bucket is full ``reset`` from now, ``limit - remaining`` units
        later; with part of the next unit refilled already, each of them comes no later
        than this pace says). None when it cannot be told: no limit, no reset, or
        nothing missing."""
        if self.limit is None or self.remaining is None or self.reset is None or self.reset <= 0:
            return None
        missing = self.limit - self.remaining
        return self.reset / missing if missing > 0 else None


def openai_allowances(get: Getter) -> tuple[Allowance, ...]:
    """OpenAI's allowances, one per kind whose ``x-ratelimit-remaining-<kind>`` is a
    count (:data:`OPENAI_KINDS`; Azure OpenAI sends the remaining fields alone): the
    limit, the remaining and the reset, a Go duration read at its latest meaning
    (:func:`go_duration_latest`), in seconds from the response."""
    found = []
    for kind in OPENAI_KINDS:
        remaining = count(get("x-ratelimit-remaining-" + kind))
        if remaining is not None:
            limit = count(get("x-ratelimit-limit-" + kind))
            reset = go_duration_latest(get("x-ratelimit-reset-" + kind))
            found.append(Allowance(kind, limit, remaining, reset))
    return tuple(found)


def anthropic_allowances(get: Getter, now: float) -> tuple[Allowance, ...]:
    """Anthropic's allowances, one per kind whose ``anthropic-ratelimit-<kind>-remaining``
    is a count (:data:`ANTHROPIC_KINDS`): the limit, the remaining and the reset, an
    RFC 3339 time read at its latest meaning (:func:`rfc3339_latest`: whole seconds, one
    more) measured against ``now``, the response's own time in epoch seconds (its valid
    ``Date``, else receipt); a past reset is 0."""
    found = []
    for kind in ANTHROPIC_KINDS:
        field = "anthropic-ratelimit-" + kind
        remaining = count(get(field + "-remaining"))
        if remaining is not None:
            limit = count(get(field + "-limit"))
            at = rfc3339_latest(get(field + "-reset"))
            reset = None if at is None else max(0.0, at - now)
            found.append(Allowance(kind, limit, remaining, reset, at))
    return tuple(found)


#: The fields that give a wait in milliseconds: OpenAI's, and Azure's.
MS_FIELDS = ("retry-after-ms", "x-ms-retry-after-ms")


def precise_wait(retry_after: float | None, whole_seconds: bool, waits_ms: tuple[float, ...]) -> float | None:
    """The wait (seconds) a response names with ``Retry-After`` (``retry_after`` seconds,
    None: absent; ``whole_seconds``: it was delay-seconds, not a date) and the valid
    millisecond fields (``waits_ms``, in seconds, see :func:`milliseconds`).

    The longest millisecond field is read for precision when it agrees with the whole
    seconds (rounded up to a whole second it is ``retry_after``: ``retry-after: 2`` and
    ``retry-after-ms: 1200`` is 1.2 s); otherwise the longest of all the fields (never
    shorter than any field the server sent); alone, it is the wait."""
    longest = max(waits_ms, default=None)
    if longest is None:
        return retry_after
    if retry_after is None:
        return longest
    if whole_seconds and math.ceil(longest) == retry_after:
        return longest
    return max(retry_after, longest)


def should_retry(get: Getter) -> bool | None:
    """OpenAI's ``x-should-retry``: True or False (any case, trimmed), else None."""
    raw = get("x-should-retry")
    text = None if raw is None else raw.strip(" \t").lower()
    return {"true": True, "false": False}.get(text or "")


_PARTS = ("remaining", "limit", "reset")
#: Fields that mark an answer as OpenAI's (Azure OpenAI's too) or Anthropic's: the
#: per-kind rate-limit fields of :func:`openai_allowances` and
#: :func:`anthropic_allowances`, and the providers' own ``openai-*`` and
#: ``anthropic-*`` fields. No other API names a field so (a generic ``X-RateLimit-*``
#: or ``request-id`` is not one of them), and gateways that stand in front of these
#: APIs pass them on.
UNPROCESSED_FIELDS = (
    *(f"x-ratelimit-{part}-{kind}" for kind in OPENAI_KINDS for part in _PARTS),
    "openai-organization",
    "openai-processing-ms",
    "openai-version",
    *(f"anthropic-ratelimit-{kind}-{part}" for kind in ANTHROPIC_KINDS for part in _PARTS),
    "anthropic-organization-id",
)


def not_processed(status: int | None, get: Getter, body: bytes | None = None) -> bool:
    """Whether an answer says, by its provider's documented contract, that the request
    was not processed, so that sending it again after the wait cannot do its work twice:
    a 429 of OpenAI (or Azure OpenAI) or Anthropic, whose rate limits refuse a request
    before any work on it (their SDKs send any request again after one, a POST too).
    Recognised by a field of :data:`UNPROCESSED_FIELDS`; or a 429 of Google's APIs
    (Gemini) whose ``body`` (when it was read) is a ``RESOURCE_EXHAUSTED`` error naming
    the quota that refused it (:attr:`GoogleError.quota_refused`). A 503 (an overloaded
    or failing server) is no such answer, nor is a 429 of any other API."""
    if status != 429:
        return False
    if any(get(name) is not None for name in UNPROCESSED_FIELDS):
        return True
    found = google_rpc_error(body) if body else None
    return found is not None and found.quota_refused


# ------------------------------------------------------------------------------ Gemini
#: What separates a scope from a Gemini model's key (:func:`gemini_key`) in a refined scope.
GEMINI_MARK = "|gemini:"
#: The ``@type`` of the details of a ``google.rpc.Status`` read here.
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
#: protobuf's own range: a Duration is at most 315,576,000,000 s (10,000 years).
MAX_PROTO_DURATION = 315_576_000_000
#: A body longer than this (bytes) is not parsed for a wait (a Google error is a few
#: hundred bytes; :data:`~retry_after_adapter.body.DEFAULT_MAX_RETRY_BODY` bounds what is read).
MAX_GOOGLE_BODY = 64 * 1024
#: Violations of a ``QuotaFailure`` read (Google sends one to three).
MAX_VIOLATIONS = 16
#: What a quota id or a model name may be to be kept (as Google names them:
#: ``GenerateRequestsPerMinutePerProjectPerModel-FreeTier``, ``gemini-2.0-flash``,
#: ``models/gemini-1.5-pro-002``): anything else is dropped, never shown or keyed.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@/\-]{0,127}", re.ASCII).fullmatch
# A protobuf Duration's JSON form (proto3 JSON mapping): seconds with 0, 3, 6 or 9
# fractional digits and an "s"; the mapping's parsers accept 1 to 9 digits, as read here.
_PROTO_DURATION = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,9}))?s", re.ASCII).fullmatch


def proto_duration(raw: object) -> float | None:
    """A protobuf ``Duration`` in its JSON form (``"2s"``, ``"37.5s"``, ``"0.000000001s"``)
    as a wait in **seconds**; None for anything else: never 0 for bad input.

    ASCII digits, an optional ``.`` and 1 to 9 fractional digits, and a lowercase ``s``:
    no sign (a negative wait is not a wait), no space, no exponent, no other unit, not a
    JSON number, nothing past :data:`MAX_PROTO_DURATION` (protobuf's own range) nor
    longer than :data:`MAX_VALUE` characters. A fraction is kept to the nanosecond, as
    written. A long but valid value is left to the policy's ``max_retry_after``."""
    if not isinstance(raw, str) or len(raw) > MAX_VALUE:
        return None
    m = _PROTO_DURATION(raw)
    if m is None:
        return None
    whole, fraction = m.group(1), m.group(2)
    seconds = int(whole)
    if seconds > MAX_PROTO_DURATION or (seconds == MAX_PROTO_DURATION and fraction and int(fraction)):
        return None
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


@dataclass(frozen=True)
class GoogleError:
    """What a Google API error body (a ``google.rpc.Status`` in JSON: ``{"error":
    {"code", "status", "message", "details"}}``) says of a rate limit.

    - ``status``: its canonical code's name (``"RESOURCE_EXHAUSTED"``), or None.
    - ``retry_delay``: the ``RetryInfo`` detail's ``retryDelay`` as sent (None: no
      ``RetryInfo``); ``delay`` its seconds (:func:`proto_duration`), None when it cannot
      be read; ``invalid``: a ``RetryInfo`` was sent but says no valid wait (malformed,
      missing, repeated), which stops a call as an invalid Retry-After does.
    - ``quota_ids``: the ``QuotaFailure`` violations' ``quotaId``s (well formed ones).
    - ``models``: the models those violations name (``quotaDimensions.model``).
    - ``project_wide``: a violation names a quota that is not per model (no model
      dimension, and ``PerModel`` nowhere in its id): it holds back every model.
    """

    status: str | None
    retry_delay: str | None = None
    delay: float | None = None
    invalid: bool = False
    quota_ids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    project_wide: bool = False
    quota_failure: bool = False

    @property
    def quota_refused(self) -> bool:
        """A quota refused the request (``RESOURCE_EXHAUSTED`` with a ``QuotaFailure``
        or a ``RetryInfo``): Google's APIs check quotas before any work on a request, so
        it was not processed (Google's own clients retry it, a POST too)."""
        return self.status == "RESOURCE_EXHAUSTED" and (self.quota_failure or self.retry_delay is not None)


def _name(value: object) -> str | None:
    return value if isinstance(value, str) and _NAME(value) is not None else None


def google_rpc_error(body: bytes | None) -> GoogleError | None:
    """The rate-limit parts of a Google API error ``body`` (see :class:`GoogleError`),
    or None when it is not one: not JSON, not ``{"error": {...}}`` (a list of one, as a
    streamed answer sends it, is read too), longer than :data:`MAX_GOOGLE_BODY`. Never
    raises. A ``RetryInfo`` sent more than once, or whose ``retryDelay`` is not a
    Duration string, is ``invalid`` (as a repeated or malformed Retry-After is)."""
    if not body or len(body) > MAX_GOOGLE_BODY:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    status = error.get("status") if isinstance(error.get("status"), str) else None
    details = error.get("details")
    if not isinstance(details, list):
        return GoogleError(status)
    delays: list[object] = []
    quota_ids: list[str] = []
    models: list[str] = []
    project_wide = quota_failure = False
    for detail in details[:MAX_VIOLATIONS * 4]:
        if not isinstance(detail, dict):
            continue
        kind = detail.get("@type")
        if kind == RETRY_INFO:
            delays.append(detail.get("retryDelay"))
        elif kind == QUOTA_FAILURE:
            quota_failure = True
            violations = detail.get("violations")
            for violation in violations[:MAX_VIOLATIONS] if isinstance(violations, list) else ():
                if not isinstance(violation, dict):
                    continue
                quota_id = _name(violation.get("quotaId"))
                dimensions = violation.get("quotaDimensions")
                model = _name(dimensions.get("model")) if isinstance(dimensions, dict) else None
                if quota_id is not None and quota_id not in quota_ids:
                    quota_ids.append(quota_id)
                if model is not None and model not in models:
                    models.append(model)
                if model is None and (quota_id is None or "PerModel" not in quota_id):
                    project_wide = True
    if not delays:
        return GoogleError(status, quota_ids=tuple(quota_ids), models=tuple(models),
                           project_wide=project_wide, quota_failure=quota_failure)
    raw = delays[0]
    delay = proto_duration(raw) if len(delays) == 1 else None
    shown = raw if isinstance(raw, str) and len(raw) <= MAX_VALUE and raw.isprintable() else "?"
    return GoogleError(
        status, shown, delay, delay is None, tuple(quota_ids), tuple(models), project_wide, quota_failure
    )


def wants_google_body(status: int | None, get: Getter) -> bool:
    """Whether a 429's body is to be read for a wait: it names none in its fields (no
    ``Retry-After``, no millisecond field) and its body is JSON (a Google API error
    body, :func:`google_rpc_error`). Never for any other status: a 200 costs nothing."""
    if status != 429 or get("Retry-After") is not None or any(get(name) is not None for name in MS_FIELDS):
        return False
    kind = get("Content-Type")
    return kind is not None and kind.split(";", 1)[0].strip(" \t").lower() == "application/json"


# ``[/v1|/v1beta|...][/projects/P/locations/L/publishers/X]/models/M:verb`` (Google's
# custom method form, AIP-136); a tuned model is ``tunedModels/M``.
_GEMINI_PATH = re.compile(
    r"(?:/[A-Za-z0-9_.\-]+)*?"
    r"(?:/projects/([A-Za-z0-9_.\-]{1,64})/locations/([A-Za-z0-9_.\-]{1,64})/publishers/[A-Za-z0-9_.\-]{1,64})?"
    r"/(models|tunedModels)/([A-Za-z0-9][A-Za-z0-9_.@\-]{0,127}):[A-Za-z]{1,64}",
    re.ASCII,
).fullmatch


#: The headers Google's clients send: the GenAI SDK's API key and its client tag.
_GOOGLE_HEADERS = frozenset({"x-goog-api-key", "x-goog-api-client"})


def google_client(headers: Any, url: str) -> bool:
    """Whether a request is a Google client's (so a model named in its path is one of
    Gemini's, whose quotas are per model): it carries an ``x-goog-api-key`` or
    ``x-goog-api-client`` header (``headers``: any mapping of names, any case; None:
    none), its API key in the query (``key=``, as Google's REST examples send it), or it
    goes to a ``googleapis.com`` host. Only names are read, never a value."""
    if headers is not None:
        try:
            if any(str(name).lower() in _GOOGLE_HEADERS for name in headers):
                return True
        except (AttributeError, TypeError):
            pass
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    if host == "googleapis.com" or host.endswith(".googleapis.com"):
        return True
    return any(item.partition("=")[0] == "key" for item in parts.query.split("&"))


def gemini_key(path: str) -> str | None:
    """The quota key of a request to Google's Gemini (or Vertex AI) model API, from its
    ``path`` (or its whole URL; the query and user info are left out): ``gemini:<model>`` for
    ``/v1beta/models/gemini-2.0-flash:generateContent``, ``gemini:<project>/<location>/<model>``
    for Vertex AI's ``/v1/projects/p/locations/l/publishers/google/models/m:predict``
    (its quotas are per project, region and model), ``gemini:tunedModels/<model>`` for a
    tuned model; None for any other path (a request not of a model). Costs one
    substring test for a path without ``models/`` or ``Models/``."""
    if "odels/" not in path:
        return None
    if "://" in path:
        rest = path.partition("://")[2]
        slash = rest.find("/")
        path = rest[slash:] if slash >= 0 else "/"
    path = path.split("?", 1)[0].split("#", 1)[0]
    m = _GEMINI_PATH(path)
    if m is None:
        return None
    project, location, kind, model = m.group(1, 2, 3, 4)
    name = model if kind == "models" else f"tunedModels/{model}"
    return f"gemini:{project}/{location}/{name}" if project else f"gemini:{name}"


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


def google_status(delay: float, message: str) -> dict[str, Any]:
    """A ``google.rpc.Status`` (JSON) of a 429 built here, as Google's clients read one:
    ``RESOURCE_EXHAUSTED``, ``message``, and a ``RetryInfo`` whose ``retryDelay`` is
    ``delay`` seconds rounded up to the millisecond (never a shorter wait)."""
    millis = max(0, math.ceil(round(delay * 1000.0, 6)))
    return {
        "code": 429,
        "message": message,
        "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": RETRY_INFO, "retryDelay": f"{millis // 1000}.{millis % 1000:03d}s"}],
    }


def body_needed(status: int | None, get: Getter) -> bool:
    """Whether an answer must have its body read before it is judged, whatever the
    front end: a GitHub 403 that names no wait (:func:`wants_body`: its body tells a
    secondary limit from a permission denied) or a 429 that names its wait only in a
    JSON body (:func:`wants_google_body`, Gemini's). Never for any other status (a 200
    costs one comparison). A front end reads that body bounded (at most
    ``max_retry_body`` bytes, within the call's time), keeps it readable for its caller,
    and hands the bytes to the judgement."""
    if status == 429:
        return wants_google_body(429, get)
    return status == 403 and wants_body(403, get)
