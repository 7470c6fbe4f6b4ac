"""The examples run as real processes, bounded in time, and do what they print."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from retry_after_adapter import Deferral

from ..servers import Reply

REPO = Path(__file__).resolve().parents[2]
JOB_QUEUE = REPO / "examples" / "sqlite_job_queue.py"


def run_example(*args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(JOB_QUEUE), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def rows(db: Path) -> list[tuple[str, str, float, str | None, str | None]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT url, state, eligible_at, deferral_json, note FROM jobs ORDER BY id"
        ).fetchall()


def test_job_queue_demo_runs_standalone():
    done, took = run_example()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert took < 15, f"the demo took {took:.1f} s"
    # Four jobs: done at once, after one and two deferrals, and given up after the limit.
    assert "job 1 /reports/a: done, HTTP 200 after 0 deferrals" in out
    assert "job 2 /reports/b: done, HTTP 200 after 1 deferrals" in out
    assert "job 3 /reports/c: done, HTTP 200 after 2 deferrals" in out
    assert "job 4 /reports/d: gave up, chain of 3 deferrals (max_deferrals)" in out
    assert out.count("/reports/d: HTTP 429, deferral") == 2  # deferrals 1 and 2 were returned
    assert "server: 9 requests, 0 before their eligible time" in out
    assert "coalesced 2 redundant jobs" in out  # the poller's repeats added no request
    assert "summary: 3 done, 1 failed" in out
    assert done.stderr == ""


def test_redundant_jobs_for_one_resource_are_coalesced_while_pending(tmp_path, real_server):
    real_server.serve([Reply(429, {"Retry-After": "1"}, b"busy"), Reply(200, body=b"ok")])
    db = tmp_path / "jobs.sqlite3"
    url = real_server.url + "/report"
    other = real_server.url + "/other"
    done, _ = run_example("--url", url, "--url", url, "--url", other, "--url", url, "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert "coalesced 2 redundant jobs" in done.stdout
    assert [(row[0], row[1]) for row in rows(db)] == [(url, "done"), (other, "done")]
    assert real_server.count() == 3  # /report deferred once then done, /other done
    # Once done, the same resource may be queued again: only pending jobs coalesce.
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("INSERT INTO jobs (url, key, state, eligible_at) VALUES (?, ?, 'queued', 0)", (url, url))
        conn.commit()
        assert conn.execute("SELECT count(*) FROM jobs WHERE key = ?", (url,)).fetchone()[0] == 2


def test_job_queue_survives_a_restart_and_never_sends_early(tmp_path, real_server):
    real_server.serve([Reply(429, {"Retry-After": "1"}, b"busy"), Reply(200, body=b"ok")])
    db = tmp_path / "jobs.sqlite3"
    url = real_server.url + "/report"

    # First worker: the job is deferred, then the worker stops before it is due.
    first, _ = run_example("--url", url, "--db", str(db), "--time-limit", "0.3")
    assert first.returncode == 1, first.stderr  # time limit reached with a job queued
    assert "deferral 1 (max_wait, Retry-After 1)" in first.stdout
    [(_, state, eligible_at, stored, _)] = rows(db)
    assert state == "queued" and stored is not None
    deferral = Deferral.from_dict(json.loads(stored))
    assert (deferral.attempts, deferral.deferrals, deferral.retry_after) == (1, 1, "1")
    assert eligible_at == deferral.eligible_at.timestamp()
    assert real_server.count() == 1

    # A new worker process on the same table carries on at the eligible time.
    second, _ = run_example("--url", url, "--db", str(db))
    assert second.returncode == 0, second.stderr
    assert "carrying on with 1 unfinished jobs" in second.stdout
    assert "done, HTTP 200 after 1 deferrals" in second.stdout
    [(_, state, _, _, note)] = rows(db)
    assert (state, note) == ("done", "HTTP 200")
    assert real_server.count() == 2
    assert real_server.seen[1].at >= deferral.eligible_at


def test_job_queue_gives_up_and_keeps_the_chain(tmp_path, real_server):
    real_server.serve([Reply(429, {"Retry-After": "1"}, b"busy")])
    db = tmp_path / "jobs.sqlite3"
    url = real_server.url + "/report?token=s3cr3t-value"
    done, _ = run_example("--url", url, "--db", str(db), "--max-deferrals", "0")
    assert done.returncode == 0, done.stderr
    assert "job 1 /report: gave up, chain of 1 deferrals (max_deferrals)" in done.stdout
    assert "s3cr3t" not in done.stdout + done.stderr  # no query string in the output
    [(_, state, _, stored, note)] = rows(db)
    assert (state, note) == ("failed", "gave up after 1 deferrals (max_deferrals)")
    assert stored is not None and "s3cr3t" not in stored
    assert Deferral.from_dict(json.loads(stored)).deferrals == 1
    assert real_server.count() == 1


def test_the_quota_and_leases_store_demo_keeps_its_quota_and_its_slots() -> None:
    """``examples/locked_dict_store.py``: eight threads on one store of one's own, a quota
    of 3 per second and 2 slots; every request answered, neither bound ever passed."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "locked_dict_store.py")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "answers: 200 200 200 200 200 200 200 200" in done.stdout
    found = re.search(r"most in any second: (\d+); most at once: (\d+)", done.stdout)
    assert found is not None, done.stdout
    in_a_second, at_once = map(int, found.groups())
    assert 1 <= in_a_second <= 3 and 1 <= at_once <= 2, done.stdout  # a store that ignored either: 8
    assert took < 20, f"the demo took {took:.1f} s (about 3 s alone)"
    assert done.stderr == ""
