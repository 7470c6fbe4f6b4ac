"""Shared helpers for the benchmarks: statistics, tables, JSON results, the machine
description, a fast loopback keep-alive HTTP server run in its own process, and a
private ``redis-server`` or Redis Cluster.

Every benchmark prints a table and then its JSON document (after a line ``--- JSON ---``)
and writes the same JSON to ``benchmarks/results/<name>.json`` (or to ``--out DIR``).

Run as a script, this module is that server::

    python benchmarks/lib/common.py --serve-ok     # prints "PORT <n>", serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Self

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
JSON_MARKER = "--- JSON ---"

# Run from a checkout without installing: make the package importable.
if str(REPO_DIR) not in sys.path:
    try:
        import retry_after_adapter  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO_DIR))

from retry_after_adapter.testing.redis import RedisCluster, RedisServer, missing  # noqa: E402

# -- statistics ---------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float | int]:
    """Median, min, max and count of ``values`` (same unit as the values)."""
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Pairwise ``a / b`` of two equally long sequences (e.g. per-block times)."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def fmt(value: float | int | None, digits: int = 3) -> str:
    """A compact number: ints as ints, floats with ``digits`` significant decimals."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if value != 0 and abs(value) < 10**-(digits):
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"


def fmt_summary(s: dict[str, Any], digits: int = 3) -> str:
    """``median [min-max]`` of a :func:`summary`."""
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}-{fmt(s['max'], digits)}]"


# -- output ---------------------------------------------------------------------------------


def cell(s: dict[str, Any] | None, digits: int = 0) -> str:
    """A table cell of a :func:`summary`: "-" for None, the one value when every run
    gave it, else the median with its range (``digits`` decimals; 0: as it is)."""
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return fmt(s["median"], digits) if digits else f"{s['median']:g}"
    if digits:
        return fmt_summary(s, digits)
    return f"{s['median']:g} [{s['min']:g}-{s['max']:g}]"


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain-text (and Markdown-compatible) table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [f"## {title}", ""]
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip()


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (other work on the machine skews timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    """Where and with what the benchmark ran: cores, CPU model, versions, UTC date, commit."""
    import requests
    import urllib3

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    status = _git("status", "--porcelain", "--", "retry_after_adapter")
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "urllib3": urllib3.__version__,
        "requests": requests.__version__,
        "platform": platform.platform(),
        "loadavg_at_end": loadavg(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "package_files_modified": [line[3:] for line in status.splitlines()] if status else [],
    }


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark takes."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny smoke run of a few seconds")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory for the JSON result (default: benchmarks/results)",
    )
    return p


def finish(name: str, payload: dict[str, Any], tables: Sequence[str], out_dir: Path) -> Path:
    """Print the tables and the JSON, and write the JSON to ``out_dir/<name>.json``."""
    document = {"benchmark": name, "machine": machine(), **payload}
    text = json.dumps(document, indent=2, sort_keys=False, default=str)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(text + "\n", encoding="utf-8")  # first: a closed stdout must not lose it
    for table_text in tables:
        print(table_text)
    print(JSON_MARKER)
    print(text, flush=True)
    print(f"(written to {path})", file=sys.stderr)
    return path


def rss_kib() -> int:
    """This process's resident set size in KiB (VmRSS from /proc/self/status)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- paired runs -----------------------------------------------------------------------------


def rotation(names: Sequence[str], r: int) -> list[str]:
    """``names`` in round ``r``'s order: rotated by one every round, so that no variant
    always runs first."""
    k = r % len(names)
    return [*names[k:], *names[:k]]


def paired_blocks(
    names: Sequence[str],
    run_block: Callable[[str], object],
    rounds: int,
    *,
    discard: int = 0,
    before: Callable[[], object] | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """Paired runs: each round one block of each variant (``run_block(name)``), in
    :func:`rotation`'s order; the wall and CPU seconds (this process's) of each block,
    by variant. The first ``discard`` rounds run unkept; ``before()`` runs ahead of each
    block, untimed. A block's ratio to the baseline's block of the same round
    (:func:`ratios`) is then free of the machine's drift from one round to the next."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(discard + rounds):
        for name in rotation(names, r):
            if before is not None:
                before()
            cpu, wall = time.process_time(), time.perf_counter()
            run_block(name)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if r >= discard:
                times[name].append((wall, cpu))
    return times


# -- a fleet of processes started together -------------------------------------------------


def process_fleet(
    ctx: Any,
    target: Callable[..., object],
    specs: Sequence[dict[str, Any]],
    results_within: float,
    *,
    on_start: Callable[[float], object] | None = None,
    join_timeout: float = 10.0,
) -> tuple[float, list[Any]]:
    """Run one process of ``ctx`` (a multiprocessing context) per spec, as
    ``target(spec, messages, start, start_value)``: each puts ``("ready", name)``, waits
    for ``start`` and puts ``("done", result)`` (or ``("error", name, why)``). Once every
    one is ready, ``start_value`` is set to a monotonic time 0.2 s ahead (handed to
    ``on_start`` first) and they all start; returns that time and the results as they
    came. A process not ready within 120 s, or results not all in ``results_within``
    seconds of the start, raise; every process is joined on the way out (terminated past
    ``join_timeout`` seconds)."""
    messages, start, start_value = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = []
    results: list[Any] = []
    try:
        for spec in specs:
            proc = ctx.Process(target=target, args=(spec, messages, start, start_value), daemon=True)
            proc.start()
            procs.append(proc)
        for _ in procs:
            message = messages.get(timeout=120)
            if message[0] != "ready":
                raise RuntimeError(f"a fleet process failed: {message}")
        start_value.value = time.monotonic() + 0.2
        if on_start is not None:
            on_start(start_value.value)
        start.set()
        end = start_value.value + results_within
        while len(results) < len(procs):
            message = messages.get(timeout=max(1.0, end - time.monotonic()))
            if message[0] != "done":
                raise RuntimeError(f"a fleet process failed: {message}")
            results.append(message[1])
    finally:
        for proc in procs:
            proc.join(join_timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    return start_value.value, results


# -- the package's log, counted -----------------------------------------------------------


class PackageLog(logging.Handler):
    """Counts the package's log records (INFO and up) while it is installed: by level
    (``counts``), the warnings (WARNING and up) and the recovery lines apart; keeps the
    first three records (``first``) and each warning or recovery line (``lines``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()
        self.first: list[str] = []
        self.lines: list[str] = []
        self.warnings = 0
        self.recoveries = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.counts[record.levelname] += 1
        if len(self.first) < 3:
            self.first.append(f"{record.levelname}: {message}"[:300])
        warning = record.levelno >= logging.WARNING
        if warning or "recovered" in message:
            self.lines.append(message[:120])
        if warning:
            self.warnings += 1
        elif "recovered" in message:
            self.recoveries += 1


@contextlib.contextmanager
def package_log() -> Iterator[PackageLog]:
    """A :class:`PackageLog` on the package's logger (set to INFO meanwhile)."""
    handler = PackageLog()
    logger = logging.getLogger("retry_after_adapter")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


# -- the stores a benchmark runs on -------------------------------------------------------


def open_store(kind: str | None, where: str = "", **options: Any) -> Any:
    """A fresh cooldown store: ``memory``, ``sqlite`` (``where`` is the file's path) or
    ``redis`` (``where`` is its URL); None for ``kind`` None (no store). ``options`` go
    to the SQLite constructor or to ``RedisCooldownStore.from_url`` (``prefix``, ``push``,
    socket timeouts in seconds)."""
    import retry_after_adapter as raa

    if kind is None:
        return None
    if kind == "memory":
        return raa.MemoryCooldownStore()
    if kind == "sqlite":
        return raa.SQLiteCooldownStore(where, **options)
    if kind == "redis":
        return raa.RedisCooldownStore.from_url(where, **options)
    raise ValueError(f"unknown store {kind!r}")


def scope_of(url: str) -> str:
    """The adapter's default scope (the origin) of ``url``."""
    from retry_after_adapter.scope import RequestInfo, origin_scope

    return origin_scope(RequestInfo("GET", url, {}))


# -- a fast keep-alive server in its own process --------------------------------------------

_OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def _content_length(head: bytes) -> int:
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    end = lower.find(b"\r\n", at + 2)
    value = lower[at + 17 : end if end >= 0 else len(lower)]
    return int(value.strip() or b"0")


class _OkProtocol(asyncio.Protocol):
    """Answers every HTTP/1.1 request on a connection with ``200 ok`` (keep-alive)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data
        answers = 0
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            size = end + 4 + _content_length(buf[:end])
            if len(buf) < size:
                break
            buf = buf[size:]
            answers += 1
        self.buffer = buf
        if answers and self.transport is not None:
            self.transport.write(_OK_RESPONSE * answers)


def _serve_ok() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_OkProtocol, "127.0.0.1", 0, backlog=512)
        port = server.sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class ServerProcess:
    """A loopback server started as ``python <script> <args>`` in a child process.

    The child prints ``PORT <n>`` once listening; :meth:`stop` ends it (it is also
    ended when the context manager exits). ``url`` is ``http://127.0.0.1:<n>``.
    """

    def __init__(self, script: Path | str, *args: str, start_timeout: float = 20.0) -> None:
        # A Path is a script; a str is a module, run with ``python -m``.
        head = [str(script)] if isinstance(script, Path) else ["-m", script]
        self._start([sys.executable, *head, *args], f"server {script}", start_timeout)

    def _start(
        self, command: list[str], what: str, start_timeout: float, cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Run ``command`` and wait (at most ``start_timeout`` seconds) for its ``PORT``
        line; ``what`` names the server in the error when it does not come."""
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + start_timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("PORT ") or not line:
                break
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"{what} did not start (got {line!r})")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def ok_server() -> ServerProcess:
    """The fast ``200 ok`` keep-alive server, in its own process."""
    return ServerProcess(Path(__file__), "--serve-ok")


# -- a private redis-server (the package's test harness) ---------------------------------


@contextlib.contextmanager
def redis_server(workdir: str | Path) -> Iterator[tuple[RedisServer | None, str]]:
    """Yield ``(server, "")`` for a fresh loopback redis-server (ended on exit), or
    ``(None, why not)`` when the binary or the ``redis`` package is missing or it
    would not start."""
    why = missing()
    if why:
        yield None, why
        return
    try:
        server = RedisServer(workdir).start()
    except RuntimeError as exc:
        yield None, str(exc)
        return
    with server:
        yield server, ""


@contextlib.contextmanager
def redis_url(workdir: str | Path) -> Iterator[tuple[str | None, str]]:
    """:func:`redis_server` as ``(url, version)``, or ``(None, why not)``."""
    with redis_server(workdir) as (server, why):
        yield (server.url, server.version) if server is not None else (None, why)


@contextlib.contextmanager
def redis_cluster(workdir: str | Path, nodes: int = 3) -> Iterator[tuple[RedisCluster | None, str]]:
    """Yield ``(cluster, "")`` for a fresh ``nodes``-master Redis Cluster on loopback
    (made with ``redis-cli --cluster create``, ended on exit), or ``(None, why not)``."""
    why = missing(cluster=True)
    if why:
        yield None, why
        return
    try:
        cluster = RedisCluster(Path(workdir) / "cluster", nodes).start()
    except RuntimeError as exc:
        yield None, str(exc)
        return
    with cluster:
        yield cluster, ""


_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def callgrind_collected(script: str, args: Sequence[str], what: str, timeout: float = 1800) -> int:
    """Run ``script --child *args`` under valgrind's callgrind, collecting only inside
    ``functools.reduce`` (the measured loop), and return the instructions collected.
    The child gets this process's ``sys.path`` and a fixed hash seed; ``what`` names
    the run in the error raised when it fails."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    command = [
        "valgrind",
        "--tool=callgrind",
        "--toggle-collect=functools_reduce",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        script,
        "--child",
        *args,
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    found = _COLLECTED.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{what}: the callgrind run failed ({proc.returncode}): {proc.stderr[-800:]}")
    return int(found[-1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (all its threads), from
    ``/proc/<pid>/stat``; NaN when it cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-ok"]:
        with contextlib.suppress(KeyboardInterrupt):
            _serve_ok()
    else:
        print(__doc__)
        sys.exit(2)
