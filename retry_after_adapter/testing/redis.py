"""A real ``redis-server`` (or a 3-node Redis Cluster) on loopback, for tests and
benchmarks: :class:`RedisServer` and :class:`RedisCluster`.

Each starts on a free port of 127.0.0.1, without persistence, in a working directory of
its own (a temporary one removed on :meth:`~RedisServer.stop` unless one is given), and
is stopped by ``stop()`` or on leaving its ``with`` block::

    with RedisServer() as server:
        store = RedisCooldownStore.from_url(server.url)

:func:`missing` says why neither can run here (no ``redis-server``/``redis-cli`` on
``PATH``, no ``redis`` package), so a caller can skip rather than fail. Every duration
here is in seconds.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .ports import free_port

__all__ = ["START_TIMEOUT", "RedisCluster", "RedisServer", "free_port", "missing", "redis_version"]

#: Seconds a freshly started server may take to answer PING.
START_TIMEOUT = 10.0

#: Seconds a new cluster may take to reach ``cluster_state:ok`` on every node.
CLUSTER_TIMEOUT = 30.0


def missing(cluster: bool = False) -> str:
    """Why a private Redis (a cluster: also ``redis-cli``) cannot run here; "" when it can."""
    if shutil.which("redis-server") is None:
        return "redis-server not found on PATH (Debian/Ubuntu: apt-get install redis-server)"
    if cluster and shutil.which("redis-cli") is None:
        return "redis-cli not found on PATH (it comes with redis-server: redis-tools)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install 'retry_after_adapter[redis]')"
    return ""


def redis_version() -> str:
    """``redis-server --version`` ("" without the binary)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return ""
    run = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return run.stdout.strip()


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, without persistence.

    ``workdir`` holds its log (a temporary directory when None); ``extra_args`` are
    passed to the server (``"--requirepass", "s3cret"``). :meth:`start` picks a free
    port; ``kill()`` (SIGKILL), ``freeze()``/``thaw()`` (SIGSTOP/SIGCONT) and
    :meth:`restart` (same port, empty data) are for outage tests.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="redis-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.extra_args = tuple(extra_args)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def version(self) -> str:
        return redis_version()

    def start(self) -> RedisServer:
        """Start on a free port (five tries: another process may take the port first);
        RuntimeError naming the cause when it would not start. Running already: nothing
        to do."""
        if self.proc is not None:
            return self
        error = ""
        for _ in range(5):
            self.port = free_port()
            try:
                self._launch()
                return self
            except RuntimeError as exc:
                error = str(exc)
        raise RuntimeError(f"redis-server did not start: {error}")

    def restart(self) -> RedisServer:
        """Start again on the same port (after kill() or stop()), empty."""
        self.stop(keep_workdir=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self._launch()
                return self
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"redis-{self.port}.log"
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--logfile", str(log),
            *self.extra_args,
        ]  # fmt: skip
        # What it says before its log is open (a bad argument) goes to the log too; no
        # pipe of the caller's is held by the server.
        with open(log, "ab") as early:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=early, stderr=early)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                self.proc = None
                raise RuntimeError(f"redis-server exited at start: {tail}")
            if self.answers_ping():
                return
            time.sleep(0.02)
        self.stop(keep_workdir=True)
        raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT} s")

    def answers_ping(self) -> bool:
        """Whether the server answers PING now (a password-protected one answers NOAUTH)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def kill(self) -> None:
        """SIGKILL: the server dies at once, dropping every connection and all data."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung server)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, keep_workdir: bool = False) -> None:
        """End the server (SIGTERM, then SIGKILL after 5 s); remove its temporary
        working directory unless ``keep_workdir`` (it is about to start again)."""
        if self.proc is not None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.proc = None
        if self._tmp is not None and not keep_workdir:
            self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RedisCluster:
    """A real Redis Cluster on 127.0.0.1 of ``nodes`` masters and no replicas, made
    with ``redis-cli --cluster create``; ``ports`` are its nodes'. Its data lives and
    dies with it."""

    def __init__(self, workdir: str | Path | None = None, nodes: int = 3) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="redis-cluster-")
            workdir = self._tmp.name
        root = Path(workdir)
        cluster_args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000",
        )  # fmt: skip
        self.servers = [RedisServer(root / f"node-{n}", cluster_args) for n in range(nodes)]
        self.started = False

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def version(self) -> str:
        return redis_version()

    def start(self) -> RedisCluster:
        """Start the nodes, join them and wait for ``cluster_state:ok`` on each;
        RuntimeError naming the cause (every node stopped) when that fails. Started
        already: nothing to do."""
        if self.started:
            return self
        try:
            for server in self.servers:
                server.start()
            self._create()
        except BaseException:
            self.stop()
            raise
        self.started = True
        return self

    def _create(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli not found on PATH (it comes with redis-server)")
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        created = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {created.stdout[-300:]} {created.stderr[-300:]}"
            )
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while time.monotonic() < deadline:
            infos = [
                subprocess.run(
                    [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True, timeout=5
                )
                for port in self.ports
            ]
            if all("cluster_state:ok" in info.stdout for info in infos):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis Cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT} s")

    def stop(self) -> None:
        """End every node and remove the temporary working directory."""
        self.started = False
        for server in self.servers:
            server.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
