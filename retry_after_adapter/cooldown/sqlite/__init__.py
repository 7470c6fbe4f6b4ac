"""The SQLite store: cooldowns, permits, allowances, slots and learned rates in one
database file shared by the processes of one host.

- ``store``: :class:`SQLiteCooldownStore`, every operation one short transaction, and
  its change feed (the file's change log, read before each attempt);
- ``rules``: admission and its rules, on the rows they read and write (a quota's
  permits, an announced allowance, concurrency slots, the learned rate, token permits);
- ``file``: the connections, the schema and the file checks (a file deleted, replaced
  or overwritten is noticed, and the store starts over on the new one).
"""

from .file import DEFAULT_TIMEOUT
from .store import SQLiteCooldownStore

__all__ = ["DEFAULT_TIMEOUT", "SQLiteCooldownStore"]
