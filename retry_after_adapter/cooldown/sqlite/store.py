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
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from ...errors import ConfigurationError, CooldownStoreError
from .._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms
from ..allowance import ALLOWANCE_KEPT, merge_allowance, roll
from ..base import (
    Admission,
    Ask,
    Bounded,
    Changed,
    Feed,
    Hold,
    LeaseRenewal,
    Mark,
    PartwiseStore,
    Replaceable,
    Reservations,
    Weighed,
    Weights,
    check_scope,
    check_until,
    settled_mark,
    token_scope,
)
from ..freshness import FRESHNESS_KEPT, Freshness, check_outcome, merge_note
from ..rate import Rate, answer_rate, rate_holds
from .file import CHANGES_KEPT, DEFAULT_TIMEOUT, SQLiteFile, immediate, sqlite_gate
from .rules import (
    SELECT_UNTIL,
    SWEEP_PER_WRITE,
    admit_locked,
    allowance_row,
    peek,
    put_allowance,
    put_rate,
    quota_of,
    rate_row_of,
    settle_locked,
    take_permit,
)

__all__ = ["DEFAULT_TIMEOUT", "FILE_CHECK_EVERY", "SQLiteCooldownStore", "SQLiteFeed"]



#: Rows whose time is older than this are deleted now and then by ``extend``.
_KEEP_EXPIRED_MS = 3_600_000
#: About one ``extend`` in this many also deletes long-expired rows (at most
#: ``_SWEEP_ONE_IN`` of them: more than one per ``extend``, never a long transaction).
_SWEEP_ONE_IN = 256

#: ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` needs SQLite 3.35.
_HAS_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

_UPSERT_RETURNING = (
    "INSERT INTO cooldown (scope, until_ms) VALUES (?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET until_ms = max(until_ms, excluded.until_ms) "
    "RETURNING until_ms"
)
_SWEEP = "DELETE FROM cooldown WHERE until_ms < ?"
_SWEEP_SOME = "DELETE FROM cooldown WHERE rowid IN (SELECT rowid FROM cooldown WHERE until_ms < ? LIMIT ?)"
#: A few rows of any scope that stopped mattering (see ``rules`` for permits and
#: leases): allowances ``ALLOWANCE_KEPT`` past their reset, freshness ``FRESHNESS_KEPT``
#: past its last note.
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
#: Every table with rows of a scope (``delete`` lifts them all).
_SCOPE_TABLES = (
    "cooldown", "allowance", "permit_log", "open_permit", "reservation", "lease", "learned_rate", "token_log",
)


def _freshness_row(row: tuple[object, ...]) -> Freshness:
    """A ``_FRESH`` row as a Freshness."""
    _, success, error, error_at, until = row

    def when(ms: object) -> datetime | None:
        return None if ms is None else from_epoch_ms(int(str(ms)))

    return Freshness(when(success), None if error is None else str(error), when(error_at), when(until))


def _restore(path: str, timeout: float, push: bool = True) -> SQLiteCooldownStore:
    return SQLiteCooldownStore(path, timeout=timeout, push=push)


#: ``LeaseRenewal.renew``'s statements: a held lease's end set as given, or moved later.
_SET_EXACT = "UPDATE lease SET expires_ms = ? WHERE scope = ? AND token = ? AND expires_ms > ?"
_SET_LATER = (
    "UPDATE lease SET expires_ms = max(expires_ms, ?) WHERE scope = ? AND token = ? AND expires_ms > ?"
)


class SQLiteCooldownStore(
    SQLiteFile, PartwiseStore, Weights, Bounded, LeaseRenewal, Reservations, Replaceable
):
    """Cooldowns shared by every process and thread on one host through a SQLite file.

    ``path`` is the database file (created when missing; its directory must exist). A
    relative path is resolved against the working directory once, here. ``timeout``
    (seconds, default 0.25) bounds how long one ``get`` or ``extend`` waits for a lock
    held by another writer; past it the call raises :class:`CooldownStoreError`. No
    ``sqlite3`` error ever leaves the store. The store declares that bound
    (:class:`~.base.Bounded`), so the failure layer calls it on the calling thread.

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

    #: ``rate_answer`` reads what kind of attempt was answered (``LearnedRate.rate_kinds``).
    rate_kinds = True

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT, push: bool = True
    ) -> None:
        if not isinstance(push, bool):
            raise ConfigurationError("push must be True or False")
        #: Whether each process keeps a near copy that follows the file's change log
        #: (False: every attempt reads the file).
        self._push = push
        self._open(path, timeout)

    def operation_timeout(self) -> float:
        """The most (seconds) one operation takes: its ``timeout`` (see :class:`~.base.Bounded`)."""
        return self._timeout

    def get(self, scope: str) -> datetime | None:
        check_scope(scope)
        # fetchall(): the statement finishes here, so no read snapshot stays open.
        rows = self._run(lambda conn: conn.execute(SELECT_UNTIL, (scope,)).fetchall())
        return from_epoch_ms(int(rows[0][0])) if rows else None

    def extend(self, scope: str, until: datetime) -> datetime:
        check_scope(scope)
        ms = to_epoch_ms(check_until(until))
        effective = self._run(lambda conn: self._upsert(conn, scope, ms))
        if random.randrange(_SWEEP_ONE_IN) == 0:
            self._sweep_quietly()
        return from_epoch_ms(effective)

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
                current = allowance_row(conn, scope)
                merged = merge_allowance(current, int(remaining), until, now, seq, limit, window)
                if merged is not None:
                    put_allowance(conn, scope, merged)
                stale = to_epoch_ms(now) - int(ALLOWANCE_KEPT * 1000)
                conn.execute(_SWEEP_ALLOWANCE, (stale, scope, SWEEP_PER_WRITE))

        self._run(allow)

    def admit(self, ask: Ask) -> Admission:
        """Admission for one attempt (see ``MemoryCooldownStore.admit``): the cooldown,
        the announced allowance, the quota permit and the concurrency slot in one
        transaction, all or nothing (a plain read while the scope has none of them).
        ``now`` None: the real present, read once the transaction holds the lock, so a
        permit's time is when it is granted."""
        scope, now, limit, lease, learn = ask.scope, ask.now, ask.limit, ask.lease, ask.learn
        weigh, batch, hold, rank = ask.weigh, ask.batch, ask.hold, ask.priority
        reserve_by = None if ask.reserve_by is None else check_until(ask.reserve_by)
        held = None if ask.held is None else check_until(ask.held)
        check_scope(scope)
        fixed = None if now is None else check_until(now)
        quota = quota_of(limit, ask.per, ask.margin, ask.opened) if limit is not None else None
        nothing_to_take = quota is None and lease is None and weigh is None

        def admit(conn: sqlite3.Connection) -> Admission:
            if nothing_to_take:
                peeked = peek(conn, scope, fixed, learn is not None)
                if peeked is not None:
                    return peeked
            with immediate(conn):
                at = fixed or datetime.now(timezone.utc)  # the lock is ours: the grant's time
                return admit_locked(
                    conn, scope, at, limit, quota, lease, batch, hold, learn, weigh, reserve_by, held, rank
                )

        return self._run(admit)

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        """See ``Weights.settle_weighed``: one immediate transaction (the answer's time
        rounded up: the request reached the server before it)."""
        check_scope(scope)
        check_until(weighed.expires)
        fixed = None if now is None else to_epoch_ms(check_until(now))

        def settle(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                at = fixed if fixed is not None else to_epoch_ms(datetime.now(timezone.utc))
                settle_locked(conn, scope, weighed, at)

        self._run(settle)

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        """See ``Store.rate_answer``: one immediate transaction."""
        check_scope(scope)
        at = now_epoch_ms(check_until(now)) / 1000  # the present rounded down, as Redis reads it
        end = None if until is None else to_epoch_ms(check_until(until)) / 1000

        def answer(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                rate = rate_row_of(conn, scope)
                if rate is not None:
                    changed = answer_rate(rate, epoch, end, at, probe)
                    if changed != rate:
                        put_rate(conn, scope, changed)

        self._run(answer)

    def rate_of(self, scope: str) -> Rate | None:
        """See ``Store.rate_of``."""
        check_scope(scope)
        return self._run(lambda conn: rate_row_of(conn, scope))

    def feed(self, changed: Changed) -> Feed | None:
        """The file's change log, checked before each attempt (see ``SQLiteFeed``); None
        when the store was made with ``push=False``."""
        # Held weakly: the failure layer holds the store weakly too, so that both are
        # collected once it is unused.
        return SQLiteFeed(weakref.proxy(self), changed) if self._push else None

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: the present, read inside the transaction): the permit counts at least
        until ``now + per`` (see ``MemoryCooldownStore.settle``; put back if it expired
        meanwhile); ``exact``: until then exactly."""
        self.settle_many([(scope, limit, per, expires, now, exact)])

    def settle_many(self, settles: Sequence[tuple[Any, ...]]) -> None:
        """Several settles (each :meth:`settle`'s arguments) in one immediate
        transaction (none when none moves a permit)."""
        checked = [_settle_args(*args) for args in settles]

        def settle(conn: sqlite3.Connection) -> None:
            present = to_epoch_ms(datetime.now(timezone.utc))
            moving = [(args, new) for args in checked if (new := _settled_end(args, present)) is not None]
            if not moving:
                return  # every stored end already covers its answer
            with immediate(conn):
                for args, new in moving:
                    _settle_locked(conn, args, new)

        self._run(settle)

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class (see ``MemoryCooldownStore.note``): one
        immediate transaction."""
        check_scope(scope)
        check_outcome(outcome)
        at = check_until(at)

        def note(conn: sqlite3.Connection) -> None:
            with immediate(conn):
                conn.execute(_SWEEP_FRESHNESS, (to_epoch_ms(at) - _FRESHNESS_KEPT_MS, SWEEP_PER_WRITE))
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

    def renew(
        self, leases: Sequence[tuple[str, str, datetime]], now: datetime | None = None, exact: bool = False
    ) -> set[str]:
        """Move held leases later, or (``exact``) to the end given (see
        ``LeaseRenewal.renew``): one immediate transaction."""
        rows = [
            (to_epoch_ms(check_until(until)), check_scope(scope), token) for scope, token, until in leases
        ]
        at = to_epoch_ms(now) if now is not None else None

        def renew(conn: sqlite3.Connection) -> set[str]:
            present = at if at is not None else now_epoch_ms(datetime.now(timezone.utc))
            lost = set()
            with immediate(conn):
                for until, scope, token in rows:
                    found = conn.execute(
                        _SET_EXACT if exact else _SET_LATER,
                        (until, scope, token, present),
                    ).rowcount
                    if not found:
                        lost.add(token)
            return lost

        return self._run(renew)

    def renew_open(
        self, permits: Sequence[tuple[str, int, float, datetime, datetime, int]], now: datetime | None = None
    ) -> list[int]:
        """Move open permits' ends later (see ``LeaseRenewal.renew_open``): one
        immediate transaction."""
        rows = []
        for scope, limit, per, end, until, count in permits:
            quota = quota_of(limit, per, 0.0)[0]
            ends = (to_epoch_ms(check_until(end)), to_epoch_ms(check_until(until)))
            rows.append((check_scope(scope), quota, *ends, count))
        at = to_epoch_ms(now) if now is not None else None

        def renew(conn: sqlite3.Connection) -> list[int]:
            present = at if at is not None else now_epoch_ms(datetime.now(timezone.utc))
            moved = []
            with immediate(conn):
                for scope, quota, old, new, count in rows:
                    if not present < old < new:
                        moved.append(0)
                        continue
                    moved.append(conn.execute(
                        "UPDATE permit_log SET expires_ms = ? WHERE rowid IN (SELECT rowid FROM permit_log "
                        "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT ?)",
                        (new, scope, quota, old, count),
                    ).rowcount)
                    conn.execute(
                        "UPDATE open_permit SET expires_ms = ? WHERE rowid IN (SELECT rowid FROM open_permit "
                        "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT ?)",
                        (new, scope, quota, old, moved[-1]),
                    )
            return moved

        return self._run(renew)

    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back (an operator clearing it): its
        cooldown, announced allowance, quota permits and concurrency leases, in one
        transaction; True if there was any of them."""
        check_scope(scope)

        def delete(conn: sqlite3.Connection) -> int:
            with immediate(conn):
                tokens = conn.execute("DELETE FROM allowance WHERE scope = ?", (token_scope(scope),)).rowcount
                return tokens + sum(
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
                record = allowance_row(conn, str(scope))
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
                rate = rate_row_of(conn, str(scope))
                ends = None if rate is None else rate_holds(rate, now_ms / 1000)
                if rate is not None and ends is not None:
                    hold = Hold("rate", from_epoch_ms(round(ends * 1000)), rate.limit)
                    found.setdefault(str(scope), []).append(hold)
            for scope, quota, weight, first in conn.execute(
                "SELECT scope, quota, sum(cost), min(expires_ms) FROM token_log WHERE expires_ms > ? "
                "GROUP BY scope, quota",
                (now_ms,),
            ).fetchall():
                limit = int(str(quota).split("/", 1)[0])
                if int(weight) >= limit:
                    found.setdefault(str(scope), []).append(Hold("tokens", from_epoch_ms(int(first)), limit))
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
            rows = conn.execute(SELECT_UNTIL, (scope,)).fetchall()
        return int(rows[0][0])


class _Settle(NamedTuple):
    """A settle's checked arguments: the quota's key and window (ms), the permit's
    stored end (epoch ms), the answer's time (epoch ms, rounded up: the request reached
    the server before it; None: the present) and whether it was open."""

    scope: str
    quota: str
    per_ms: int
    old: int
    fixed: int | None
    exact: bool


def _settle_args(
    scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None, exact: bool = False
) -> _Settle:
    check_scope(scope)
    quota, per_ms, _, _ = quota_of(limit, per, 0.0)
    fixed = None if now is None else to_epoch_ms(check_until(now))
    return _Settle(scope, quota, per_ms, to_epoch_ms(check_until(expires)), fixed, bool(exact))


def _settled_end(args: _Settle, present: int) -> int | None:
    """The permit's new end (epoch ms), or None when the settle changes nothing (its
    stored end already covers the answer, and it was not open)."""
    new = (args.fixed if args.fixed is not None else present) + args.per_ms
    moves = new > args.old or (new < args.old and args.exact)
    return new if moves or args.exact else None


def _settle_locked(conn: sqlite3.Connection, args: _Settle, new: int) -> None:
    """(In an immediate transaction.) One settle: an open permit open no more, and the
    permit's end moved to ``new`` (put back if it expired meanwhile)."""
    scope, quota, _, old, _, exact = args
    if exact:  # an open permit's answer: open no more
        conn.execute(
            "DELETE FROM open_permit WHERE rowid = (SELECT rowid FROM open_permit "
            "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1)",
            (scope, quota, old),
        )
        # A reservation given back, or a sent one answered: its mark goes (``base.settled_mark``).
        answered = new - args.per_ms
        rows = conn.execute(
            "SELECT rowid, priority, place_ms, sent FROM reservation "
            "WHERE scope = ? AND quota = ? AND expires_ms = ?",
            (scope, quota, old),
        ).fetchall()
        marks = {Mark(int(rank), int(place), bool(sent)): int(rowid) for rowid, rank, place, sent in rows}
        mark = settled_mark(list(marks), answered)
        if mark is not None and mark.sent:  # answered: its mark moves with its end
            conn.execute("UPDATE reservation SET expires_ms = ? WHERE rowid = ?", (new, marks[mark]))
        elif mark is not None:  # given back
            conn.execute("DELETE FROM reservation WHERE rowid = ?", (marks[mark],))
    if new == old:
        return
    moved = conn.execute(
        "UPDATE permit_log SET expires_ms = ? WHERE rowid = (SELECT rowid FROM permit_log "
        "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1)",
        (new, scope, quota, old),
    ).rowcount
    if not moved:  # expired (and deleted) meanwhile: put back
        take_permit(conn, scope, quota, new)

# ------------------------------------------------------------------------------------
# The change feed of a SQLite store in one process (see :class:`SQLiteFeed`): what
# keeps its near copy fresh, as ``redis.feed`` does for Redis.


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
