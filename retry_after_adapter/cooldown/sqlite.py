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

import collections
import contextlib
import math
import os
import random
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone

from ..errors import ConfigurationError, CooldownStoreError
from ._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms, window_ms
from ._sqlite_file import DEFAULT_TIMEOUT, RATE_COLUMNS, SQLiteFile, immediate
from .allowance import ALLOWANCE_KEPT, Allowance, admit_allowance, admit_more, merge_allowance, roll
from .base import (
    Admission,
    Ask,
    Changed,
    Feed,
    FullStore,
    Granted,
    Hold,
    Learn,
    Lease,
    RateHeld,
    check_scope,
    check_until,
    extra_permits,
    free_at,
)
from .freshness import FRESHNESS_KEPT, Freshness, check_outcome, merge_note
from .rate import (
    OPEN_KEPT,
    PROBE_RECHECK,
    RATE_KEPT,
    Rate,
    answer_rate,
    fresh_rate,
    rate_from_row,
    rate_holds,
    rate_row,
    roll_rate,
)

__all__ = ["DEFAULT_TIMEOUT", "SQLiteCooldownStore"]

#: Rows whose time is older than this are deleted now and then by ``extend``.
_KEEP_EXPIRED_MS = 3_600_000
#: About one ``extend`` in this many also deletes long-expired rows (at most
#: ``_SWEEP_ONE_IN`` of them: more than one per ``extend``, never a long transaction).
_SWEEP_ONE_IN = 256
#: Rows of other scopes that stopped mattering deleted by each write that may add one
#: (a permit or a lease taken, an allowance, a note): more than the one row a write
#: adds, so the tables stay as small as what still matters. Each finds them through an
#: index on when they stop mattering: never a scan of a table.
_SWEEP_PER_WRITE = 8

#: ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` needs SQLite 3.35.
_HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

_UPSERT_RETURNING = (
    "INSERT INTO cooldown (scope, until_ms) VALUES (?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms) "
    "RETURNING until_ms"
)
_SELECT = "SELECT until_ms FROM cooldown WHERE scope = ?"
_SWEEP = "DELETE FROM cooldown WHERE until_ms < ?"
_SWEEP_SOME = "DELETE FROM cooldown WHERE rowid IN (SELECT rowid FROM cooldown WHERE until_ms < ? LIMIT ?)"
#: A few rows of any scope that stopped mattering: permits that stopped counting,
#: leases that expired, allowances ``ALLOWANCE_KEPT`` past their reset, freshness
#: ``FRESHNESS_KEPT`` past its last note.
_SWEEP_PERMITS = (
    "DELETE FROM permit_log WHERE rowid IN (SELECT rowid FROM permit_log WHERE expires_ms <= ? LIMIT ?)"
)
_SWEEP_LEASES = "DELETE FROM lease WHERE rowid IN (SELECT rowid FROM lease WHERE expires_ms <= ? LIMIT ?)"
_SWEEP_ALLOWANCE = (
    "DELETE FROM allowance WHERE rowid IN "
    "(SELECT rowid FROM allowance WHERE until_ms <= ? AND scope != ? LIMIT ?)"
)
#: (The expression of the ``freshness_noted`` index, as it is written there.)
_SWEEP_FRESHNESS = (
    "DELETE FROM freshness WHERE rowid IN (SELECT rowid FROM freshness "
    "WHERE max(coalesce(success_ms, 0), coalesce(error_ms, 0)) <= ? LIMIT ?)"
)
_FRESHNESS_KEPT_MS = int(FRESHNESS_KEPT * 1000)
_DELETE = "DELETE FROM cooldown WHERE scope = ?"
_RELEASE = "DELETE FROM lease WHERE scope = ? AND token = ?"
_ALL = "SELECT scope, until_ms FROM cooldown ORDER BY until_ms DESC"
#: Freshness rows with their cooldown.
_FRESH = (
    "SELECT f.scope, f.success_ms, f.error, f.error_ms, c.until_ms FROM freshness f "
    "LEFT JOIN cooldown c ON c.scope = f.scope"
)
#: The cooldown, and whether an announced allowance runs (without a write transaction).
_PEEK = (
    "SELECT (SELECT until_ms FROM cooldown WHERE scope = ?), (SELECT n FROM allowance WHERE scope = ?), "
    "(SELECT cap + lim FROM learned_rate WHERE scope = ?)"
)
#: A few learned rates unused for ``RATE_KEPT`` (an open one for ``OPEN_KEPT``: see
#: ``rate.rate_kept_until``) are dropped per new one.
_SWEEP_RATES = (
    "DELETE FROM learned_rate WHERE scope IN (SELECT scope FROM learned_rate WHERE start_ms + window_ms <= ? "
    "AND (cap + lim != 0 OR start_ms + window_ms <= ?) LIMIT ?)"
)
#: A scope's learned rate, read and written (an update keeps the row: no trigger of a
#: delete fires).
_RATE_ROW = f"SELECT {', '.join(RATE_COLUMNS)} FROM learned_rate WHERE scope = ?"  # noqa: S608
_PUT_RATE = (
    f"INSERT INTO learned_rate VALUES (?{', ?' * len(RATE_COLUMNS)}) ON CONFLICT (scope) DO UPDATE SET "  # noqa: S608
    + ", ".join(f"{column} = excluded.{column}" for column in RATE_COLUMNS)
)
#: Every table with rows of a scope (``delete`` lifts them all).
_SCOPE_TABLES = ("cooldown", "allowance", "permit_log", "open_permit", "lease", "learned_rate")


def _quota(limit: int, per: float | None, margin: float, opened: float = 0.0) -> tuple[str, int, int, int]:
    """A quota's log name (``"limit/per_ms"``), how long (ms) a permit counts (an open
    one ``opened`` seconds longer), how long it would count had its answer come in
    time (0: not open), and its per (ms)."""
    if per is None:
        raise ConfigurationError("a quota needs a window (per)")
    per_ms = window_ms(per)
    counts = per_ms + math.ceil(margin * 1000)
    return f"{int(limit)}/{per_ms}", counts + math.ceil(opened * 1000), counts if opened > 0 else 0, per_ms


def _freshness_row(row: tuple[object, ...]) -> Freshness:
    """A ``_FRESH`` row as a Freshness."""
    _, success, error, error_at, until = row

    def when(ms: object) -> datetime | None:
        return None if ms is None else from_epoch_ms(int(str(ms)))

    return Freshness(when(success), None if error is None else str(error), when(error_at), when(until))


def _restore(path: str, timeout: float, push: bool = True) -> SQLiteCooldownStore:
    return SQLiteCooldownStore(path, timeout=timeout, push=push)


class SQLiteCooldownStore(SQLiteFile, FullStore):
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
    writer, and one extend is one short write transaction. Rows that can no longer
    matter are deleted a few at a time as others are written (permits that stopped
    counting, leases that expired, an allowance an hour after its reset, freshness 30
    days after its last note; cooldowns an hour after they ended, now and then), each
    found through an index, so the file stays as small as the set of live scopes and no
    operation scans a table. The file must be on a local disk (SQLite locking over network file systems
    is unreliable); for several machines use :class:`RedisCooldownStore`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT, push: bool = True
    ) -> None:
        if not isinstance(push, bool):
            raise ConfigurationError("push must be True or False")
        #: Whether each process keeps a near copy that follows the file's change log
        #: (False: every attempt reads the file).
        self._push = push
        self._open(path, timeout)

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

    @staticmethod
    def _permit_refused(
        conn: sqlite3.Connection, scope: str, quota: str, limit: int, now_ms: int, per_ms: int = 0
    ) -> int | None:
        """Inside a write transaction: None when a permit of ``quota`` is free, else the
        earliest time (ms) one could be (an open permit counted as ending at its grant +
        per + margin, or now + ``per_ms`` if later: see ``base.free_at``). Permits that
        stopped counting are deleted: the scope's, and a few of other scopes'."""
        conn.execute(
            "DELETE FROM permit_log WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, quota, now_ms)
        )
        conn.execute(_SWEEP_PERMITS, (now_ms, _SWEEP_PER_WRITE))
        rows = conn.execute(
            "SELECT expires_ms FROM permit_log WHERE scope = ? AND quota = ? "
            "ORDER BY expires_ms DESC LIMIT 1 OFFSET ?",
            (scope, quota, limit - 1),
        ).fetchall()
        if not rows:
            return None
        conn.execute("DELETE FROM open_permit WHERE expires_ms <= ?", (now_ms,))
        opened = conn.execute(
            "SELECT expires_ms, expected_ms FROM open_permit WHERE scope = ? AND quota = ?", (scope, quota)
        ).fetchall()
        if not opened:
            return int(rows[0][0])
        count = int(
            conn.execute(
                "SELECT count(*) FROM permit_log WHERE scope = ? AND quota = ?", (scope, quota)
            ).fetchall()[0][0]
        )
        wanted = count - limit + 1
        ends = conn.execute(
            "SELECT expires_ms FROM permit_log WHERE scope = ? AND quota = ? ORDER BY expires_ms LIMIT ?",
            (scope, quota, wanted + len(opened)),
        ).fetchall()
        skip = collections.Counter(int(row[0]) for row in opened)
        closed = []
        for (end,) in ends:
            if skip[int(end)] > 0:
                skip[int(end)] -= 1
            else:
                closed.append(int(end))
        return free_at(closed, [int(row[1]) for row in opened], limit, count, now_ms + per_ms)

    @staticmethod
    def _take_permit(
        conn: sqlite3.Connection, scope: str, quota: str, expires_ms: int, expected_ms: int = 0
    ) -> None:
        """Inside a write transaction: a permit of ``quota`` counting until
        ``expires_ms``; ``expected_ms`` > 0: an open one (see ``Store.admit``)."""
        conn.execute(
            "INSERT INTO permit_log (scope, quota, expires_ms) VALUES (?, ?, ?)", (scope, quota, expires_ms)
        )
        if expected_ms:
            conn.execute(
                "INSERT INTO open_permit VALUES (?, ?, ?, ?)", (scope, quota, expires_ms, expected_ms)
            )

    @staticmethod
    def _slot_refused(conn: sqlite3.Connection, scope: str, limit: int, now_ms: int) -> int | None:
        """Inside a write transaction: None when a slot is free, else when the earliest
        lease expires (ms); expired leases are dropped (the scope's, and a few of other
        scopes', a killed worker's)."""
        conn.execute("DELETE FROM lease WHERE scope = ? AND expires_ms <= ?", (scope, now_ms))
        conn.execute(_SWEEP_LEASES, (now_ms, _SWEEP_PER_WRITE))
        rows = conn.execute(
            "SELECT count(*), min(expires_ms) FROM lease WHERE scope = ?", (scope,)
        ).fetchall()
        return None if int(rows[0][0]) < limit else int(rows[0][1])

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        """Record the server's announced allowance (see ``MemoryCooldownStore.allow``):
        one immediate transaction."""
        check_scope(scope)
        until = check_until(until)
        now = check_until(now)

        def allow(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                current = self._allowance_row(conn, scope)
                merged = merge_allowance(current, int(remaining), until, now, seq, limit, window)
                if merged is not None:
                    self._put_allowance(conn, scope, merged)
                stale = to_epoch_ms(now) - int(ALLOWANCE_KEPT * 1000)
                conn.execute(_SWEEP_ALLOWANCE, (stale, scope, _SWEEP_PER_WRITE))

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

    def admit(self, ask: Ask) -> Admission:
        """Admission for one attempt (see ``MemoryCooldownStore.admit``): the cooldown,
        the announced allowance, the quota permit and the concurrency slot in one
        transaction, all or nothing (a plain read while the scope has none of them).
        ``now`` None: the real present, read once the transaction holds the lock, so a
        permit's time is when it is granted."""
        scope, now, limit, per, lease, margin, batch, hold, learn, opened = ask
        check_scope(scope)
        fixed = None if now is None else check_until(now)
        quota = _quota(limit, per, margin, opened) if limit is not None else None
        nothing_to_take = quota is None and lease is None

        def admit(conn: sqlite3.Connection) -> Admission:
            if nothing_to_take:
                peeked = self._peek(conn, scope, fixed, learn is not None)
                if peeked is not None:
                    return peeked
            with immediate(conn):
                at = fixed or datetime.now(timezone.utc)  # the lock is ours: the grant's time
                return self._admit_locked(conn, scope, at, limit, quota, lease, batch, hold, learn)

        return self._run(admit)

    @staticmethod
    def _peek(conn: sqlite3.Connection, scope: str, fixed: datetime | None, learn: bool) -> Admission | None:
        """Without a write transaction: the answer when nothing is to be taken, the
        scope's admissions are not counted (no announced allowance) and, when
        ``learn``, its learned rate takes nothing (its cap lifted, no limit); else None."""
        rows = conn.execute(_PEEK, (scope, scope, scope)).fetchall()
        cooldown = None if rows[0][0] is None else from_epoch_ms(int(rows[0][0]))
        now = fixed or datetime.now(timezone.utc)
        if cooldown is not None and cooldown > now:
            return Admission(cooldown, cooldown)
        if rows[0][1] is not None or (learn and rows[0][2] != 0):
            return None
        return Admission(cooldown, None)

    def _admit_locked(
        self, conn: sqlite3.Connection, scope: str, now: datetime, limit: int | None,
        quota: tuple[str, int, int, int] | None, lease: Lease | None, batch: int = 1, hold: float = 0.0,
        learn: Learn | None = None,
    ) -> Admission:
        """Inside the write transaction: the whole admission at ``now`` (``batch``,
        ``hold``: extra permits; ``learn``: the learned rate, see ``Store.admit``)."""
        now_ms = now_epoch_ms(now)
        rows = conn.execute(_SELECT, (scope,)).fetchall()
        cooldown = from_epoch_ms(int(rows[0][0])) if rows else None
        if cooldown is not None and cooldown > now:
            return Admission(cooldown, cooldown)
        record = self._allowance_row(conn, scope)
        rolled = None
        if record is not None:
            rolled, wait = admit_allowance(record, now)
            if wait is not None:
                if rolled != record:
                    self._put_allowance(conn, scope, rolled)
                return Admission(cooldown, from_epoch_ms(to_epoch_ms(wait)))
        if learn is not None and quota is None and record is None:
            return self._admit_rate(conn, scope, now_ms, cooldown, lease, learn)
        refused = self._refused(conn, scope, quota, limit, lease, now_ms, cooldown)
        if refused is not None:
            return refused
        seq = None
        units = 0
        if rolled is not None:
            seq = rolled.admitted - 1
            rolled, units = admit_more(rolled, now, batch)
            self._put_allowance(conn, scope, rolled)
        until = rolled.until if units and rolled is not None else None
        if quota is None:
            if units:
                return Granted.of(None, cooldown, seq, 0, None, units, until)
            return Admission(cooldown, None, seq)
        # The permit's end from its grant rounded *up*: never before grant + per + margin.
        end_ms = to_epoch_ms(now) + quota[1]
        extra = 0
        if batch > 1 and limit is not None:
            live = conn.execute(
                "SELECT count(*) FROM permit_log WHERE scope = ? AND quota = ?", (scope, quota[0])
            ).fetchall()[0][0]
            extra = extra_permits(batch, limit - int(live), limit)
            later = end_ms + round(hold * 1000)  # whole ms (see Near.batch)
            conn.executemany(
                "INSERT INTO permit_log (scope, quota, expires_ms) VALUES (?, ?, ?)",
                [(scope, quota[0], later)] * extra,
            )
        self._take_permit(conn, scope, quota[0], end_ms, to_epoch_ms(now) + quota[2] if quota[2] else 0)
        return Granted.of(from_epoch_ms(end_ms), cooldown, seq, extra, None, units, until)

    def _refused(
        self, conn: sqlite3.Connection, scope: str, quota: tuple[str, int, int, int] | None,
        limit: int | None, lease: Lease | None, now_ms: int, cooldown: datetime | None,
    ) -> Admission | None:
        """Inside the write transaction: None when a permit of ``quota`` (None: none
        asked) is free and the slot of ``lease`` (None: none) is taken, else the refusal
        (nothing taken)."""
        if quota is not None and limit is not None:
            refused = self._permit_refused(conn, scope, quota[0], limit, now_ms, quota[3])
            if refused is not None:
                return Admission(cooldown, from_epoch_ms(refused))
        if lease is not None:
            busy = self._slot_refused(conn, scope, lease[0], now_ms)
            if busy is not None:
                return Admission(cooldown, from_epoch_ms(busy), None, True)
            expires = now_ms + window_ms(lease[1])
            conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, lease[2], expires))
        return None

    def _admit_rate(
        self, conn: sqlite3.Connection, scope: str, now_ms: int, cooldown: datetime | None,
        lease: Lease | None, learn: Learn,
    ) -> Admission:
        """Inside the write transaction, no cooldown running, no quota, no allowance:
        admission by the scope's learned rate (see ``MemoryCooldownStore._admit_rate``):
        a known send (one of its limit in the epoch), else a probe (a slot of its cap),
        else refused."""
        rate = self._rate_now(conn, scope, now_ms)
        if round(rate.start * 1000) > now_ms:  # a throttle's backoff
            return RateHeld(cooldown, from_epoch_ms(round(rate.start * 1000)))
        if rate.open or rate.known:
            refused = self._refused(conn, scope, None, None, lease, now_ms, cooldown)
            if refused is not None or rate.open:
                return refused or Admission(cooldown, None)  # (refused: every configured slot held)
            conn.execute("UPDATE learned_rate SET sent = sent + 1 WHERE scope = ?", (scope,))
            return Granted.of(None, cooldown, None, rate_epoch=rate.epoch)
        ends = round(rate.ends * 1000) if rate.limit > 0 else None
        if not rate.probes:
            assert ends is not None
            return RateHeld(cooldown, from_epoch_ms(ends))
        # A probe: a slot under the cap (with a configured one, under the smaller).
        cap = (min(lease[0], rate.cap), lease[1], lease[2]) if lease is not None else (rate.cap, *learn)
        busy = self._slot_refused(conn, scope, cap[0], now_ms)
        if busy is not None and lease is not None and lease[0] <= rate.cap:
            return Admission(cooldown, from_epoch_ms(busy), None, True)  # the configured cap binds
        if busy is not None:
            again = min(busy, now_ms + round(PROBE_RECHECK * 1000), ends if ends is not None else busy)
            return RateHeld(cooldown, from_epoch_ms(again), None, True)
        expires = now_ms + window_ms(cap[1])
        conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, cap[2], expires))
        if not rate.probed:
            self._put_rate(conn, scope, rate.probing())
        token = cap[2] if lease is None else None
        return Granted.of(None, cooldown, None, 0, token, rate_epoch=rate.epoch, rate_report=True)

    def _rate_now(self, conn: sqlite3.Connection, scope: str, now_ms: int) -> Rate:
        """Inside the write transaction: the scope's learned rate as of ``now_ms``, made
        at its first admission (a few rates unused for ``RATE_KEPT`` swept then); kept
        when it changed."""
        rate = self._rate_row(conn, scope)
        if rate is None:
            kept, open_kept = int(RATE_KEPT * 1000), int(OPEN_KEPT * 1000)
            conn.execute(_SWEEP_RATES, (now_ms - kept, now_ms - open_kept, _SWEEP_PER_WRITE))
            rate = fresh_rate(now_ms / 1000)
            self._put_rate(conn, scope, rate)
            return rate
        rolled = roll_rate(rate, now_ms / 1000)
        if rolled is not rate:
            self._put_rate(conn, scope, rolled)
        return rolled

    @staticmethod
    def _rate_row(conn: sqlite3.Connection, scope: str) -> Rate | None:
        rows = conn.execute(_RATE_ROW, (scope,)).fetchall()
        return rate_from_row(tuple(int(v) for v in rows[0])) if rows else None

    @staticmethod
    def _put_rate(conn: sqlite3.Connection, scope: str, rate: Rate) -> None:
        conn.execute(_PUT_RATE, (scope, *rate_row(rate)))

    def rate_answer(self, scope: str, epoch: int | None, until: datetime | None, now: datetime) -> None:
        """See ``Store.rate_answer``: one immediate transaction."""
        check_scope(scope)
        at = now_epoch_ms(check_until(now)) / 1000  # the present rounded down, as Redis reads it
        end = None if until is None else to_epoch_ms(check_until(until)) / 1000

        def answer(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                rate = self._rate_row(conn, scope)
                if rate is not None:
                    changed = answer_rate(rate, epoch, end, at)
                    if changed != rate:
                        self._put_rate(conn, scope, changed)

        self._run(answer)

    def rate_of(self, scope: str) -> Rate | None:
        """See ``Store.rate_of``."""
        check_scope(scope)
        return self._run(lambda conn: self._rate_row(conn, scope))

    def feed(self, changed: Changed) -> Feed | None:
        """The file's change log, checked before each attempt (see ``SQLiteFeed``); None
        when the store was made with ``push=False``."""
        from ._sqlite_feed import SQLiteFeed  # (its module needs this one's store)

        return SQLiteFeed(self, changed) if self._push else None

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: the present, read inside the transaction): the permit counts at least
        until ``now + per`` (see ``MemoryCooldownStore.settle``; put back if it expired
        meanwhile); ``exact``: until then exactly."""
        check_scope(scope)
        quota, per_ms, _, _ = _quota(limit, per, 0.0)
        old = to_epoch_ms(check_until(expires))
        # The answer's time rounded *up*: the request reached the server before it.
        fixed = None if now is None else to_epoch_ms(check_until(now))

        def settle(conn: sqlite3.Connection) -> None:
            new = (fixed if fixed is not None else to_epoch_ms(datetime.now(timezone.utc))) + per_ms
            moves = new > old or (new < old and exact)
            if not (moves or exact):
                return  # the stored end already covers the answer
            with immediate(conn):
                if exact:  # an open permit's answer: open no more
                    conn.execute(
                        "DELETE FROM open_permit WHERE rowid = (SELECT rowid FROM open_permit "
                        "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1)",
                        (scope, quota, old),
                    )
                if not moves:
                    return
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
            with immediate(conn):
                conn.execute(_SWEEP_FRESHNESS, (to_epoch_ms(at) - _FRESHNESS_KEPT_MS, _SWEEP_PER_WRITE))
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
            with immediate(conn):
                return sum(
                    conn.execute(f"DELETE FROM {table} WHERE scope = ?", (scope,)).rowcount  # noqa: S608
                    for table in _SCOPE_TABLES
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
            for (scope,) in conn.execute("SELECT scope FROM learned_rate").fetchall():
                rate = self._rate_row(conn, str(scope))
                ends = None if rate is None else rate_holds(rate, now_ms / 1000)
                if rate is not None and ends is not None:
                    hold = Hold("rate", from_epoch_ms(round(ends * 1000)), rate.limit)
                    found.setdefault(str(scope), []).append(hold)
            return found

        return self._run(read)

    def entries(self) -> dict[str, datetime]:
        """Every stored scope and its eligible time (long-expired rows are swept now and
        then, so a few past times may be among them)."""
        rows = self._run(lambda conn: conn.execute(_ALL).fetchall())
        return {str(scope): from_epoch_ms(int(ms)) for scope, ms in rows}

    def __enter__(self) -> SQLiteCooldownStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(
        self,
    ) -> tuple[Callable[[str, float, bool], SQLiteCooldownStore], tuple[str, float, bool]]:
        # Only the path and options travel; each process opens its own connections.
        return (_restore, (self._path, self._timeout, self._push))

    def __repr__(self) -> str:
        return f"SQLiteCooldownStore({self._path!r}, timeout={self._timeout})"

    # -- internals ----------------------------------------------------------------

    def sweep(self, older_than_ms: int = _KEEP_EXPIRED_MS) -> int:
        """Delete cooldown rows whose time is more than ``older_than_ms`` in the past;
        return how many.

        ``extend`` deletes up to 256 such rows by itself about once in 256 calls.
        """
        cutoff = to_epoch_ms(datetime.now(timezone.utc)) - older_than_ms
        return self._run(lambda conn: conn.execute(_SWEEP, (cutoff,)).rowcount)

    def _sweep_quietly(self) -> None:
        """Delete at most ``_SWEEP_ONE_IN`` long-expired rows (a short transaction)."""
        cutoff = to_epoch_ms(datetime.now(timezone.utc)) - _KEEP_EXPIRED_MS
        with contextlib.suppress(CooldownStoreError):  # housekeeping: the next sweep catches up
            self._run(lambda conn: conn.execute(_SWEEP_SOME, (cutoff, _SWEEP_ONE_IN)).rowcount)

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
        with immediate(conn):
            conn.execute("INSERT OR IGNORE INTO cooldown (scope, until_ms) VALUES (?, ?)", (scope, ms))
            conn.execute("UPDATE cooldown SET until_ms = ? WHERE scope = ? AND until_ms < ?", (ms, scope, ms))
            rows = conn.execute(_SELECT, (scope,)).fetchall()
        return int(rows[0][0])
