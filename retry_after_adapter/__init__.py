"""Obey a server's Retry-After exactly in requests and urllib3.

Never shortened, never slept past the caller's deadline, and shared by every worker
that spends the same quota. See the README for usage.
"""

from __future__ import annotations

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
from .engine import budget
from .errors import (
    ConfigurationError,
    CooldownStoreError,
    DeferralLimitExceeded,
    InvalidDeferral,
    InvalidRetryAfter,
    MaxRetryDeferred,
    RetryAfterError,
    RetryDeferred,
)
from .header import RetryAfter, parse_retry_after
from .observe import Counters, DecisionRecord, redact_urllib3_logs
from .policy import Reason
from .pool import RetryAfterPoolManager
from .quota import Quota
from .retry import RetryAfterRetry
from .scope import public_scope

__version__ = "0.5.0"

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
    "redact_urllib3_logs",
    "store_from_url",
]
