"""Admission decisions per second against one Redis, flat out, no HTTP in the way.

Each limiter is asked "may one more go now?" in a loop by ``threads`` threads in each
of ``processes`` worker processes (one limiter object per process, shared by its
threads, as an application holds one; pyrate-limiter's one a thread, see
``_decider``), on a quota of ``limit`` per 1 s:

- ``Redis INCRBY``: one ``INCRBY`` a decision, the floor throttled-py's own benchmark
  quotes its figures against;
- ``retry_after_adapter engine``: what the engine calls for each attempt, the store's
  process-wide failure layer (``guard_of``: the near copy, its batches of permits, a
  quota permit taken open) with the engine's ``Ask``; each admitted permit is settled
  exactly at once, as its answer would (coalesced with the others, as the engine's are);
- ``retry_after_adapter store``: ``RedisCooldownStore.admit`` itself, one ``EVALSHA``
  of its admission script a decision (a plain permit, counting per + margin: no settle
  owed);
- ``throttled-py GCRA``: ``Throttled.limit(key)`` on its ``RedisStore`` (one Lua call a
  decision, no wait);
- ``pyrate-limiter``: ``Limiter.try_acquire(key, blocking=False)`` on its
  ``RedisBucket``.

A refusal is a decision as much as a grant: on a binding quota most are refusals
(nobody waits or reserves: every limiter's non-blocking check), and what was admitted a
second says whether the quota held. Each phase measures,
after a short warm-up, the decisions made within its window, the client processes' CPU
(all threads) and Redis round trips (each write of redis-py's connections, counted at
the clients, a pipeline once), and the Redis server's CPU and commands (``INFO cpu``,
``INFO commandstats``, the scripts' own commands included).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from . import load

INCRBY = "Redis INCRBY"
ENGINE = "retry_after_adapter engine"
STORE = "retry_after_adapter store"
THROTTLED = "throttled-py GCRA"
PYRATE = "pyrate-limiter"
LIMITERS = (INCRBY, ENGINE, STORE, THROTTLED, PYRATE)
#: The two quotas of a phase: one no decision reaches, one that refuses most.
MODES = {"open": 1_000_000, "binding": 40}
PER = 1.0
MARGIN = 0.05  # Quota's default
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall", "evalsha_ro", "eval_ro")

ADMITTED, REFUSED = 0, 1


def _decider(name: str, url: str, limit: int, key: str, shared: dict[str, Any]) -> Callable[[], int]:
    """One decision of ``name``'s limiter on the quota ``limit`` per 1 s under ``key``:
    ADMITTED or REFUSED. ``shared``: what the process keeps across phases (our store)."""
    if name == INCRBY:
        import redis

        client = shared.setdefault("redis", redis.Redis.from_url(url))
        return lambda: ADMITTED if client.incrby(key, 1) else REFUSED  # (always: a floor)
    if name == THROTTLED:
        from throttled import RateLimiterType, RedisStore, Throttled, rate_limiter

        throttle = shared.get(key)
        if throttle is None:  # one a process, its threads sharing it
            throttle = shared[key] = Throttled(
                key=key, using=RateLimiterType.GCRA.value, quota=rate_limiter.per_sec(limit),
                store=RedisStore(server=url),
            )
        return lambda: REFUSED if throttle.limit(key).limited else ADMITTED
    if name == PYRATE:
        import redis
        from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

        # One a thread: a Limiter's lock refuses a call that does not block while another
        # thread holds it, without asking Redis (not a decision of the quota).
        client = shared.setdefault("redis", redis.Redis.from_url(url))
        limiter = Limiter(RedisBucket.init([Rate(limit, Duration.SECOND)], client, key))
        shared.setdefault("close", []).append(limiter)
        return lambda: ADMITTED if limiter.try_acquire(key, blocking=False) else REFUSED
    from retry_after_adapter import RedisCooldownStore
    from retry_after_adapter.cooldown.base import Ask
    from retry_after_adapter.cooldown.guard import guard_of
    from retry_after_adapter.engine.plan import OPEN_FOR

    store = shared.get("store")
    if store is None:
        store = shared["store"] = RedisCooldownStore.from_url(url, prefix="bench-decide:")
    if name == STORE:
        ask = Ask(scope=key, limit=limit, per=PER, margin=MARGIN)
        admit = store.admit
        return lambda: REFUSED if admit(ask).not_before is not None else ADMITTED
    if name != ENGINE:
        raise ValueError(f"unknown limiter {name!r}")
    guard = guard_of(store)
    ask = Ask(scope=key, limit=limit, per=PER, margin=MARGIN, opened=OPEN_FOR)  # plan.Plan.asked
    engine_admit, settle = guard.admit, guard.settle

    def engine() -> int:
        answer = engine_admit(ask)
        if answer.not_before is not None:
            return REFUSED
        if answer.permit is not None:  # answered at once: settled exactly (plan.Plan._settle,
            settle(key, limit, PER, answer.permit, None, True)  # on the real clock)
        return ADMITTED

    return engine


def _store_down(shared: dict[str, Any]) -> bool:
    """Whether this process's failure layer of our store holds the store down (then
    the engine's local copy decides alone: failing open, each process counting apart)."""
    store = shared.get("store")
    if store is None:
        return False
    from retry_after_adapter.cooldown.base import FAILURE_LAYERS

    guard = FAILURE_LAYERS.find(store)
    return bool(guard is not None and guard.breaker.is_down)


def _worker(name: str, url: str, inbox: Any, outbox: Any, index: int) -> None:
    """A worker process: runs each phase its inbox sends, reports each; None ends it."""
    load._count_round_trips()
    shared: dict[str, Any] = {}
    try:  # imported and connected before the first phase's clock runs
        ready = _decider(name, url, MODES["open"], f"bench-decide-ready-{index}-{name}", shared)
        with contextlib.suppress(Exception):  # (a slow store: its next phases will tell)
            ready()
        outbox.put((index, "ready"))
    except Exception as exc:
        outbox.put((index, {"error": f"{type(exc).__name__}: {exc}"}))
    while True:
        phase = inbox.get()
        if phase is None:
            break
        limit, threads, key, start, t0, t1 = phase
        try:  # each thread's (see _decider)
            deciders = [_decider(name, url, limit, key, shared) for _ in range(threads)]
        except Exception as exc:
            outbox.put((index, {"error": f"{type(exc).__name__}: {exc}"}))
            continue
        counts = [[0, 0] for _ in range(threads)]
        failures = [0]
        for decide in deciders:  # scripts loaded, connections made (a failure: counted below)
            with contextlib.suppress(Exception):
                decide()

        def run(mine: list[int], decide: Callable[[], int]) -> None:
            time.sleep(max(0.0, start - time.monotonic()))
            while True:
                try:
                    outcome = decide()
                except Exception:
                    failures[0] += 1
                    outcome = -1
                done = time.monotonic()
                if done >= t1:
                    return
                if done >= t0 and outcome >= 0:
                    mine[outcome] += 1

        pairs = zip(counts, deciders, strict=True)
        workers = [threading.Thread(target=run, args=pair, daemon=True) for pair in pairs]
        for worker in workers:
            worker.start()
        load._SENT[0], load._WINDOW[:] = 0, [t0, t1]
        time.sleep(max(0.0, t0 - time.monotonic()))
        cpu0 = time.process_time()
        time.sleep(max(0.0, t1 - time.monotonic()))
        cpu1 = time.process_time()
        for worker in workers:
            worker.join(max(1.0, t1 - time.monotonic() + 30))
        outbox.put((index, {
            "admitted": sum(c[ADMITTED] for c in counts),
            "refused": sum(c[REFUSED] for c in counts),
            "failures": failures[0],
            "client_cpu_s": cpu1 - cpu0,
            "round_trips": load._SENT[0],
            "stuck": sum(w.is_alive() for w in workers),
            "store_down": _store_down(shared),
        }))
    for limiter in shared.get("close", []):
        with contextlib.suppress(Exception):
            limiter.close()
    if "store" in shared:
        from retry_after_adapter.cooldown.base import quiesce_guard

        quiesce_guard(shared["store"])
        shared["store"].close()


def _script_usec(kept: load.Stores) -> tuple[int, float]:
    """Script calls since the reset and the microseconds Redis spent in them."""
    calls, usec = 0, 0.0
    for client in kept.clients["redis"]:
        for name, entry in client.info("commandstats").items():
            if name.removeprefix("cmdstat_") in SCRIPT_COMMANDS:
                calls += int(entry["calls"])
                usec += float(entry["usec"])
    return calls, usec


class Fleet:
    """``processes`` worker processes of one limiter, kept across its phases."""

    def __init__(self, name: str, url: str, processes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.outbox = context.Queue()
        self.inboxes = [context.Queue() for _ in range(processes)]
        self.procs = [
            context.Process(target=_worker, args=(name, url, inbox, self.outbox, i), daemon=True)
            for i, inbox in enumerate(self.inboxes)
        ]
        for proc in self.procs:
            proc.start()
        ready: dict[int, Any] = {}
        last = time.monotonic() + 120
        while len(ready) < processes and time.monotonic() < last:
            with contextlib.suppress(queue.Empty):
                index, message = self.outbox.get(timeout=max(0.1, last - time.monotonic()))
                ready[index] = message
        #: Why the workers cannot decide ("" when they all can).
        self.broken = next((m["error"] for m in ready.values() if m != "ready"), "")
        if len(ready) < processes:
            self.broken = self.broken or "a worker did not start"

    def phase(
        self, kept: load.Stores, limit: int, threads: int, key: str, setup: float, warm: float,
        duration: float,
    ) -> dict[str, Any]:
        """One phase: every process's threads decide flat out; what they and Redis did."""
        if self.broken:
            return {"error": self.broken}
        kept.empty("redis")
        start = time.monotonic() + setup
        t0 = start + warm
        t1 = t0 + duration
        for inbox in self.inboxes:
            inbox.put((limit, threads, key, start, t0, t1))
        time.sleep(max(0.0, t0 - time.monotonic()))
        kept.reset_stats("redis")
        cpu0 = kept.cpu("redis")
        time.sleep(max(0.0, t1 - time.monotonic()))
        cpu1 = kept.cpu("redis")
        commands = kept.commands("redis")
        scripts, script_usec = _script_usec(kept)
        reports: dict[int, dict[str, Any]] = {}
        last = time.monotonic() + 60 + duration
        while len(reports) < len(self.procs) and time.monotonic() < last:
            with contextlib.suppress(queue.Empty):
                index, report = self.outbox.get(timeout=max(0.1, last - time.monotonic()))
                reports[index] = report
        errors = [r["error"] for r in reports.values() if "error" in r]
        if errors or len(reports) < len(self.procs):
            return {"error": errors[0] if errors else "a worker did not report"}
        made = sum(r["admitted"] + r["refused"] for r in reports.values())
        result: dict[str, Any] = {
            "decisions_per_s": made / duration,
            "admitted_share": sum(r["admitted"] for r in reports.values()) / made if made else None,
            "admitted_per_s": sum(r["admitted"] for r in reports.values()) / duration,
            "store_down": sum(r["store_down"] for r in reports.values()),
            "failures": sum(r["failures"] for r in reports.values()),
            "stuck_threads": sum(r["stuck"] for r in reports.values()),
        }
        if made:
            busy = max(0.0, cpu1 - cpu0 - kept.idle["redis"] * duration)
            result["redis_cpu_us_per_decision"] = busy / made * 1e6
            client = sum(r["client_cpu_s"] for r in reports.values())
            result["client_cpu_us_per_decision"] = client / made * 1e6
            result["round_trips_per_decision"] = sum(r["round_trips"] for r in reports.values()) / made
            result["commands_per_decision"] = commands / made
        if scripts:
            result["script_usec_per_call"] = script_usec / scripts
        return result

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
