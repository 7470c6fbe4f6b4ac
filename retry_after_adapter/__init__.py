"""Obey a server's Retry-After exactly in requests and urllib3.

Never shortened, never slept past the caller's deadline, and shared by every worker
that spends the same quota. See the README for usage and docs/ for the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _lazy

if TYPE_CHECKING:
    from .adapter import RetryAfterAdapter, RetryAfterResponse
    from .clock import Clock, FakeClock, SystemClock
    from .cooldown import (
        CooldownStore,
        MemoryCooldownStore,
        RedisCooldownStore,
        SQLiteCooldownStore,
        store_from_url,
    )
    from .deferral import Deferral, deferral_of
    from .deferred import DeferralLimitExceeded, MaxRetryDeferred, RetryDeferred
    from .engine import budget
    from .errors import (
        ConfigurationError,
        CooldownStoreError,
        InvalidDeferral,
        InvalidRetryAfter,
        RetryAfterError,
    )
    from .header import RetryAfter, parse_retry_after
    from .observe import Counters, DecisionRecord, redact_logs, redact_urllib3_logs
    from .policy import Reason
    from .pool import RetryAfterPoolManager
    from .quota import Quota
    from .retry import RetryAfterRetry
    from .scope import public_scope

#: Where each public name lives: imported on first use, so that importing the package
#: (the pytest plugin does, in every test run of a project that has it installed) costs
#: nothing until a name is used.
_WHERE: dict[str, str] = {
    "Clock": ".clock",
    "ConfigurationError": ".errors",
    "CooldownStore": ".cooldown",
    "CooldownStoreError": ".errors",
    "Counters": ".observe",
    "DecisionRecord": ".observe",
    "Deferral": ".deferral",
    "DeferralLimitExceeded": ".deferred",
    "FakeClock": ".clock",
    "InvalidDeferral": ".errors",
    "InvalidRetryAfter": ".errors",
    "MaxRetryDeferred": ".deferred",
    "MemoryCooldownStore": ".cooldown",
    "Quota": ".quota",
    "Reason": ".policy",
    "RedisCooldownStore": ".cooldown",
    "RetryAfter": ".header",
    "RetryAfterAdapter": ".adapter",
    "RetryAfterError": ".errors",
    "RetryAfterPoolManager": ".pool",
    "RetryAfterResponse": ".adapter",
    "RetryAfterRetry": ".retry",
    "RetryDeferred": ".deferred",
    "SQLiteCooldownStore": ".cooldown",
    "SystemClock": ".clock",
    "budget": ".engine",
    "deferral_of": ".deferral",
    "parse_retry_after": ".header",
    "public_scope": ".scope",
    "redact_logs": ".observe",
    "redact_urllib3_logs": ".observe",
    "store_from_url": ".cooldown",
}

__version__ = "0.16.0"

__all__ = [
    "Clock",
    "ConfigurationError",
    "CooldownStore",
    "CooldownStoreError",
    "Counters",
    "DecisionRecord",
    "Deferral",
    "DeferralLimitExceeded",
    "FakeClock",
    "InvalidDeferral",
    "InvalidRetryAfter",
    "MaxRetryDeferred",
    "MemoryCooldownStore",
    "Quota",
    "Reason",
    "RedisCooldownStore",
    "RetryAfter",
    "RetryAfterAdapter",
    "RetryAfterError",
    "RetryAfterPoolManager",
    "RetryAfterResponse",
    "RetryAfterRetry",
    "RetryDeferred",
    "SQLiteCooldownStore",
    "SystemClock",
    "budget",
    "deferral_of",
    "parse_retry_after",
    "public_scope",
    "redact_logs",
    "redact_urllib3_logs",
    "store_from_url",
]


def __getattr__(name: str) -> Any:
    return _lazy.load(__name__, _WHERE, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
