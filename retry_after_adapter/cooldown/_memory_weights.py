"""The memory store's token permits (a configured ``Quota(..., unit="tokens")``): per
scope and quota, a log of ``(end, cost)``, soonest end first, with the sum of its
costs; times in whole microseconds since the epoch. Every method runs under the
store's lock."""

from __future__ import annotations

import bisect
import collections
from datetime import datetime

from ._memory_log import _as_datetime
from .allowance import Allowance, admit_allowance
from .base import Admission, Weigh, Weighed, token_scope
from .weights import NO_ALLOWANCE, check_fits, oversized, weighed_free_at, with_weighed

#: A quota's log key: (limit, per in microseconds).
_Key = tuple[int, int]


class _Log:
    """One token quota's live permits and what they weigh."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: collections.deque[tuple[int, int]] = collections.deque()
        self.total = 0

    def drop(self, at: int) -> None:
        """Drop the permits that stopped counting at ``at``."""
        entries = self.entries
        while entries and entries[0][0] <= at:
            self.total -= entries.popleft()[1]

    def put(self, end: int, cost: int) -> None:
        if not self.entries or end >= self.entries[-1][0]:
            self.entries.append((end, cost))
        else:
            bisect.insort(self.entries, (end, cost))
        self.total += cost

    def remove(self, end: int, cost: int) -> bool:
        index = bisect.bisect_left(self.entries, (end, cost))
        if index < len(self.entries) and self.entries[index] == (end, cost):
            del self.entries[index]
            self.total -= cost
            return True
        return False


class TokenLogs:
    """Every scope's token permits (the lock is the store's)."""

    def __init__(self) -> None:
        self._logs: dict[str, dict[_Key, _Log]] = {}

    @staticmethod
    def _micros(seconds: float) -> int:
        return round(seconds * 1_000_000)

    def _log(self, scope: str, limit: int, per: float) -> _Log:
        logs = self._logs.setdefault(scope, {})
        key = (limit, self._micros(per))
        log = logs.get(key)
        if log is None:
            log = logs[key] = _Log()
        return log

    def refused(self, scope: str, weigh: Weigh, at: int) -> int | None:
        """None when ``weigh``'s cost fits its quota at ``at``, else when it could."""
        log = self._log(scope, weigh.limit, weigh.per)
        log.drop(at)
        end: int | None = weighed_free_at(log.entries, log.total, weigh.cost, weigh.limit)
        return end

    def weigh(
        self, allowances: dict[str, Allowance], scope: str, weigh: Weigh, now: datetime, at: int
    ) -> tuple[Allowance | None, datetime | None]:
        """The attempt's tokens, by the announced token allowances kept in
        ``allowances`` (the store's) and this log: ``(record, None)`` when they fit (the
        announced token allowance with the cost counted, to keep on the grant;
        ``weights.NO_ALLOWANCE`` when only a configured token quota weighs them; None: nothing weighs
        them), else ``(None, when to ask again)``, or ``(the announced allowance, its
        reset)`` when the cost is above its whole limit (``weights.oversized``: never
        admitted, see ``weights.too_large``); nothing taken."""
        record = allowances.get(token_scope(scope))
        counted = None
        if record is not None:
            if oversized(record, weigh.cost):
                return record, record.until
            counted, wait = admit_allowance(record, now, weigh.cost)
            if wait is not None:
                allowances[token_scope(scope)] = counted  # rolled
                return None, wait
        if weigh.limit > 0:
            check_fits(weigh.cost, weigh.limit, weigh.per)
            refused = self.refused(scope, weigh, at)
            if refused is not None:
                return None, _as_datetime(refused)
            return counted or NO_ALLOWANCE, None
        return counted, None

    def grant(
        self, allowances: dict[str, Allowance], scope: str, weigh: Weigh, at: int, counted: Allowance,
        answer: Admission,
    ) -> Admission:
        """The grant ``answer``'s tokens, checked by :meth:`weigh` before anything was
        taken: the announced allowance ``counted`` kept (its count after the cost: what
        an answer's figure holds as of), the token quota's permit taken."""
        seq = None
        if counted is not NO_ALLOWANCE:
            allowances[token_scope(scope)] = counted
            seq = counted.admitted - 1
        end = _as_datetime(self.take(scope, weigh, at)) if weigh.limit > 0 else None
        return with_weighed(answer, end, seq)

    def take(self, scope: str, weigh: Weigh, at: int) -> int:
        """Take ``weigh``'s permit at ``at``; returns when it stops counting."""
        end = at + self._micros(weigh.per + weigh.margin)
        self._log(scope, weigh.limit, weigh.per).put(end, weigh.cost)
        self._sweep(at)
        return end

    def settle(self, scope: str, weighed: Weighed, old: int, at: int) -> None:
        """The permit stopping at ``old`` was answered at ``at``: it counts at least
        until ``at + per`` (put back if it was dropped meanwhile)."""
        new = at + self._micros(weighed.per)
        if new <= old:
            return
        log = self._log(scope, weighed.limit, weighed.per)
        log.remove(old, weighed.cost)
        log.put(new, weighed.cost)

    def _sweep(self, at: int) -> None:
        """Forget a few scopes whose permits all stopped counting (one look per take)."""
        if len(self._logs) > 64:
            scope = next(iter(self._logs))
            logs = self._logs.pop(scope)
            if any(log.entries and log.entries[-1][0] > at for log in logs.values()):
                self._logs[scope] = logs  # still counts: to the back of the queue

    def holds(self, at: int) -> list[tuple[str, int, int]]:
        """``(scope, when the quota has room again, limit)`` of each full token quota."""
        found = []
        for scope, logs in self._logs.items():
            for (limit, _), log in logs.items():
                log.drop(at)
                if log.total >= limit and log.entries:
                    found.append((scope, log.entries[0][0], limit))
        return found

    def delete(self, scope: str) -> bool:
        return self._logs.pop(scope, None) is not None

    def clear(self) -> None:
        self._logs.clear()

