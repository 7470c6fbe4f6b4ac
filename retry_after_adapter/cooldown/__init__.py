"""Cooldown stores: where workers share a scope's next eligible time and admission.

- :class:`Store`: the whole interface every store implements (see ``base``); a store
  of 0.x with only ``get`` and ``extend`` (:class:`CooldownStore`) is adapted once.
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

from .base import Admission, CooldownStore, Granted, Hold, Store
from .freshness import Freshness
from .memory import MemoryCooldownStore
from .redis import RedisCooldownStore
from .sqlite import SQLiteCooldownStore
from .url import store_from_url

__all__ = [
    "Admission",
    "CooldownStore",
    "Freshness",
    "Granted",
    "Hold",
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "SQLiteCooldownStore",
    "Store",
    "store_from_url",
]
