"""A store of your own with two capabilities, ``QuotaLogs`` and ``Leases``: a dict
under one lock, shared by the threads of one process. Besides the cooldown (``get``
and ``extend``), its ``admit`` takes a configured quota's permits and a concurrency
slot, all or nothing, and its ``answer`` settles a permit and gives a slot back; so
an adapter on it takes ``quota=Quota(...)`` and ``max_concurrency=``. It passes the
conformance kit. Run it to see eight threads share a quota of 3 requests per second
and at most 2 requests in flight: ``python3 examples/locked_dict_store.py``.
"""

from __future__ import annotations

import math
import threading
from datetime import datetime, timedelta, timezone

from retry_after_adapter.cooldown import (
    Admission,
    Answer,
    Ask,
    Leases,
    QuotaLogs,
    Store,
    check_scope,
    check_until,
)
from retry_after_adapter.cooldown.base import extra_permits, free_at

Micros = int  # every time is kept as whole microseconds since the epoch, every span too


class LockedDictStore(Store, QuotaLogs, Leases):
    """Cooldowns, quota permits and concurrency leases in dicts, each operation under
    one lock (so an admission is atomic: nothing is read outside the lock it writes
    under). A permit is ``[end, expected]``: it counts until ``end``; ``expected`` is,
    for an open permit, when it would end had its answer come in time (else None)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, Micros] = {}
        self._permits: dict[str, list[list[Micros | None]]] = {}
        self._leases: dict[str, dict[str, Micros]] = {}  # scope -> {token: end}

    def get(self, scope: str) -> datetime | None:
        until = self._until.get(check_scope(scope))
        return None if until is None else _time(until)

    def extend(self, scope: str, until: datetime) -> datetime:
        scope, asked = check_scope(scope), _micros(check_until(until))
        with self._lock:  # later wins, atomically
            kept = self._until[scope] = max(self._until.get(scope, asked), asked)
        return _time(kept)

    def admit(self, ask: Ask) -> Admission:
        scope = check_scope(ask.scope)  # refused before anything is taken
        now = _micros(check_until(ask.now) if ask.now is not None else datetime.now(timezone.utc))
        with self._lock:
            stored = self._until.get(scope)
            cooldown = None if stored is None else _time(stored)
            waits = [stored] if stored is not None and stored > now else []  # -> not_before
            permits = leases = None
            if ask.limit is not None and ask.per is not None:  # a quota (QuotaLogs)
                per, margin = _span(ask.per), _span(ask.margin)
                permits = [p for p in self._permits.get(scope, []) if p[0] > now]  # still counting
                self._permits[scope] = permits
                if len(permits) >= ask.limit:
                    closed = sorted(p[0] for p in permits if p[1] is None)
                    expected = [p[1] for p in permits if p[1] is not None]
                    waits.append(free_at(closed, expected, ask.limit, len(permits), now + per))
            if ask.lease is not None:  # a concurrency slot (Leases)
                slots, ttl, token = ask.lease.slots, ask.lease.ttl, ask.lease.token
                leases = {t: end for t, end in self._leases.get(scope, {}).items() if end > now}
                self._leases[scope] = leases
                held = sorted(end for t, end in leases.items() if t != token)
                if len(held) >= slots and not waits:  # refused only because every slot is held:
                    busy = _time(held[len(held) - slots])  # when the earliest lease expires
                    return Admission(cooldown=cooldown, not_before=busy, slot_busy=True)
            if waits:  # all or nothing: refused, nothing taken
                return Admission(cooldown=cooldown, not_before=_time(max(waits)))
            if ask.lease is not None and leases is not None:
                leases[token] = now + _span(ttl)
            if permits is None:
                return Admission(cooldown=cooldown, not_before=None)
            opened, hold = _span(ask.opened), _span(ask.hold)
            counts = now + per + margin  # a permit counts per + margin from its grant
            first = [counts + opened, counts if opened else None]  # open: `opened` longer
            extra = extra_permits(ask.batch, ask.limit - len(permits), ask.limit)
            later = [first[0] + hold, None if first[1] is None else first[1] + hold]  # hold longer
            permits.extend([first, *(list(later) for _ in range(extra))])
            return Admission(cooldown=cooldown, not_before=None, permit=_time(first[0]), extra=extra)

    def answer(self, answer: Answer) -> None:
        scope = check_scope(answer.scope)
        now = _micros(check_until(answer.now) if answer.now is not None else datetime.now(timezone.utc))
        with self._lock:
            if answer.token is not None:  # the slot given back
                self._leases.get(scope, {}).pop(answer.token, None)
            if answer.permit is not None:  # the permit settled: found by its stored end
                stored, ends = _micros(answer.permit.expires), now + _span(answer.permit.per)
                permits = self._permits.setdefault(scope, [])
                found = next((p for p in permits if p[0] == stored), None)
                if found is None:  # it stopped counting meanwhile: put back
                    permits.append([ends, None])
                else:  # at least until the answer + per; exactly then (earlier too) if exact
                    found[:] = [ends if answer.permit.exact else max(stored, ends), None]


def _micros(at: datetime) -> Micros:
    return (at - _EPOCH) // timedelta(microseconds=1)


def _span(seconds: float) -> Micros:
    return math.ceil(round(seconds * 1_000_000, 3))  # rounded up: nothing ends early


def _time(micros: Micros) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

if __name__ == "__main__":
    import time
    from concurrent.futures import ThreadPoolExecutor
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry

    arrivals: list[float] = []
    flight, counting = {"now": 0, "most": 0}, threading.Lock()

    class Slow(BaseHTTPRequestHandler):  # answers each request after 0.2 s, counting them
        def do_GET(self) -> None:
            with counting:
                arrivals.append(time.monotonic())
                flight["now"] += 1
                flight["most"] = max(flight["most"], flight["now"])
            time.sleep(0.2)
            with counting:
                flight["now"] -= 1
            self.send_response(200), self.send_header("Content-Length", "0"), self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    store = LockedDictStore()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/"

    def worker(n: int) -> int:  # a Session per thread, one store between them
        with requests.Session() as session:
            retry, quota = RetryAfterRetry(total=0), Quota(3, per=1.0)  # 3 in any second, 2 at once
            session.mount("http://", RetryAfterAdapter(retry, cooldown=store, quota=quota, max_concurrency=2))
            return session.get(url).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(worker, range(8)))
    server.shutdown(), server.server_close()
    busiest = max(sum(a <= t < a + 1.0 for t in arrivals) for a in arrivals)
    print("answers:", *codes)
    print(f"sent over {arrivals[-1] - arrivals[0]:.1f} s; most in any second: {busiest}; ", end="")
    print("most at once:", flight["most"])
