"""Cooldown stores: where workers share a scope's next eligible time and admission.

- :class:`Store`: the core every store implements (``get``, ``extend``, ``admit`` of
  one :class:`Ask`, ``answer`` of one :class:`Answer`), and one mixin per capability
  (:class:`QuotaLogs`, :class:`Leases`, :class:`Allowances`, :class:`LearnedRate`,
  :class:`FreshnessLog`, :class:`Listing`, :class:`ChangeFeed`, :class:`LeaseRenewal`,
  :class:`Reservations`, whose rules every store shares: :class:`Mark`,
  :func:`placing_ends`, :func:`holder_ends`, :func:`paced`; see ``base``), and
  :class:`Bounded` for a store that bounds each of its own operations. A store of
  0.x (an object with ``get`` and ``extend`` that is no ``Store``) is refused with a
  message that says what to change.
- :class:`MemoryCooldownStore`: the threads of one process.
- :class:`SQLiteCooldownStore`: the processes of one host, through one SQLite file.
- :class:`RedisCooldownStore`: processes on any number of hosts, through Redis or Valkey
  (needs the ``redis`` extra; redis-py is imported only when a store is built from a URL).
- :class:`Freshness`: what a store keeps of a scope's health (last success, next
  eligible time, last error class); :class:`Admission`: what ``admit`` answers.
- :func:`store_from_url`: any of these from ``memory://``, ``sqlite:///path``,
  ``redis://...`` or ``valkey://...``.
"""

from __future__ import annotations

from typing import Any

from .base import (
    CAPABILITIES,
    STORE_FORMAT,
    Admission,
    Allowances,
    Announced,
    Answer,
    Ask,
    Bounded,
    ChangeFeed,
    CooldownStore,
    Feed,
    Forgetful,
    FreshnessLog,
    Hold,
    InProcess,
    Learn,
    LearnedRate,
    Lease,
    LeaseRenewal,
    Leases,
    Listing,
    Mark,
    PartwiseStore,
    Permit,
    QuotaLogs,
    RateOutcome,
    Replaceable,
    Reservations,
    Store,
    Weigh,
    Weighed,
    Weights,
    check_scope,
    check_until,
    holder_ends,
    paced,
    placing_ends,
    renamed,
    token_scope,
)
from .freshness import Freshness
from .memory import MemoryCooldownStore
from .redis import RedisCooldownStore
from .sqlite import SQLiteCooldownStore
from .url import store_from_url

__all__ = [
    "CAPABILITIES",
    "STORE_FORMAT",
    "Admission",
    "Allowances",
    "Announced",
    "Answer",
    "Ask",
    "Bounded",
    "ChangeFeed",
    "CooldownStore",
    "Feed",
    "Forgetful",
    "Freshness",
    "FreshnessLog",
    "Hold",
    "InProcess",
    "Learn",
    "LearnedRate",
    "Lease",
    "LeaseRenewal",
    "Leases",
    "Listing",
    "Mark",
    "MemoryCooldownStore",
    "PartwiseStore",
    "Permit",
    "QuotaLogs",
    "RateOutcome",
    "RedisCooldownStore",
    "Replaceable",
    "Reservations",
    "SQLiteCooldownStore",
    "Store",
    "Weigh",
    "Weighed",
    "Weights",
    "check_scope",
    "check_until",
    "holder_ends",
    "paced",
    "placing_ends",
    "store_from_url",
    "token_scope",
]


def __getattr__(name: str) -> Any:
    return renamed(__name__, name)  # FullStore, with a DeprecationWarning
