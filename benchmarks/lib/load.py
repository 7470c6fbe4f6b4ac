"""The load fleet of ``bench_load.py`` and ``bench_scale.py``: worker processes of
threads, each thread with its own Session on a shared store (or a memory store of its
own) and a quota that never binds, sending GETs flat out or paced to the benchmarks'
``200 ok`` server; how the parent starts them together, collects their reports and
replaces a stuck one; and what Redis was asked meanwhile (``INFO commandstats``, and
``MONITOR`` by client)."""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import logging
import math
import multiprocessing
import os
import queue
import re
import signal
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import PackageLog, cpu_seconds, ok_server, open_store, redis_cluster, redis_server, summary

#: The quota every adapter has: it never binds.
QUOTA_LIMIT = 10_000
TIMEOUT = 10.0
#: Seconds after the window's end by which every worker must have reported (a call may
#: take up to its 30 s deadline): past it a worker is reported stuck and replaced.
STUCK_AFTER = 45.0
#: Commands the benchmark itself sends to Redis (left out of every count).
OWN_COMMANDS = ("info", "config", "monitor", "flushall")
#: The change feed's commands, shown apart.
FEED_COMMANDS = ("ping", "subscribe", "unsubscribe")


def _path_scope(request: Any) -> str:
    """A scope per path (``/s17``): a plain scope function (its result is hashed)."""
    return str(request.url).rsplit("/", 1)[1]


def _make_store(spec: dict[str, Any]) -> Any:
    kind = spec["store"]
    timeout = spec["timeout"]
    if kind == "cluster":  # "where": the port of one of its nodes
        from redis.cluster import RedisCluster

        from retry_after_adapter.cooldown import RedisCooldownStore

        wait = timeout or 0.1
        client = RedisCluster(
            host="127.0.0.1", port=spec["where"], socket_timeout=wait, socket_connect_timeout=wait
        )
        return RedisCooldownStore(client, prefix=spec["prefix"], push=spec["push"])
    if kind == "memory":
        return open_store(kind)
    options: dict[str, Any] = {"push": spec["push"]}
    if kind == "sqlite":
        if timeout is not None:
            options["timeout"] = timeout
    else:
        kind = "redis"
        options["prefix"] = spec["prefix"]
        if timeout is not None:
            options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    return open_store(kind, spec["where"], **options)


def _session(spec: dict[str, Any], store: Any) -> Any:
    import requests

    from retry_after_adapter import Quota, RetryAfterAdapter, RetryAfterRetry

    retry = RetryAfterRetry(total=5, backoff_factor=0.5, status_forcelist=(429, 502, 503, 504), deadline=30)
    kwargs: dict[str, Any] = {"cooldown": store}
    if spec["quota"]:
        margin = {} if spec.get("margin") is None else {"margin": spec["margin"]}
        kwargs["quota"] = Quota(spec.get("limit", QUOTA_LIMIT), per=spec.get("per", 1.0), **margin)
    if spec.get("max_concurrency"):
        kwargs["max_concurrency"] = spec["max_concurrency"]
    if spec["scopes"] > 0:
        kwargs["scope"] = _path_scope
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(max_retries=retry, **kwargs))
    return session


def _thread(
    session: Any, urls: list[str], offset: int, t0: float, t1: float, out: list[int], every: float = 0.0
) -> None:
    """GETs until ``t1``; ``out``: [200s answered within [t0, t1), other outcomes].
    ``every`` > 0: one GET every ``every`` seconds at most (on schedule, not catching up
    with a burst when late), the threads' first ones spread over the first ``every``."""
    get = session.get
    clock = time.monotonic
    n = len(urls)
    i = offset
    inside = bad = 0
    due = clock() + every * ((offset * 0.6180339887) % 1.0)  # golden-ratio spread
    while True:
        if every:
            time.sleep(max(0.0, due - clock()))
            due = max(due + every, clock())
        try:
            ok = get(urls[i % n], timeout=TIMEOUT).status_code == 200
        except Exception:
            ok = False
        i += 1
        now = clock()
        if now >= t1:
            break
        if not ok:
            bad += 1
        elif now >= t0:
            inside += 1
    out[0], out[1] = inside, bad


#: This worker's writes to Redis within the measured window (``_WINDOW``, monotonic).
_SENT = [0]
#: ... by what each carried (see :func:`round_trip_kind`).
_SENT_BY: Counter[str] = Counter()


_WINDOW = [math.inf, math.inf]
#: The head of a packed command: its name and, an ``EVALSHA``'s, the script's SHA1.
_HEAD = re.compile(rb"\*[0-9]+\r\n\$[0-9]+\r\n([A-Za-z]+)\r\n(?:\$40\r\n([0-9a-f]{40}))?")
_NAMES: dict[bytes, str] = {}


def round_trip_kind(packed: Any) -> str:
    """What a write to Redis carries, named by its first command (an ``EVALSHA`` by its
    script: ``evalsha settle``; a pipeline by its first command, with ``+`` when it
    carries more than one): as the benchmarks' tables break round trips down."""
    if isinstance(packed, list | tuple):
        chunks = [bytes(chunk) for chunk in packed]
    else:
        chunks = [packed.encode() if isinstance(packed, str) else bytes(packed)]
    head = _HEAD.match(chunks[0]) if chunks else None
    if head is None:
        return "(other)"
    name = head.group(1).decode().lower()
    if head.group(2) is not None:
        if not _NAMES:
            _NAMES.update(script_names())
        name += " " + _NAMES.get(head.group(2), "(another script)")
    # A pipeline's commands are packed one after the other: a second array header.
    data = b"".join(chunks)
    more = sum(1 for _ in _ARRAY.finditer(data)) > 1
    return name + (" +" if more else "")


#: An array header at the start of a packed command (one per command of a pipeline; a
#: bulk string's content could look the same, which would only mark a write ``+``).
_ARRAY = re.compile(rb"(?:^|\r\n)\*[0-9]+\r\n\$")


def _count_round_trips() -> None:
    """Count each write this process sends to Redis within the measured window: one
    per round trip (a pipeline of many commands is one write; MONITOR shows each
    command of it apart), and by what it carries."""
    try:
        from redis import connection
    except ImportError:
        return
    send = connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        if _WINDOW[0] <= time.monotonic() < _WINDOW[1]:
            _SENT[0] += 1
            _SENT_BY[round_trip_kind(command)] += 1
        return send(self, command, *args, **kwargs)

    connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


def worker(index: int, commands: Any, results: Any, nice: int) -> None:
    """One worker process: runs each spec it is sent (see :func:`run_variant`)."""
    from retry_after_adapter.cooldown.guard import guard_of

    _count_round_trips()

    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack on stderr
    logger = logging.getLogger("retry_after_adapter")
    logger.setLevel(logging.INFO)
    while True:
        spec = commands.get()
        if spec is None:
            return
        handler = PackageLog()
        logger.addHandler(handler)
        store = _make_store(spec)
        base = spec["url"]
        urls = [f"{base}/s{n}" for n in range(spec["scopes"])] if spec["scopes"] > 0 else [base + "/"]
        if spec.get("one_session"):  # every thread on one Session (one adapter)
            sessions = [_session(spec, store)] * spec["threads"]
        else:
            sessions = [_session(spec, store) for _ in range(spec["threads"])]
        results.put(("ready", index))
        start_at, t0, t1 = commands.get()
        _SENT[0], _WINDOW[:] = 0, [t0, t1]
        _SENT_BY.clear()
        outs = [[0, 0] for _ in sessions]
        # Paced (``pace`` GETs a second in the process): each thread's share, spread.
        every = len(sessions) / spec["pace"] if spec.get("pace") else 0.0
        threads = [
            threading.Thread(
                target=_thread,
                args=(s, urls, index * len(sessions) + n, t0, t1, outs[n], every),
                daemon=True,
            )
            for n, s in enumerate(sessions)
        ]
        time.sleep(max(0.0, start_at - time.monotonic()))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in sessions:
            s.close()
        health = {"failures": 0, "busy": 0, "outages": 0}
        if spec["store"] == "memory":
            store.close()
        else:
            guard = guard_of(store)
            health = {"failures": guard.failures, "busy": guard.busy, "outages": guard.outages}
            guard.close()  # its held slots, its change feed, then the store
        logger.removeHandler(handler)
        results.put(
            (
                "done",
                index,
                {
                    "ok": sum(o[0] for o in outs),
                    "bad": sum(o[1] for o in outs),
                    "log": dict(handler.counts),
                    "log_first": handler.first,
                    "sent": _SENT[0],
                    "sent_by": dict(_SENT_BY),
                    **health,
                },
            )
        )


class Fleet:
    """The worker processes, started once (spawn) and given one variant at a time."""

    def __init__(self, processes: int, nice: int) -> None:
        self.nice = nice
        self.context = multiprocessing.get_context("spawn")
        self.results = self.context.Queue()
        self.commands: list[Any] = [None] * processes
        self.procs: list[Any] = [None] * processes
        for n in range(processes):
            self._start(n)

    def _start(self, n: int) -> None:
        self.commands[n] = self.context.Queue()
        self.procs[n] = self.context.Process(
            target=worker, args=(n, self.commands[n], self.results, self.nice), daemon=True
        )
        self.procs[n].start()

    def replace(self, n: int) -> None:
        """Worker ``n`` is stuck: its threads' stacks go to stderr, then it is killed and
        a new worker takes its place."""
        proc = self.procs[n]
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGUSR1)  # see worker(): faulthandler
        time.sleep(1.0)
        proc.kill()
        proc.join(timeout=10)
        self._start(n)

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)


_LINE = re.compile(rb'([0-9]+\.[0-9]+) \[[0-9]+ ([^\]]+)\] "([^"]+)"(?: "([^"]*)")?')


def script_names() -> dict[bytes, str]:
    """The package's Lua scripts by SHA1 (what ``EVALSHA`` names): a round trip is
    counted per script (``evalsha admit``, ``evalsha settle``...)."""
    try:
        from retry_after_adapter.cooldown.redis.wire import SCRIPTS, script_source
    except ImportError:  # the redis module moved: counted as plain "evalsha"
        return {}
    return {hashlib.sha1(script_source(name).encode("utf-8")).hexdigest().encode(): name for name in SCRIPTS}


class Monitor:
    """Counts the commands Redis runs between two ``INFO commandstats`` (as ``MONITOR``
    shows them, in the order Redis runs them: exactly what the difference of those two
    commandstats counts), by who sent them: a client (a round trip) or a Lua script
    (``[0 lua]`` in ``MONITOR``'s lines). (A window of wall-clock stamps around a reset
    of the stats missed what ran between a stamp and its command on a busy machine.)"""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        reply = self.sock.recv(5)
        if reply != b"+OK\r\n":
            raise RuntimeError(f"MONITOR refused: {reply!r}")
        self.counting = False
        self.clients: Counter[str] = Counter()
        self.scripts: Counter[str] = Counter()
        self.received = time.monotonic()  # when the last chunk came
        self.names = script_names()
        self._stop = False
        self._thread = threading.Thread(target=self._read, name="monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self.sock.settimeout(0.1)
        rest = b""
        while not self._stop:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            self.received = time.monotonic()
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            data, rest = data[:cut], data[cut:]
            for _, source, command, first in _LINE.findall(data):
                name = command.decode().lower()
                if name == "info" and first.lower() == b"commandstats":
                    self.counting = not self.counting  # from the first to the second
                elif not self.counting:
                    continue
                elif source == b"lua":
                    self.scripts[name] += 1
                else:
                    if name == "evalsha":
                        name += " " + self.names.get(first, "(another script)")
                    self.clients[name] += 1

    def drain(self, quiet: float = 0.05, longest: float = 2.0) -> None:
        """Wait until nothing came for ``quiet`` seconds (what was sent has been read)."""
        end = time.monotonic() + longest
        while time.monotonic() < end and time.monotonic() - self.received < quiet:
            time.sleep(quiet / 2)

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()
        self._thread.join(timeout=2)


def commandstats(client: Any, since: dict[str, int] | None = None) -> dict[str, int]:
    """Calls per command (script-run commands included): since the last reset, or since
    the counts ``since`` (an earlier result)."""
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}
    if since is None:
        return calls
    return {name: count - since.get(name, 0) for name, count in calls.items()}


def own_command(command: str) -> bool:
    return command.split("|", 1)[0] in OWN_COMMANDS


def feed_command(command: str) -> bool:
    return command.split("|", 1)[0] in FEED_COMMANDS


def collect(fleet: Fleet, kind: str, count: int, last: float) -> dict[int, Any]:
    """Up to ``count`` messages ``kind`` from the workers, until ``last`` (monotonic):
    each worker's by its index."""
    got: dict[int, Any] = {}
    while len(got) < count and time.monotonic() < last:
        with contextlib.suppress(queue.Empty):
            message = fleet.results.get(timeout=max(0.1, last - time.monotonic()))
            assert message[0] == kind, (message, kind)
            got[message[1]] = message[2] if len(message) > 2 else None
    return got


def replace_stuck(fleet: Fleet, stuck: list[int], what: str) -> list[int]:
    for n in stuck:
        print(
            f"  worker {n} did not {what} within {STUCK_AFTER:g} s: its stacks follow; replaced",
            file=sys.stderr,
        )
        fleet.replace(n)
    return stuck


def ready(fleet: Fleet, spec: dict[str, Any], processes: int) -> int:
    """Send ``spec`` to the first ``processes`` workers and wait until each is ready;
    the workers stuck before they could start (then the others ran an empty window, and
    the stuck ones were replaced): 0 when every one is ready."""
    for q in fleet.commands[:processes]:
        q.put(spec)
    got = collect(fleet, "ready", processes, time.monotonic() + STUCK_AFTER)
    if len(got) == processes:
        return 0
    now = time.monotonic()
    for n in got:
        fleet.commands[n].put((now, now, now))
    collect(fleet, "done", len(got), now + STUCK_AFTER)
    return len(replace_stuck(fleet, [n for n in range(processes) if n not in got], "start"))


def start(fleet: Fleet, processes: int, warm: float, duration: float) -> tuple[float, float]:
    """Start the ready workers' run: ``warm`` seconds, then the measured window ``(t0,
    t1)`` (monotonic), returned."""
    start_at = time.monotonic() + 0.05
    t0, t1 = start_at + warm, start_at + warm + duration
    for q in fleet.commands[:processes]:
        q.put((start_at, t0, t1))
    return t0, t1


def reports(fleet: Fleet, processes: int, t1: float) -> tuple[list[dict[str, Any]], int]:
    """The workers' reports of the run whose window ended at ``t1``, and how many were
    stuck (replaced). A call that began before ``t1`` ends within its deadline (30 s); a
    worker that has not reported well after that is stuck (a deadlock in the store)."""
    got = collect(fleet, "done", processes, t1 + STUCK_AFTER)
    stuck = replace_stuck(fleet, [n for n in range(processes) if n not in got], "finish")
    return list(got.values()), len(stuck)


def prepare_sqlite(spec: dict[str, Any]) -> None:
    """Create the file and its schema before the workers open it together."""
    if spec["store"] == "sqlite":
        from retry_after_adapter.cooldown import SQLiteCooldownStore

        SQLiteCooldownStore(spec["where"]).close()


# -- one measured run (bench_load.py) ------------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """Busy and total CPU seconds of the whole machine (all cores) so far."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick


def run_variant(
    fleet: Fleet,
    spec: dict[str, Any],
    processes: int,
    pids: dict[str, int],
    redis: Any,
    warm: float,
    duration: float,
) -> dict[str, Any]:
    """Run ``spec`` on the first ``processes`` workers: warm-up, then the measured
    window; what it measured."""
    stuck_at_start = ready(fleet, spec, processes)
    if stuck_at_start:
        return {"stuck_workers": stuck_at_start, "requests": 0, "requests_per_s": 0.0}
    monitor = None
    if spec["store"] == "redis":
        redis["client"].flushall()
        monitor = Monitor(redis["port"])
    t0, t1 = start(fleet, processes, warm, duration)
    workers = [p.pid for p in fleet.procs[:processes]]
    time.sleep(max(0.0, t0 - time.monotonic()))

    def cpu() -> dict[str, float]:
        out = {name: cpu_seconds(pid) for name, pid in pids.items()}
        out["clients"] = sum(cpu_seconds(pid) for pid in workers)
        out["this process"] = time.process_time()
        out["machine busy"], out["machine total"] = machine_cpu()
        return out

    if monitor is not None:
        base = commandstats(redis["client"])  # the monitor counts from this command...
    cpu_start = cpu()
    time.sleep(max(0.0, t1 - time.monotonic()))
    cpu_end = cpu()
    stats = None
    if monitor is not None:
        stats = commandstats(redis["client"], base)  # ...to this one
        monitor.drain()
    done, stuck = reports(fleet, processes, t1)
    if monitor is not None:
        monitor.close()
    ok = sum(d["ok"] for d in done)
    used = {k: cpu_end[k] - cpu_start[k] for k in cpu_start}
    ours = sum(v for k, v in used.items() if not k.startswith("machine"))
    result: dict[str, Any] = {
        "stuck_workers": stuck,
        "requests": ok,
        "requests_per_s": ok / duration,
        "not_ok": sum(d["bad"] for d in done),
        "log": dict(sum((Counter(d["log"]) for d in done), Counter())),
        "log_first": [line for d in done for line in d["log_first"]][:3],
        "store_failures": sum(d["failures"] for d in done),
        "store_busy": sum(d["busy"] for d in done),
        "store_outages": sum(d["outages"] for d in done),
        "cpu_seconds": used,
        "client_cpu_us_per_request": used["clients"] / ok * 1e6 if ok else None,
        "http_server_cpu_us_per_request": used["http server"] / ok * 1e6 if ok else None,
        "machine_busy_share": used["machine busy"] / used["machine total"] if used["machine total"] else None,
        "other_cpu_share": (used["machine busy"] - ours) / used["machine total"]
        if used["machine total"]
        else None,
    }
    if "redis" in used:
        result["redis_cpu_us_per_request"] = used["redis"] / ok * 1e6 if ok else None
    if stats is not None and monitor is not None:
        result["client_round_trips_per_request"] = sum(d.get("sent", 0) for d in done) / ok if ok else None
        stats = {k: v for k, v in stats.items() if not own_command(k)}
        trips = {k: v for k, v in monitor.clients.items() if not own_command(k)}
        in_scripts = dict(monitor.scripts)
        n_trips = sum(trips.values())
        n_feed = sum(v for k, v in trips.items() if feed_command(k))
        n_stats = sum(stats.values())
        n_stats_feed = sum(v for k, v in stats.items() if feed_command(k))
        result["redis"] = {
            "commandstats": stats,
            "round_trips": trips,
            "run_by_scripts": in_scripts,
            "commands_per_request": n_stats / ok if ok else None,
            "commands_per_request_without_feed": (n_stats - n_stats_feed) / ok if ok else None,
            "round_trips_per_request": n_trips / ok if ok else None,
            "round_trips_per_request_without_feed": (n_trips - n_feed) / ok if ok else None,
            # MONITOR and commandstats are two views of one thing: a check of the split.
            "monitor_total_vs_commandstats": (n_trips + sum(in_scripts.values())) / n_stats
            if n_stats
            else None,
        }
    return result


def summarise(every: list[dict[str, Any]], memory_runs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Medians over a variant's runs (a run with a stuck worker is counted, not used);
    the ratio to memory is each run's over the memory run of the same repetition."""
    runs = [r for r in every if not r["stuck_workers"]]
    out: dict[str, Any] = {
        "requests_per_s": summary([r["requests_per_s"] for r in runs]),
        "client_cpu_us_per_request": summary(
            [r["client_cpu_us_per_request"] for r in runs if r["client_cpu_us_per_request"] is not None]
        ),
        "other_cpu_share": summary(
            [r["other_cpu_share"] for r in runs if r["other_cpu_share"] is not None]
        ),
        "not_ok": sum(r["not_ok"] for r in runs),
        "store_failures": sum(r["store_failures"] for r in runs),
        "store_busy": sum(r["store_busy"] for r in runs),
        "stuck_runs": len(every) - len(runs),
        "log": dict(sum((Counter(r["log"]) for r in runs), Counter())),
        "runs": every,
    }
    if memory_runs is not None:
        base = {m["rep"]: m["requests_per_s"] for m in memory_runs if not m["stuck_workers"]}
        out["ratio_vs_memory"] = summary(
            [r["requests_per_s"] / base[r["rep"]] for r in runs if r["rep"] in base]
        )
    if runs and "redis" in runs[0]:
        client_trips = [r.get("client_round_trips_per_request") for r in runs]
        out["client_round_trips_per_request"] = summary([t for t in client_trips if t is not None])
        for key in (
            "round_trips_per_request",
            "round_trips_per_request_without_feed",
            "commands_per_request",
            "commands_per_request_without_feed",
        ):
            out[key] = summary([r["redis"][key] for r in runs if r["redis"][key] is not None])
        out["round_trips_per_request_by_command"] = {
            command: statistics.median(
                r["redis"]["round_trips"].get(command, 0) / r["requests"] for r in runs
            )
            for command in sorted({c for r in runs for c in r["redis"]["round_trips"]})
        }
        out["redis_cpu_us_per_request"] = summary(
            [r["redis_cpu_us_per_request"] for r in runs if r.get("redis_cpu_us_per_request") is not None]
        )
    return out


@contextlib.contextmanager
def services(workdir: str) -> Iterator[tuple[Any, Any, str]]:
    """The HTTP server, and Redis (a dict with its url, port, pid, a client; or None and
    why not)."""
    with ok_server() as server, redis_server(workdir) as (started, why):
        redis = None
        if started is not None:
            import redis as redis_py

            redis = {
                "url": started.url,
                "port": started.port,
                "pid": started.pid,
                "version": started.version,
                "client": redis_py.Redis(port=started.port),
            }
        try:
            yield server, redis, why
        finally:
            if redis is not None:
                redis["client"].close()


# -- the Redis servers of bench_scale.py ---------------------------------------------------------------------


class Stores:
    """The shared stores' servers: Redis and the cluster (either may be missing: why)."""

    def __init__(self, redis: Any, redis_why: str, cluster: Any, cluster_why: str) -> None:
        import redis as redis_py  # only when one of them runs

        self.redis, self.cluster = redis, cluster
        self.versions = {
            "redis": getattr(redis, "version", None),
            "cluster": getattr(cluster, "version", None),
        }
        self.skipped = {k: w for k, w in (("redis", redis_why), ("cluster", cluster_why)) if w}
        self.clients = {
            "redis": [redis_py.Redis(port=redis.port)] if redis else [],
            "cluster": [redis_py.Redis(port=port) for port in cluster.ports] if cluster else [],
        }
        #: CPU seconds a second each kind's servers use with no client (their timers).
        self.idle = {kind: self.idle_rate(kind) for kind, clients in self.clients.items() if clients}

    def where(self, kind: str, workdir: str, run: int) -> Any:
        if kind == "redis":
            return self.redis.url
        if kind == "cluster":
            return self.cluster.ports[0]
        return str(Path(workdir) / f"scale-{run}.db")

    def cpu(self, kind: str) -> float:
        """CPU seconds the servers of ``kind`` have used (``INFO cpu``: microseconds, where
        ``/proc``'s ticks are 10 ms, too coarse for a paced run's few hundred requests)."""
        total = 0.0
        for client in self.clients.get(kind, []):
            info = client.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return total

    def idle_rate(self, kind: str, seconds: float = 2.0) -> float:
        before = self.cpu(kind)
        time.sleep(seconds)
        return (self.cpu(kind) - before) / seconds

    def empty(self, kind: str) -> None:
        for client in self.clients.get(kind, []):
            client.flushall()

    def reset_stats(self, kind: str) -> None:
        for client in self.clients.get(kind, []):
            client.config_resetstat()

    def commands(self, kind: str) -> int:
        """Commands the Redis servers ran since the reset, the scripts' included (the
        benchmark's own left out)."""
        return sum(self.commands_by_name(kind).values())

    def commands_by_name(self, kind: str) -> dict[str, int]:
        """:meth:`commands` by command (every node's added up, on the cluster)."""
        total: Counter[str] = Counter()
        for client in self.clients.get(kind, []):
            for name, count in commandstats(client).items():
                if not own_command(name) and count:
                    total[name] += count
        return dict(total)

    def close(self) -> None:
        for clients in self.clients.values():
            for client in clients:
                client.close()


@contextlib.contextmanager
def stores(workdir: str, kinds: list[str]) -> Iterator[Stores | None]:
    """The Redis and the Redis Cluster ``kinds`` asks for (None: neither runs)."""
    with contextlib.ExitStack() as stack:
        redis, why = (
            stack.enter_context(redis_server(workdir))
            if "redis" in kinds
            else (None, "not asked for")
        )
        cluster, cwhy = (
            stack.enter_context(redis_cluster(workdir))
            if "cluster" in kinds
            else (None, "not asked for")
        )
        if redis is None and cluster is None:
            print(f"Redis rows skipped: {why}", file=sys.stderr)
            yield None
            return
        kept = Stores(redis, why, cluster, cwhy)
        try:
            yield kept
        finally:
            kept.close()
