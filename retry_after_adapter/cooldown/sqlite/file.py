"""The SQLite file behind :class:`~.sqlite.SQLiteCooldownStore`: one connection per
thread of each process, the schema, and what happens when the file is locked, deleted,
replaced or overwritten.

Connections are private to one thread of one process: a connection opened before a
``fork`` is never used (nor closed) in the child. Every operation first compares the
file's identity (device and inode) with the one it opened: a file deleted or replaced
under running workers is noticed, every thread reopens it, and ``generation`` goes up.
Transient errors (locked, busy, I/O) are retried within the store's ``timeout``; no
``sqlite3`` error ever leaves: each is raised as :class:`CooldownStoreError`.
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
from typing import TypeVar
from urllib.request import pathname2url

from ... import _forksafe
from ...errors import ConfigurationError, CooldownStoreError, failure_cause
from ..base import quiesce_guard

_T = TypeVar("_T")

#: The default lock wait (seconds) of one operation: far below a second, so a store
#: that is locked or stuck costs a call little (the failure layer then skips it).
DEFAULT_TIMEOUT = 0.25

#: Entries of the change log kept (see below).
CHANGES_KEPT = 1024

#: The columns of a learned rate, one per field of ``rate.Rate`` (``rate.rate_row``).
RATE_COLUMNS = (
    "cap", "lim", "window_ms", "epoch", "start_ms", "base_ms", "sent", "ok", "grown", "grace", "quiet",
    "probed", "fails",
)  # fmt: skip

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
    # Open permits (taken to count until their answer settles them), beside their row of
    # permit_log: when that row stops counting, and when it would have (grant + per +
    # margin) had the answer come in time; deleted when settled.
    "CREATE TABLE IF NOT EXISTS open_permit (scope TEXT NOT NULL, quota TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL, expected_ms INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS open_permit_scope ON open_permit (scope, quota, expires_ms)",
    # The sweep of any scope's open permits that ran out (never a scan of the table).
    "CREATE INDEX IF NOT EXISTS open_permit_expires ON open_permit (expires_ms)",
    # Reservations not yet used (``base.Reservations``), beside their row of permit_log:
    # its end, the priority it was placed with, its place, and whether it was sent;
    # deleted when given back or ended.
    "CREATE TABLE IF NOT EXISTS reservation (scope TEXT NOT NULL, quota TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL, priority INTEGER NOT NULL, place_ms INTEGER NOT NULL, "
    "sent INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS reservation_scope ON reservation (scope, quota, expires_ms)",
    "CREATE INDEX IF NOT EXISTS reservation_expires ON reservation (expires_ms)",
    # Token permits (a ``Quota(..., unit="tokens")``): one row per permit, its cost in
    # tokens and when it stops counting (its grant + per + margin), per scope and quota.
    "CREATE TABLE IF NOT EXISTS token_log (scope TEXT NOT NULL, quota TEXT NOT NULL, "
    "expires_ms INTEGER NOT NULL, cost INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS token_log_scope ON token_log (scope, quota, expires_ms)",
    "CREATE INDEX IF NOT EXISTS token_log_expires ON token_log (expires_ms)",
    # Learned rates (``rate.Rate``, one column per field as ``rate.rate_row`` gives
    # them; times in ms). (Version 0.9's ``rate`` table, of another record, is no longer
    # used.)
    "CREATE TABLE IF NOT EXISTS learned_rate (scope TEXT PRIMARY KEY, "
    + ", ".join(f"{column} INTEGER NOT NULL" for column in RATE_COLUMNS)
    + ")",
    "CREATE INDEX IF NOT EXISTS learned_rate_ended ON learned_rate (start_ms + window_ms)",
    # When each row stops mattering, so that the rows of every scope are swept a few at a
    # time as others are written (see ``store.py`` and ``rules.py``), never by a
    # scan of a table.
    "CREATE INDEX IF NOT EXISTS cooldown_until ON cooldown (until_ms)",
    "CREATE INDEX IF NOT EXISTS permit_log_expires ON permit_log (expires_ms)",
    "CREATE INDEX IF NOT EXISTS lease_expires ON lease (expires_ms)",
    "CREATE INDEX IF NOT EXISTS allowance_until ON allowance (until_ms)",
    # When a freshness row was last noted: the very expression ``sqlite._SWEEP_FRESHNESS``
    # compares, so that this index serves it.
    "CREATE INDEX IF NOT EXISTS freshness_noted ON freshness "
    "(max(coalesce(success_ms, 0), coalesce(error_ms, 0)))",
    # The change log every process's near copy follows: a scope whose cooldown was
    # written or deleted, or that was first announced an allowance. Written by triggers,
    # so that every writer of the file logs (an older version of this package too); the
    # last CHANGES_KEPT entries are kept (a reader further behind starts over).
    "CREATE TABLE IF NOT EXISTS change (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS cooldown_inserted AFTER INSERT ON cooldown "
    "BEGIN INSERT INTO change (scope) VALUES (NEW.scope); END",
    "CREATE TRIGGER IF NOT EXISTS cooldown_updated AFTER UPDATE ON cooldown "
    "BEGIN INSERT INTO change (scope) VALUES (NEW.scope); END",
    "CREATE TRIGGER IF NOT EXISTS cooldown_deleted AFTER DELETE ON cooldown "
    "BEGIN INSERT INTO change (scope) VALUES (OLD.scope); END",
    "CREATE TRIGGER IF NOT EXISTS allowance_announced BEFORE INSERT ON allowance "
    "WHEN NOT EXISTS (SELECT 1 FROM allowance WHERE scope = NEW.scope) "
    "BEGIN INSERT INTO change (scope) VALUES (NEW.scope); END",
    # A learned rate that stops being open (a throttle): near copies admit by it again.
    "CREATE TRIGGER IF NOT EXISTS learned_rate_closed AFTER UPDATE ON learned_rate "
    "WHEN OLD.cap + OLD.lim = 0 AND NEW.cap + NEW.lim != 0 "
    "BEGIN INSERT INTO change (scope) VALUES (NEW.scope); END",
    "CREATE TRIGGER IF NOT EXISTS change_kept AFTER INSERT ON change "
    "BEGIN DELETE FROM change WHERE seq <= NEW.seq - 1024; END",  # CHANGES_KEPT
)

#: SQLite's primary result code for a file that is not a database (SQLITE_NOTADB).
_NOTADB = 26


def _file_state(path: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """``((device, inode), (mtime ns, size))`` of ``path``, or ``(None, None)`` when
    it does not exist (or cannot be examined)."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return (st.st_dev, st.st_ino), (st.st_mtime_ns, st.st_size)


def _looks_like_sqlite(path: str) -> bool:
    """Whether ``path`` is empty (SQLite writes its header on first use) or begins as a
    SQLite database, as SQLite reads the file itself (not its WAL: ``immutable``).

    Read through a SQLite connection of its own, never a file descriptor of ours:
    closing any descriptor of the file drops every POSIX lock this process holds on it
    (the locks SQLite's connections in every thread rely on), after which another
    process's last connection, closing, checkpoints and deletes the WAL and the
    shared-memory index under this process's feet: two processes then count permits
    apart (over their quota) and their checkpoints corrupt the file. SQLite closes its
    own descriptor only once no connection of the process holds a lock on the file.
    Only SQLite's verdict "not a database" counts; any other error (the file gone
    again, a checkpoint half written) is for the next operation to meet."""
    uri = "file:" + pathname2url(path) + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return True  # gone again: the next operation notices
    try:
        conn.execute("PRAGMA schema_version").fetchall()
    except sqlite3.Error as exc:
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) != _NOTADB
    finally:
        conn.close()
    return True


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
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


class _ForkGate:
    """No thread is inside SQLite when this process forks.

    SQLite keeps mutexes of its own (its memory allocator's, the table of open files): a
    thread of the parent inside SQLite at ``fork()`` leaves them held in the child,
    whose first ``sqlite3.connect`` then never returns. Every call into SQLite enters
    this gate (shared: threads do not wait for each other); ``fork()`` closes it first,
    waiting (at most :data:`FORK_WAIT` seconds) until no thread is inside, and holds it
    shut through the fork, so the child starts with every SQLite mutex free. A thread
    already inside enters again freely (a finalizer, a nested call); the forking thread
    may be inside itself. The child resets the gate in place; the parent reopens it."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._inside = 0  # threads inside (a thread inside again counts once)
        self._closer: int | None = None  # the thread forking, while the gate is shut
        self._depth = threading.local()  # how deep this thread is inside

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                # A fork waits for the threads inside: no other may come in meanwhile
                # (the forking thread itself may: a finalizer run during the fork).
                while self._closer is not None and self._closer != threading.get_ident():
                    self._cond.wait()
                self._inside += 1
        self._depth.n = depth + 1
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                with self._cond:
                    self._inside -= 1
                    if not self._inside:
                        self._cond.notify_all()

    def close(self) -> None:
        """Before a fork: wait until no other thread is inside, and keep them out."""
        self._cond.acquire()
        me = threading.get_ident()
        self._closer = me
        own = 1 if getattr(self._depth, "n", 0) else 0  # the forking thread inside itself
        deadline = time.monotonic() + FORK_WAIT
        while self._inside > own and time.monotonic() < deadline:
            self._cond.wait(deadline - time.monotonic())

    def reopen(self) -> None:
        """After a fork, in the parent."""
        self._closer = None
        self._cond.notify_all()
        self._cond.release()

    def reset_in_child(self) -> None:
        """After a fork, in the child: the one thread is the forking one (inside, if it
        was); the lock is new (the parent's holder is not here)."""
        self._cond = threading.Condition(threading.RLock())
        self._inside = 1 if getattr(self._depth, "n", 0) else 0
        self._closer = None


#: The longest (seconds) a fork waits for the threads inside SQLite to come out: an
#: operation waits for a lock at most its store's timeout (0.25 s by default).
FORK_WAIT = 5.0
_GATE = _ForkGate()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_GATE.close, after_in_parent=_GATE.reopen, after_in_child=_GATE.reset_in_child)


def sqlite_gate() -> contextlib.AbstractContextManager[None]:
    """The gate every call into SQLite goes through (see :class:`_ForkGate`)."""
    return _GATE.inside()


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


#: Connections never closed here: a forked child's inherited ones (closing could
#: checkpoint the parent's WAL or drop locks the parent relies on), and at exit those of
#: threads still running (see ``_release``). Referenced forever.
_INHERITED: list[sqlite3.Connection] = []


def _release(store_ref: weakref.ref[SQLiteFile], conn: sqlite3.Connection, pid: int, owner: int) -> None:
    """A thread that used a store has ended (or the store is gone): close its connection,
    unless this is a forked child, where the connection belongs to the parent, or the
    interpreter is exiting while the thread that owns it (``owner``, a daemon thread of
    the failure layer) still runs: closing it under that thread's statement would free
    what SQLite is using (the process ends, and the file with it)."""
    if os.getpid() != pid:
        _INHERITED.append(conn)
        return
    if owner != threading.get_ident() and any(thread.ident == owner for thread in threading.enumerate()):
        _INHERITED.append(conn)
        return
    store = store_ref()
    if store is not None:
        store._forget(conn)
    with sqlite_gate(), contextlib.suppress(sqlite3.Error):
        conn.close()


#: Primary SQLite result codes worth another attempt: BUSY, LOCKED, IOERR, PROTOCOL.
_TRANSIENT_CODES = frozenset({5, 6, 10, 15})


def _transient(exc: sqlite3.Error) -> bool:
    """Whether another attempt may succeed (a lock, not a missing or corrupt file)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return code is None or (code & 0xFF) in _TRANSIENT_CODES


class SQLiteFile:
    """The file and its connections (the base of the SQLite store)."""

    def _open(self, path: str | os.PathLike[str], timeout: float) -> None:
        """Check the path and options, and open the file (a bad file fails here)."""
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
        #: When (time.monotonic()) the file's identity was last checked.
        self.checked_at = 0.0
        self._replaced_reason = ""
        _forksafe.register(self)
        self._run(lambda conn: None)  # open now: a bad file fails here, not on the first 429


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

    @property
    def replaced_reason(self) -> str:
        """Why the file was last found deleted or replaced ("": never)."""
        return self._replaced_reason

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
        weakref.finalize(slot, _release, weakref.ref(self), conn, pid, threading.get_ident())
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
        self.checked_at = time.monotonic()
        ident, version = _file_state(self._path)
        if ident != self._ident or version != self._version:
            with self._lock:
                ident, version = _file_state(self._path)
                if ident != self._ident and (self._ident is not None or ident is not None):
                    self._new_file(ident)
                if version != self._version:
                    self._new_version(ident, version)
        if self._bad:
            raise sqlite3.DatabaseError("file is not a database")

    def _new_file(self, ident: tuple[int, int] | None) -> None:
        """(Lock held.) The path names another file (``ident``), or none: deleted or
        replaced, a new generation (a first open is not a replacement)."""
        if self._ident is not None:
            self._generation += 1
            self._replaced_reason = (
                "the database file was deleted" if ident is None else "the database file was replaced"
            )
        self._ident = None  # set again when a connection opens the new file
        self._bad = False

    def _new_version(self, ident: tuple[int, int] | None, version: tuple[int, int] | None) -> None:
        """(Lock held.) The file changed in place: is it still a database? One that is
        a database again is reopened and written back (a new generation)."""
        self._version = version
        was_bad = self._bad
        self._bad = ident is not None and not _looks_like_sqlite(self._path)
        if was_bad and not self._bad and not _intact(self._path, self._timeout):
            self._bad = True  # the header came back (a checkpoint), the rest did not
        if was_bad and not self._bad:
            self._generation += 1
            self._replaced_reason = "the database file was replaced"

    def _forget(self, conn: sqlite3.Connection) -> None:
        # Without the lock: this runs from a finalizer, which the garbage collector may
        # call on a thread that holds the (not re-entrant) lock. One discard is atomic.
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
                with sqlite_gate():
                    slot = self._connection()
                    self._set_busy(slot, busy_ms)
                    return operation(slot.conn)
            except sqlite3.Error as exc:
                with sqlite_gate():
                    self._after_error()
                if not _transient(exc) and not self._moved():
                    raise self._failure(exc, waited=False) from exc
                # A lock, or a file replaced under this connection: again. Only the
                # message is kept: the exception's traceback would hold this frame (and
                # the thread's connection slot) in a reference cycle.
                error = sqlite3.OperationalError(str(exc) or type(exc).__name__)
                error.sqlite_errorcode = getattr(exc, "sqlite_errorcode", None)  # type: ignore[attr-defined]
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
        """``exc`` as the package's error, naming what it was (``failure_cause``: a full
        disk, a file that is not a database or may not be written, told apart from a
        lock held past the timeout)."""
        reason = str(exc) or type(exc).__name__
        after = f" after trying for {self._timeout:g} s" if waited else ""
        cause, lasting = failure_cause(exc)
        return CooldownStoreError(
            f"the SQLite cooldown store {self._path!r} is unavailable: {cause} ({reason}){after}",
            busy=waited,  # locks held by other writers past the timeout: contention
            cause=cause,
            lasting=lasting and not waited,
        )

    def close(self) -> None:
        """Close this process's connections. The store cannot be used afterwards."""
        quiesce_guard(self)
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
        for conn in conns:
            with sqlite_gate(), contextlib.suppress(sqlite3.Error):
                conn.close()
