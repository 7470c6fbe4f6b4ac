"""Token-weighted admission in the file of :class:`~.sqlite.SQLiteCooldownStore` (see
``weights``): the announced token allowance (a row of ``allowance`` under the scope's
``token_scope``) and a configured token quota's permits (``token_log``: one row per
permit, with its cost and when it stops counting). Every function runs inside the
write transaction its caller holds; times are UTC epoch milliseconds (``_ms``)."""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime

from ._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms, window_ms
from ._sqlite_admit import allowance_row, put_allowance
from .allowance import Allowance, admit_allowance
from .base import Weigh, Weighed, token_scope
from .weights import NO_ALLOWANCE, check_fits, oversized, weighed_free_at

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
