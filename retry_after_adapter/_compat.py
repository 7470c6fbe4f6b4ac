"""Every difference between urllib3 1.26.x and 2.x that the package depends on.

Nothing outside this module looks at urllib3's version.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import version as _dist_version
from typing import Any

from urllib3.util.retry import Retry
from urllib3.util.timeout import Timeout

#: urllib3's version as a tuple of ints, e.g. (2, 7, 0).
URLLIB3_VERSION: tuple[int, ...] = tuple(
    int(part) for part in _dist_version("urllib3").split(".")[:3] if part.isdigit()
)
IS_URLLIB3_V1 = URLLIB3_VERSION < (2,)

_RETRY_PARAMS = frozenset(inspect.signature(Retry.__init__).parameters) - {"self", "history"}

#: Whether this urllib3 has its own Retry-After cap (2.6.3+ ``retry_after_max``). We
#: never call the methods that apply it, so it can never shorten a wait of ours.
HAS_RETRY_AFTER_MAX = "retry_after_max" in _RETRY_PARAMS

#: The methods urllib3 treats as idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE).
DEFAULT_ALLOWED_METHODS: frozenset[str] = frozenset(Retry.DEFAULT_ALLOWED_METHODS)

#: The smallest socket timeout an attempt gets when its deadline is nearly used up, in
#: seconds (a zero timeout would make the socket non-blocking). Give the policy an
#: ``attempt_reserve`` to keep more than this for the last attempt.
MIN_ATTEMPT_TIMEOUT = 0.1


def retry_arguments(retry: Retry) -> dict[str, Any]:
    """The constructor arguments that rebuild ``retry`` on this urllib3 (no history)."""
    # 1.26 also accepts the deprecated "method_whitelist" (same value as
    # allowed_methods; reading it warns, and passing both is an error): skip it.
    names = _RETRY_PARAMS - {"method_whitelist"}
    return {name: getattr(retry, name) for name in names if hasattr(retry, name)}


def supported_retry_arguments() -> frozenset[str]:
    """The keyword arguments this urllib3's ``Retry.__init__`` accepts."""
    return _RETRY_PARAMS


def _clamp(value: Any, left: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return min(float(value), left)
    # None (wait forever) and the "socket default" sentinel (both versions) become left.
    return left


class BudgetTimeout(Timeout):
    """A Timeout whose per-attempt copy is clamped to what is left of a deadline.

    urllib3 (1.26 and 2.x) calls ``clone()`` once for every attempt, retries included,
    so each attempt's connect and read timeouts are at most the seconds left when it
    starts. ``remaining()`` returns those seconds, or None when there is no deadline.
    """

    def __init__(self, timeout: Any, remaining: Callable[[], float | None]) -> None:
        # ``timeout`` is what requests' HTTPAdapter.send accepts: a number, None, a
        # (connect, read) tuple or a Timeout; built in one Timeout.__init__ call.
        if isinstance(timeout, Timeout):
            super().__init__(connect=timeout._connect, read=timeout._read, total=timeout.total)
        elif isinstance(timeout, tuple):
            if len(timeout) != 2:
                raise ValueError(
                    f"Invalid timeout {timeout}. Pass a (connect, read) timeout tuple, "
                    "or a single float to set both timeouts to the same value."
                )
            super().__init__(connect=timeout[0], read=timeout[1])
        else:
            super().__init__(connect=timeout, read=timeout)
        self._remaining = remaining

    def clone(self) -> Timeout:
        left = self._remaining()
        if left is None:
            return Timeout(connect=self._connect, read=self._read, total=self.total)
        left = max(left, MIN_ATTEMPT_TIMEOUT)
        total = None if self.total is None else _clamp(self.total, left)
        return Timeout(connect=_clamp(self._connect, left), read=_clamp(self._read, left), total=total)


def response_header(response: Any, name: str) -> str | None:
    """A header of a urllib3 response, repeated fields joined with ", " (both versions)."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get(name)
    return None if value is None else str(value)


def response_status(response: Any) -> int | None:
    status = getattr(response, "status", None)
    return status if isinstance(status, int) else None
