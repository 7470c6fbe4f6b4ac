"""The change feed of a SQLite store in one process (see :class:`SQLiteFeed`): what
keeps its near copy fresh, as ``_redis_feed`` does for Redis."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from ._sqlite_file import CHANGES_KEPT, sqlite_gate
from .base import Changed, Feed

if TYPE_CHECKING:
    from .sqlite import SQLiteCooldownStore

__all__ = ["FILE_CHECK_EVERY", "SQLiteFeed"]

_LAST_CHANGE = "SELECT max(seq) FROM change"

#: Seconds between two checks of the file's identity by the feed (a file deleted or
#: replaced is noticed within this, or at the next store operation).
FILE_CHECK_EVERY = 0.01


class SQLiteFeed(Feed):
    """The change feed of a SQLite file in one process, polled: before an attempt is
    admitted near, the change log's last number is read on the thread's connection (one
    indexed read, no write transaction: WAL readers take no lock); only when it moved
    are the new entries read, from where this process left off. So the near copy is
    never staler than the check itself. The file's identity is checked at least every
    :data:`FILE_CHECK_EVERY` seconds: a file deleted or replaced (a new generation)
    starts the copy over."""

    def __init__(self, store: SQLiteCooldownStore, changed: Changed) -> None:
        self._store = store
        self._changed = changed
        self._lock = threading.Lock()
        #: The last change applied (None: not read yet), and in which generation.
        self._seen: int | None = None
        self._generation = -1

    def fresh(self) -> bool:
        store = self._store
        slot = store._slot()
        if (
            slot is not None
            and self._seen is not None
            and slot.generation == self._generation == store.generation
            and time.monotonic() - store.checked_at < FILE_CHECK_EVERY
        ):
            # The common case: this thread's connection, the file checked just now.
            try:
                with sqlite_gate():
                    last = slot.conn.execute(_LAST_CHANGE).fetchone()[0]
            except sqlite3.Error:
                return False
            if (last or 0) == self._seen:
                return True
        try:
            return store._run(self._poll)
        except Exception:  # the store's trouble: the attempt goes to the store and meets it
            return False

    def _poll(self, conn: sqlite3.Connection) -> bool:
        with self._lock:
            if self._generation != self._store.generation or self._seen is None:
                self._seen = int(conn.execute(_LAST_CHANGE).fetchone()[0] or 0)
                self._generation = self._store.generation
                self._changed(None, None)
                return True
            rows = conn.execute(
                "SELECT seq, scope FROM change WHERE seq > ? ORDER BY seq LIMIT ?", (self._seen, CHANGES_KEPT)
            ).fetchall()
            if rows and (rows[0][0] != self._seen + 1 or len(rows) == CHANGES_KEPT):
                self._changed(None, None)  # fell behind what the log keeps: start over
            else:
                for _, scope in rows:
                    self._changed(str(scope), None)
            if rows:
                self._seen = int(rows[-1][0])
        return True
