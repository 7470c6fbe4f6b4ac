"""Admission in the file of :class:`~.store.SQLiteCooldownStore`: the rules that
decide one attempt inside its write transaction (the cooldown, the announced allowance,
a quota permit, a concurrency slot, the learned rate; all or nothing), and the rows of a
scope they read and write, which the store's other operations read and write too.

Every function runs on one connection of the store, inside the write transaction its
caller holds, except those that only read a row (also read outside one). Times are
UTC epoch milliseconds (``_ms``, as stored), ``now`` an aware UTC datetime, durations
seconds unless named ``_ms``.
"""

from __future__ import annotations

import collections
import math
import sqlite3
from datetime import datetime, timezone

from ...errors import ConfigurationError
from .._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms, window_ms
from ..allowance import Allowance, admit_allowance, admit_more
from ..base import (
    PACE_UNDER,
    RECHECK,
    Admission,
    Learn,
    Lease,
    Mark,
    Weigh,
    Weighed,
    extra_permits,
    free_at,
    free_in,
    holder_ends,
    paced,
    placing_ends,
    token_scope,
)
from ..rate import OPEN_KEPT, PROBE_RECHECK, RATE_KEPT, Rate, fresh_rate, rate_from_row, rate_row, roll_rate
from ..weights import NO_ALLOWANCE, check_fits, oversized, too_large, weighed_free_at, with_weighed
from .file import RATE_COLUMNS

#: Rows of other scopes that stopped mattering deleted by each write that may add one
#: (a permit or a lease taken, an allowance, a note): more than the one row a write
#: adds, so the tables stay as small as what still matters. Each finds them through an
#: index on when they stop mattering: never a scan of a table.
SWEEP_PER_WRITE = 8

#: A scope's cooldown.
SELECT_UNTIL = "SELECT until_ms FROM cooldown WHERE scope = ?"
#: A few permits, and leases, of any scope that stopped counting (see ``SWEEP_PER_WRITE``).
SWEEP_PERMITS = (
    "DELETE FROM permit_log WHERE rowid IN (SELECT rowid FROM permit_log WHERE expires_ms <= ? LIMIT ?)"
)
SWEEP_LEASES = "DELETE FROM lease WHERE rowid IN (SELECT rowid FROM lease WHERE expires_ms <= ? LIMIT ?)"
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

#: ``(name, counts_ms, expected_ms, per_ms)``: a quota as :func:`quota_of` gives it.
QuotaLog = tuple[str, int, int, int]


def quota_of(limit: int, per: float | None, margin: float, opened: float = 0.0) -> QuotaLog:
    """A quota's log name (``"limit/per_ms"``), how long (ms) a permit counts (an open
    one ``opened`` seconds longer), how long it would count had its answer come in
    time (0: not open), and its per (ms)."""
    if per is None:
        raise ConfigurationError("a quota needs a window (per)")
    per_ms = window_ms(per)
    counts = per_ms + math.ceil(margin * 1000)
    return f"{int(limit)}/{per_ms}", counts + math.ceil(opened * 1000), counts if opened > 0 else 0, per_ms


# ------------------------------------------------------------------ the admission
def peek(conn: sqlite3.Connection, scope: str, fixed: datetime | None, learn: bool) -> Admission | None:
    """Without a write transaction: the answer when nothing is to be taken, the
    scope's admissions are not counted (no announced allowance) and, when
    ``learn``, its learned rate takes nothing (its cap lifted, no limit); else None.
    ``fixed``: the attempt's time (None: the present)."""
    rows = conn.execute(_PEEK, (scope, scope, scope)).fetchall()
    cooldown = None if rows[0][0] is None else from_epoch_ms(int(rows[0][0]))
    now = fixed or datetime.now(timezone.utc)
    if cooldown is not None and cooldown > now:
        return Admission(cooldown=cooldown, not_before=cooldown)
    if rows[0][1] is not None or (learn and rows[0][2] != 0):
        return None
    return Admission(cooldown=cooldown, not_before=None)


def admit_locked(
    conn: sqlite3.Connection, scope: str, now: datetime, limit: int | None, quota: QuotaLog | None,
    lease: Lease | None, batch: int = 1, hold: float = 0.0, learn: Learn | None = None,
    weigh: Weigh | None = None, reserve_by: datetime | None = None, held: datetime | None = None,
    priority: int = 0,
) -> Admission:
    """The whole admission at ``now``: held back by a running cooldown or an announced
    allowance used up, by the attempt's tokens (``weigh``) that do not fit, by the
    learned rate when it governs (``learn``: no quota, no allowance, no tokens weighed),
    refused while a permit of ``quota`` (of ``limit``) or a slot of ``lease`` is not
    free (nothing taken); else granted (``batch``, ``hold`` seconds: extra permits, see
    ``Store.admit``)."""
    now_ms = now_epoch_ms(now)
    rows = conn.execute(SELECT_UNTIL, (scope,)).fetchall()
    cooldown = from_epoch_ms(int(rows[0][0])) if rows else None
    if cooldown is not None and cooldown > now:
        if held is not None and quota is not None:  # its place is moot: given back
            _give_back(conn, scope, quota[0], to_epoch_ms(held))
        return Admission(cooldown=cooldown, not_before=cooldown)
    record, rolled, spent = _announced(conn, scope, now)
    if spent is not None:
        return Admission(cooldown=cooldown, not_before=spent)
    tokens = None
    if weigh is not None:
        tokens, wait = weigh_locked(conn, scope, weigh, now)
        if wait is not None:
            if tokens is None:
                return Admission(cooldown=cooldown, not_before=wait)
            return too_large(cooldown, tokens, now)
    if learn is not None and quota is None and record is None and tokens is None:
        return _admit_rate(conn, scope, now_ms, cooldown, lease, learn)
    if held is not None and quota is not None and limit is not None:
        by_ms = None if reserve_by is None else now_epoch_ms(reserve_by)
        kept_at = kept(conn, scope, quota, limit, to_epoch_ms(held), now_ms, by_ms, priority)
        if kept_at is not None:
            again, end_ms = kept_at
            reserved = None if again <= now_ms else from_epoch_ms(again)
            permit = held if end_ms is None else from_epoch_ms(end_ms)
            return Admission(cooldown=cooldown, not_before=None, permit=permit, reserved=reserved)
    refused = _refused(conn, scope, quota, limit, lease, now_ms, cooldown)
    if refused is not None:
        alone = quota is not None and lease is None and record is None and weigh is None
        if reserve_by is None or not alone:
            return refused  # no reservation asked for, or refused by more than the permit
        return _reserve(conn, scope, cooldown, quota, limit, refused, reserve_by, now_ms, priority)  # type: ignore[arg-type]
    answer = _grant(conn, scope, now, cooldown, rolled, limit, quota, batch, hold)
    if tokens is None or weigh is None:
        return answer
    return with_weighed(answer, *take_locked(conn, scope, weigh, now, tokens))


def kept(
    conn: sqlite3.Connection, scope: str, quota: QuotaLog, limit: int, end_ms: int, now_ms: int,
    by_ms: int | None, priority: int = 0,
) -> tuple[int, int | None] | None:
    """(In an immediate transaction.) A reservation's holder of ``priority`` asks at
    its time (``Ask.held``: its permit stored to end at ``end_ms``), its permit kept:
    ``(now_ms, new end)`` when it goes now (its permit then counting from now, as one
    granted now would, and waiting no more), else ``(when to ask again, None)``, if no
    later than ``by_ms`` (see ``MemoryCooldownStore._kept_locked``); else its permit is
    given back (None)."""
    name, per_ms = quota[0], quota[3]
    conn.execute(
        "DELETE FROM permit_log WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, name, now_ms)
    )
    conn.execute(
        "DELETE FROM open_permit WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, name, now_ms)
    )
    log = [int(row[0]) for row in conn.execute(
        "SELECT expires_ms FROM permit_log WHERE scope = ? AND quota = ? ORDER BY expires_ms", (scope, name)
    ).fetchall()]
    if end_ms not in log:
        return None  # (given back or lapsed meanwhile)
    pending: dict[int, list[int]] = {}
    for stored, when in conn.execute(
        "SELECT expires_ms, expected_ms FROM open_permit WHERE scope = ? AND quota = ?", (scope, name)
    ).fetchall():
        pending.setdefault(int(stored), []).append(int(when))
    marks, rows = _marks(conn, scope, name, now_ms)
    mine = pending.get(end_ms)
    expected = mine.pop() if mine else end_ms
    waiting = [m for m in marks.get(end_ms, ()) if not m.sent]
    own = next((m for m in waiting if m.rank == priority), waiting[-1]) if waiting else None
    if own is not None:
        marks[end_ms].remove(own)
    log.remove(end_ms)
    recheck = now_ms + round(RECHECK * 1000)
    mark = own or Mark(priority, end_ms - quota[1])
    ends = holder_ends(log, pending, marks, mark, expected, now_ms, per_ms, recheck)
    if len(ends) < limit:
        new_end = max(now_ms + quota[1], end_ms)
        # Sent from its place: marked so, its mark moved with its end.
        rowid = rows.get((end_ms, mark)) if own is not None else None
        if rowid is not None:
            conn.execute("UPDATE reservation SET expires_ms = ?, sent = 1 WHERE rowid = ?", (new_end, rowid))
        else:
            row = (scope, name, new_end, mark.rank, mark.place)
            conn.execute("INSERT INTO reservation VALUES (?, ?, ?, ?, ?, 1)", row)
        # An open one is expected to end per + margin after now, as one granted now (not
        # moved as much as its stored end: this ask may keep it open longer or shorter
        # than the reservation did, a batch's OPEN_LIFE against an attempt's OPEN_FOR).
        # (now_ms is rounded down: a millisecond more, never before a grant's)
        expects = now_ms + 1 + (quota[2] or quota[1])
        for table in ("permit_log", "open_permit"):
            row = conn.execute(
                f"SELECT rowid FROM {table} WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1",  # noqa: S608
                (scope, name, end_ms),
            ).fetchone()
            if row is None:
                continue  # (not an open permit)
            if table == "permit_log":
                conn.execute("UPDATE permit_log SET expires_ms = ? WHERE rowid = ?", (new_end, row[0]))
            else:
                conn.execute(
                    "UPDATE open_permit SET expires_ms = ?, expected_ms = MAX(expected_ms, ?) "
                    "WHERE rowid = ?",
                    (new_end, expects, row[0]),
                )
        return now_ms, new_end
    ends.sort()
    wait = ends[len(ends) - limit]
    if by_ms is None or wait <= by_ms:
        return wait, None
    _give_back(conn, scope, name, end_ms)
    return None


def _give_back(conn: sqlite3.Connection, scope: str, name: str, end_ms: int) -> None:
    """A reservation of the quota ``name`` stored to end at ``end_ms`` is given back:
    one row with that end of each of its tables goes (its mark: a waiting one)."""
    for table in ("permit_log", "open_permit"):
        conn.execute(
            f"DELETE FROM {table} WHERE rowid = (SELECT rowid FROM {table} "  # noqa: S608 - a fixed name
            "WHERE scope = ? AND quota = ? AND expires_ms = ? LIMIT 1)",
            (scope, name, end_ms),
        )
    conn.execute(
        "DELETE FROM reservation WHERE rowid = (SELECT rowid FROM reservation "
        "WHERE scope = ? AND quota = ? AND expires_ms = ? AND sent = 0 LIMIT 1)",
        (scope, name, end_ms),
    )


def _marks(
    conn: sqlite3.Connection, scope: str, name: str, now_ms: int
) -> tuple[dict[int, list[Mark]], dict[tuple[int, Mark], int]]:
    """The quota ``name``'s reservations' marks (``base.Mark``) by their permits' end,
    and a rowid for each (end, mark) (those ended by ``now_ms`` deleted, any scope's)."""
    conn.execute("DELETE FROM reservation WHERE expires_ms <= ?", (now_ms,))
    marks: dict[int, list[Mark]] = {}
    rows: dict[tuple[int, Mark], int] = {}
    for rowid, stored, rank, place, sent in conn.execute(
        "SELECT rowid, expires_ms, priority, place_ms, sent FROM reservation WHERE scope = ? AND quota = ?",
        (scope, name),
    ).fetchall():
        mark = Mark(int(rank), int(place), bool(sent))
        marks.setdefault(int(stored), []).append(mark)
        rows[(int(stored), mark)] = int(rowid)
    return marks, rows


def _reserve(
    conn: sqlite3.Connection, scope: str, cooldown: datetime | None, quota: QuotaLog, limit: int,
    refused: Admission, reserve_by: datetime, now_ms: int, priority: int = 0,
) -> Admission:
    """The quota's permit alone refused: a reservation of ``priority`` at the earliest
    time a permit is free counting no waiting reservation of a lower priority (granted
    now when that is now), if that is no later than ``reserve_by``, else the refusal
    (see ``base.Reservations``)."""
    start = refused.not_before
    assert start is not None
    name = quota[0]
    marks, _ = _marks(conn, scope, name, now_ms)
    if marks:
        log = [int(row[0]) for row in conn.execute(
            "SELECT expires_ms FROM permit_log WHERE scope = ? AND quota = ? ORDER BY expires_ms",
            (scope, name),
        ).fetchall()]
        counted, out = placing_ends(log, marks, priority, now_ms)
        if out:
            opened: dict[int, list[int]] = {}
            for stored, when in conn.execute(
                "SELECT expires_ms, expected_ms FROM open_permit WHERE scope = ? AND quota = ?", (scope, name)
            ).fetchall():
                opened.setdefault(int(stored), []).append(int(when))
            for end in out:
                if opened.get(end):
                    opened[end].pop()
            opened = {end: ends for end, ends in opened.items() if ends}
            free = free_in(counted, opened, limit, now_ms + quota[3])
            start = from_epoch_ms(now_ms if free is None else max(free, now_ms))
    if marks and quota[3] < PACE_UNDER * 1000:
        every = (m for ms in marks.values() for m in ms)
        start = from_epoch_ms(paced(to_epoch_ms(start), every, priority, quota[3] // limit))
    if start > reserve_by:
        return Admission(cooldown=cooldown, not_before=start)
    start_ms = to_epoch_ms(start)
    end_ms = start_ms + quota[1]
    take_permit(conn, scope, name, end_ms, start_ms + quota[2] if quota[2] else 0)
    sent = start_ms <= now_ms  # granted at once, ahead of the lower waiting ones: marked sent
    conn.execute(
        "INSERT INTO reservation VALUES (?, ?, ?, ?, ?, ?)", (scope, name, end_ms, priority, start_ms, sent)
    )
    if sent:
        return Admission(cooldown=cooldown, not_before=None, permit=from_epoch_ms(end_ms))
    return Admission(cooldown=cooldown, not_before=None, permit=from_epoch_ms(end_ms), reserved=start)


def _announced(
    conn: sqlite3.Connection, scope: str, now: datetime
) -> tuple[Allowance | None, Allowance | None, datetime | None]:
    """The scope's announced allowance at ``now``: its record (None: none), rolled with
    one admission counted (to write on the grant), and when to ask again when it is
    used up (the rolled record written; None: it admits)."""
    record = allowance_row(conn, scope)
    if record is None:
        return None, None, None
    rolled, wait = admit_allowance(record, now)
    if wait is None:
        return record, rolled, None
    if rolled != record:
        put_allowance(conn, scope, rolled)
    return record, rolled, from_epoch_ms(to_epoch_ms(wait))


def _grant(
    conn: sqlite3.Connection, scope: str, now: datetime, cooldown: datetime | None,
    rolled: Allowance | None, limit: int | None, quota: QuotaLog | None, batch: int, hold: float,
) -> Admission:
    """Nothing refused at ``now``: the grant. One admission of the announced allowance
    ``rolled`` counted (up to ``batch`` of them), and the permit of ``quota`` taken,
    ending at ``now`` rounded up + per + margin, with up to ``batch - 1`` extra ones
    counted ``hold`` seconds longer."""
    seq = None
    units = 0
    if rolled is not None:
        seq = rolled.admitted - 1
        rolled, units = admit_more(rolled, now, batch)
        put_allowance(conn, scope, rolled)
    until = rolled.until if units and rolled is not None else None
    if quota is None:
        if units:
            return Admission(cooldown=cooldown, not_before=None, seq=seq, units=units, units_until=until)
        return Admission(cooldown=cooldown, not_before=None, seq=seq)
    # The permit's end from its grant rounded *up*: never before grant + per + margin.
    end_ms = to_epoch_ms(now) + quota[1]
    extra = 0
    if batch > 1 and limit is not None:
        live = conn.execute(
            "SELECT count(*) FROM permit_log WHERE scope = ? AND quota = ?", (scope, quota[0])
        ).fetchall()[0][0]
        extra = extra_permits(batch, limit - int(live), limit)
        later = end_ms + round(hold * 1000)  # whole ms (see PermitBatches.batch)
        conn.executemany(
            "INSERT INTO permit_log (scope, quota, expires_ms) VALUES (?, ?, ?)",
            [(scope, quota[0], later)] * extra,
        )
        if quota[2]:  # open too when this one is: each settled by its answer, or given back
            expected = to_epoch_ms(now) + quota[2] + round(hold * 1000)
            conn.executemany(
                "INSERT INTO open_permit VALUES (?, ?, ?, ?)", [(scope, quota[0], later, expected)] * extra
            )
    take_permit(conn, scope, quota[0], end_ms, to_epoch_ms(now) + quota[2] if quota[2] else 0)
    return Admission(
        cooldown=cooldown, not_before=None, seq=seq, permit=from_epoch_ms(end_ms), extra=extra, units=units,
        units_until=until,
    )


def _refused(
    conn: sqlite3.Connection, scope: str, quota: QuotaLog | None, limit: int | None, lease: Lease | None,
    now_ms: int, cooldown: datetime | None,
) -> Admission | None:
    """None when a permit of ``quota`` (None: none asked) is free and the slot of
    ``lease`` (None: none) is taken, else the refusal (nothing taken)."""
    if quota is not None and limit is not None:
        refused = _permit_refused(conn, scope, quota[0], limit, now_ms, quota[3])
        if refused is not None:
            return Admission(cooldown=cooldown, not_before=from_epoch_ms(refused))
    if lease is not None:
        busy = _slot_refused(conn, scope, lease.slots, now_ms)
        if busy is not None:
            return Admission(cooldown=cooldown, not_before=from_epoch_ms(busy), slot_busy=True)
        expires = now_ms + window_ms(lease.ttl)
        conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, lease.token, expires))
    return None


def _admit_rate(
    conn: sqlite3.Connection, scope: str, now_ms: int, cooldown: datetime | None, lease: Lease | None,
    learn: Learn,
) -> Admission:
    """No cooldown running, no quota, no allowance: admission by the scope's learned
    rate (see ``MemoryCooldownStore._admit_rate``): a known send (one of its limit in
    the epoch; with probes to come, holding a probe slot until its answer), else a
    probe (a slot of its cap, every known send's answered), else refused."""
    rate = _rate_now(conn, scope, now_ms)
    if round(rate.start * 1000) > now_ms:  # a throttle's backoff
        return Admission(cooldown=cooldown, not_before=from_epoch_ms(round(rate.start * 1000)), by_rate=True)
    if rate.open or rate.known:
        refused = _refused(conn, scope, None, None, lease, now_ms, cooldown)
        if refused is not None or rate.open:
            return refused or Admission(
                cooldown=cooldown, not_before=None
            )  # (refused: every configured slot held)
        conn.execute("UPDATE learned_rate SET sent = sent + 1 WHERE scope = ?", (scope,))
        if lease is None and rate.waits_for_known:
            # Probes follow in this epoch: this send holds a probe slot (never refused
            # for it) until its answer, so no probe races it to the server.
            expires = now_ms + window_ms(learn.ttl)
            conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, learn.token, expires))
            return Admission(cooldown=cooldown, not_before=None, token=learn.token, rate_epoch=rate.epoch)
        return Admission(cooldown=cooldown, not_before=None, rate_epoch=rate.epoch)
    ends = round(rate.ends * 1000) if rate.limit > 0 else None
    if not rate.probes:
        assert ends is not None
        return Admission(cooldown=cooldown, not_before=from_epoch_ms(ends), by_rate=True)
    return _probe(conn, scope, now_ms, cooldown, lease, learn, rate, ends)


def _probe(
    conn: sqlite3.Connection, scope: str, now_ms: int, cooldown: datetime | None, lease: Lease | None,
    learn: Learn, rate: Rate, ends: int | None,
) -> Admission:
    """A probe of the learned ``rate`` (its epoch ending at ``ends``, None: no limit): a
    slot under its cap (with a configured ``lease``, under the smaller), else held back
    until a slot may be free (at most ``PROBE_RECHECK`` seconds); a configured cap that
    binds refuses as concurrency."""
    if lease is not None:
        slots, ttl, held = min(lease.slots, rate.cap), lease.ttl, lease.token
    else:
        slots, ttl, held = rate.cap, learn.ttl, learn.token
    busy = _slot_refused(conn, scope, slots, now_ms)
    if busy is not None and lease is not None and lease.slots <= rate.cap:
        return Admission(
            cooldown=cooldown, not_before=from_epoch_ms(busy), slot_busy=True
        )  # the configured cap binds
    if busy is not None:
        again = min(busy, now_ms + round(PROBE_RECHECK * 1000), ends if ends is not None else busy)
        return Admission(cooldown=cooldown, not_before=from_epoch_ms(again), slot_busy=True, by_rate=True)
    expires = now_ms + window_ms(ttl)
    conn.execute("INSERT OR REPLACE INTO lease VALUES (?, ?, ?)", (scope, held, expires))
    if not rate.probed:
        put_rate(conn, scope, rate.probing())
    token = held if lease is None else None
    return Admission(cooldown=cooldown, not_before=None, token=token, rate_epoch=rate.epoch, rate_report=True)


# ------------------------------------------------------------ permits and leases
def _permit_refused(
    conn: sqlite3.Connection, scope: str, quota: str, limit: int, now_ms: int, per_ms: int = 0
) -> int | None:
    """None when a permit of ``quota`` is free, else the earliest time (ms) one could be
    (an open permit counted as ending at its grant + per + margin, or now + ``per_ms``
    if later: see ``base.free_at``). Permits that stopped counting are deleted: the
    scope's, and a few of other scopes'."""
    conn.execute(
        "DELETE FROM permit_log WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, quota, now_ms)
    )
    conn.execute(SWEEP_PERMITS, (now_ms, SWEEP_PER_WRITE))
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


def take_permit(
    conn: sqlite3.Connection, scope: str, quota: str, expires_ms: int, expected_ms: int = 0
) -> None:
    """A permit of ``quota`` counting until ``expires_ms``; ``expected_ms`` > 0: an
    open one (see ``Store.admit``)."""
    conn.execute(
        "INSERT INTO permit_log (scope, quota, expires_ms) VALUES (?, ?, ?)", (scope, quota, expires_ms)
    )
    if expected_ms:
        conn.execute(
            "INSERT INTO open_permit VALUES (?, ?, ?, ?)", (scope, quota, expires_ms, expected_ms)
        )


def _slot_refused(conn: sqlite3.Connection, scope: str, limit: int, now_ms: int) -> int | None:
    """None when a slot is free, else when the earliest lease expires (ms); expired
    leases are dropped (the scope's, and a few of other scopes', a killed worker's)."""
    conn.execute("DELETE FROM lease WHERE scope = ? AND expires_ms <= ?", (scope, now_ms))
    conn.execute(SWEEP_LEASES, (now_ms, SWEEP_PER_WRITE))
    rows = conn.execute(
        "SELECT count(*), min(expires_ms) FROM lease WHERE scope = ?", (scope,)
    ).fetchall()
    return None if int(rows[0][0]) < limit else int(rows[0][1])


# ------------------------------------------------ the allowance and the learned rate
def allowance_row(conn: sqlite3.Connection, scope: str) -> Allowance | None:
    """The scope's announced allowance as stored (None: none)."""
    rows = conn.execute(
        "SELECT remaining, at_n, until_ms, n, lim, window_ms, exact FROM allowance WHERE scope = ?",
        (scope,),
    ).fetchall()
    if not rows:
        return None
    left, at, until, count, lim, window, exact = (int(v) for v in rows[0])
    return Allowance(left, at, from_epoch_ms(until), count, lim, window / 1000, bool(exact))


def put_allowance(conn: sqlite3.Connection, scope: str, record: Allowance) -> None:
    """Write the scope's announced allowance (its reset and window in ms)."""
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


def _rate_now(conn: sqlite3.Connection, scope: str, now_ms: int) -> Rate:
    """The scope's learned rate as of ``now_ms``, made at its first admission (a few
    rates unused for ``RATE_KEPT`` swept then); kept when it changed."""
    rate = rate_row_of(conn, scope)
    if rate is None:
        kept, open_kept = int(RATE_KEPT * 1000), int(OPEN_KEPT * 1000)
        conn.execute(_SWEEP_RATES, (now_ms - kept, now_ms - open_kept, SWEEP_PER_WRITE))
        rate = fresh_rate(now_ms / 1000)
        put_rate(conn, scope, rate)
        return rate
    rolled = roll_rate(rate, now_ms / 1000)
    if rolled is not rate:
        put_rate(conn, scope, rolled)
    return rolled


def rate_row_of(conn: sqlite3.Connection, scope: str) -> Rate | None:
    """The scope's learned rate as stored (None: none)."""
    rows = conn.execute(_RATE_ROW, (scope,)).fetchall()
    return rate_from_row(tuple(int(v) for v in rows[0])) if rows else None


def put_rate(conn: sqlite3.Connection, scope: str, rate: Rate) -> None:
    """Write the scope's learned rate (see ``rate.rate_row``)."""
    conn.execute(_PUT_RATE, (scope, *rate_row(rate)))

# ------------------------------------------------------------------------------------
# Token-weighted admission in the file of :class:`~.sqlite.SQLiteCooldownStore` (see
# ``weights``): the announced token allowance (a row of ``allowance`` under the scope's
# ``token_scope``) and a configured token quota's permits (``token_log``: one row per
# permit, with its cost and when it stops counting). Every function runs inside the
# write transaction its caller holds; times are UTC epoch milliseconds (``_ms``).


#: Rows of any scope's token permits that stopped counting, deleted per permit taken.
SWEEP_PER_WRITE = 8


def _name(limit: int, per: float) -> str:
    """A token quota's name in ``token_log``: ``"limit/per_ms"``."""
    return f"{int(limit)}/{window_ms(per)}"


def weigh_locked(
    conn: sqlite3.Connection, scope: str, weigh: Weigh, now: datetime
) -> tuple[Allowance | None, datetime | None]:
    """The attempt's tokens at ``now``: ``(record, None)`` when they fit (the announced
    token allowance with the cost counted, to write on the grant; :data:`NO_ALLOWANCE`
    when only a token quota weighs them; None: nothing weighs them), else ``(None,
    when to ask again)``, or ``(the announced allowance, its reset)`` when the cost is
    above its whole limit (``weights.oversized``); nothing taken (a rolled allowance is
    written)."""
    tokens = token_scope(scope)
    record = allowance_row(conn, tokens)
    counted = None
    if record is not None:
        if oversized(record, weigh.cost):
            return record, record.until  # never admitted (see ``weights.too_large``)
        counted, wait = admit_allowance(record, now, weigh.cost)
        if wait is not None:
            if counted != record:
                put_allowance(conn, tokens, counted)
            return None, from_epoch_ms(to_epoch_ms(wait))
    if weigh.limit <= 0:
        return counted, None
    check_fits(weigh.cost, weigh.limit, weigh.per)
    name = _name(weigh.limit, weigh.per)
    now_ms = now_epoch_ms(now)
    conn.execute(
        "DELETE FROM token_log WHERE scope = ? AND quota = ? AND expires_ms <= ?", (scope, name, now_ms)
    )
    rows = conn.execute(
        "SELECT expires_ms, cost FROM token_log WHERE scope = ? AND quota = ? ORDER BY expires_ms",
        (scope, name),
    ).fetchall()
    end = weighed_free_at(rows, sum(int(cost) for _, cost in rows), weigh.cost, weigh.limit)
    if end is not None:
        return None, from_epoch_ms(int(end))
    return counted or NO_ALLOWANCE, None


def take_locked(
    conn: sqlite3.Connection, scope: str, weigh: Weigh, now: datetime, counted: Allowance
) -> tuple[datetime | None, int | None]:
    """The grant's tokens: the announced allowance ``counted`` written (unless
    :data:`NO_ALLOWANCE`), the token quota's permit taken, ending at ``now`` rounded up +
    per + margin. Returns that end (None: no token quota) and the allowance's count
    after the cost, less one (None: none counted; see ``Admission.token_seq``)."""
    seq = None
    if counted is not NO_ALLOWANCE:
        put_allowance(conn, token_scope(scope), counted)
        seq = counted.admitted - 1
    if weigh.limit <= 0:
        return None, seq
    end_ms = to_epoch_ms(now) + window_ms(weigh.per) + math.ceil(weigh.margin * 1000)
    conn.execute(
        "DELETE FROM token_log WHERE rowid IN (SELECT rowid FROM token_log WHERE expires_ms <= ? LIMIT ?)",
        (now_epoch_ms(now), SWEEP_PER_WRITE),
    )
    conn.execute(
        "INSERT INTO token_log (scope, quota, expires_ms, cost) VALUES (?, ?, ?, ?)",
        (scope, _name(weigh.limit, weigh.per), end_ms, weigh.cost),
    )
    return from_epoch_ms(end_ms), seq


def settle_locked(conn: sqlite3.Connection, scope: str, weighed: Weighed, now_ms: int) -> None:
    """The token permit ``weighed`` was answered at ``now_ms`` (rounded up): it counts
    at least until then + per (put back if it was dropped meanwhile)."""
    old = to_epoch_ms(weighed.expires)
    new = now_ms + window_ms(weighed.per)
    if new <= old:
        return
    name = _name(weighed.limit, weighed.per)
    moved = conn.execute(
        "UPDATE token_log SET expires_ms = ? WHERE rowid = (SELECT rowid FROM token_log "
        "WHERE scope = ? AND quota = ? AND expires_ms = ? AND cost = ? LIMIT 1)",
        (new, scope, name, old, weighed.cost),
    ).rowcount
    if not moved:
        conn.execute(
            "INSERT INTO token_log (scope, quota, expires_ms, cost) VALUES (?, ?, ?, ?)",
            (scope, name, new, weighed.cost),
        )
