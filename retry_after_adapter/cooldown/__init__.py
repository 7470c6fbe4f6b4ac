"""Cooldown stores: where workers share a scope's next eligible time.

- :class:`MemoryCooldownStore`: the threads of one process.
- :class:`SQLiteCooldownStore`: the processes of one host, through one SQLite file.
- :class:`RedisCooldownStore`: processes on any number of hosts, through Redis or Valkey
  (needs the ``redis`` extra; redis-py is imported only when a store is built from a URL).
- :func:`store_from_url`: any of these from ``memory://``, ``sqlite:///path``,
  ``redis://...`` or ``valkey://...``.
"""

from __future__ import annotations

from .base import CooldownStore
from .memory import MemoryCooldownStore
from .redis import RedisCooldownStore
from .sqlite import SQLiteCooldownStore
from .url import store_from_url

__all__ = [
    "CooldownStore",
    "MemoryCooldownStore",
    "RedisCooldownStore",
    "SQLiteCooldownStore",
    "store_from_url",
]
