"""The learned send rate with real parts: a cold start measured at a real server, and a
fleet that learns a quota nobody configured, in threads (memory store) and in real
processes sharing a SQLite file or a real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from retry_after_adapter import MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown import Ask, Learn
from retry_after_adapter.cooldown.rate import SLOW_START_CAP
from retry_after_adapter.scope import RequestInfo, origin_scope
from retry_after_adapter.testing.server import QuotaServer

from ..servers import HoldingServer
from .conftest import process_store, process_store_place


def _burst(url: str, adapter: RetryAfterAdapter, threads: int) -> list[int]:
    session = requests.Session()
    session.mount("http://", adapter)
    statuses: list[int] = []
    barrier = threading.Barrier(threads)

    def one() -> None:
        barrier.wait()
        statuses.append(session.get(url, timeout=10).status_code)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    return statuses


def test_a_cold_scope_sends_one_attempt_first_then_more_per_good_answer(slow_server: HoldingServer) -> None:
    """Twenty threads start at once on a scope the store never saw: the first request
    goes alone, and what is in flight grows with the good answers (never 20 at once)."""
    store = MemoryCooldownStore()
    adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=2, deadline=20), cooldown=store)
    statuses = _burst(slow_server.url, adapter, 20)
    assert statuses == [200] * 20
    assert slow_server.seen[:2] == [1, 1]  # one in flight, then one again after it
    # 1, 2, 3, 4 in flight after 3 good answers, then one more per round: 6 by the 12th.
    assert max(slow_server.seen) <= SLOW_START_CAP + 2
    rate = store.rate_of(origin_scope(RequestInfo("GET", slow_server.url, {})))
    assert rate is not None and rate.ok == 20 and rate.cap > 1


def test_learn_rate_false_sends_the_burst_at_once(slow_server: HoldingServer) -> None:
    store = MemoryCooldownStore()
    adapter = RetryAfterAdapter(
        max_retries=RetryAfterRetry(total=2, deadline=20), cooldown=store, learn_rate=False
    )
    assert _burst(slow_server.url, adapter, 20) == [200] * 20
    assert max(slow_server.seen) > SLOW_START_CAP + 1
    assert store.rate_of(origin_scope(RequestInfo("GET", slow_server.url, {}))) is None


def test_quota_headers_switch_the_learned_rate_off(slow_server: HoldingServer) -> None:
    """A server that announces its quota is admitted by what it announces: after its
    first answer, no learned cap holds the burst back."""
    with QuotaServer(1000, 60.0, align="first", quota_headers="ietf") as server:
        store = MemoryCooldownStore()
        adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=2, deadline=20), cooldown=store)
        session = requests.Session()
        session.mount("http://", adapter)
        assert session.get(server.url + "/first").status_code == 200
        scope = origin_scope(RequestInfo("GET", server.url, {}))
        assert store.admit(Ask(scope=scope, learn=Learn(ttl=60.0, token="probe"))).rate_epoch is None


# -- a fleet that learns the quota: threads, and real processes on a shared store -----------

LIMIT, WINDOW, ITEMS = 10, 1.0, 30

WORKER = textwrap.dedent(
    """
    import json, sys, threading, time
    import requests
    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry
    sys.path.insert(0, {root!r})
    from tests.integration.conftest import process_store

    kind, where, url, items, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    store = process_store(kind, where, "rate-test:")
    adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=5, deadline=3.0), cooldown=store)
    done = []
    todo = list(range(items))
    lock = threading.Lock()
    end = time.monotonic() + 20

    def work():
        session = requests.Session()
        session.mount("http://", adapter)
        while time.monotonic() < end:
            with lock:
                if not todo:
                    return
                item = todo.pop()
            response = session.get(url)
            if response.status_code == 200:
                done.append(item)
                continue
            deferral = getattr(response, "deferral", None)
            if deferral is not None:
                time.sleep(max(0.0, min(2.0, deferral.eligible_at.timestamp() - time.time())))
            with lock:
                todo.append(item)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    print(json.dumps({{"done": len(done)}}))
    """
)


def _run_processes(kind: str, where: str, url: str, processes: int, threads: int) -> int:
    root = str(Path(__file__).resolve().parents[2])
    code = WORKER.format(root=root)
    share = [ITEMS // processes + (1 if n < ITEMS % processes else 0) for n in range(processes)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, kind, where, url, str(count), str(threads)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for count in share
    ]
    done = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        done += json.loads(out.strip().splitlines()[-1])["done"]
    return done


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_fleet_learns_an_unannounced_quota_and_keeps_to_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Workers with nothing configured against a quota of 10 per 1 s that announces
    nothing: all items done, a few 429s while the quota is found, the learned rate in
    the store is what the server accepted (10) per about its window."""
    with QuotaServer(LIMIT, WINDOW, align="first") as server:
        if kind == "memory":
            store: Any = MemoryCooldownStore()
            where = ""
            adapter = RetryAfterAdapter(max_retries=RetryAfterRetry(total=5, deadline=3.0), cooldown=store)
            done: list[int] = []
            todo = list(range(ITEMS))
            lock = threading.Lock()

            def work() -> None:
                session = requests.Session()
                session.mount("http://", adapter)
                end = time.monotonic() + 20
                while time.monotonic() < end:
                    with lock:
                        if not todo:
                            return
                        item = todo.pop()
                    response = session.get(server.url)
                    if response.status_code == 200:
                        done.append(item)
                        continue
                    deferral = getattr(response, "deferral", None)
                    if deferral is not None:
                        wait = deferral.eligible_at.timestamp() - time.time()
                        time.sleep(max(0.0, min(2.0, wait)))
                    with lock:
                        todo.append(item)

            workers = [threading.Thread(target=work) for _ in range(8)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(30)
            finished = len(done)
        else:
            where = process_store_place(kind, tmp_path, request)
            finished = _run_processes(kind, where, server.url, 2, 4)
            store = process_store(kind, where, "rate-test:")
        statuses = [entry[server_field("status")] for entry in server.log]
    assert finished == ITEMS
    assert statuses.count(200) == ITEMS
    assert statuses.count(429) <= 8, statuses
    rate = store.rate_of(origin_scope(RequestInfo("GET", server.url, {})))
    assert rate is not None and 1 <= rate.limit <= LIMIT, rate
    assert WINDOW <= rate.window <= WINDOW + 1.5, rate


def server_field(name: str) -> int:
    from retry_after_adapter.testing.server import LOG_FIELDS

    return LOG_FIELDS.index(name)


# -- the same rules in every store (Redis runs them as Lua) -----------------------------------

NOW = datetime(2027, 1, 15, 12, 0, tzinfo=timezone.utc)


def test_every_store_learns_alike(every_store: Any) -> None:
    """One sequence of admissions and answers, the same records in every store: the
    memory and SQLite stores apply ``rate.py``, Redis its Lua copy."""
    store = every_store
    first = store.admit(Ask(scope="r", now=NOW, learn=Learn(ttl=60.0, token="t1")))
    assert first.not_before is None and first.token == "t1" and first.rate_report
    busy = store.admit(Ask(scope="r", now=NOW, learn=Learn(ttl=60.0, token="t2")))
    assert busy.slot_busy and busy.by_rate  # one probe in flight
    for _ in range(5):
        store.rate_answer("r", 0, None, NOW)
    store.release("r", "t1")
    rate = store.rate_of("r")
    assert rate is not None and (rate.cap, rate.ok, rate.limit, rate.probed) == (4, 5, 0, 1)  # 1, 2, 3, 4
    # A throttle while cold: 5 per the time they took (not the cooldown's end); late
    # good answers add; probes go on a window after the cooldown.
    until = NOW + timedelta(seconds=30)
    store.rate_answer("r", 0, until, NOW + timedelta(seconds=2.5))
    store.rate_answer("r", 0, until + timedelta(seconds=9), NOW + timedelta(seconds=2.6))  # once
    store.rate_answer("r", 0, None, NOW + timedelta(seconds=2.7))
    rate = store.rate_of("r")
    assert rate is not None and (rate.cap, rate.limit, rate.epoch, rate.quiet, rate.grace) == (1, 6, 1, 1, 0)
    assert rate.window == pytest.approx(2.5, abs=0.002) and rate.start == pytest.approx(until.timestamp())
    held = store.admit(Ask(scope="r", now=until - timedelta(seconds=1), learn=Learn(ttl=60.0, token="early")))
    assert held.by_rate and held.not_before == until  # nothing before the epoch begins
    granted = [store.admit(Ask(scope="r", now=until, learn=Learn(ttl=60.0, token=f"a{n}"))) for n in range(7)]
    assert [g.not_before is None for g in granted] == [True] * 6 + [False]
    assert not any(g.rate_report for g in granted[:6])  # known sends: nothing to tell
    assert granted[6].by_rate and granted[6].not_before == until + timedelta(seconds=2.5)  # quiet
    second = until + timedelta(seconds=2.5)
    granted = [store.admit(Ask(scope="r", now=second, learn=Learn(ttl=60.0, token=f"b{n}"))) for n in range(7)]
    assert [g.not_before is None for g in granted] == [True] * 6 + [False]
    # Probes follow in this epoch: each known send holds a probe slot until its answer,
    # and the probe waits for them (it never races a known send to the server).
    assert [g.token for g in granted[:6]] == [f"b{n}" for n in range(6)]
    assert not any(g.rate_report for g in granted[:6])
    assert granted[6].by_rate and granted[6].slot_busy
    assert granted[6].not_before == second + timedelta(seconds=1)  # looked at again within a second
    for n in range(5):
        store.release("r", f"b{n}")
    assert store.admit(Ask(scope="r", now=second, learn=Learn(ttl=60.0, token="b6"))).slot_busy  # one known send unanswered
    store.release("r", "b5")
    probe = store.admit(Ask(scope="r", now=second, learn=Learn(ttl=60.0, token="b6")))
    assert probe.not_before is None and probe.rate_report and probe.token == "b6"  # a probe
    busy = store.admit(Ask(scope="r", now=second, learn=Learn(ttl=60.0, token="b7")))
    assert busy.by_rate and busy.slot_busy  # one probe in flight
    store.release("r", "b6")
    # The probe refused: the limit is confirmed, once per epoch.
    until = second  # (what follows counts from the second epoch's start)
    store.rate_answer("r", 2, until + timedelta(seconds=2), until + timedelta(seconds=1))
    store.rate_answer("r", 2, until + timedelta(seconds=5), until + timedelta(seconds=1.1))
    rate = store.rate_of("r")
    assert rate is not None and (rate.limit, rate.epoch, rate.quiet, rate.fails) == (6, 3, 2, 1)
    # Throttles without a usable wait, in a row: backoffs of 2 s, then 4 s (the first
    # throttle above, after a good answer, was one of the row).
    at = until + timedelta(seconds=2)
    store.rate_answer("r", 3, at, at)
    assert store.admit(Ask(scope="r", now=at + timedelta(seconds=0.5), learn=Learn(ttl=60.0, token="b"))).not_before == at + timedelta(seconds=2)
    store.rate_answer("r", 4, at + timedelta(seconds=2), at + timedelta(seconds=2))
    rate = store.rate_of("r")
    assert rate is not None and rate.start == pytest.approx((at + timedelta(seconds=6)).timestamp())
    # A throttle before any good answer learns nothing: counted again.
    store.rate_answer("fresh", None, None, NOW)  # no record: nothing
    assert store.rate_of("fresh") is None
    store.admit(Ask(scope="fresh", now=NOW, learn=Learn(ttl=60.0, token="f1")))
    store.rate_answer("fresh", 0, NOW + timedelta(seconds=30), NOW)
    fresh = store.rate_of("fresh")
    assert fresh is not None and (fresh.cap, fresh.limit, fresh.epoch) == (1, 0, 1)
    # A scope that shows no limit is opened: admission takes nothing, reports nothing.
    store.admit(Ask(scope="open", now=NOW, learn=Learn(ttl=60.0, token="o1")))
    store.release("open", "o1")
    for _ in range(600):
        store.rate_answer("open", 0, None, NOW)
    opened = store.rate_of("open")
    assert opened is not None and (opened.cap, opened.limit) == (0, 0)
    answer = store.admit(Ask(scope="open", now=NOW, learn=Learn(ttl=60.0, token="o2")))
    assert answer.not_before is None and answer.token is None and answer.rate_epoch is None


def test_learn_rate_is_kept_by_copies_and_pickles_and_the_pool_manager_takes_it() -> None:
    import copy
    import pickle

    from retry_after_adapter import Quota, RetryAfterPoolManager
    from retry_after_adapter.errors import ConfigurationError

    off = RetryAfterAdapter(learn_rate=False)
    assert not off._plan.learns
    for clone in (copy.copy(off), copy.deepcopy(off), pickle.loads(pickle.dumps(off))):
        assert clone.learn_rate is False and not clone._plan.learns
    assert RetryAfterAdapter()._plan.learns  # on by default
    assert not RetryAfterAdapter(quota=Quota(10, per=1))._plan.learns  # a Quota governs
    manager = RetryAfterPoolManager(learn_rate=False)
    assert not manager._plan.learns
    assert not pickle.loads(pickle.dumps(manager))._plan.learns
    assert RetryAfterPoolManager()._plan.learns
    with pytest.raises(ConfigurationError):
        RetryAfterAdapter(learn_rate="no")  # type: ignore[arg-type]


def test_plain_urllib3_through_the_pool_manager_starts_cold_too(slow_server: HoldingServer) -> None:
    from retry_after_adapter import RetryAfterPoolManager

    manager = RetryAfterPoolManager(
        retries=RetryAfterRetry(total=2, deadline=20), cooldown=MemoryCooldownStore(), maxsize=16
    )
    barrier = threading.Barrier(10)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        statuses.append(manager.request("GET", slow_server.url + "/").status)

    workers = [threading.Thread(target=one) for _ in range(10)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert statuses == [200] * 10
    assert slow_server.seen[:2] == [1, 1] and max(slow_server.seen) <= SLOW_START_CAP


#: The parity run's phases: steps, the share of admissions, the share up to which the
#: rest are good answers (throttles after), the gaps (ms) between steps. Together they
#: reach every rule: the cold start, known sends, probes, backoffs, decreases, probes
#: accepted within and across the server's reset, a window measured again, the scope
#: opened, admitted open, and closed by a throttle.
PARITY_PHASES = (
    (600, 0.55, 0.9, (0, 1, 10, 100, 500, 1300)),
    (700, 0.1, 1.0, (0, 1, 10)),
    (400, 0.5, 0.97, (0, 10, 300)),
    (1200, 0.9, 0.93, (0, 10, 300, 700, 1100)),
)


def test_every_store_keeps_the_record_rate_py_computes(every_store: Any) -> None:
    """A long pseudo-random run of admissions, good answers of probes and throttles (with
    and without a usable wait, of the current epoch and of past ones), over a fake
    timeline in whole milliseconds: after each step, the store's record is the one
    ``rate.py`` computes from the same steps (Redis's Lua included)."""
    import random

    from retry_after_adapter.cooldown.rate import answer_rate, fresh_rate, roll_rate

    rng = random.Random(29)
    store = every_store
    t0_ms = round(NOW.timestamp() * 1000)
    at_ms, step = 0, 0
    model = None
    last_epoch: int | None = None
    for steps, admits, goods, gaps in PARITY_PHASES:
        for _ in range(steps):
            step += 1
            at_ms += rng.choice(gaps)
            now = (t0_ms + at_ms) / 1000  # whole milliseconds, as the stores keep them
            when = datetime.fromtimestamp(0, timezone.utc) + timedelta(milliseconds=t0_ms + at_ms)
            kind = rng.random()
            if kind < admits or model is None:
                answer = store.admit(Ask(scope="p", now=when, learn=Learn(ttl=60.0, token=f"t{step}")))
                model = fresh_rate(now) if model is None else roll_rate(model, now)
                if model.start <= now and not model.open:
                    if model.known:
                        model = model.sending()
                    elif model.probes:
                        model = model.probing()
                if answer.token is not None:
                    store.release("p", answer.token)
                last_epoch = answer.rate_epoch if answer.rate_epoch is not None else model.epoch
            elif kind < goods:
                store.rate_answer("p", last_epoch, None, when)
                model = answer_rate(model, last_epoch, None, now)
            else:
                wait_ms = rng.choice((0, 400, 1000, 2000, 3700))
                epoch = rng.choice((last_epoch, model.epoch, None))
                probe = rng.choice((None, True, False))  # a probe, a known send, not said
                store.rate_answer("p", epoch, when + timedelta(milliseconds=wait_ms), when, probe)
                model = answer_rate(model, epoch, (t0_ms + at_ms + wait_ms) / 1000, now, probe)
            stored = store.rate_of("p")
            assert stored is not None
            for name in ("cap", "limit", "epoch", "sent", "ok", "grown", "grace", "quiet", "probed", "fails"):
                assert getattr(stored, name) == getattr(model, name), (step, name, stored, model)
            for name in ("window", "start", "base"):  # whole milliseconds, exactly
                assert round(getattr(stored, name) * 1000) == round(getattr(model, name) * 1000), (step, name)
