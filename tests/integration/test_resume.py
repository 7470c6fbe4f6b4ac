"""Resuming deferred work against a real loopback server: counts carry over, nothing is
sent before ``eligible_at``, and repeated deferrals escalate.

Time passes on the shared FakeClock (the server stamps every request with it), except in
the cross-process test, which uses the real clock and a one-second Retry-After.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3

from retry_after_adapter import (
    CooldownStoreError,
    DecisionRecord,
    Deferral,
    DeferralLimitExceeded,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterError,
    RetryAfterPoolManager,
    RetryAfterResponse,
    RetryAfterRetry,
    RetryDeferred,
    budget,
    deferral_of,
)
from retry_after_adapter.cooldown import Store

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer
from .conftest import make_session

REPO = Path(__file__).resolve().parents[2]


def busy(seconds: int | str) -> Reply:
    return Reply(429, {"Retry-After": str(seconds)}, b"busy")


def via_json(deferral: Deferral) -> Deferral:
    """What a job queue stores and reads back: the deferral through JSON text."""
    return Deferral.from_dict(json.loads(json.dumps(deferral.to_dict())))


def advance_to(clock: FakeClock, when: datetime) -> None:
    clock.advance((when - clock.now()).total_seconds())


def resume(
    clock: FakeClock, url: str, deferral: Deferral | None, store: Any = None, **retry_kwargs: Any
) -> tuple[requests.Response | None, Deferral | None]:
    """One call of the job in a fresh Session (as a new worker would make it).

    Returns (response, deferral); the response is None when the call was deferred before
    anything was sent (the adapter's local 429).
    """
    retry_kwargs.setdefault("total", 5)
    retry = RetryAfterRetry(clock=clock, **retry_kwargs)
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=store))
    with budget(resume=deferral):
        response = session.get(url)
    if isinstance(response, RetryAfterResponse) and response.local:
        return None, local_deferral(response)
    return response, deferral_of(response)


# -- counts carry over ------------------------------------------------------------------


def test_a_chain_resumed_from_json_keeps_its_counts(server, clock):
    t0 = clock.now()
    # Call 1 retries once in-process (1 s fits), then defers; each resume defers again.
    server.serve([busy(1), busy(30), busy(30), busy(30)])
    response, d1 = resume(clock, server.url + "/job", None, max_wait=10)
    assert response is not None and response.status_code == 429
    assert (d1.attempts, d1.deferrals, d1.history, d1.started_at) == (2, 1, (), t0)
    assert d1.eligible_at == t0 + timedelta(seconds=31)

    advance_to(clock, d1.eligible_at)
    _, d2 = resume(clock, server.url + "/job", via_json(d1), max_wait=10)
    assert (d2.attempts, d2.deferrals, d2.started_at) == (3, 2, t0)
    assert d2.history == (d1,)

    advance_to(clock, d2.eligible_at)
    _, d3 = resume(clock, server.url + "/job", via_json(d2), max_wait=10)
    assert (d3.attempts, d3.deferrals, d3.started_at) == (4, 3, t0)
    assert len(d3.history) == 2 and d3.chain()[0] == d1
    assert [d.attempts for d in d3.chain()] == [2, 3, 4]
    assert [(s.at - t0).total_seconds() for s in server.seen] == [0, 1, 31, 61]
    assert clock.sleeps == [1.0]  # only the in-process retry ever slept


def test_a_resumed_success_ends_the_chain(server, clock):
    server.serve([busy(30), Reply(200, body=b"done")])
    _, d1 = resume(clock, server.url + "/ok", None, max_wait=10)
    advance_to(clock, d1.eligible_at)
    response, deferral = resume(clock, server.url + "/ok", via_json(d1), max_wait=10)
    assert response is not None and response.status_code == 200 and response.text == "done"
    assert deferral is None
    assert server.count() == 2 and server.seen[1].at == d1.eligible_at


def test_hooks_see_the_job_wide_attempt_number(server, clock):
    server.serve([busy(30), busy(30)])
    _, d1 = resume(clock, server.url + "/n", None, max_wait=10)
    seen: list[DecisionRecord] = []
    advance_to(clock, d1.eligible_at)
    session = requests.Session()
    retry = RetryAfterRetry(total=5, max_wait=10, clock=clock)
    session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=None, on_decision=seen.append))
    with budget(resume=via_json(d1)):
        session.get(server.url + "/n")
    assert [(r.action, r.reason, r.attempt) for r in seen] == [("defer", "max_wait", 2)]


# -- nothing is sent before eligible_at -----------------------------------------------------


@pytest.mark.parametrize("store", [None, "fresh", "shared"], ids=["no-store", "fresh-store", "shared-store"])
def test_resuming_early_sends_nothing_and_defers_again_at_the_same_time(server, clock, store):
    shared = MemoryCooldownStore()
    server.serve([busy(120), Reply(200)])
    _, d1 = resume(clock, server.url + "/early", None, store=shared, max_wait=10)
    # A new worker: no store, an empty one (another process), or the one that saw the 429.
    chosen = {None: None, "fresh": MemoryCooldownStore(), "shared": shared}[store]
    response, d2 = resume(clock, server.url + "/early", via_json(d1), store=chosen, max_wait=10)
    assert response is None  # deferred before sending: a local 429, nothing received
    assert server.count() == 1
    assert clock.sleeps == []
    assert d2.reason == "cooldown"
    assert d2.eligible_at == d1.eligible_at
    assert d2.delay == 120.0
    assert (d2.attempts, d2.deferrals, d2.started_at) == (1, 2, d1.started_at)
    assert d2.history == (d1,)


def test_resuming_partway_defers_to_the_same_eligible_time(server, clock):
    server.serve([busy(120), Reply(200)])
    _, d1 = resume(clock, server.url + "/part", None, max_wait=10)
    clock.advance(100.000_001)  # 19.999999 s left: more than max_wait
    _, d2 = resume(clock, server.url + "/part", via_json(d1), max_wait=10)
    assert d2.reason == "cooldown" and d2.eligible_at == d1.eligible_at
    assert d2.delay == pytest.approx(19.999999, abs=1e-9)
    assert server.count() == 1


def test_a_deadline_too_short_for_the_wait_defers_without_sending(server, clock):
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/dl", None, max_wait=10)
    clock.advance(25)
    with budget(deadline=4):  # 5 s left: fits max_wait but not the deadline
        _, d2 = resume(clock, server.url + "/dl", via_json(d1), max_wait=10)
    assert d2.reason == "deadline" and d2.eligible_at == d1.eligible_at  # the deadline forced it
    assert server.count() == 1 and clock.sleeps == []


def test_resuming_when_the_wait_fits_waits_until_eligible_at(server, clock):
    server.serve([busy(30), Reply(200, body=b"done")])
    _, d1 = resume(clock, server.url + "/fit", None, max_wait=10)
    clock.advance(25.5)
    response, deferral = resume(clock, server.url + "/fit", via_json(d1), max_wait=10)
    assert response is not None and response.status_code == 200 and deferral is None
    assert clock.sleeps == [4.5]
    assert server.count() == 2
    assert server.seen[1].at >= d1.eligible_at
    assert server.seen[1].at == d1.eligible_at  # and not a moment later, on the fake clock


def test_the_later_of_the_shared_cooldown_and_eligible_at_wins(server, clock):
    store = MemoryCooldownStore()
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/later", None, store=store, max_wait=10)
    later = d1.eligible_at + timedelta(seconds=40)
    store.extend(d1.scope, later)  # another worker learned of a longer cooldown meanwhile
    advance_to(clock, d1.eligible_at)
    _, d2 = resume(clock, server.url + "/later", via_json(d1), store=store, max_wait=10)
    assert d2.reason == "cooldown" and d2.eligible_at == later
    assert server.count() == 1


# -- escalation ----------------------------------------------------------------------------


def test_escalation_fires_exactly_at_max_deferrals(server, clock):
    server.serve([busy(30)])
    _, d1 = resume(clock, server.url + "/esc", None, max_wait=10, max_deferrals=2)
    assert d1.deferrals == 1
    advance_to(clock, d1.eligible_at)
    response, d2 = resume(clock, server.url + "/esc", via_json(d1), max_wait=10, max_deferrals=2)
    assert response is not None and d2.deferrals == 2  # the limit itself is still returned
    advance_to(clock, d2.eligible_at)
    with pytest.raises(DeferralLimitExceeded) as caught:
        resume(clock, server.url + "/esc", via_json(d2), max_wait=10, max_deferrals=2)
    error = caught.value
    assert isinstance(error, RetryAfterError) and not isinstance(error, RetryDeferred)
    assert error.limit == "max_deferrals"
    assert len(error.chain) == 3
    assert [d.deferrals for d in error.chain] == [1, 2, 3]
    assert [d.attempts for d in error.chain] == [1, 2, 3]
    assert error.chain[:2] == (d1, d2.chain()[-1])
    assert error.deferral.history == error.chain[:2]
    # The third request was sent (at its eligible time); its answer was the last straw.
    assert [s.at for s in server.seen] == [d1.started_at, d1.eligible_at, d2.eligible_at]


def test_escalation_when_resuming_early_sends_nothing(server, clock):
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/esc-early", None, max_wait=10, max_deferrals=1)
    with pytest.raises(DeferralLimitExceeded) as caught:
        resume(clock, server.url + "/esc-early", via_json(d1), max_wait=10, max_deferrals=1)
    assert [d.reason for d in caught.value.chain] == ["max_wait", "cooldown"]
    assert server.count() == 1


def test_max_deferrals_zero_gives_up_at_the_first_deferral(server, clock):
    server.serve([busy(30)])
    with pytest.raises(DeferralLimitExceeded) as caught:
        resume(clock, server.url + "/zero", None, max_wait=10, max_deferrals=0)
    assert len(caught.value.chain) == 1 and caught.value.chain[0].attempts == 1


def test_lifetime_cap_allows_equality_and_gives_up_past_it(server, clock):
    server.serve([busy(30)])
    kwargs = {"max_wait": 10, "max_lifetime": 90}
    _, deferral = resume(clock, server.url + "/life", None, **kwargs)
    lifetimes = [(deferral.eligible_at - deferral.started_at).total_seconds()]
    with pytest.raises(DeferralLimitExceeded) as caught:
        for _ in range(5):  # bounded: the cap must fire by the fourth deferral
            advance_to(clock, deferral.eligible_at)
            _, deferral = resume(clock, server.url + "/life", via_json(deferral), **kwargs)
            lifetimes.append((deferral.eligible_at - deferral.started_at).total_seconds())
    assert lifetimes == [30, 60, 90]  # exactly 90 s is still allowed
    assert caught.value.limit == "max_lifetime"
    assert len(caught.value.chain) == 4
    assert server.count() == 4


def test_lifetime_cap_applies_to_an_early_resume(server, clock):
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/life-early", None, max_wait=10)
    clock.advance(10)
    with pytest.raises(DeferralLimitExceeded) as caught:  # d1 is fine, but not under 20 s
        resume(clock, server.url + "/life-early", via_json(d1), max_wait=10, max_lifetime=20)
    assert caught.value.limit == "max_lifetime"
    assert server.count() == 1


def test_plain_urllib3_resume_at_eligible_at_keeps_the_counts(server, clock):
    server.serve([busy(30)])
    _, d1 = resume(clock, server.url + "/plain-ok", None, max_wait=10)
    advance_to(clock, d1.eligible_at)
    pool = RetryAfterPoolManager(retries=RetryAfterRetry(total=5, max_wait=10, clock=clock), cooldown=None)
    try:
        with budget(resume=via_json(d1)):
            response = pool.request("GET", server.url + "/plain-ok")
    finally:
        pool.clear()
    assert response.status == 429 and not getattr(response, "local", False)
    d2 = deferral_of(response)
    assert (d2.attempts, d2.deferrals, d2.history, d2.started_at) == (2, 2, (d1,), d1.started_at)
    assert server.seen[1].at == d1.eligible_at


# -- gaps found in review, fixed: each test keeps the fix in place -------------------------


class BrokenStore(Store):
    """A shared store whose backend is down."""

    def get(self, scope: str) -> datetime | None:
        raise CooldownStoreError("backend down")

    def extend(self, scope: str, until: datetime) -> datetime:
        raise CooldownStoreError("backend down")


def test_a_cancelled_resume_keeps_the_eligible_time(server, clock):
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/cancel", None, max_wait=10)
    stop = threading.Event()
    stop.set()
    with budget(cancel=stop):
        _, d2 = resume(clock, server.url + "/cancel", via_json(d1), max_wait=10)
    _, _ = resume(clock, server.url + "/cancel", via_json(d2), max_wait=10)
    assert d2.reason == "cancelled"
    assert server.count() == 1, "a request went out before the first deferral's eligible_at"
    assert d2.eligible_at == d1.eligible_at


def test_a_store_outage_never_moves_eligible_at_earlier(server, clock):
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/outage", None, max_wait=10)
    retry = RetryAfterRetry(total=5, max_wait=10, clock=clock)
    session = requests.Session()
    session.mount(
        "http://", RetryAfterAdapter(max_retries=retry, cooldown=BrokenStore(), store_failure="closed")
    )
    with budget(resume=via_json(d1)):
        d2 = local_deferral(session.get(server.url + "/outage"))
    assert d2.reason == "cooldown-unknown"
    assert d2.eligible_at >= d1.eligible_at


def test_lifetime_cap_fires_for_a_job_that_never_got_to_send(server, clock):
    store = MemoryCooldownStore()
    scope = f"http://127.0.0.1:{server.port}"
    deferral = None
    with pytest.raises(DeferralLimitExceeded):
        for _ in range(4):  # other workers keep renewing a 30 s cooldown: past 50 s by the 2nd call
            store.extend(scope, clock.now() + timedelta(seconds=30))
            _, deferral = resume(
                clock, server.url + "/never", deferral, store=store, max_wait=10, max_lifetime=50
            )
            clock.advance(29)
    assert server.count() == 0


class TickingClock(FakeClock):
    """A FakeClock whose wall clock moves 1 ms on every read, as a real one does."""

    def now(self) -> datetime:
        self.advance(0.001)
        return super().now()


def test_an_early_resume_keeps_eligible_at_exactly_while_time_moves(server, clock):
    server.serve([busy(120), Reply(200)])
    _, d1 = resume(clock, server.url + "/tick", None, max_wait=10)
    _, d2 = resume(TickingClock(start=clock.now()), server.url + "/tick", via_json(d1), max_wait=10)
    assert d2.reason == "cooldown"
    assert d2.eligible_at == d1.eligible_at


def test_plain_urllib3_resume_sends_nothing_early(server, clock):
    # RetryAfterPoolManager runs the engine: admission holds back the first request too.
    server.serve([busy(30), Reply(200)])
    _, d1 = resume(clock, server.url + "/plain", None, max_wait=10)
    pool = RetryAfterPoolManager(retries=RetryAfterRetry(total=5, max_wait=10, clock=clock), cooldown=None)
    try:
        with budget(resume=via_json(d1)):
            d2 = local_deferral(pool.request("GET", server.url + "/plain"))
    finally:
        pool.clear()
    assert d2.reason == "cooldown" and d2.eligible_at == d1.eligible_at
    assert server.count() == 1
    # With raise_on_defer=True it raises urllib3's MaxRetryError instead.
    pool = RetryAfterPoolManager(
        retries=RetryAfterRetry(total=5, max_wait=10, clock=clock), cooldown=None, raise_on_defer=True
    )
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised, budget(resume=via_json(d1)):
        pool.request("GET", server.url + "/plain")
    assert deferral_of(raised.value).reason == "cooldown"
    assert server.count() == 1


# -- across processes, on the real clock --------------------------------------------------

CHILD = r"""
import json, sys, time
import requests
from retry_after_adapter import (
    Deferral, DeferralLimitExceeded, RetryAfterAdapter, RetryAfterRetry, RetryDeferred, budget,
)

max_wait = float(sys.argv[1])
print("ready", flush=True)
path = sys.stdin.readline().strip()
with open(path, encoding="utf-8") as handle:
    job = json.load(handle)
decisions = []
retry = RetryAfterRetry(total=2, max_wait=max_wait, deadline=5)
session = requests.Session()
session.mount("http://", RetryAfterAdapter(max_retries=retry, cooldown=None, on_decision=decisions.append))
out = {"began": time.time()}
try:
    with budget(resume=Deferral.from_dict(job["deferral"])):
        response = session.get(job["url"], timeout=5)
    out["status"] = response.status_code
    out["local"] = response.local
    out["deferral"] = response.deferral.to_dict() if response.deferral else None
except RetryDeferred as exc:
    out["raised"] = "RetryDeferred"
    out["deferral"] = exc.deferral.to_dict()
except DeferralLimitExceeded as exc:
    out["raised"] = "DeferralLimitExceeded"
    out["chain"] = len(exc.chain)
out["ended"] = time.time()
out["decisions"] = [[d.action, d.reason, d.wait, d.attempt] for d in decisions]
print(json.dumps(out), flush=True)
"""


class ChildProcess:
    """A new Python process that resumes a deferral read from a JSON file.

    It starts (and imports everything) before the deferral exists and says "ready", so
    its wait for the eligible time is not hidden by interpreter start-up. All it is then
    given is the path of a JSON file.
    """

    def __init__(self, tmp_path: Path, max_wait: float) -> None:
        self.tmp_path = tmp_path
        script = tmp_path / "child.py"
        script.write_text(CHILD, encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, str(script), str(max_wait)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> ChildProcess:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # bounded: the child prints it or exits
        assert line.strip() == "ready", self.process.stderr.read() if self.process.stderr else line
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()

    def resume(
        self, server: ThrottleServer, deferral: Deferral
    ) -> tuple[dict[str, Any], list[tuple[float, int]]]:
        """Hand over the JSON file; sample (time, server count) until the child reports."""
        job_file = self.tmp_path / "job.json"
        job = {"url": server.url + "/x", "deferral": deferral.to_dict()}
        job_file.write_text(json.dumps(job), encoding="utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(f"{job_file}\n")
        self.process.stdin.flush()
        samples: list[tuple[float, int]] = []
        limit = time.monotonic() + 10
        while self.process.poll() is None and time.monotonic() < limit:
            samples.append((time.time(), server.count()))
            time.sleep(0.02)
        out, err = self.process.communicate(timeout=max(0.1, limit - time.monotonic()))
        assert self.process.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1]), samples


def first_deferral_on_the_real_clock(real_server: ThrottleServer, *replies: Reply) -> Deferral:
    real_server.serve([busy(1), *replies])
    session = make_session(None, max_wait=0.5)  # 1 s does not fit: defer
    response = session.get(real_server.url + "/x")
    deferral = response.deferral
    assert deferral is not None and deferral.reason == "max_wait" and deferral.attempts == 1
    return deferral


def test_a_new_process_waits_for_eligible_at_and_continues_the_counts(tmp_path, real_server):
    with ChildProcess(tmp_path, max_wait=5) as child:
        d1 = first_deferral_on_the_real_clock(real_server, busy(30))
        report, samples = child.resume(real_server, d1)
    eligible = d1.eligible_at.timestamp()

    assert report["began"] < eligible  # the child really started early...
    action, reason, wait, attempt = report["decisions"][0]
    assert (action, reason, attempt) == ("retry", "cooldown", 1)  # ...and waited before sending
    assert 0 < wait <= 1.0
    assert any(at < eligible for at, _ in samples)
    assert all(count == 1 for at, count in samples if at < eligible), "a request arrived early"
    assert real_server.count() == 2
    assert real_server.seen[1].at >= d1.eligible_at

    # The resumed request got Retry-After 30 (> max_wait 5): deferral 2 of the same job.
    assert report["status"] == 429
    d2 = Deferral.from_dict(report["deferral"])
    assert d2.reason == "max_wait" and d2.retry_after == "30"
    assert (d2.attempts, d2.deferrals, d2.history, d2.started_at) == (2, 2, (d1,), d1.started_at)


def test_a_new_process_resuming_too_early_defers_without_sending(tmp_path, real_server):
    with ChildProcess(tmp_path, max_wait=0.5) as child:
        d1 = first_deferral_on_the_real_clock(real_server, Reply(200))
        report, _ = child.resume(real_server, d1)
    # Early, and the second left does not fit 0.5 s: deferred at once, same eligible time.
    assert report["local"] is True and report["status"] == 429
    d2 = Deferral.from_dict(report["deferral"])
    assert d2.reason == "cooldown"
    # Never earlier; on the real clock later by the time between two clock reads (see
    # test_an_early_resume_keeps_eligible_at_exactly_while_time_moves).
    assert d1.eligible_at <= d2.eligible_at <= d1.eligible_at + timedelta(seconds=0.05)
    assert (d2.attempts, d2.deferrals, d2.history, d2.started_at) == (1, 2, (d1,), d1.started_at)
    assert real_server.count() == 1
    assert report["ended"] < d1.eligible_at.timestamp()  # it did not sit out the wait
