"""Reservations under a binding quota (``cooldown.base.Reservations``), with real parts:
worker processes on one SQLite file and on the session's Redis, a process SIGKILLed
while its threads sleep on reservations, and the async httpx transport on a memory
store, each against a loopback ``QuotaServer`` that logs every arrival.

A call that cannot be admitted now but whose wait fits its budget is given a permit
for a later time in the same store operation: it sleeps until then and asks once more
holding it (granted at once unless a permit it counted on was answered late), so a
binding quota costs about two admissions per request, and waiters are served in the
order they asked.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import statistics
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from retry_after_adapter import MemoryCooldownStore, Quota, RetryAfterRetry
from retry_after_adapter.cooldown import Admission, Ask, Reservations
from retry_after_adapter.httpx import AsyncRetryAfterTransport
from retry_after_adapter.testing.server import QuotaServer
from tests.integration.test_dead_processes import where_for

KINDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis)]
#: A quota that binds: 6 per second; its margin covers a loaded machine's time from a
#: reservation's time to the server's arrival (the margin's contract, see ``Quota``).
LIMIT, PER, MARGIN = 6, 1.0, 0.25
QUOTA = f"{LIMIT},{PER},{MARGIN}"


def worst_window(server: QuotaServer, per: float) -> int:
    """The most arrivals the server saw in any ``per`` seconds."""
    arrivals = sorted(a.at.timestamp() for a in list(server.arrivals))
    return max((bisect.bisect_left(arrivals, t + per) - i for i, t in enumerate(arrivals)), default=0)


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.reserve_children", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_processes_on_one_store_keep_a_binding_quota_asking_about_twice_per_request(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three processes of four threads each send flat out through ``Quota(6, per=1)``
    for 3 s against a server allowing 6 a second: no second at the server holds more
    than 6, none is refused, the store is asked at most 2.5 times per request (a
    reservation, and once more at its time: asking again on every wake, about 6), and
    the longest wait is at most a window longer than the median (served in order)."""
    where = where_for(kind, tmp_path, request)
    with QuotaServer(LIMIT, PER, align="first") as server:
        procs = [child("fleet", kind, where, "fleet:", server.url + "/", "4", "3", QUOTA) for _ in range(3)]
        reports = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
        worst = worst_window(server, PER)
    waits = [wait for report in reports for wait, status in report["waits"] if status == 200]
    statuses = {status for report in reports for _, status in report["waits"]}
    admits = sum(report["admits"] for report in reports)
    reserved = sum(report["reserved"] for report in reports)
    print(
        f"\n{kind}: {len(waits)} answered, worst window {worst}/{LIMIT}, {admits / len(waits):.2f} "
        f"admissions per request ({reserved} reservations), wait median {statistics.median(waits):.2f} s, "
        f"longest {max(waits):.2f} s"
    )
    assert statuses == {200}, statuses
    assert worst <= LIMIT
    assert admits / len(waits) <= 2.5
    assert reserved >= len(waits) / 2
    assert max(waits) <= statistics.median(waits) + PER + MARGIN + 0.5


@pytest.mark.parametrize("kind", KINDS)
def test_a_sigkilled_process_s_reservations_never_let_the_quota_be_exceeded(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A process of four threads holds reservations on ``Quota(6, per=1)`` and is
    SIGKILLed while they sleep; a fleet then sends through the same quota for 2 s: no
    second at the server holds more than 6 (the dead reservations are never moved
    earlier: they cost throughput until they lapse), none is refused, and the fleet is
    served."""
    where = where_for(kind, tmp_path, request)
    with QuotaServer(LIMIT, PER, align="first") as server:
        holder = child("hold_until_killed", kind, where, "killed:", server.url + "/", "4", QUOTA)
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.strip() == "reserved", (line, holder.poll())
            holder.kill()
            holder.wait(10)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(10)
        fleet = child("fleet", kind, where, "killed:", server.url + "/", "4", "2", QUOTA)
        out, err = fleet.communicate(timeout=60)
        assert fleet.returncode == 0, err
        worst = worst_window(server, PER)
    report = json.loads(out.strip().splitlines()[-1])
    statuses = [status for _, status in report["waits"]]
    assert set(statuses) == {200}, statuses
    assert worst <= LIMIT
    assert len(statuses) >= 1


def counted_memory_store() -> tuple[MemoryCooldownStore, list[int]]:
    """A memory store whose admissions are counted (each one store operation): the
    store and ``[admissions, reservations]``."""
    store = MemoryCooldownStore()
    counts = [0, 0]
    admit = store.admit

    def counted(ask: Ask) -> Admission:
        answer = admit(ask)
        counts[0] += 1
        counts[1] += answer.reserved is not None
        return answer

    store.admit = counted  # type: ignore[method-assign]
    return store, counts


def test_async_calls_sleep_on_their_reservations() -> None:
    """Twelve httpx async tasks on one memory store through ``Quota(4, per=0.5)``
    against a server allowing 4 per 0.5 s: no window over 4, none refused, at most
    2.5 admissions per request (a reservation, and once more at its time)."""
    store, counts = counted_memory_store()
    assert Reservations in store.capabilities
    quota = Quota(4, per=0.5, margin=0.1)

    async def fleet(url: str) -> list[int]:
        transport = AsyncRetryAfterTransport(RetryAfterRetry(total=0, max_wait=10), cooldown=store, quota=quota)
        async with httpx.AsyncClient(transport=transport) as client:
            responses = await asyncio.gather(*(client.get(url) for _ in range(12)))
        return [r.status_code for r in responses]

    with QuotaServer(4, 0.5, align="first") as server:
        statuses = asyncio.run(fleet(server.url + "/"))
        worst = worst_window(server, 0.5)
    assert statuses == [200] * 12
    assert worst <= 4
    assert counts[0] <= 12 * 2.5, counts


def test_a_task_cancelled_while_it_sleeps_on_its_reservation_gives_it_back() -> None:
    """``Quota(2, per=1)`` spent by two GETs; a third task is given a reservation about
    a second ahead and cancelled while it sleeps on it: the reservation goes back, so
    the next one asked for takes its place (kept, it would be a second later)."""
    store, counts = counted_memory_store()
    quota = Quota(2, per=1.0, margin=0.0)

    async def run(url: str) -> tuple[datetime, datetime | None]:
        transport = AsyncRetryAfterTransport(RetryAfterRetry(total=0, max_wait=10), cooldown=store, quota=quota)
        async with httpx.AsyncClient(transport=transport) as client:
            spent = datetime.now(timezone.utc)
            for _ in range(2):
                assert (await client.get(url)).status_code == 200
            before = counts[0]
            task = asyncio.ensure_future(client.get(url))
            while counts[0] == before:  # its admission: a reservation, then its sleep
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert not task.done() and counts[1] == 1, counts  # asleep on its reservation
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        later = datetime.now(timezone.utc) + timedelta(seconds=10)
        ask = Ask(scope=url.rstrip("/"), limit=2, per=1.0, reserve_by=later)
        return spent, store.admit(ask).reserved

    with QuotaServer(100, 1.0) as server:
        spent, reserved = asyncio.run(run(server.url + "/"))
    assert reserved is not None
    assert reserved < spent + timedelta(seconds=1.5), (reserved - spent).total_seconds()
