"""The memory store's admission by a scope's learned rate (see ``rate``): a mixin of
:class:`~.memory.MemoryCooldownStore`, whose lock every ``_locked`` method runs
under; times in whole microseconds since the epoch (``at``)."""

from __future__ import annotations

import collections
import sys
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ._memory_log import _PROBE_RECHECK_US, _as_datetime, _granted, _micros, _rate_ended, _sweep
from .base import Admission, Learn, Lease
from .rate import Rate, answer_rate, fresh_rate, roll_rate


class RateAdmission:
    """What the memory store admits by, and tells, a scope's learned rate."""

    _lock: threading.Lock
    _rates: dict[str, Rate]
    _rate_scopes: collections.deque[str]

    if TYPE_CHECKING:  # the store's own

        def _refused(
            self, scope: str, key: tuple[int, int, int, timedelta] | None, limit: int | None,
            lease: Lease | None, at: int, cooldown: datetime | None,
        ) -> Admission | None: ...

        def _take_slot(self, scope: str, lease: Lease, at: int) -> int | None: ...

    def _admit_rate(
        self, scope: str, now: datetime, at: int, cooldown: datetime | None, lease: Lease | None,
        learn: Learn,
    ) -> Admission:
        """(Lock held, no cooldown running, no quota, no allowance.) Admission by the
        scope's learned rate (see ``rate``): a known send (one of its limit in the
        epoch; with probes to come, holding a probe slot until its answer), else a probe
        (a slot of its cap, every known send's answered), else refused."""
        rate = self._rate_locked(scope, at / 1e6)
        start = round(rate.start * 1e6)
        if start > at:  # a throttle's backoff
            return Admission(cooldown=cooldown, not_before=_as_datetime(start), by_rate=True)
        if rate.open or rate.known:
            refused = self._refused(scope, None, None, lease, at, cooldown)
            if refused is not None or rate.open:
                return refused or _granted(cooldown)  # (refused: every configured slot held)
            self._rates[scope] = rate.sending()
            if lease is None and rate.waits_for_known:
                # Probes follow in this epoch: this send holds a probe slot (never
                # refused for it) until its answer, so no probe races it to the server.
                self._take_slot(scope, Lease(slots=sys.maxsize, ttl=learn.ttl, token=learn.token), at)
                return Admission(cooldown=cooldown, not_before=None, token=learn.token, rate_epoch=rate.epoch)
            return Admission(cooldown=cooldown, not_before=None, rate_epoch=rate.epoch)
        ends = round(rate.ends * 1e6) if rate.limit > 0 else None
        if not rate.probes:
            assert ends is not None
            return Admission(cooldown=cooldown, not_before=_as_datetime(ends), by_rate=True)
        return self._probe_locked(scope, at, cooldown, lease, learn, rate, ends)

    def _probe_locked(
        self, scope: str, at: int, cooldown: datetime | None, lease: Lease | None, learn: Learn,
        rate: Rate, ends: int | None,
    ) -> Admission:
        """(Lock held; ``at``, ``ends`` (the epoch's end, None: no limit) in microseconds.)
        A probe of the learned ``rate``: a slot under its cap (with a configured
        ``lease``, the smaller), else held back at most ``PROBE_RECHECK`` seconds."""
        if lease is not None:
            cap = Lease(slots=min(lease.slots, rate.cap), ttl=lease.ttl, token=lease.token)
        else:
            cap = Lease(slots=rate.cap, ttl=learn.ttl, token=learn.token)
        busy = self._take_slot(scope, cap, at)
        if busy is not None and lease is not None and lease.slots <= rate.cap:
            # the configured cap binds
            return Admission(cooldown=cooldown, not_before=_as_datetime(busy), slot_busy=True)
        if busy is not None:
            again = min(busy, at + _PROBE_RECHECK_US, ends if ends is not None else busy)
            return Admission(cooldown=cooldown, not_before=_as_datetime(again), slot_busy=True, by_rate=True)
        self._rates[scope] = rate.probing()
        token = cap.token if lease is None else None
        return Admission(
            cooldown=cooldown, not_before=None, token=token, rate_epoch=rate.epoch, rate_report=True
        )

    def _rate_locked(self, scope: str, now: float) -> Rate:
        """(Lock held.) The scope's learned rate as of ``now`` (seconds since the epoch),
        made at its first admission; kept."""
        rate = self._rates.get(scope)
        if rate is None:
            from . import memory  # its bounds, read when a scope is new (tests set them)

            if len(self._rate_scopes) > memory._SWEEP_AT:
                _sweep(self._rate_scopes, self._rates, _rate_ended, now, memory._SWEEP_PER_WRITE)
            rate = fresh_rate(now)
            self._rate_scopes.append(scope)
        else:
            rate = roll_rate(rate, now)
        self._rates[scope] = rate
        return rate

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        """See ``Store.rate_answer``."""
        at = _micros(now) / 1e6
        # The throttle's end in whole milliseconds rounded up, as the other stores keep
        # it: an epoch that begins there (and each a window on) never begins before it.
        end = None if until is None else -(-_micros(until) // 1000) / 1000
        with self._lock:
            rate = self._rates.get(scope)
            if rate is not None:
                self._rates[scope] = answer_rate(rate, epoch, end, at, probe)

    def rate_of(self, scope: str) -> Rate | None:
        """See ``Store.rate_of``."""
        return self._rates.get(scope)

