"""A cooldown store in one SQLite file, shared by every process on a host.

Each scope is one row ``(scope TEXT PRIMARY KEY, until_ms INTEGER NOT NULL)`` holding
the eligible time as wall-clock UTC epoch milliseconds. The later-wins extend is a
single upsert statement (``max(stored, new)``), so it is atomic across threads and
processes without any lock of our own.

Connections are private to one thread of one process: a connection opened before a
``fork`` is never used (nor closed) in the child, and the store pickles as its path and
options, so it can be handed to ``spawn`` workers.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import TypeVar

from .. import _forksafe
from ..errors import ConfigurationError, CooldownStoreError
from .allowance import ALLOWANCE_KEPT, Allowance, admit_allowance, merge_allowance, roll
from .base import Admission, Granted, Hold, check_scope, check_until
from .freshness import Freshness, check_outcome, merge_note

_T = TypeVar("_T")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_MS = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)
_MIN_MS = (datetime.min.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)

#: Rows whose time is older than this are deleted now and then by ``extend``.
_KEEP_EXPIRED_MS = 3_600_000
#: About one ``extend`` in this many also deletes long-expired rows.
_SWEEP_ONE_IN = 256

#: ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` needs SQLite 3.35.
_HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

_SCHEMA = "CREATE TABLE IF NOT EXISTS cooldown (scope TEXT PRIMARY KEY, until_ms INTEGER NOT NULL)"
#: Quota permits: one row per permit granted, per scope and quota (``"limit/per_ms"``),
#: with the time it stops counting (its grant + per + margin), deleted after that.
#: (Version 0.4's ``permit`` table, stamped before the transaction, is no longer used.)
_PERMIT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS permit_log (scope TEXT NOT NULL, quota TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS permit_log_scope ON permit_log (scope, quota, expires_ms)",
    "CREATE TABLE IF NOT EXISTS lease (scope TEXT NOT NULL, token TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL, PRIMARY KEY (scope, token))",
    # What servers announced (``allowance.Allowance``, one column per field).
    "CREATE TABLE IF NOT EXISTS allowance (scope TEXT PRIMARY KEY, remaining INTEGER NOT NULL, "
    "at_n INTEGER NOT NULL, until_ms INTEGER NOT NULL, n INTEGER NOT NULL, lim INTEGER NOT NULL, "
    "window_ms INTEGER NOT NULL, exact INTEGER NOT NULL)",
    # Freshness (``freshness.Freshness``): the last success, the last error class and when.
    "CREATE TABLE IF NOT EXISTS freshness (scope TEXT PRIMARY KEY, success_ms INTEGER, error TEXT, "
    "error_ms INTEGER)",
)
_UPSERT_RETURNING = (
    "INSERT INTO cooldown (scope, until_ms) VALUES (?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms) "
    "RETURNING until_ms"
)
_SELECT = "SELECT until_ms FROM cooldown WHERE scope = ?"
_SWEEP = "DELETE FROM cooldown WHERE until_ms < ?"
_DELETE = "DELETE FROM cooldown WHERE scope = ?"
_RELEASE = "DELETE FROM lease WHERE scope = ? AND token = ?"
_ALL = "SELECT scope, until_ms FROM cooldown ORDER BY until_ms DESC"
#: Freshness rows with their cooldown.
_FRESH = (
    "SELECT f.scope, f.success_ms, f.error, f.error_ms, c.until_ms FROM freshness f "
    "LEFT JOIN cooldown c ON c.scope = f.scope"
)
#: The cooldown, and whether an announced allowance runs (without a write transaction).
_PEEK = "SELECT (SELECT until_ms FROM cooldown WHERE scope = ?), (SELECT n FROM allowance WHERE scope = ?)"


def _quota(limit: int, per: float | None, margin: float) -> tuple[str, int]:
    """A quota's log name (``"limit/per_ms"``) and how long (ms) a permit counts."""
    if per is None:
        raise ConfigurationError("a quota needs a window (per)")
    per_ms = max(1, math.ceil(per * 1000))
    return f"{int(limit)}/{per_ms}", per_ms + math.ceil(margin * 1000)


def _present_ms() -> int:
    """The real present as UTC epoch milliseconds, rounded down."""
    return now_epoch_ms(datetime.now(timezone.utc))


def to_epoch_ms(until: datetime) -> int:
    """An aware datetime as UTC epoch milliseconds, rounded *up* (never earlier)."""
    micros = (until - _EPOCH) // timedelta(microseconds=1)
    return -(-micros // 1000)


def now_epoch_ms(now: datetime) -> int:
    """The present as UTC epoch milliseconds, rounded *down*: compared with a stored
    time (rounded up), a cooldown still runs until the real present reaches it."""
    micros = (now - _EPOCH) // timedelta(microseconds=1)
    return micros // 1000


def from_epoch_ms(ms: int) -> datetime:
    """UTC epoch milliseconds as an aware UTC datetime (clamped to datetime's range)."""
    if ms > _MAX_MS:  # datetime.max rounded up to a whole millisecond
        return datetime.max.replace(tzinfo=timezone.utc)
    if ms < _MIN_MS:
        return datetime.min.replace(tzinfo=timezone.utc)
    return _EPOCH + timedelta(milliseconds=ms)


#: The default lock wait (seconds) of one operation: far below a second, so a store
#: that is locked or stuck costs a call little (the failure layer then skips it).
DEFAULT_TIMEOUT = 0.25

_HEADER = b"SQLite format 3\x00"


def _freshness_row(row: tuple[object, ...]) -> Freshness:
    """A ``_FRESH`` row as a Freshness."""
    _, success, error, error_at, until = row

    def when(ms: object) -> datetime | None:
        return None if ms is None else from_epoch_ms(int(str(ms)))

    return Freshness(when(success), None if error is None else str(error), when(error_at), when(until))


def _file_state(path: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """``((device, inode), (mtime ns, size))`` of ``path``, or ``(None, None)`` when
    it does not exist (or cannot be examined)."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return (st.st_dev, st.st_ino), (st.st_mtime_ns, st.st_size)


def _looks_like_sqlite(path: str) -> bool:
    """Whether ``path`` is empty (SQLite writes its header on first use) or starts with
    the SQLite header."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_HEADER))
    except OSError:
        return True  # gone again: the next operation notices
    return head == b"" or head == _HEADER


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction taken at once (``BEGIN IMMEDIATE``): committed when the
    block ends, rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


def _intact(path: str, timeout: float) -> bool:
    """Whether SQLite's quick integrity check passes on ``path`` (a fresh connection)."""
    try:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
        return rows == [("ok",)]
    except sqlite3.Error:
        return False
    finally:
        conn.close()


class _Slot:
    """One thread's connection, held only by that thread's ``threading.local``.

    When the thread ends, its slot is freed and a finalizer closes the connection, so
    short-lived threads do not leak connections. ``generation`` is the store's
    generation the connection was opened in: a file deleted or replaced since makes the
    thread reopen.
    """

    __slots__ = ("__weakref__", "busy_ms", "conn", "generation", "pid")

    def __init__(self, conn: sqlite3.Connection, pid: int, busy_ms: int, generation: int) -> None:
        self.conn = conn
        self.pid = pid
        self.busy_ms = busy_ms
        self.generation = generation


#: Connections a forked child inherited: referenced forever and never closed in the child
#: (closing could checkpoint the parent's WAL or drop locks the parent relies on).
_INHERITED: list[sqlite3.Connection] = []


def _release(store_ref: weakref.ref[SQLiteCooldownStore], conn: sqlite3.Connection, pid: int) -> None:
    """A thread that used a store has ended (or the store is gone): close its connection,
    unless this is a forked child, where the connection belongs to the parent."""
    if os.getpid() != pid:
        _INHERITED.append(conn)
        return
    store = store_ref()
    if store is not None:
        store._forget(conn)
    with contextlib.suppress(sqlite3.Error):
        conn.close()


#: Primary SQLite result codes worth another attempt: BUSY, LOCKED, IOERR, PROTOCOL.
_TRANSIENT_CODES = frozenset({5, 6, 10, 15})


def _transient(exc: sqlite3.Error) -> bool:
    """Whether another attempt may succeed (a lock, not a missing or corrupt file)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return code is None or (code & 0xFF) in _TRANSIENT_CODES


def _restore(path: str, timeout: float) -> SQLiteCooldownStore:
    return SQLiteCooldownStore(path, timeout=timeout)


class SQLiteCooldownStore:
    """Cooldowns shared by every process and thread on one host through a SQLite file.

    ``path`` is the database file (created when missing; its directory must exist). A
    relative path is resolved against the working directory once, here. ``timeout``
    (seconds, default 0.25) bounds how long one ``get`` or ``extend`` waits for a lock
    held by another writer; past it the call raises :class:`CooldownStoreError`. No
    ``sqlite3`` error ever leaves the store.

    Every operation first compares the file's identity (device and inode) with the one
    it opened: a file deleted or replaced under running workers (old connections would
    keep the deleted inode while new ones made a fresh file: a split store) is noticed,
    every thread reopens the file at the path, and ``generation`` goes up, so the
    failure layer warns once and writes its cooldowns back. A file whose content is no
    longer a SQLite database raises :class:`CooldownStoreError` (the failure policy
    applies) until it is replaced or deleted.

    Times are kept in whole milliseconds; ``extend`` rounds up, so a stored cooldown
    never ends earlier than asked. The file is in WAL mode: readers never wait for a
    writer, and one extend is one short write transaction. Rows expired for more than
    an hour are deleted now and then, so the file stays as small as the set of live
    scopes. The file must be on a local disk (SQLite locking over network file systems
    is unreliable); for several machines use :class:`RedisCooldownStore`.
    """

    #: ``admit`` stamps a permit with the time it grants it (``now`` None: the present
    #: read inside the operation) and keeps each quota's log and each permit's margin.
    stamps_grants = True

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            text = os.fspath(path)
        except TypeError:
            raise ConfigurationError("the SQLite cooldown path must be a str or path-like") from None
        if not isinstance(text, str):
            raise ConfigurationError("the SQLite cooldown path must be a str path, not bytes")
        if text in ("", ":memory:") or text.startswith("file:"):
            raise ConfigurationError(
                "the SQLite cooldown store needs a real file path that every process can open "
                "(not ':memory:', an empty path or a 'file:' URI)"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ConfigurationError("the SQLite cooldown timeout must be a number of seconds")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigurationError("the SQLite cooldown timeout must be a finite number of seconds > 0")
        full = os.path.abspath(text)
        directory = os.path.dirname(full)
        if not os.path.isdir(directory):
            raise ConfigurationError(
                f"the directory of the SQLite cooldown file does not exist: {directory!r} "
                "(create it first; the store does not create directories)"
            )
        if os.path.isdir(full):
            raise ConfigurationError(f"the SQLite cooldown path is a directory: {full!r}")
        self._path = full
        self._timeout = float(timeout)
        self._full_busy_ms = max(1, int(self._timeout * 1000))
        self._local = threading.local()
        self._lock = threading.Lock()
        # Every open connection this process made (one per live thread), for close().
        self._conns: set[sqlite3.Connection] = set()
        self._pid = os.getpid()
        self._closed = False
        #: Bumped when the file at the path is found deleted or replaced.
        self._generation = 0
        self._ident: tuple[int, int] | None = None
        self._version: tuple[int, int] | None = None
        self._bad = False
        self.replaced_reason = ""
        _forksafe.register(self)
        self._run(lambda conn: None)  # open now: a bad file fails here, not on the first 429

    # -- public API ---------------------------------------------------------------

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._path

    @property
    def timeout(self) -> float:
        """How long (seconds) one call may wait for the database before it fails."""
        return self._timeout

    @property
    def generation(self) -> int:
        """How many times this process found the file deleted or replaced (and reopened)."""
        return self._generation

    def get(self, scope: str) -> datetime | None:
        check_scope(scope)
        # fetchall(): the statement finishes here, so no read snapshot stays open.
        rows = self._run(lambda conn: conn.execute(_SELECT, (scope,)).fetchall())
        return from_epoch_ms(int(rows[0][0])) if rows else None

    def extend(self, scope: str, until: datetime) -> datetime:
        check_scope(scope)
        ms = to_epoch_ms(check_until(until))
        effective = self._run(lambda conn: self._upsert(conn, scope, ms))
        if random.randrange(_SWEEP_ONE_IN) == 0:
            self._sweep_quietly()
        return from_epoch_ms(effective)

    def acquire(
        self, scope: str, limit: int, per: float, now: datetime | None = None, margin: float = 0.0
    ) -> datetime | None:
        """Take a quota permit (see ``MemoryCooldownStore.admit``): one immediate
        transaction, so every process on the host agrees; the permit's time is read
        inside it (``now`` None: the real present)."""
        check_scope(scope)
        quota, count_ms = _quota(limit, per, margin)
        fixed = None if now is None else now_epoch_ms(check_until(now))

        def take(conn: sqlite3.Connection) -> int | None:
            with _immediate(conn):
                now_ms = fixed if fixed is not None else _present_ms()
                refused = self._permit_refused(conn, scope, quota, limit, now_ms)
                if refused is None:
                    self._take_permit(conn, scope, quota, now_ms + count_ms)
                return refused

        eligible = self._run(take)
        return None if eligible is None else from_epoch_ms(eligible)

    @staticmethod
    def _permit_refused(
        conn: sqlite3.Connection, scope: str, quota: str, limit: int, now_ms: int
    ) -> int | None:
        """Inside a write transaction: None when a permit of ``quota`` is free, else
        when one will be (ms). Permits that stopped counting are deleted."""
        conn.execute(
            "DELETE FROM permit_log WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, quota, now_ms)
        )
        rows = conn.execute(
            "SELECT expires_ms FROM permit_log WHERE scope = ? AND quota = ? "
            "ORDER BY expires_ms DESC LIMIT 1 OFFSET ?",
            (scope, quota, limit - 1),
        ).fetchall()
        return int(rows[0][0]) if rows else None

    @staticmethod
    def _take_permit(conn: sqlite3.Connection, scope: str, quota: str, expires_ms: int) -> None:
        conn.execute(
            "INSERT INTO permit_log (scope, quota, expires_ms) VALUES (?, ?, ?)", (scope, quota, expires_ms)
        )

    @staticmethod
    def _slot_refused(conn: sqlite3.Connection, scope: str, limit: int, now_ms: int) -> int | None:
        """Inside a write transaction: None when a slot is free, else when the earliest
        lease expires (ms); expired leases are dropped."""
        conn.execute("DELETE FROM lease WHERE scope = ? AND expires_ms <= ?", (scope, now_ms))
        rows = conn.execute(
            "SELECT count(*), min(expires_ms) FROM lease WHERE scope = ?", (scope,)
        ).fetchall()
        return None if int(rows[0][0]) < limit else int(rows[0][1])

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
    ) -> None:
        """Record the server's announced allowance (see ``MemoryCooldownStore.allow``):
        one immediate transaction."""
        check_scope(scope)
        until = check_until(until)
        now = check_until(now)

        def allow(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                current = self._allowance_row(conn, scope)
                merged = merge_allowance(current, int(remaining), until, now, seq, limit, window)
                if merged is not None:
                    self._put_allowance(conn, scope, merged)
                stale = to_epoch_ms(now) - int(ALLOWANCE_KEPT * 1000)
                conn.execute("DELETE FROM allowance WHERE until_ms <= ? AND scope != ?", (stale, scope))

        self._run(allow)

    @staticmethod
    def _allowance_row(conn: sqlite3.Connection, scope: str) -> Allowance | None:
        rows = conn.execute(
            "SELECT remaining, at_n, until_ms, n, lim, window_ms, exact FROM allowance WHERE scope = ?",
            (scope,),
        ).fetchall()
        if not rows:
            return None
        left, at, until, count, lim, window, exact = (int(v) for v in rows[0])
        return Allowance(left, at, from_epoch_ms(until), count, lim, window / 1000, bool(exact))

    @staticmethod
    def _put_allowance(conn: sqlite3.Connection, scope: str, record: Allowance) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO allowance VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                scope,
                record.left,
                record.at,
                to_epoch_ms(record.until),
                record.admitted,
                record.limit,
                round(record.window * 1000),
                int(record.exact),
            ),
        )

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        margin: float = 0.0,
    ) -> Admission:
        """Admission for one attempt (see ``MemoryCooldownStore.admit``): the cooldown,
        the announced allowance, the quota permit and the concurrency slot in one
        transaction, all or nothing (a plain read while the scope has none of them).
        ``now`` None: the real present, read once the transaction holds the lock, so a
        permit's time is when it is granted."""
        check_scope(scope)
        fixed = None if now is None else check_until(now)
        quota, count_ms = _quota(limit, per, margin) if limit is not None else (None, 0)

        def admit(conn: sqlite3.Connection) -> tuple[int | None, int | None, int | None, bool]:
            now = fixed if fixed is not None else datetime.now(timezone.utc)
            now_ms = now_epoch_ms(now)
            if quota is None and lease is None:
                # Nothing to take: a plain read, unless the scope's admissions are counted.
                rows = conn.execute(_PEEK, (scope, scope)).fetchall()
                cooldown = None if rows[0][0] is None else int(rows[0][0])
                if cooldown is not None and cooldown > now_ms:
                    return cooldown, cooldown, None, False
                if rows[0][1] is None:
                    return cooldown, None, None, False
            with _immediate(conn):
                if fixed is None:
                    now = datetime.now(timezone.utc)  # the lock is ours: this is the grant's time
                    now_ms = now_epoch_ms(now)
                rows = conn.execute(_SELECT, (scope,)).fetchall()
                cooldown = int(rows[0][0]) if rows else None
                if cooldown is not None and cooldown > now_ms:
                    return cooldown, cooldown, None, False
                record = self._allowance_row(conn, scope)
                rolled = None
                if record is not None:
                    rolled, wait = admit_allowance(record, now)
                    if wait is not None:
                        if rolled != record:
                            self._put_allowance(conn, scope, rolled)
                        return cooldown, to_epoch_ms(wait), None, False
                if quota is not None and limit is not None:
                    refused = self._permit_refused(conn, scope, quota, limit, now_ms)
                    if refused is not None:
                        return cooldown, refused, None, False
                if lease is not None:
                    busy = self._slot_refused(conn, scope, lease[0], now_ms)
                    if busy is not None:
                        return cooldown, busy, None, True
                    expires = now_ms + max(1, math.ceil(lease[1] * 1000))
                    conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, lease[2], expires))
                if quota is not None:
                    permits.append(now_ms + count_ms)
                    self._take_permit(conn, scope, quota, permits[-1])
                if rolled is None:
                    return cooldown, None, None, False
                self._put_allowance(conn, scope, rolled)
            return cooldown, None, rolled.admitted - 1, False

        permits: list[int] = []
        cooldown, wait, seq, busy = self._run(admit)
        stored = None if cooldown is None else from_epoch_ms(cooldown)
        if permits and wait is None:
            return Granted.of(from_epoch_ms(permits[-1]), stored, seq)
        return Admission(stored, None if wait is None else from_epoch_ms(wait), seq, busy)

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: the present, read inside the transaction): the permit counts at least
        until ``now + per`` (see ``MemoryCooldownStore.settle``; put back if it expired
        meanwhile)."""
        check_scope(scope)
        quota, per_ms = _quota(limit, per, 0.0)
        old = to_epoch_ms(check_until(expires))
        fixed = None if now is None else now_epoch_ms(check_until(now))

        def settle(conn: sqlite3.Connection) -> None:
            new = (fixed if fixed is not None else _present_ms()) + per_ms
            if new <= old:
                return
            with _immediate(conn):
                moved = conn.execute(
                    "UPDATE permit_log SET expires_ms = ? WHERE rowid = (SELECT rowid FROM permit_log "
                    "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1)",
                    (new, scope, quota, old),
                ).rowcount
                if not moved:  # expired (and deleted) meanwhile: put back
                    self._take_permit(conn, scope, quota, new)

        self._run(settle)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class (see ``MemoryCooldownStore.note``): one
        immediate transaction."""
        check_scope(scope)
        check_outcome(outcome)
        at = check_until(at)

        def note(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                rows = conn.execute(_FRESH + " WHERE f.scope = ?", (scope,)).fetchall()
                merged = merge_note(_freshness_row(rows[0]) if rows else None, outcome, at)
                conn.execute(
                    "INSERT OR REPLACE INTO freshness VALUES (?, ?, ?, ?)",
                    (
                        scope,
                        None if merged.last_success is None else to_epoch_ms(merged.last_success),
                        merged.last_error,
                        None if merged.last_error_at is None else to_epoch_ms(merged.last_error_at),
                    ),
                )

        self._run(note)

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness (see ``MemoryCooldownStore.freshness``)."""
        check_scope(scope)
        rows = self._run(lambda conn: conn.execute(_FRESH + " WHERE f.scope = ?", (scope,)).fetchall())
        if rows:
            return _freshness_row(rows[0])
        until = self.get(scope)
        return None if until is None else Freshness(next_eligible=until)

    def freshness_entries(self) -> dict[str, Freshness]:
        """Every scope's freshness (see ``MemoryCooldownStore.freshness``)."""
        rows = self._run(lambda conn: conn.execute(_FRESH).fetchall())
        found = {str(row[0]): _freshness_row(row) for row in rows}
        for scope, until in self.entries().items():
            found.setdefault(scope, Freshness(next_eligible=until))
        return found

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> datetime | None:
        """Take a concurrency slot (see ``MemoryCooldownStore.lease``): one immediate
        transaction, so every process on the host agrees."""
        check_scope(scope)
        now_ms = now_epoch_ms(check_until(now))
        ttl_ms = max(1, math.ceil(ttl * 1000))
        earliest = self._run(lambda conn: self._hold(conn, scope, limit, ttl_ms, now_ms, token))
        return None if earliest is None else from_epoch_ms(earliest)

    @staticmethod
    def _hold(
        conn: sqlite3.Connection, scope: str, limit: int, ttl_ms: int, now_ms: int, token: str
    ) -> int | None:
        with _immediate(conn):
            busy = SQLiteCooldownStore._slot_refused(conn, scope, limit, now_ms)
            if busy is None:
                conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, token, now_ms + ttl_ms))
        return busy

    def release(self, scope: str, token: str) -> None:
        """Give a concurrency slot back."""
        check_scope(scope)
        self._run(
            lambda conn: conn.execute("DELETE FROM lease WHERE scope = ? AND token = ?", (scope, token))
        )

    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back (an operator clearing it): its
        cooldown, announced allowance, quota permits and concurrency leases, in one
        transaction; True if there was any of them."""
        check_scope(scope)

        def delete(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                return sum(
                    conn.execute(f"DELETE FROM {table} WHERE scope = ?", (scope,)).rowcount  # noqa: S608
                    for table in ("cooldown", "allowance", "permit_log", "lease")
                )

        return bool(self._run(delete))

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        """Every scope held back at ``now`` (default: the present) and by what (see
        ``MemoryCooldownStore.holds``)."""
        now = now if now is not None else datetime.now(timezone.utc)
        now_ms = now_epoch_ms(now)

        def read(conn: sqlite3.Connection) -> dict[str, list[Hold]]:
            found: dict[str, list[Hold]] = {}
            cooldowns = conn.execute("SELECT scope, until_ms FROM cooldown WHERE until_ms > ?", (now_ms,))
            for scope, until in cooldowns.fetchall():
                found.setdefault(str(scope), []).append(Hold("cooldown", from_epoch_ms(int(until))))
            for (scope,) in conn.execute("SELECT scope FROM allowance").fetchall():
                record = self._allowance_row(conn, str(scope))
                rolled = roll(record, now) if record is not None else None
                if rolled is not None and rolled.until > now and rolled.remaining <= 0:
                    found.setdefault(str(scope), []).append(Hold("allowance", rolled.until))
            logs: dict[tuple[str, str], list[int]] = {}
            for scope, quota, expires in conn.execute(
                "SELECT scope, quota, expires_ms FROM permit_log WHERE expires_ms > ? ORDER BY expires_ms",
                (now_ms,),
            ).fetchall():
                logs.setdefault((str(scope), str(quota)), []).append(int(expires))
            for (scope, quota), live in logs.items():
                limit = int(quota.split("/", 1)[0])
                if len(live) >= limit:
                    until = from_epoch_ms(live[len(live) - limit])
                    found.setdefault(scope, []).append(Hold("quota", until, limit))
            for scope, count, last in conn.execute(
                "SELECT scope, count(*), max(expires_ms) FROM lease WHERE expires_ms > ? GROUP BY scope",
                (now_ms,),
            ).fetchall():
                found.setdefault(str(scope), []).append(Hold("leases", from_epoch_ms(int(last)), int(count)))
            return found

        return self._run(read)

    def entries(self) -> dict[str, datetime]:
        """Every stored scope and its eligible time (long-expired rows are swept now and
        then, so a few past times may be among them)."""
        rows = self._run(lambda conn: conn.execute(_ALL).fetchall())
        return {str(scope): from_epoch_ms(int(ms)) for scope, ms in rows}

    def close(self) -> None:
        """Close this process's connections. The store cannot be used afterwards."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def __enter__(self) -> SQLiteCooldownStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[[str, float], SQLiteCooldownStore], tuple[str, float]]:
        # Only the path and options travel; each process opens its own connections.
        return (_restore, (self._path, self._timeout))

    def __repr__(self) -> str:
        return f"SQLiteCooldownStore({self._path!r}, timeout={self._timeout})"

    # -- internals ----------------------------------------------------------------

    def sweep(self, older_than_ms: int = _KEEP_EXPIRED_MS) -> int:
        """Delete rows whose time is more than ``older_than_ms`` in the past; return how many.

        ``extend`` calls this by itself about once in 256 calls.
        """
        cutoff = to_epoch_ms(datetime.now(timezone.utc)) - older_than_ms
        return self._run(lambda conn: conn.execute(_SWEEP, (cutoff,)).rowcount)

    def _sweep_quietly(self) -> None:
        with contextlib.suppress(CooldownStoreError):  # housekeeping: the next sweep catches up
            self.sweep()

    @staticmethod
    def _upsert(conn: sqlite3.Connection, scope: str, ms: int) -> int:
        if _HAS_RETURNING:
            # fetchall(): the statement (and its implicit transaction) ends here.
            rows = conn.execute(_UPSERT_RETURNING, (scope, ms)).fetchall()
            return int(rows[0][0])
        return SQLiteCooldownStore._upsert_in_transaction(conn, scope, ms)

    @staticmethod
    def _upsert_in_transaction(conn: sqlite3.Connection, scope: str, ms: int) -> int:
        """The same later-wins write for SQLite older than 3.35 (no RETURNING)."""
        with _immediate(conn):
            conn.execute("INSERT OR IGNORE INTO cooldown (scope, until_ms) VALUES (?, ?)", (scope, ms))
            conn.execute("UPDATE cooldown SET until_ms = ? WHERE scope = ? AND until_ms < ?", (ms, scope, ms))
            rows = conn.execute(_SELECT, (scope,)).fetchall()
        return int(rows[0][0])

    def _slot(self) -> _Slot | None:
        """This thread's slot, if it was made in this process."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None and slot.pid == os.getpid():
            return slot
        return None

    def _connection(self) -> _Slot:
        if self._closed:
            raise CooldownStoreError(f"the SQLite cooldown store {self._path!r} is closed")
        self._check_file()
        slot = self._slot()
        if slot is not None:
            if slot.generation == self._generation:
                return slot
            self._forget(slot.conn)
            with contextlib.suppress(sqlite3.Error):
                slot.conn.close()
            self._local.slot = None
        pid = os.getpid()
        if self._pid != pid:  # forked without the at-fork hook (not expected on POSIX)
            self._after_fork()
        # Drop a slot inherited through fork: its finalizer sees the other pid and keeps
        # the parent's connection open.
        self._local.slot = None
        conn = sqlite3.connect(
            self._path,
            timeout=self._timeout,
            isolation_level=None,  # autocommit: each statement is its own transaction
            check_same_thread=False,  # only this thread uses it; close() may run elsewhere
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            for statement in _PERMIT_SCHEMA:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if self._closed:
                conn.close()
                raise CooldownStoreError(f"the SQLite cooldown store {self._path!r} is closed")
            self._conns.add(conn)
            generation = self._generation
            if self._ident is None:
                self._ident, self._version = _file_state(self._path)
        slot = _Slot(conn, pid, self._full_busy_ms, generation)
        weakref.finalize(slot, _release, weakref.ref(self), conn, pid)
        self._local.slot = slot
        return slot

    def _moved(self) -> bool:
        """Whether the file at the path is no longer the one opened (an operation on
        the old one then fails, for example read-only because its WAL was deleted)."""
        slot = self._slot()
        if slot is not None and slot.generation != self._generation:
            return True  # another thread found the file replaced: reopen and try again
        return self._ident is not None and _file_state(self._path)[0] != self._ident

    def _check_file(self) -> None:
        """Notice a file deleted or replaced (a new generation: every thread reopens)
        or overwritten with something that is not a database (raise)."""
        ident, version = _file_state(self._path)
        if ident != self._ident or version != self._version:
            with self._lock:
                ident, version = _file_state(self._path)
                if ident != self._ident and (self._ident is not None or ident is not None):
                    if self._ident is not None:  # a first open (None) is not a replacement
                        self._generation += 1
                        self.replaced_reason = (
                            "the database file was deleted"
                            if ident is None
                            else "the database file was replaced"
                        )
                    self._ident = None  # set again when a connection opens the new file
                    self._bad = False
                if version != self._version:
                    self._version = version
                    was_bad = self._bad
                    self._bad = ident is not None and not _looks_like_sqlite(self._path)
                    if was_bad and not self._bad and not _intact(self._path, self._timeout):
                        self._bad = True  # the header came back (a checkpoint), the rest did not
                    if was_bad and not self._bad:  # a database again: reopen and write back
                        self._generation += 1
                        self.replaced_reason = "the database file was replaced"
        if self._bad:
            raise sqlite3.DatabaseError("file is not a database")

    def _forget(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _after_fork(self) -> None:
        """In a forked child: the parent's connections stay open and untouched; the
        child opens its own on first use."""
        self._lock = threading.Lock()  # a parent thread may have held it during fork
        _INHERITED.extend(self._conns)
        self._conns = set()
        self._pid = os.getpid()

    @staticmethod
    def _set_busy(slot: _Slot, ms: int) -> None:
        if slot.busy_ms != ms:
            slot.conn.execute(f"PRAGMA busy_timeout = {int(ms)}")
            slot.busy_ms = ms

    def _run(self, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``operation`` on this thread's connection.

        Transient errors (locked, busy, I/O) are retried with a short backoff until
        ``timeout`` has passed, each attempt waiting for locks only as long as the budget
        has left; then, or at once for a permanent error, CooldownStoreError is raised.
        No sqlite3 exception escapes.
        """
        deadline = time.monotonic() + self._timeout
        busy_ms = self._full_busy_ms
        pause = 0.002
        while True:
            try:
                slot = self._connection()
                self._set_busy(slot, busy_ms)
                return operation(slot.conn)
            except sqlite3.Error as exc:
                self._after_error()
                if not _transient(exc) and not self._moved():
                    raise self._failure(exc, waited=False) from exc
                error = exc  # a lock, or a file replaced under this connection: again
            left = deadline - time.monotonic()
            if left > 0:
                time.sleep(min(left, pause * (0.5 + random.random())))
                pause = min(pause * 2, 0.05)
                left = deadline - time.monotonic()
            if left <= 0:
                raise self._failure(error, waited=True) from error
            busy_ms = max(1, int(left * 1000))

    def _after_error(self) -> None:
        slot = self._slot()
        with contextlib.suppress(sqlite3.Error):
            if slot is not None and slot.conn.in_transaction:
                slot.conn.execute("ROLLBACK")

    def _failure(self, exc: sqlite3.Error, *, waited: bool) -> CooldownStoreError:
        reason = str(exc) or type(exc).__name__
        after = f" after trying for {self._timeout:g} s" if waited else ""
        return CooldownStoreError(
            f"the SQLite cooldown store {self._path!r} is unavailable ({reason}){after}",
            busy=waited,  # locks held by other writers past the timeout: contention
        )
