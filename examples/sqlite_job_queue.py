"""A worker loop over a SQLite job table that re-queues deferred jobs at ``eligible_at``.

Each job is one GET. When the server asks for a wait that does not fit the call's
budget, the call comes back at once with a deferral; the worker stores it as JSON in
the job's row and re-queues the job at ``deferral.eligible_at``. When the job is due,
the worker resumes it with ``budget(resume=Deferral.from_dict(...))``: the job keeps its
attempt and deferral counts, and nothing is sent before the eligible time. Past
``max_deferrals`` the call raises ``DeferralLimitExceeded`` and the job is marked failed.

Run it with no arguments to use a small throttling server started in this process on
127.0.0.1 (it finishes in about three seconds)::

    python examples/sqlite_job_queue.py

or point it at your own URLs (each ``--url`` is one job)::

    python examples/sqlite_job_queue.py --url http://127.0.0.1:8000/a --url http://127.0.0.1:8000/b

The job table (``--db``, a temporary file by default) has the columns ``id``, ``url``,
``key``, ``state`` (``queued``, ``running``, ``done``, ``failed``), ``eligible_at`` (Unix
seconds, UTC), ``deferral_json`` (the last deferral, or NULL) and ``note``. Given an
existing ``--db`` that still holds unfinished jobs, the worker carries on with them
instead of adding new ones: that is a restart, and the stored deferrals keep the counts.

Redundant jobs are coalesced: there is at most one pending (queued or running) job per
``key`` (by default the URL), enforced by a partial unique index, so a poller that
enqueues the same resource again while it is throttled adds nothing; the pending job
keeps its eligible time and its deferral. (Seed 003: "coalesce redundant jobs".)
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from retry_after_adapter import (
    Deferral,
    DeferralLimitExceeded,
    RetryAfterAdapter,
    RetryAfterResponse,
    RetryAfterRetry,
    RetryDeferred,
    budget,
    deferral_of,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id            INTEGER PRIMARY KEY,
    url           TEXT NOT NULL,
    key           TEXT,
    state         TEXT NOT NULL DEFAULT 'queued',
    eligible_at   REAL NOT NULL,
    deferral_json TEXT,
    note          TEXT
)
"""
#: One pending job per key: a second one for the same resource is coalesced into it.
ONE_PENDING_PER_KEY = (
    "CREATE UNIQUE INDEX IF NOT EXISTS one_pending_per_key ON jobs (key) WHERE state IN ('queued', 'running')"
)

#: Paths served by the demo server, and how many 429s each answers before a 200.
DEMO_PLAN: dict[str, float] = {
    "/reports/a": 0,  # done at once
    "/reports/b": 1,  # one deferral, then done
    "/reports/c": 2,  # two deferrals, then done
    "/reports/d": math.inf,  # never ready: given up after max_deferrals
}
#: The demo's poller asks for these again while they are pending: coalesced, not added.
DEMO_REPEATS = ("/reports/b", "/reports/c")

#: The demo server's Retry-After, in seconds.
DEMO_RETRY_AFTER = 1


# -- the demo server ----------------------------------------------------------------


class DemoServer:
    """A loopback server that answers 429 with ``Retry-After`` a set number of times per path.

    It remembers, for every path, the earliest time it told the client to come back, and
    counts requests that arrive before it (``early``): the worker should never cause one.
    Times are Unix seconds.
    """

    def __init__(self, plan: dict[str, float], retry_after: int = DEMO_RETRY_AFTER) -> None:
        self.plan = dict(plan)
        self.retry_after = retry_after
        self.hits: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.early = 0
        self.lock = threading.Lock()
        demo = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep the demo's output readable
                pass

            def do_GET(self) -> None:
                status, headers = demo.answer(urlsplit(self.path).path, time.time())
                body = b"busy, come back later\n" if status == 429 else b"report ready\n"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.daemon = True

    def answer(self, path: str, now: float) -> tuple[int, dict[str, str]]:
        with self.lock:
            if now < self.not_before.get(path, 0.0):
                self.early += 1
            seen = self.hits.get(path, 0)
            self.hits[path] = seen + 1
            if path not in self.plan:
                return 404, {}
            if seen < self.plan[path]:
                self.not_before[path] = now + self.retry_after
                return 429, {"Retry-After": str(self.retry_after)}
            return 200, {}

    def __enter__(self) -> DemoServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


# -- the job table ------------------------------------------------------------------


@dataclass
class Job:
    id: int
    url: str
    deferral: Deferral | None


def open_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10, isolation_level=None)  # explicit transactions
    db.execute(SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    if "key" not in columns:  # a table made by an earlier version of this example
        db.execute("ALTER TABLE jobs ADD COLUMN key TEXT")
    db.execute(ONE_PENDING_PER_KEY)
    return db


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT: one writer at a time, so two workers never claim one job."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def add_jobs(db: sqlite3.Connection, urls: Sequence[str]) -> int:
    """Queue one job per URL, keyed by the URL; returns how many were coalesced into a
    job already pending for the same key (and so not added)."""
    added = 0
    with transaction(db):
        for url in urls:
            cursor = db.execute(
                "INSERT OR IGNORE INTO jobs (url, key, state, eligible_at) VALUES (?, ?, 'queued', ?)",
                (url, url, time.time()),
            )
            added += cursor.rowcount
    return len(urls) - added


def unfinished(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')").fetchone()
    return int(row[0])


def claim_due_job(db: sqlite3.Connection, now: float) -> Job | None:
    """Take the job that has been eligible longest, or None when none is due yet."""
    with transaction(db):
        row = db.execute(
            "SELECT id, url, deferral_json FROM jobs WHERE state = 'queued' AND eligible_at <= ? "
            "ORDER BY eligible_at, id LIMIT 1",
            (now,),
        ).fetchone()
        if row is None:
            return None
        db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (row[0],))
    stored = None if row[2] is None else Deferral.from_dict(json.loads(row[2]))
    return Job(id=row[0], url=row[1], deferral=stored)


def next_eligible(db: sqlite3.Connection) -> float | None:
    row = db.execute("SELECT min(eligible_at) FROM jobs WHERE state = 'queued'").fetchone()
    return None if row[0] is None else float(row[0])


def requeue(db: sqlite3.Connection, job: Job, deferral: Deferral) -> None:
    """Store the deferral and make the job due again at its eligible time."""
    with transaction(db):
        db.execute(
            "UPDATE jobs SET state = 'queued', eligible_at = ?, deferral_json = ?, note = ? WHERE id = ?",
            (
                deferral.eligible_at.timestamp(),
                json.dumps(deferral.to_dict()),
                f"deferral {deferral.deferrals} ({deferral.reason})",
                job.id,
            ),
        )


def finish(db: sqlite3.Connection, job: Job, state: str, note: str, last: Deferral | None = None) -> None:
    """Mark the job done or failed; ``last`` replaces the stored deferral when given."""
    with transaction(db):
        db.execute("UPDATE jobs SET state = ?, note = ? WHERE id = ?", (state, note, job.id))
        if last is not None:
            db.execute("UPDATE jobs SET deferral_json = ? WHERE id = ?", (json.dumps(last.to_dict()), job.id))


# -- the worker ---------------------------------------------------------------------


def make_session(max_deferrals: int, max_wait: float) -> requests.Session:
    """A Session whose calls wait at most ``max_wait`` seconds in-process.

    A longer wait is handed back as a deferral, so the worker can serve other jobs.
    ``cooldown=None``: on the demo server every path has its own quota. Against a real
    provider, pass a shared store (``SQLiteCooldownStore`` or ``RedisCooldownStore``)
    so that every worker obeys one cooldown.
    """
    retry = RetryAfterRetry(total=3, deadline=10, max_wait=max_wait, max_deferrals=max_deferrals)
    session = requests.Session()
    adapter = RetryAfterAdapter(max_retries=retry, cooldown=None)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def run_job(session: requests.Session, db: sqlite3.Connection, job: Job, log: Any) -> None:
    label = f"job {job.id} {urlsplit(job.url).path or '/'}"  # never print a query string
    try:
        with budget(resume=job.deferral):
            response = session.get(job.url, timeout=5)
    except DeferralLimitExceeded as exc:
        # Keep the last deferral: its JSON holds the whole chain (history) for inspection.
        finish(db, job, "failed", f"gave up after {len(exc.chain)} deferrals ({exc.limit})", exc.deferral)
        log(f"{label}: gave up, chain of {len(exc.chain)} deferrals ({exc.limit})")
        return
    except RetryDeferred as exc:  # the last attempt failed in transport: try again later
        requeue(db, job, exc.deferral)
        log(f"{label}: {type(exc).__name__} ({exc.deferral.reason}), due in {exc.deferral.delay:.2f} s")
        return
    except requests.RequestException as exc:
        finish(db, job, "failed", type(exc).__name__)
        log(f"{label}: failed ({type(exc).__name__})")
        return
    deferral = deferral_of(response)
    if isinstance(response, RetryAfterResponse) and response.local:  # nothing was sent
        assert deferral is not None
        requeue(db, job, deferral)
        log(f"{label}: deferred before sending ({deferral.reason}), due in {deferral.delay:.2f} s")
    elif deferral is not None:
        requeue(db, job, deferral)
        log(
            f"{label}: HTTP {response.status_code}, deferral {deferral.deferrals} "
            f"({deferral.reason}, Retry-After {deferral.retry_after}), due in {deferral.delay:.2f} s"
        )
    elif response.ok:
        earlier = job.deferral.deferrals if job.deferral else 0
        finish(db, job, "done", f"HTTP {response.status_code}")
        log(f"{label}: done, HTTP {response.status_code} after {earlier} deferrals")
    else:
        finish(db, job, "failed", f"HTTP {response.status_code}")
        log(f"{label}: failed, HTTP {response.status_code}")


def work(db: sqlite3.Connection, session: requests.Session, time_limit: float, log: Any) -> bool:
    """Run due jobs until none is left; True when every job finished within ``time_limit`` s."""
    started = time.monotonic()
    while unfinished(db):
        left = time_limit - (time.monotonic() - started)
        if left <= 0:
            return False
        job = claim_due_job(db, time.time())
        if job is not None:
            run_job(session, db, job, log)
            continue
        due = next_eligible(db)
        if due is None:  # only 'running' jobs left (another worker's): look again shortly
            time.sleep(min(0.1, left))
            continue
        time.sleep(min(max(0.0, due - time.time()), left, 1.0))
    return True


def report(db: sqlite3.Connection, log: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    log("")
    log(f"{'id':>3}  {'state':<7} {'deferrals':>9}  note")
    rows = db.execute("SELECT id, state, deferral_json, note FROM jobs ORDER BY id").fetchall()
    for job_id, state, deferral_json, note in rows:
        counts[state] = counts.get(state, 0) + 1
        stored = None if deferral_json is None else Deferral.from_dict(json.loads(deferral_json))
        deferrals = stored.deferrals if stored else 0
        log(f"{job_id:>3}  {state:<7} {deferrals:>9}  {note or ''}")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", default=[], help="a URL to GET (one job each; repeatable)")
    parser.add_argument("--db", type=Path, help="the SQLite job table (default: a temporary file)")
    parser.add_argument("--max-deferrals", type=int, default=2, help="deferrals allowed per job (default 2)")
    parser.add_argument(
        "--max-wait", type=float, default=0.5, help="longest in-process wait, in seconds (default 0.5)"
    )
    parser.add_argument(
        "--time-limit", type=float, default=30.0, help="stop the worker after this many seconds (default 30)"
    )
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        print(f"{stamp}  {line}" if line else "", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        db_path = args.db or Path(tmp) / "jobs.sqlite3"
        with closing(open_db(db_path)) as db:
            demo = None if args.url else DemoServer(DEMO_PLAN)
            try:
                if demo is not None:
                    demo.__enter__()
                    log(f"demo server on {demo.url} (Retry-After: {demo.retry_after})")
                if unfinished(db):
                    log(f"carrying on with {unfinished(db)} unfinished jobs from {db_path.name}")
                else:
                    urls = args.url or [demo.url + path for path in DEMO_PLAN]  # type: ignore[union-attr]
                    coalesced = add_jobs(db, urls)
                    if demo is not None:  # the poller asks again for two pending reports
                        coalesced += add_jobs(db, [demo.url + path for path in DEMO_REPEATS])
                    if coalesced:
                        log(f"coalesced {coalesced} redundant jobs into the ones pending for the same URL")
                session = make_session(args.max_deferrals, args.max_wait)
                finished = work(db, session, args.time_limit, log)
                counts = report(db, log)
            finally:
                if demo is not None:
                    demo.__exit__(None, None, None)
        if demo is not None:
            log(f"server: {sum(demo.hits.values())} requests, {demo.early} before their eligible time")
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        log(f"summary: {summary}" + ("" if finished else " (time limit reached)"))
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
