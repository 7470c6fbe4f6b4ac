"""Quota headers: what a server says is left of its quota. Pure: no I/O, no clock.

Two families are read:

- the IETF fields of draft-ietf-httpapi-ratelimit-headers, Structured Fields parsed by
  the maintained ``http-sf`` library (never by hand):
  ``RateLimit: "default";r=0;t=30`` (a List; each item's ``r`` is what remains and
  ``t`` the seconds until the quota resets) and ``RateLimit-Policy:
  "default";q=100;w=60`` (``q`` requests per ``w`` seconds). The Dictionary form of
  the earlier drafts (``RateLimit: limit=100, remaining=0, reset=30``) is read too.
  The working group's open rename (``a`` for ``r``, ``w`` for ``t``) is read per item,
  never mixed with the published drafts (see :func:`~retry_after_adapter.dialects.ietf_item`).
- the de facto ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (epoch seconds, as
  GitHub and Discord send, decimals allowed; epoch milliseconds; or seconds from now,
  as Envoy sends: told apart by magnitude) and ``-Reset-After`` (seconds, decimals
  allowed, as Discord sends). ``X-RateLimit-Limit`` may be Envoy's list
  (``10, 10;w=1;name="per-ip"``: limit 10 per window of 1 s).
- the LLM providers' per-kind allowances, when neither family above is sent: OpenAI's
  (and Azure OpenAI's) ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (the
  reset a Go duration) and Anthropic's ``anthropic-ratelimit-<kind>-{limit,remaining,
  reset}`` for requests, tokens, input and output tokens (the reset an RFC 3339 time).
  The requests figures fill the hint as ``X-RateLimit-*`` does; a token kind with
  nothing left makes the hint say nothing may be sent until that kind's reset; every
  kind's figures are kept on the hint (``allowances``), see :func:`from_allowances`.

:mod:`~retry_after_adapter.dialects` holds each provider's pieces and says what is read
of whom.

A field that is malformed (not the grammar, a negative or non-ASCII number, a value
over 64 characters, a repeated field that disagrees) is ignored, as the draft says:
never fatal, and never read as 0. An epoch reset is measured against the response's
own ``Date`` when that is valid (so a skewed local clock does not matter), else
against the receipt time given by the caller; the hint also keeps the epoch and the
``Date`` as they were sent (``reset_at``, ``date``), for a reader that knows the
server's clock better than one whole-second ``Date`` tells.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from .dialects import (
    EPOCH_THRESHOLD,
    REFILL_STEP,
    RESET_MARGIN,
    Allowance,
    anthropic_allowances,
    epoch_seconds,
    ietf_item,
    limit_field,
    openai_allowances,
    reset_seconds,
    sf_count,
    sf_field,
)
from .errors import ConfigurationError, InvalidRetryAfter
from .header import MAX_COUNT, MAX_SECONDS, parse_http_date

__all__ = [
    "EPOCH_THRESHOLD",
    "UNITS",
    "Quota",
    "QuotaHint",
    "bound_hint",
    "from_allowances",
    "read_quota",
    "refill_step",
]

#: An ``X-RateLimit-*`` value longer than this is ignored.
MAX_NUMBER = 64
_INTEGER = re.compile(r"[0-9]{1,18}", re.ASCII).fullmatch
_DECIMAL = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,9})?", re.ASCII).fullmatch
_UTC = timezone.utc

#: ``get(name)``: a response's header value (repeated fields joined by ", "), or None.
HeaderGetter = Callable[[str], "str | None"]


#: What a :class:`Quota` counts: requests (each attempt one), or tokens (each attempt
#: its declared cost: ``cost=`` of the front ends, ``budget(cost=...)``).
UNITS = ("requests", "tokens")


def _shown(value: object) -> str:
    """``value`` as an error shows it: its repr, cut to 40 characters (its type alone
    when it has no repr to give, such as an int too long to write out)."""
    try:
        text = repr(value)
    except Exception:
        name = type(value).__name__
        return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(value: float) -> bool:
    """Whether ``value`` (an int or a float) is a finite number (an int too large for a
    float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Quota:
    """At most ``limit`` requests (``unit="tokens"``: tokens) sent in any interval of
    ``per`` seconds, by every worker that shares the store and the scope.

    A sliding log, not a token bucket: before each attempt (retries too) a worker takes
    a permit atomically in the store; the permit is granted when fewer than ``limit``
    were granted in the last ``per`` seconds. So neither a fixed-window nor a
    sliding-window provider quota of the same size is ever exceeded by admissions (the
    network may still reorder requests by a few milliseconds).

    With ``unit="tokens"`` each attempt's permit weighs its declared cost (an attempt
    without one takes none), and it is granted when the costs granted in the last
    ``per`` seconds leave room for it. A front end takes one quota of each unit.
    """

    limit: int
    per: float
    #: Seconds added to the window: a permit is taken a little before the request
    #: reaches the server, and the server counts arrivals. With ``margin`` at least the
    #: time from admission to arrival, the server never sees more than ``limit`` in any
    #: ``per`` seconds.
    margin: float = 0.05
    #: ``"requests"`` or ``"tokens"`` (see :data:`UNITS`).
    unit: str = "requests"

    @property
    def window(self) -> float:
        """Seconds a permit counts against the limit: ``per + margin``."""
        return self.per + self.margin

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ConfigurationError(f"Quota limit must be an int >= 1, not {_shown(self.limit)}")
        if (
            isinstance(self.per, bool)
            or not isinstance(self.per, (int, float))
            or not (_finite(self.per) and self.per > 0)
        ):
            shown = _shown(self.per)
            raise ConfigurationError(f"Quota per must be a finite number of seconds > 0, not {shown}")
        if (
            isinstance(self.margin, bool)
            or not isinstance(self.margin, (int, float))
            or not (_finite(self.margin) and self.margin >= 0)
        ):
            shown = _shown(self.margin)
            raise ConfigurationError(f"Quota margin must be a finite number of seconds >= 0, not {shown}")
        if self.unit not in UNITS:
            raise ConfigurationError(f"Quota unit must be 'requests' or 'tokens', not {_shown(self.unit)}")


@dataclass(frozen=True)
class QuotaHint:
    """What a response said of its quota (None: it did not say, or said it badly).

    - ``remaining``: requests left before the quota resets.
    - ``reset``: seconds from the response until it resets.
    - ``limit`` / ``window``: the policy, requests per ``window`` seconds.
    - ``source``: ``"ratelimit"`` (IETF fields), ``"x-ratelimit"``, ``"openai"`` or
      ``"anthropic"``.
    - ``reset_at``: the reset as the server named it, in epoch seconds of the server's
      clock, when it named an epoch (``X-RateLimit-Reset``); None for seconds from now.
    - ``date``: with ``reset_at``, the response's valid ``Date`` in epoch seconds (None
      without one): ``reset`` is ``reset_at`` less it. Whole seconds, truncated by the
      server, so one answer bounds the server's clock only within a second; the engine
      narrows that across answers (``engine.meters.ServerClock``).
    - ``refill``: seconds in which one unit of a continuously refilled limit comes
      back (OpenAI's and Anthropic's requests: a token bucket, whole milliseconds);
      ``remaining`` then holds until ``reset``, the next unit, and one more comes each
      ``refill`` after (``reset_at``, ``date``: the full refill's epoch, when named, and
      the ``Date`` it was measured against). None: a window (the whole limit again at
      ``reset``).
    - ``allowances``: a provider's figures per limit kind (requests, tokens, input and
      output tokens: :class:`~retry_after_adapter.dialects.Allowance`), as read
      (OpenAI, Anthropic); empty for the other sources. ``remaining``/``reset`` above
      are built from them (:func:`from_allowances`). A positive token figure is kept
      here; its ``tokens`` kind is recorded as the scope's announced token allowance
      when the call declared a cost (see ``cooldown.weights``).
    """

    remaining: int | None
    reset: float | None
    limit: int | None = None
    window: float | None = None
    source: str = "ratelimit"
    reset_at: float | None = None
    date: float | None = None
    allowances: tuple[Allowance, ...] = ()
    refill: float | None = None

    @property
    def exhausted(self) -> bool:
        """Nothing left, and a reset still ahead: hold every worker back until then."""
        return self.remaining == 0 and self.reset is not None and self.reset > 0




def bound_hint(hint: QuotaHint | None, bound: float | None) -> QuotaHint | None:
    """``hint`` with every value a store would keep or a worker obey made safe: a reset
    or a window longer than ``bound`` seconds (``max_retry_after``; None: no bound but
    :data:`MAX_SECONDS`) is dropped (unknown, as if not sent: never obeyed, never
    shortened), and counts above :data:`MAX_COUNT` are read as it. The one bound every
    quota header passes before it is stored or obeyed."""
    if hint is None:
        return None
    limit_seconds = MAX_SECONDS if bound is None else min(bound, MAX_SECONDS)
    if hint.allowances:
        # Each kind bounded on its own, then the hint made again from them: a kind's
        # reset past the bound is unknown, and the other kinds still count.
        bounded = tuple(_bound_allowance(each, limit_seconds) for each in hint.allowances)
        if bounded != hint.allowances:
            hint = from_allowances(bounded, hint.source, hint.date)
    reset, window = hint.reset, hint.window
    if reset is not None and not (0 <= reset <= limit_seconds):
        reset = None
    if window is not None and not (0 < window <= limit_seconds):
        window = None
    remaining = None if hint.remaining is None else min(hint.remaining, MAX_COUNT)
    limit = None if hint.limit is None else min(hint.limit, MAX_COUNT)
    if (remaining, reset, limit, window) == (hint.remaining, hint.reset, hint.limit, hint.window):
        return hint
    # A reset dropped takes the epoch and the Date it was read with along.
    reset_at, date = (hint.reset_at, hint.date) if reset is not None else (None, None)
    return replace(
        hint, remaining=remaining, reset=reset, limit=limit, window=window, reset_at=reset_at, date=date
    )


def _bound_allowance(allowance: Allowance, limit_seconds: float) -> Allowance:
    """``allowance`` with a reset past ``limit_seconds`` dropped (its epoch too) and its
    counts at most :data:`MAX_COUNT`."""
    reset, reset_at = allowance.reset, allowance.reset_at
    if reset is not None and not (0 <= reset <= limit_seconds):
        reset = reset_at = None
    remaining = None if allowance.remaining is None else min(allowance.remaining, MAX_COUNT)
    limit = None if allowance.limit is None else min(allowance.limit, MAX_COUNT)
    return replace(allowance, limit=limit, remaining=remaining, reset=reset, reset_at=reset_at)


def read_quota(get: HeaderGetter, *, received_at: datetime, date: str | None = None) -> QuotaHint | None:
    """The quota a response announces, from its IETF fields if valid, else from its
    ``X-RateLimit-*`` fields, else from OpenAI's or Anthropic's per-kind fields; None
    when none says anything usable.

    ``received_at`` (aware) is when the response arrived, the reference for an epoch
    reset when the response has no valid ``Date``.
    """
    hint = _ietf(get)
    if hint is not None:
        return hint
    hint = _x_ratelimit(get, received_at=received_at, date=date)
    if hint is not None:
        return hint
    return _providers(get, received_at=received_at, date=date)


# --------------------------------------------------------------------------- IETF
def _ietf(get: HeaderGetter) -> QuotaHint | None:
    raw = get("RateLimit")
    remaining, reset, name = _tightest(sf_field(raw, "list"))
    if remaining is None:
        remaining, reset = _dictionary(sf_field(raw, "dictionary"))
    if remaining is None:
        return None
    limit, window = _policy(get("RateLimit-Policy"), name)
    return QuotaHint(remaining, None if reset is None else float(reset), limit, window, "ratelimit")


def _tightest(items: Any) -> tuple[int | None, int | None, object]:
    """``(r, t, name)`` of the List form's tightest item: one item per policy, nothing
    left wins, then the fewest left; an item without a valid r says nothing."""
    remaining: int | None = None
    reset: int | None = None
    name: object = None
    for value, params in items or ():
        r, t = ietf_item(params)  # r/t, or the rename's a/w: never mixed
        if r is None:
            continue
        if remaining is None or r < remaining or (r == remaining and (t or 0) > (reset or 0)):
            remaining, reset, name = r, t, value
    return remaining, reset, name


def _dictionary(legacy: Any) -> tuple[int | None, int | None]:
    """``(remaining, reset)`` of the earlier drafts' Dictionary: "limit=100,
    remaining=0, reset=30", or the short "r=0;t=30" (t a parameter of r, or a member
    of its own)."""
    for key, reset_key in (("remaining", "reset"), ("r", "t")):
        entry = legacy.get(key) if legacy else None
        if not isinstance(entry, tuple):
            continue
        r = sf_count(entry[0])
        if r is not None:
            t = sf_count(entry[1].get(reset_key))
            return r, t if t is not None else sf_count(_member(legacy, reset_key))
    return None, None


def _member(dictionary: Any, key: str) -> object:
    entry = dictionary.get(key)
    return entry[0] if isinstance(entry, tuple) else None


def _policy(raw: str | None, name: object) -> tuple[int | None, float | None]:
    """``(q, w)`` of the policy named like the governing ``RateLimit`` item, else of
    the first valid one."""
    items = sf_field(raw, "list")
    first: tuple[int | None, float | None] = (None, None)
    for value, params in items or ():
        q, w = sf_count(params.get("q")), sf_count(params.get("w"))
        if q is None and isinstance(value, int) and not isinstance(value, bool):
            q = sf_count(value)  # an earlier draft: RateLimit-Policy: 100;w=60
        if q is None or not w:
            continue
        if name is not None and value == name:
            return q, float(w)
        if first[0] is None:
            first = (q, float(w))
    return first


# --------------------------------------------------------------------- X-RateLimit
def _number(raw: str | None, *, decimals: bool = False) -> float | None:
    if raw is None:
        return None
    text = raw.strip(" \t")
    if len(text) > MAX_NUMBER or not (_DECIMAL if decimals else _INTEGER)(text):
        return None
    return float(text)


def _latest(raw: str | None) -> float | None:
    """A decimal ``X-RateLimit-*`` time (seconds, or an epoch in seconds or ms) at the
    latest its text can mean: one unit of its last printed decimal more (``1.234``: up
    to 1.235, rounded or truncated). Whole numbers are read as they are: servers round
    whole seconds up (each answer's reset bounds the real one; see the meters)."""
    value = _number(raw, decimals=True)
    if value is None or raw is None:
        return value
    _, dot, fraction = raw.strip(" \t").partition(".")
    return value + 10.0 ** -len(fraction) if dot else value


def _x_ratelimit(get: HeaderGetter, *, received_at: datetime, date: str | None) -> QuotaHint | None:
    left = _number(get("X-RateLimit-Remaining"))
    if left is None:
        return None
    reset = _latest(get("X-RateLimit-Reset-After"))
    reset_at = said = None
    if reset is None:
        at = _latest(get("X-RateLimit-Reset"))
        if at is not None and at >= EPOCH_THRESHOLD:
            # Epoch milliseconds or epoch seconds, by magnitude: measured against the
            # response's own Date, else its receipt.
            reset_at, said = epoch_seconds(at), _date_epoch(received_at, date)
            reset = reset_seconds(at, received_at.astimezone(_UTC).timestamp() if said is None else said)
        elif at is not None:
            reset = at  # seconds from now
    raw_limit = get("X-RateLimit-Limit")
    limit = _number(raw_limit)
    window: float | None = None
    if limit is None and raw_limit is not None:
        count, window = limit_field(raw_limit)  # Envoy's "10, 10;w=1;name=\"per-ip\""
        limit = None if count is None else float(count)
    policy = None if limit is None else int(limit)
    return QuotaHint(int(left), reset, policy, window, "x-ratelimit", reset_at, said)


def _date_epoch(received_at: datetime, date: str | None) -> float | None:
    """The response's valid ``Date`` as epoch seconds, else None."""
    if date is not None:
        try:
            return parse_http_date(date, received_at=received_at).timestamp()
        except InvalidRetryAfter:
            pass
    return None


# ---------------------------------------------------------------- OpenAI, Anthropic
def _providers(get: HeaderGetter, *, received_at: datetime, date: str | None) -> QuotaHint | None:
    """OpenAI's allowances, else Anthropic's (its resets measured against the
    response's valid ``Date``, else the receipt); None when neither is sent."""
    allowances = openai_allowances(get)
    if allowances:
        return from_allowances(allowances, "openai", None)
    said = _date_epoch(received_at, date)
    now = received_at.astimezone(_UTC).timestamp() if said is None else said
    allowances = anthropic_allowances(get, now)
    return from_allowances(allowances, "anthropic", said) if allowances else None


def from_allowances(allowances: tuple[Allowance, ...], source: str, date: float | None) -> QuotaHint:
    """The hint of a provider's per-kind ``allowances`` (``date``: the response's valid
    ``Date`` in epoch seconds, None without one or for a reset named as a duration).

    Both providers' limits are refilled continuously (a token bucket) and each reset is
    the time until the kind is *full* again, so a kind with nothing left does not hold
    everything back until its reset:

    - The requests kind, its limit known (:attr:`~.dialects.Allowance.refill`): one
      request refills every ``reset / (limit - remaining)`` seconds. The hint is
      ``remaining`` until the next one (that step, in whole milliseconds rounded up,
      plus :data:`~.dialects.RESET_MARGIN`), one more each step after (``refill``);
      with nothing left, exhausted until then (the next request is the bucket's next
      unit, never the full refill).
    - A token kind with nothing left: exhausted until a request's share of it has
      refilled (``reset / requests limit``: a request's share of the tokens, at the
      pace the bucket refills; its whole reset while the requests limit is unknown).
    - Without a limit to tell the pace by, a kind is read as a window: ``remaining``
      until its reset (exhausted until it, when nothing is left).

    Positive token figures are kept (``allowances``): the ``tokens`` kind is what
    declared costs are admitted against (``engine.learn``, ``cooldown.weights``).
    """
    requests = next((each for each in allowances if each.kind == "requests"), None)
    step = None if requests is None else refill_step(requests.refill)
    spent = [each for each in allowances if each.spent]
    if spent:
        waits = [(_next_request(each, requests, step), each) for each in spent]
        wait, governing = max(waits, key=lambda pair: pair[0])
        if governing is requests and step is not None:
            return _bucket_of(requests, 0, wait, step, source, date, allowances)
        limit = governing.limit if governing.kind == "requests" else None
        if wait != governing.reset:  # a token kind's share: no epoch of its own
            return QuotaHint(0, wait, limit, None, source, allowances=allowances)
        return _hint_of(governing, 0, limit, source, date, allowances)
    if requests is None:
        return QuotaHint(None, None, None, None, source, allowances=allowances)
    if step is not None:
        return _bucket_of(requests, requests.remaining, step + RESET_MARGIN, step, source, date, allowances)
    return _hint_of(requests, requests.remaining, requests.limit, source, date, allowances)


def _bucket_of(
    requests: Allowance, remaining: int | None, reset: float, step: float, source: str, date: float | None,
    every: tuple[Allowance, ...],
) -> QuotaHint:
    """The hint of a requests bucket: ``remaining`` until ``reset`` (its next unit), one
    more every ``step``; its full refill's epoch and the ``date`` kept when it named a
    time (Anthropic: the engine may read it against the server's clock it learned)."""
    said = date if requests.reset_at is not None else None
    return QuotaHint(
        remaining, reset, requests.limit, None, source, requests.reset_at, said, every, refill=step
    )


def refill_step(refill: float | None) -> float | None:
    """A bucket's refill step (seconds a unit) as stores keep it: whole milliseconds,
    rounded up, at least :data:`~.dialects.REFILL_STEP`."""
    if refill is None:
        return None
    return max(REFILL_STEP, math.ceil(round(refill * 1000, 6)) / 1000)


def _next_request(each: Allowance, requests: Allowance | None, step: float | None) -> float:
    """Seconds until a spent kind ``each`` allows the next request (see
    :func:`from_allowances`): the requests kind's next unit, or a token kind's share
    of a request; its reset when the pace cannot be told."""
    assert each.reset is not None
    if each is requests and step is not None:
        return step + RESET_MARGIN
    if each.kind != "requests" and requests is not None and requests.limit:
        return min(each.reset, each.reset / requests.limit + RESET_MARGIN)
    return each.reset


def _hint_of(
    each: Allowance,
    remaining: int | None,
    limit: int | None,
    source: str,
    date: float | None,
    every: tuple[Allowance, ...],
) -> QuotaHint:
    """The hint whose reset is ``each``'s (its epoch and the ``date`` with it, if named)."""
    said = date if each.reset_at is not None else None
    return QuotaHint(remaining, each.reset, limit, None, source, each.reset_at, said, every)
