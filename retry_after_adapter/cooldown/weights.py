"""Token-weighted admission: the rules every store applies to an attempt that declared
a cost (``base.Weigh``), as pure functions (no I/O, no clock: each is given ``now``).

Two things may weigh an attempt's tokens, and a store checks both before it takes
either, with the rest of the attempt's admission:

- the server's announced token allowance (OpenAI's ``x-ratelimit-*-tokens``,
  Anthropic's ``anthropic-ratelimit-tokens-*``), kept as the allowance of the scope's
  :func:`~.base.token_scope` and merged as a requests allowance is (an answer's figure
  lowers it when the server counted more): ``allowance.admit_allowance`` with the
  attempt's ``cost`` counts it, or says to wait for its reset;
- a configured ``Quota(limit, per, unit="tokens")``: a log of permits, each weighing
  its cost and counting ``per + margin`` seconds from its grant;
  :func:`weighed_free_at` says when enough of them stop counting for a cost to fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigurationError
from .allowance import Allowance
from .base import Admission

#: What a store's weighing gives when only a configured token quota weighs an attempt
#: (no announced token allowance to count the cost in): a grant writes no allowance.
NO_ALLOWANCE = Allowance(0, 0, datetime.min.replace(tzinfo=timezone.utc), 0)


def token_quota(limit: int, per: float) -> str:
    """A token quota of ``limit`` per ``per`` seconds, in words (for an error)."""
    return f"the token quota of {limit} per {per:g} s"


def check_fits(cost: int, limit: int, per: float) -> None:
    """Raise ConfigurationError for a cost a token quota of ``limit`` per ``per``
    seconds could never admit (more than its limit). The engine checks this before
    asking a store (naming where the cost came from); a store checks it again for a
    caller that asks it directly."""
    if limit > 0 and cost > limit:
        raise ConfigurationError(
            f"a request's cost of {cost} tokens exceeds {token_quota(limit, per)}: it could never be admitted"
        )


def oversized(record: Allowance, cost: int) -> bool:
    """Whether ``cost`` tokens can never be admitted by the server's announced token
    allowance ``record``: they are more than its whole limit, when the server said it
    (no window of the server's would take them: OpenAI answers such a request "too
    large"). The store answers :func:`too_large` then, and the engine raises a
    ConfigurationError naming the cost and the limit (``Plan.admit_once``)."""
    return 0 < record.limit < cost


def too_large(cooldown: datetime | None, record: Allowance, now: datetime) -> Admission:
    """The refusal of a cost :func:`oversized` for ``record``: ``Admission.oversized``
    is the announced limit; ``not_before`` the allowance's reset (now, when that is
    past), what a layer that does not know this answer waits for."""
    return Admission(cooldown=cooldown, not_before=max(record.until, now), oversized=record.limit)


def weighed_free_at(entries: Iterable[tuple[Any, int]], total: int, cost: int, limit: int) -> Any:
    """None when ``cost`` fits a token quota of ``limit`` whose live permits weigh
    ``total``, else when it fits at the earliest: the end of the permit after which
    the ones that stopped counting leave room. ``entries``: ``(end, cost)`` of each
    live permit, soonest end first (an end in any unit: it is returned as given)."""
    excess = total + cost - limit
    if excess <= 0:
        return None
    end = None
    for end, weight in entries:
        excess -= weight
        if excess <= 0:
            return end
    return end  # (a cost above the limit is refused before: ``check_fits``)


def with_weighed(answer: Admission, expires: datetime | None, seq: int | None = None) -> Admission:
    """A grant ``answer`` that also took tokens: a token permit stopping at ``expires``
    (None: none), and ``seq``, the announced token allowance's count after this cost
    less one (None: none counted), as a request's admission number is."""
    if expires is None and seq is None:
        return answer
    return replace(answer, weighed=expires, token_seq=seq)
