"""``status --cooldown URL`` lists what a shared store holds each scope back with;
``clear SCOPE --cooldown URL`` lifts it for one scope."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..cooldown.base import FreshnessLog, Listing
from ._output import EX_FAILED, EX_OK, EX_UNAVAILABLE, EX_USAGE, err, open_store, print_json

if TYPE_CHECKING:
    from ..cooldown.base import Hold
    from ..cooldown.freshness import Freshness

    Row = tuple[str, Freshness]


def _shared_store(text: str) -> tuple[Any, int]:
    """The store ``--cooldown`` names for ``status`` and ``clear`` (a URL, or
    ``module:factory`` for a store of one's own), or (after an error message) None and
    the exit code: not a shared store, a store that lists nothing, or unavailable."""
    from ..cooldown.base import Listing
    from ..errors import ConfigurationError, CooldownStoreError

    if text.strip().lower().startswith("memory:"):
        err("error: --cooldown: memory:// lives inside one process; use sqlite:// or redis://")
        return None, EX_USAGE
    try:
        store = open_store(text, None, create=False)
    except (ConfigurationError, ImportError) as exc:
        err(f"error: --cooldown: {exc}")
        return None, EX_USAGE
    except CooldownStoreError as exc:
        err(f"error: {exc}")
        return None, EX_UNAVAILABLE
    if not isinstance(store, Listing):
        err(
            f"error: --cooldown: {type(store).__name__} cannot list what it holds: status and "
            "clear need a store with the Listing capability (entries, holds, delete)"
        )
        return None, EX_USAGE
    return store, EX_OK


# --------------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    from ..cooldown.base import FreshnessLog
    from ..errors import CooldownStoreError

    store, code = _shared_store(args.cooldown)
    if store is None:
        return code
    now = datetime.now(timezone.utc)
    try:
        entries = store.entries()
        fresh: dict[str, Freshness] = store.freshness_entries() if isinstance(store, FreshnessLog) else {}
        holds: dict[str, list[Hold]] = store.holds(now)
    except CooldownStoreError as exc:
        err(f"error: {_plain(exc)}")
        return EX_UNAVAILABLE
    _merge(fresh, entries, holds)
    rows = _rows(fresh, now, every=args.all)
    if args.json:
        cooldowns = [_row_json(scope, record, holds.get(scope, []), now) for scope, record in rows]
        print_json({"now": now.isoformat(), "cooldowns": cooldowns})
    elif not rows:
        print("no cooldown is running" if not args.all else "nothing is stored")
    else:
        _print_table(rows, holds, now)
    return EX_OK


def _merge(fresh: dict[str, Freshness], entries: dict[str, datetime], holds: dict[str, list[Hold]]) -> None:
    """Add to ``fresh`` every scope the store holds back, eligible when its last block ends."""
    from dataclasses import replace

    from ..cooldown.freshness import Freshness

    for scope, until in entries.items():
        fresh.setdefault(scope, Freshness(next_eligible=until))
    for scope, held in holds.items():
        # Every kind of block counts for when the scope is eligible again.
        ends = [hold.until for hold in held if hold.kind != "leases"]
        record = fresh.setdefault(scope, Freshness())
        if ends and (record.next_eligible is None or max(ends) > record.next_eligible):
            fresh[scope] = replace(record, next_eligible=max(ends))


def _rows(fresh: dict[str, Freshness], now: datetime, *, every: bool) -> list[Row]:
    """The scopes to list (those still held back, or ``every`` one), the latest first."""
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(
        (
            (scope, record)
            for scope, record in fresh.items()
            if every or (record.next_eligible is not None and record.next_eligible > now)
        ),
        key=lambda row: (row[1].next_eligible or epoch, row[1].last_success or epoch, row[0]),
        reverse=True,
    )


def _row_json(scope: str, record: Freshness, held: list[Hold], now: datetime) -> dict[str, Any]:
    until = record.next_eligible
    return {
        "scope": scope,
        "eligible_at": _iso(until),
        "seconds_left": round(max(0.0, (until - now).total_seconds()), 3) if until is not None else 0.0,
        "last_success": _iso(record.last_success),
        "seconds_since_success": None
        if record.last_success is None
        else round(record.seconds_since_success(now) or 0.0, 3),
        "last_error": record.last_error,
        "last_error_at": _iso(record.last_error_at),
        "held_by": [{"kind": hold.kind, "until": _iso(hold.until), "number": hold.number} for hold in held],
    }


def _print_table(rows: list[Row], holds: dict[str, list[Hold]], now: datetime) -> None:
    width = max(len("scope"), *(len(scope) for scope, _ in rows))
    print(
        f"{'scope':<{width}}  {'eligible at (UTC)':<25}  {'left':<8}  {'held by':<18}  "
        f"{'last success':<14}  last error"
    )
    for scope, record in rows:
        until = record.next_eligible
        left = max(0.0, (until - now).total_seconds()) if until is not None else 0.0
        shown = f"{left:.1f} s" if left else ("ended" if until is not None else "-")
        eligible = until.isoformat(timespec="seconds") if until is not None else "-"
        kinds = ",".join(sorted({hold.kind for hold in holds.get(scope, [])})) or "-"
        print(
            f"{scope:<{width}}  {eligible:<25}  {shown:<8}  {kinds:<18}  "
            f"{_success_cell(record, now):<14}  {_error_cell(record, now)}"
        )


def _success_cell(record: Freshness, now: datetime) -> str:
    since = record.seconds_since_success(now)
    return "never" if since is None else f"{_ago(since)} ago"


def _error_cell(record: Freshness, now: datetime) -> str:
    if record.last_error is None or record.last_error_at is None:
        return "-"
    return f"{record.last_error}, {_ago(max(0.0, (now - record.last_error_at).total_seconds()))} ago"


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _ago(seconds: float) -> str:
    """A duration for a person: 4.2 s, 12 min, 3.5 h, 2.0 d."""
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# --------------------------------------------------------------------------- clear
def cmd_clear(args: argparse.Namespace) -> int:
    from ..errors import ConfigurationError, CooldownStoreError

    store, code = _shared_store(args.cooldown)
    if store is None:
        return code
    scope: str = args.scope
    try:
        held = store.holds().get(scope, [])
        until = store.get(scope)
        removed = store.delete(scope)
        nearest = [] if removed else _nearest(store, scope)
    except ConfigurationError as exc:
        err(f"error: {exc}")
        return EX_USAGE
    except CooldownStoreError as exc:
        err(f"error: {_plain(exc)}")
        return EX_UNAVAILABLE
    if not removed:
        nearest = [found for found in nearest if found != scope]  # never the one just missed
        hint = f"; stored scopes like it: {', '.join(nearest)}" if nearest else ""
        err(f"nothing is stored for {scope}{hint}")
        return EX_FAILED
    others = sorted({hold.kind for hold in held} - {"cooldown"})
    ran = f" (it ran until {until.isoformat()})" if until is not None else ""
    also = f"; also lifted: {', '.join(others)}" if others else ""
    what = "the cooldown of " if until is not None else "what holds back "
    print(f"cleared {what}{scope}{ran}{also}")
    return EX_OK


def _nearest(store: Listing, scope: str) -> list[str]:
    """Stored scopes that the one asked for names in part (an origin without its port,
    a scheme less): what the operator most likely meant."""
    known = set(store.entries()) | set(store.holds())
    if isinstance(store, FreshnessLog):
        known |= set(store.freshness_entries())
    bare = scope.rstrip("/")
    return sorted(k for k in known if bare and (k.startswith(bare) or bare.startswith(k)))[:5]


def _plain(exc: BaseException) -> str:
    """A store error for a person: without the package's internal operation names."""
    return re.sub(r" during [a-z_]+", "", str(exc))
