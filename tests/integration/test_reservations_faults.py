"""Reservations under a binding quota while something breaks around them, with real
parts: worker processes on one Redis restarted mid-run (its data kept by its
append-only file, or lost), on a real 3-node Redis Cluster, and on a memory store, a
SQLite file and a Redis while every core is kept busy, each against a loopback
``QuotaServer`` that logs every arrival.

Every fleet sends flat out through ``Quota(20, per=1)`` against a server allowing 20
a second, so the quota binds the whole run: most calls sleep on a reservation. What
is checked is the server's count (no second holding more than 20 arrivals), that the
fleet is served (goodput: the server's 200s against what the quota allowed while the
fleet sent), and that no call and no process hangs (bounded time).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from retry_after_adapter.testing.redis import RedisCluster, RedisServer
from retry_after_adapter.testing.server import QuotaServer

#: The quota that binds: 20 a second, with the default margin.
LIMIT, PER, MARGIN = 20, 1.0, 0.25
QUOTA = f"{LIMIT},{PER},{MARGIN}"
#: Each call's deadline in the children (``fault_children.fleet``), seconds.
DEADLINE = 10.0
#: The most one call may take: its deadline, and half as much again for a loaded
#: machine (a call past it has hung).
LONGEST = DEADLINE * 1.5
#: Seconds a process may take to start and say it is ready (imports on a loaded machine).
START = 60.0


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.fault_children", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ready(procs: list[subprocess.Popen[str]]) -> None:
    """Wait until each fleet process has opened its store and said so."""
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # (a child that dies says nothing: EOF)
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"a fleet process did not start: {line!r} {err[-2000:]}")


def go(procs: list[subprocess.Popen[str]]) -> float:
    """Start every fleet process's sending at once; the epoch seconds it started."""
    started = time.time()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return started


def reports(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Each fleet process's report; every process must have ended within ``timeout``
    seconds (from now) and succeeded."""
    ends = time.monotonic() + timeout
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(0.1, ends - time.monotonic()))
            assert proc.returncode == 0, stderr[-2000:]
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return out


@dataclass
class Run:
    """What one fleet run saw: the server's arrivals (epoch seconds, status), each
    call's ``[start, end, status, reason]``, when sending started and for how long."""

    arrivals: list[tuple[float, int]]
    calls: list[list[Any]]
    started: float
    seconds: float
    reserved: int
    admits: int

    def worst(self, since: float = 0.0, until: float = float("inf")) -> int:
        """The most arrivals in any ``PER`` seconds starting in ``[since, until)``."""
        times = [t for t, _ in self.arrivals]
        return max(
            (bisect.bisect_left(times, t + PER) - i for i, t in enumerate(times) if since <= t < until),
            default=0,
        )

    def crowded(self) -> str:
        """The arrivals (seconds from the start, status) in the worst second, to
        explain a failure."""
        times = [t for t, _ in self.arrivals]
        counts = [bisect.bisect_left(times, t + PER) - i for i, t in enumerate(times)]
        first = counts.index(max(counts)) if counts else 0
        inside = self.arrivals[first : first + (max(counts) if counts else 0)]
        return ", ".join(f"{t - self.started:.3f}:{status}" for t, status in inside)

    def served(self, since: float, until: float) -> int:
        """The server's 200s in ``[since, until)``."""
        return sum(1 for t, status in self.arrivals if since <= t < until and status == 200)

    def goodput(self) -> float:
        """The server's 200s from the first arrival to the end of sending, against what
        the quota allowed in that time: ``LIMIT`` in each of the server's windows that
        began in it (they start at the first arrival)."""
        first = self.arrivals[0][0]
        span = self.started + self.seconds - first
        return self.served(first, first + span) / (LIMIT * math.ceil(span / PER))

    def statuses(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for _, _, status, reason in self.calls:
            key = f"{status} {reason}".strip()
            counted[key] = counted.get(key, 0) + 1
        return counted

    def longest(self) -> float:
        return max(end - start for start, end, _, _ in self.calls)


def fleet_run(
    server: QuotaServer,
    kind: str,
    where: str,
    processes: int,
    threads: int,
    seconds: float,
    failure: str = "open",
    during: Callable[[Callable[[], object]], None] | None = None,
    late: int = 0,
    prefix: str = "faults:",
    options: str = "{}",
) -> Run:
    """``processes`` fleet processes of ``threads`` threads each on the store of
    ``kind`` at ``where`` send to ``server`` for ``seconds``; ``during`` runs once they
    have started (it breaks something), given a function that starts ``late`` more
    such processes (started and ready already: they begin at once). Every process must
    end within the calls' deadline after its sending stops (no call, and no process,
    hangs)."""
    url = server.url + "/"
    procs = [
        child("fleet", kind, where, prefix, url, str(threads), str(seconds), QUOTA, failure, options)
        for _ in range(processes + late)
    ]
    try:
        ready(procs)
        started = go(procs[:processes])
        if during is not None:
            during(functools.partial(go, procs[processes:]))
        got = reports(procs, seconds + DEADLINE + 20)  # (+20: a loaded machine's slack)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    arrivals = sorted((a.at.timestamp(), a.status) for a in list(server.arrivals))
    calls = [call for report in got for call in report["calls"]]
    reserved = sum(report["reserved"] for report in got)
    admits = sum(report["admits"] for report in got)
    return Run(arrivals, calls, started, seconds, reserved, admits)


def served_enough(run: Run, least: float) -> None:
    """The fleet's goodput is at least ``least`` (every other check of the test comes
    first). With reservations it is about ``per / (per + margin)``: 0.8 at this
    margin of 0.25 s (a place is ``per + margin`` after the one it follows); it fell to
    0.35-0.47 when a refusal read only the first open permits (reverted)."""
    assert run.goodput() >= least, f"goodput {run.goodput():.2f} < {least}, {run.statuses()}"


# ============================================================ one Redis, no fault
@pytest.mark.redis
@pytest.mark.parametrize("options", ["{}", '{"max_waiting": 1000}'], ids=["reservations", "no-reservations"])
def test_processes_on_one_redis_keep_a_binding_quota(options: str, redis_client: Any, redis_url: str) -> None:
    """4 processes x 8 threads on one Redis through ``Quota(20, per=1)`` for 4 s, with
    reservations (the default) and without (``max_waiting`` set: a refused call waits
    and asks again): no second at the server holds more than 20 arrivals, the server
    refused none, the fleet is served (goodput at least 0.6) and no call hangs. (Before
    reservations kept a mark beside their permit, 6 runs of 9 with reservations had a
    second of 21-24 on a loaded machine, the ones without none; the goodputs printed
    compare the two.)"""
    with QuotaServer(LIMIT, PER, align="first") as server:
        run = fleet_run(server, "redis", redis_url, 4, 8, 4.0, options=options)
    print(
        f"\nredis 4x8 {options}: worst window {run.worst()}/{LIMIT}; served {run.served(0, float('inf'))}, "
        f"goodput {run.goodput():.2f}; {run.reserved} reservations in {run.admits} admissions; longest call "
        f"{run.longest():.2f} s; {run.statuses()}"
    )
    assert run.longest() <= LONGEST
    if options == "{}":
        assert run.reserved > 0
    assert run.worst() <= LIMIT, run.crowded()
    assert all(status == 200 for _, status in run.arrivals)
    if options == "{}":
        served_enough(run, 0.6)
    assert run.goodput() >= 0.6


# ============================================================ a Redis restarted mid-run
#: Seconds Redis stays down: stopped (SIGTERM: with ``appendonly`` it writes its file
#: and exits) once two windows' worth of the fleet's sends have reached the server,
#: while the last ones' settles wait to be written (up to 0.25 s, coalesced), and
#: started again on the same port this long after.
OUTAGE = 0.3
RESTART_SECONDS = 6.0
#: From a second after the restart, for three seconds, at least this share of what the
#: quota allows must be served (the fleet has recovered).
RECOVERED = 0.6


@dataclass
class Restarted:
    run: Run
    down: float  # epoch seconds: when the stop began
    up: float  # epoch seconds: when the restarted server answered

    def recovered(self) -> int:
        """The server's 200s in the three seconds from a second after the restart."""
        return self.run.served(self.up + 1, self.up + 4)


@pytest.fixture(scope="module")
def restarted(
    redis_binary: str, redis_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Restarted]]:
    """``restarted(data)``: one run (made once per module) of 4 processes x 8 threads
    on a Redis of their own, failing closed (``store_failure="closed"``: nothing is
    sent while the store is down), the Redis stopped and started again mid-run; then a
    fifth process of 8 threads starts sending on it, as a worker started (or
    reconnected) just after the restart would. ``data``: "kept" (``appendonly yes``:
    what the store held comes back) or "lost" (no persistence: it comes back empty)."""
    made: dict[str, Restarted] = {}

    def run(data: str) -> Restarted:
        if data in made:
            return made[data]
        extra = ("--appendonly", "yes") if data == "kept" else ()
        redis = RedisServer(tmp_path_factory.mktemp(f"redis-{data}"), extra, binary=redis_binary).start()
        times: list[float] = []

        def restart(newcomer: Callable[[], object]) -> None:
            ends = time.monotonic() + START
            while server.stats().requests < 2 * LIMIT and time.monotonic() < ends:
                time.sleep(0.002)  # until two windows' worth of sends have arrived
            times.append(time.time())
            redis.stop(keep_workdir=True)
            time.sleep(OUTAGE)
            redis.restart()  # same port
            times.append(time.time())
            newcomer()

        try:
            with QuotaServer(LIMIT, PER, align="first") as server:
                fleet = fleet_run(
                    server, "redis", redis.url, 4, 8, RESTART_SECONDS, "closed", restart, late=1
                )
        finally:
            redis.stop()
        made[data] = Restarted(fleet, times[0], times[1])
        return made[data]

    yield run


def report_restart(data: str, r: Restarted) -> None:
    run = r.run
    down, up, across = r.down - run.started, r.up - run.started, run.worst(r.down - PER, r.up + PER)
    print(
        f"\nredis restart, data {data}: down {down:.2f}-{up:.2f} s after the start; worst window "
        f"{run.worst()}/{LIMIT} (across the restart {across}); served {run.served(0, float('inf'))}, "
        f"{r.recovered()} in the 3 s from 1 s after the restart; goodput {run.goodput():.2f}; "
        f"longest call {run.longest():.2f} s; {run.statuses()}"
    )


LOST = (
    "the permits a Redis restarted without persistence granted before it went down are "
    "not in the empty store that comes back (a process holds them, unanswered or "
    "reserved, but writes back only cooldowns and allowances: limits.md), so a worker "
    "asking it then is granted a whole quota more in the same second"
)
#: Seen in most runs with the data kept (0-28 served of the 36 asked before the
#: priorities' marks, 24-38 since).
UNSETTLED = (
    "the exact settles of the answers that came back while Redis was down are dropped, "
    "not tried again (guard.settle, _coalesce.flush): their open permits count 10 s past "
    "per + margin in the restored store and hold the fleet back that long"
)


@pytest.mark.redis
@pytest.mark.parametrize(
    "data", ["kept", pytest.param("lost", marks=pytest.mark.xfail(strict=True, reason=LOST))]
)
def test_a_redis_restart_mid_run_never_lets_a_second_at_the_server_exceed_the_quota(
    data: str, restarted: Callable[[str], Restarted]
) -> None:
    """4 processes x 8 threads reserve on one Redis through ``Quota(20, per=1)``,
    failing closed; Redis is stopped once two windows' worth of sends (40) have
    arrived and started again 0.3 s later on the same port, and a fifth process starts sending:
    no second at the server holds more than 20 arrivals, across the restart too, and
    no call hangs (each ends within its deadline, give or take a loaded machine)."""
    r = restarted(data)
    report_restart(data, r)
    assert r.run.longest() <= LONGEST
    if data == "lost" and r.up - r.down > PER - 0.4:
        # The newcomer's sends come too late to meet the window that went on at the stop.
        pytest.skip(f"Redis took {r.up - r.down:.2f} s to stop and start again")
    assert r.run.worst() <= LIMIT, r.run.crowded()


@pytest.mark.redis
@pytest.mark.parametrize("data", ["kept", "lost"])
def test_a_fleet_reserving_on_a_restarted_redis_is_served_at_the_quota_s_pace_a_second_later(
    data: str, restarted: Callable[[str], Restarted]
) -> None:
    """The same run: in the three seconds from a second after Redis answers again, the
    fleet is served at least 0.6 of what the quota allows (it has recovered)."""
    r = restarted(data)
    report_restart(data, r)
    if data == "kept" and r.recovered() < RECOVERED * LIMIT * 3 / PER:
        pytest.xfail(f"{UNSETTLED}: {r.recovered()} served in the 3 s from 1 s after the restart")
    assert r.recovered() >= RECOVERED * LIMIT * 3 / PER


# ============================================================ the Redis Cluster
@pytest.mark.redis
def test_processes_reserving_on_a_redis_cluster_keep_a_binding_quota(
    redis_cluster: RedisCluster, cluster_client: Any
) -> None:
    """4 processes x 8 threads reserve on a real 3-node Redis Cluster through
    ``Quota(20, per=1)`` for 4 s: no second at the server holds more than 20 arrivals,
    the fleet is served (goodput at least 0.7; the server refused none) and no call
    takes longer than its deadline."""
    where = f"127.0.0.1:{redis_cluster.ports[0]}"
    with QuotaServer(LIMIT, PER, align="first") as server:
        run = fleet_run(server, "cluster", where, 4, 8, 4.0)
    print(
        f"\ncluster: worst window {run.worst()}/{LIMIT}; served {run.served(0, float('inf'))}, goodput "
        f"{run.goodput():.2f}; {run.reserved} reservations in {run.admits} admissions; longest call "
        f"{run.longest():.2f} s; {run.statuses()}"
    )
    assert run.longest() <= LONGEST
    assert run.reserved > 0
    assert run.worst() <= LIMIT, run.crowded()
    assert all(status == 200 for _, status in run.arrivals)
    served_enough(run, 0.7)
    assert run.goodput() >= 0.7


# ============================================================ every core busy
#: Seconds of traffic with every core busy; the burners run this much longer (they
#: start first and outlive the fleet's last calls) and are stopped after.
BUSY_SECONDS = 3.0
BUSY = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.mark.parametrize("kind", BUSY)
def test_a_binding_quota_holds_with_every_core_busy(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``os.cpu_count()`` processes each keep a core busy while a fleet reserves
    through ``Quota(20, per=1)`` for 3 s: one process of 16 threads on a memory store
    of its own, or 2 processes of 8 threads on one SQLite file or one Redis. No second
    at the server holds more than 20 arrivals (a descheduled waiter late on its
    reservation is covered by the margin and the open permits), the server refused
    none, and the fleet is served (goodput at least 0.5)."""
    if kind == "memory":
        where, processes, threads = "", 1, 16
    elif kind == "sqlite":
        where, processes, threads = str(tmp_path / "shared.db"), 2, 8
    else:
        request.getfixturevalue("redis_client")  # emptied before and after
        where, processes, threads = str(request.getfixturevalue("redis_url")), 2, 8
    cores = os.cpu_count() or 1
    burners = [child("burn", str(BUSY_SECONDS + DEADLINE + 5)) for _ in range(cores)]
    try:
        with QuotaServer(LIMIT, PER, align="first") as server:
            run = fleet_run(server, kind, where, processes, threads, BUSY_SECONDS)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(10)
    print(
        f"\n{kind}, {cores} cores busy: worst window {run.worst()}/{LIMIT}; served "
        f"{run.served(0, float('inf'))}, goodput {run.goodput():.2f}; {run.reserved} reservations in "
        f"{run.admits} admissions; longest call {run.longest():.2f} s; {run.statuses()}"
    )
    assert run.worst() <= LIMIT, run.crowded()
    assert all(status == 200 for _, status in run.arrivals)
    assert run.longest() <= LONGEST
    if kind == "redis":
        served_enough(run, 0.5)
    assert run.goodput() >= 0.5
