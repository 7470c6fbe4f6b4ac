"""Obey a server's Retry-After exactly in requests and urllib3.

Never shortened, never slept past the caller's deadline, and shared by every worker
that spends the same quota. See the README for usage.
"""

from __future__ import annotations

from ._call import budget
from .adapter import RetryAfterAdapter
from .clock import Clock, FakeClock, SystemClock
from .cooldown import CooldownStore, MemoryCooldownStore, RedisCooldownStore, SQLiteCooldownStore
from .deferral import Deferral
from .errors import (
    ConfigurationError,
    CooldownStoreError,
    DeferralLimitExceeded,
    InvalidDeferral,
    InvalidRetryAfter,
    RetryAfterError,
    RetryDeferred,
)
from .header import RetryAfter, parse_retry_after
from .metrics import Counters
from .policy import DecisionRecord
from .retry import RetryAfterRetry

__version__ = "0.1.0"

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
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "RetryAfter",
    "RetryAfterAdapter",
    "RetryAfterError",
    "RetryAfterRetry",
    "RetryDeferred",
    "SQLiteCooldownStore",
    "SystemClock",
    "budget",
    "parse_retry_after",
]
