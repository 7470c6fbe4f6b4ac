"""The behaviours of a :class:`~retry_after_adapter.testing.scenarios.ScenarioServer`'s
phases: each decides every answer of its phase (see that module). Times are seconds
since the phase began."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import ConfigurationError

__all__ = [
    "ANNOUNCE",
    "AllStatus",
    "Behaviour",
    "EveryNth",
    "FixedWindow",
    "Headers",
    "Healthy",
    "PhaseState",
    "SlidingWindow",
    "all_status",
    "every_nth",
    "fixed_window",
    "healthy",
    "sliding_window",
    "storm",
]

#: What a :func:`fixed_window` may say of its quota on every answer.
ANNOUNCE = (None, "ietf", "x-ratelimit")

Headers = dict[str, str]


@dataclass
class PhaseState:
    """What a phase remembers between its answers (the server's lock is held).

    - ``requests``: requests of the phase answered before this one;
    - ``throttled``: answers :func:`every_nth` gave its status;
    - ``window``, ``used``: :func:`fixed_window`'s current window (its index from the
      phase's start) and the 200s given in it;
    - ``admitted``: :func:`sliding_window`'s 200s (seconds since the phase began);
    - ``epoch``: the server clock's wall time of this decision, in seconds since the
      Unix epoch (for ``X-RateLimit-Reset``).
    """

    requests: int = 0
    throttled: int = 0
    window: int = -1
    used: int = 0
    admitted: deque[float] = field(default_factory=deque)
    epoch: float = 0.0


class Behaviour(Protocol):
    """What a phase does (see the module)."""

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        """The status and headers of a request arriving ``now`` seconds into the phase."""
        ...

    def allowed(self, seconds: float) -> float | None:
        """How many 2xx answers the phase allows in ``seconds`` (None: no bound)."""
        ...

    def overruns(self, times: Sequence[float]) -> int:
        """Windows of the phase in which more requests arrived than its limit, given the
        arrivals (seconds since the phase began, ascending); 0 without a limit."""
        ...

    def describe(self) -> str:
        """The behaviour in a few words."""
        ...


def _retry_after(value: str | None) -> Headers:
    return {} if value is None else {"Retry-After": value}


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``... ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _whole_seconds(seconds: float) -> int:
    """``seconds`` rounded up to whole seconds, at least 1 (a wait is never told short;
    a float a hair above a whole number counts as that number)."""
    return max(1, math.ceil(seconds - 1e-9))


@dataclass(frozen=True)
class Healthy:
    """200 always."""

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        return 200, {}

    def allowed(self, seconds: float) -> float | None:
        return None

    def overruns(self, times: Sequence[float]) -> int:
        return 0

    def describe(self) -> str:
        return "200"


@dataclass(frozen=True)
class EveryNth:
    """Every ``n``-th request of the phase answered ``status`` with ``Retry-After:
    retry_after`` (None: no Retry-After), at most ``times`` times (None: always); the
    others 200."""

    n: int
    status: int = 429
    retry_after: str | None = "1"
    times: int | None = None

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        if (state.requests + 1) % self.n == 0 and (self.times is None or state.throttled < self.times):
            state.throttled += 1
            return self.status, _retry_after(self.retry_after)
        return 200, {}

    def allowed(self, seconds: float) -> float | None:
        return None

    def overruns(self, times: Sequence[float]) -> int:
        return 0

    def describe(self) -> str:
        told = f" Retry-After {self.retry_after}" if self.retry_after is not None else " no Retry-After"
        cap = f", {self.times} times" if self.times is not None else ""
        return f"every {_ordinal(self.n)} {self.status}{told}{cap}"


@dataclass(frozen=True)
class AllStatus:
    """Every answer ``status`` with ``Retry-After: retry_after`` (None: no Retry-After)."""

    status: int
    retry_after: str | None = None

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        return self.status, _retry_after(self.retry_after)

    def allowed(self, seconds: float) -> float | None:
        return None if 200 <= self.status < 300 else 0.0

    def overruns(self, times: Sequence[float]) -> int:
        return 0

    def describe(self) -> str:
        told = f" Retry-After {self.retry_after}" if self.retry_after is not None else " no Retry-After"
        return f"all {self.status}{told}"


@dataclass(frozen=True)
class FixedWindow:
    """At most ``limit`` 200s per fixed window of ``window`` seconds, windows counted from
    the phase's start; past it 429 with Retry-After = the whole seconds to the reset,
    rounded up (none when ``retry_after`` is False). ``announce``: what every answer
    says of the quota: None, ``"ietf"`` (``RateLimit-Policy`` and ``RateLimit``) or
    ``"x-ratelimit"`` (``X-RateLimit-Limit``, ``-Remaining``, ``-Reset`` in epoch
    seconds, ``-Reset-After`` in seconds). Only the 200s count against the limit."""

    limit: int
    window: float
    announce: str | None = None
    retry_after: bool = True

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        index = math.floor(now / self.window)
        left = (index + 1) * self.window - now
        if index != state.window:
            state.window, state.used = index, 0
        if state.used < self.limit:
            state.used += 1
            return 200, self._told(state, left)
        headers = self._told(state, left)
        if self.retry_after:
            headers["Retry-After"] = str(_whole_seconds(left))
        return 429, headers

    def _told(self, state: PhaseState, left: float) -> Headers:
        remaining = self.limit - state.used
        if self.announce == "ietf":
            return {
                "RateLimit-Policy": f'"default";q={self.limit};w={math.ceil(self.window)}',
                "RateLimit": f'"default";r={remaining};t={_whole_seconds(left)}',
            }
        if self.announce == "x-ratelimit":
            return {
                "X-RateLimit-Limit": str(self.limit),
                "X-RateLimit-Remaining": str(remaining),
                "X-RateLimit-Reset": f"{math.ceil((state.epoch + left) * 1000) / 1000:.3f}",
                "X-RateLimit-Reset-After": f"{math.ceil(left * 1000) / 1000:.3f}",
            }
        return {}

    def allowed(self, seconds: float) -> float | None:
        return self.limit * seconds / self.window

    def overruns(self, times: Sequence[float]) -> int:
        counts: dict[int, int] = {}
        for t in times:
            index = math.floor(t / self.window)
            counts[index] = counts.get(index, 0) + 1
        return sum(1 for n in counts.values() if n > self.limit)

    def describe(self) -> str:
        told = f", announced ({self.announce})" if self.announce else ""
        silent = ", no Retry-After" if not self.retry_after else ""
        return f"fixed window {self.limit} per {self.window:g} s{told}{silent}"


@dataclass(frozen=True)
class SlidingWindow:
    """At most ``limit`` 200s in any ``window`` seconds (a sliding log of the 200s); past
    it 429 with Retry-After = the seconds until the oldest of them leaves the window,
    rounded up (none when ``retry_after`` is False)."""

    limit: int
    window: float
    retry_after: bool = True

    def decide(self, now: float, state: PhaseState) -> tuple[int, Headers]:
        log = state.admitted
        while log and log[0] <= now - self.window:
            log.popleft()
        if len(log) < self.limit:
            log.append(now)
            return 200, {}
        if not self.retry_after:
            return 429, {}
        return 429, {"Retry-After": str(_whole_seconds(log[0] + self.window - now))}

    def allowed(self, seconds: float) -> float | None:
        return self.limit * seconds / self.window

    def overruns(self, times: Sequence[float]) -> int:
        """Disjoint windows with more than ``limit`` arrivals: the first arrival that
        makes any window of ``window`` seconds hold ``limit + 1`` opens one, which covers
        the next ``window`` seconds; the next such arrival after it opens the next."""
        count, covered, start = 0, -math.inf, 0
        for n, t in enumerate(times):
            while times[start] <= t - self.window:
                start += 1
            if n - start + 1 > self.limit and t >= covered:
                count += 1
                covered = t + self.window
        return count

    def describe(self) -> str:
        silent = ", no Retry-After" if not self.retry_after else ""
        return f"sliding window {self.limit} per {self.window:g} s{silent}"


def healthy() -> Healthy:
    """200 always."""
    return Healthy()


def every_nth(n: int, status: int = 429, retry_after: str | None = "1", times: int | None = None) -> EveryNth:
    """Every ``n``-th request answered ``status`` with that Retry-After (None: none), at
    most ``times`` times; the others 200."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError("n must be an int >= 1")
    return EveryNth(n, status, retry_after, times)


def all_status(status: int, retry_after: str | None = None) -> AllStatus:
    """Every answer ``status`` with that Retry-After (None: none)."""
    return AllStatus(status, retry_after)


def storm(retry_after: str | None = None) -> AllStatus:
    """Every answer 429 without a usable Retry-After: none, or ``"0"``."""
    return AllStatus(429, retry_after)


def fixed_window(
    limit: int, window: float, announce: str | None = None, retry_after: bool = True
) -> FixedWindow:
    """At most ``limit`` 200s per fixed ``window`` seconds (see :class:`FixedWindow`)."""
    _check_quota(limit, window)
    if announce not in ANNOUNCE:
        raise ConfigurationError("announce must be None, 'ietf' or 'x-ratelimit'")
    return FixedWindow(limit, float(window), announce, retry_after)


def sliding_window(limit: int, window: float, retry_after: bool = True) -> SlidingWindow:
    """At most ``limit`` 200s in any ``window`` seconds (see :class:`SlidingWindow`)."""
    _check_quota(limit, window)
    return SlidingWindow(limit, float(window), retry_after)


def _check_quota(limit: int, window: float) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError("limit must be an int >= 1")
    if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
        raise ConfigurationError("window must be a number of seconds > 0")
