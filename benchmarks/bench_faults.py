"""Store faults under load, with real parts: how many requests go out inside a cooldown
the fleet already knows, how long a call takes with a hung store, how many warnings
one outage logs.

Every run uses real threads, one ``requests.Session`` (and so one adapter) per thread,
a loopback HTTP server that answers 429 with ``Retry-After`` once armed and counts the
requests that arrive while that cooldown runs ("inside"), a real ``redis-server`` that
is killed and restarted, a socket that accepts and never answers (a hung Redis), and
SQLite files that are overwritten, deleted or moved away under the workers. Stock
urllib3 has no shared store, so each scenario is compared with the same fleet on the
package's process-wide memory store (the floor: nothing can fail there).

    python benchmarks/bench_faults.py            # every scenario, about a minute
    python benchmarks/bench_faults.py --quick    # shorter phases
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import requests
from lib import common as _common
from lib.servers import CountingServer

from retry_after_adapter import (
    RedisCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    SQLiteCooldownStore,
    budget,
)
from retry_after_adapter.cooldown.memory import DEFAULT_STORE
from retry_after_adapter.testing.ports import black_hole

COOLDOWN = 5  # seconds: the Retry-After the server announces once armed
#: Requests admitted before the 429 reached the store may still arrive this long after
#: it (32 threads on a small machine); later arrivals were sent by a worker that knew.
GRACE = 0.5
HUNG = "hung Redis: seconds per call (first call, then the next four)"
CONTENTION = "SQLite contention: 8 processes x 16 threads doing only store operations"


class Fleet:
    """``threads`` threads, one Session each, calling under ``budget(deadline=1)`` until
    stopped."""

    def __init__(self, url: str, store: Any, threads: int, store_failure: str = "open") -> None:
        self.url = url
        self.errors: dict[str, int] = {}
        self.stop = threading.Event()
        self.sessions = []
        for _ in range(threads):
            s = requests.Session()
            retry = RetryAfterRetry(total=0, max_wait=1, backoff_factor=0)
            s.mount("http://", RetryAfterAdapter(retry, cooldown=store, store_failure=store_failure))
            self.sessions.append(s)
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in self.sessions]

    def _run(self, session: requests.Session) -> None:
        while not self.stop.is_set():
            try:
                with budget(deadline=1.0):
                    session.get(self.url, timeout=2)
            except Exception as exc:
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
            time.sleep(0.001)

    def __enter__(self) -> Fleet:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def inside_cooldown(server: CountingServer, store: Any, threads: int, fault: Callable[[], None],
                    seconds: float, store_failure: str = "open") -> dict[str, Any]:  # fmt: skip
    """Warm the fleet, apply ``fault``, arm one 429, count what is sent inside it."""
    server.disarm()
    with _common.package_log() as logs, Fleet(server.url, store, threads, store_failure) as fleet:
        time.sleep(0.3)
        fault()
        time.sleep(0.1)
        server.arm()
        server.wait_fired()
        time.sleep(seconds)
        inside, late = server.inside, server.inside_late
        fired = not server.armed
    server.disarm()
    return {
        "429_sent": fired,
        "inside": inside,
        "inside_after_grace": late,
        "warnings": logs.warnings,
        "recoveries": logs.recoveries,
        "lines": logs.lines,
        "errors": fleet.errors,
    }


SECOND_PROCESS = """
import sys, time, requests
from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry, store_from_url
s = requests.Session()
retry = RetryAfterRetry(total=0, max_wait=1)
s.mount("http://", RetryAfterAdapter(retry, cooldown=store_from_url(sys.argv[1])))
sent = 0
end = float(sys.argv[3])  # wall clock: when the cooldown ends
while time.time() < end:
    r = s.get(sys.argv[2])
    sent += not getattr(r, "local", False)
    time.sleep(0.002)
print(sent)
"""


def restart_run(server: CountingServer, tmp: str, threads: int) -> dict[str, Any]:
    """Redis killed; a 429 learned during the outage; Redis restarted (empty) 2.5 s
    after the kill while the fleet goes on; a second process starts at once."""
    with _common.redis_server(tmp) as (redis, why):
        if redis is None:
            raise RuntimeError(f"no redis-server for the restart run: {why}")
        store = RedisCooldownStore.from_url(redis.url)
        scope = server.origin
        checker = RedisCooldownStore.from_url(redis.url)
        with _common.package_log() as logs, Fleet(server.url, store, threads):
            time.sleep(0.3)
            redis.kill()
            killed = time.monotonic()
            server.arm()
            server.wait_fired()
            time.sleep(max(0.0, killed + 2.5 - time.monotonic()))
            redis.restart()
            restarted = time.monotonic()
            left = str(time.time() + server.until - time.monotonic())  # the cooldown's end, wall clock
            second = subprocess.Popen(
                [sys.executable, "-c", SECOND_PROCESS, redis.url, server.url, left],
                stdout=subprocess.PIPE,
                text=True,
            )
            appeared = None
            while time.monotonic() < server.until:
                try:
                    if checker.get(scope) is not None:
                        appeared = time.monotonic() - restarted
                        break
                except Exception:
                    pass
                time.sleep(0.01)
            out, _ = second.communicate(timeout=60)
            inside = server.inside
        redis.kill()
        store.close()
    return {
        "key_written_back_after_restart_s": appeared,
        "second_process_sent_inside": int(out.strip() or -1),
        "inside": inside,
        "warnings": logs.warnings,
        "recoveries": logs.recoveries,
        "lines": logs.lines,
    }


def _contention_worker(path: str, threads: int, seconds: float, reads: float, out: Any) -> None:
    import random

    from retry_after_adapter.cooldown.guard import guard_of

    store = SQLiteCooldownStore(path)  # held: its guard holds it weakly
    guard = guard_of(store)
    raised = [0]
    worst = [0.0]
    done = [0]

    def run() -> None:
        rng = random.Random()
        end = time.monotonic() + seconds
        base = datetime.now(timezone.utc)
        while time.monotonic() < end:
            scope = f"scope{rng.randrange(16)}"
            t0 = time.monotonic()
            try:
                if rng.random() < reads:
                    guard.get(scope)
                else:
                    guard.extend(scope, base + timedelta(seconds=rng.random() * 60))
            except Exception:
                raised[0] += 1
            worst[0] = max(worst[0], time.monotonic() - t0)
            done[0] += 1

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(
        {
            "ops": done[0],
            "raised": raised[0],
            "worst_s": worst[0],
            "busy": guard.busy,
            "outages": guard.outages,
        }
    )


def contention(tmp: str, processes: int, threads: int, seconds: float, reads: float) -> dict[str, Any]:
    """``processes`` x ``threads`` doing nothing but store operations on one SQLite file."""
    import multiprocessing

    path = os.path.join(tmp, f"contention-{reads}.db")
    SQLiteCooldownStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    args = (path, threads, seconds, reads, out)
    procs = [ctx.Process(target=_contention_worker, args=args) for _ in range(processes)]
    for proc in procs:
        proc.start()
    parts = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    return {
        "ops": sum(p["ops"] for p in parts),
        "raised": sum(p["raised"] for p in parts),
        "busy_fallbacks": sum(p["busy"] for p in parts),
        "outages": sum(p["outages"] for p in parts),
        "worst_op_s": max(p["worst_s"] for p in parts),
    }


def main() -> None:
    p = _common.parser(__doc__ or "")
    args = p.parse_args()
    seconds = 1.0 if args.quick else 3.0
    threads = 32
    results: dict[str, Any] = {}
    server = CountingServer(COOLDOWN, GRACE)
    tmp = tempfile.mkdtemp(prefix="faults-")
    try:
        DEFAULT_STORE.clear()
        results["memory store (floor)"] = inside_cooldown(
            server, DEFAULT_STORE, threads, lambda: None, seconds
        )

        with _common.redis_server(tmp) as (redis, _why):
            if redis is not None:
                store = RedisCooldownStore.from_url(redis.url)
                killed = inside_cooldown(server, store, threads, redis.kill, seconds)
                results["Redis killed, 32 threads"] = killed
                store.close()
        if redis is not None:
            results["Redis killed, restarted 2.5 s later"] = restart_run(server, tmp, threads)

        # A hung Redis: a port that accepts connections and never answers.
        with black_hole() as hole_port:
            hole_url = f"redis://127.0.0.1:{hole_port}/0"
            timings: dict[str, list[float]] = {}
            for name, deadline, failure, throttled in (
                ("budget(deadline=0.3), fail open", 0.3, "open", False),
                ("budget(deadline=0.3), fail closed", 0.3, "closed", False),
                ("no deadline, fail open", None, "open", False),
                ("a 429 each call, budget(deadline=0.3)", 0.3, "open", True),
                ("a 429 each call, no deadline", None, "open", True),
            ):
                hung = RedisCooldownStore.from_url(hole_url)  # a fresh store: its own breaker
                s = requests.Session()
                s.mount(
                    "http://",
                    RetryAfterAdapter(
                        RetryAfterRetry(total=0, raise_on_status=False, max_wait=1),
                        cooldown=hung,
                        store_failure=failure,
                    ),
                )
                took = []
                for _ in range(5):
                    if throttled:
                        server.arm()
                    started = time.monotonic()
                    with budget(deadline=deadline):
                        s.get(server.url)
                    took.append(time.monotonic() - started)
                timings[name] = took
            results[HUNG] = timings
            server.disarm()

        # SQLite faults, 32 threads in this process.
        for name, failure, fault in (
            ("SQLite overwritten with garbage, fail open", "open", "garbage"),
            ("SQLite overwritten with garbage, fail closed", "closed", "garbage"),
            ("SQLite deleted (with -wal, -shm)", "open", "delete"),
            ("SQLite directory renamed away", "open", "rename"),
        ):
            directory = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
            os.mkdir(directory)
            path = os.path.join(directory, "cooldown.db")
            store = SQLiteCooldownStore(path)

            def apply(fault: str = fault, path: str = path, directory: str = directory) -> None:
                if fault == "garbage":
                    with open(path, "r+b") as f:
                        f.write(b"garbage!" * 4096)
                elif fault == "delete":
                    for suffix in ("", "-wal", "-shm"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path + suffix)
                else:
                    os.rename(directory, directory + "-moved")

            results[name] = inside_cooldown(server, store, threads, apply, seconds, failure)
            store.close()

        results[CONTENTION] = {
            f"{int(reads * 100)} % reads": contention(tmp, 8, 16, seconds + 2, reads) for reads in (0.5, 0.99)
        }
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for name, r in results.items():
        if "inside_after_grace" in r:
            errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
            rows.append((name, r["inside"], r["inside_after_grace"], r["warnings"], r["recoveries"], errors))
    headers = ["scenario", "inside", f"> {GRACE} s after the 429", "warnings", "recovery lines", "raised (*)"]
    tables = [
        _common.table(
            f"Requests sent inside a known {COOLDOWN} s cooldown ({threads} threads, one Session each; "
            "(*) errors raised to callers: the 429's own RetryDeferred, and read timeouts of calls whose "
            "1 s deadline passed)",
            headers,
            rows,
        ),
        _common.table(
            "A hung Redis (accepts, never answers): seconds per call",
            ["variant", "first call", "next four (max)"],
            [(name, f"{t[0]:.3f}", f"{max(t[1:]):.3f}") for name, t in results[HUNG].items()],
        ),
    ]
    if CONTENTION in results:
        tables.append(
            _common.table(
                CONTENTION,
                ["mix", "operations", "raised", "busy, fell back once", "outages announced", "slowest s"],
                [
                    (mix, r["ops"], r["raised"], r["busy_fallbacks"], r["outages"], f"{r['worst_op_s']:.3f}")
                    for mix, r in results[CONTENTION].items()
                ],
            )
        )
    payload = {"cooldown_s": COOLDOWN, "threads": threads, "grace_s": GRACE, "results": results}
    _common.finish("faults", payload, tables, args.out)


if __name__ == "__main__":
    main()
