"""The Redis harness of ``retry_after_adapter.testing`` (``RedisServer``), the one the
tests' fixtures and the benchmarks start their servers with: a real ``redis-server``
on a free loopback port, in a temporary directory that goes with it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from retry_after_adapter.testing import RedisServer

pytestmark = pytest.mark.redis


def test_a_server_answers_on_its_port_and_leaves_nothing_behind(redis_binary: str, redis_module: Any) -> None:
    with RedisServer() as server:
        client = redis_module.Redis.from_url(server.url, socket_timeout=2.0)
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
        pid, workdir = server.pid, server.workdir
        assert server.start() is server and server.pid == pid  # started already: nothing to do
        assert workdir.is_dir()
    assert server.proc is None and not server.answers_ping()
    assert not workdir.exists()
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone, not left running


def test_restart_comes_back_on_the_same_port_empty(redis_binary: str, redis_module: Any) -> None:
    with RedisServer() as server:
        client = redis_module.Redis.from_url(server.url, socket_timeout=2.0)
        client.set("k", "v")
        port = server.port
        server.kill()
        assert not server.answers_ping()
        server.restart()
        assert server.port == port and server.answers_ping()
        assert client.get("k") is None  # no persistence: it comes back empty
        client.close()


def test_a_server_that_will_not_start_says_why(redis_binary: str) -> None:
    server = RedisServer(extra_args=("--no-such-directive", "x"))
    with pytest.raises(RuntimeError, match="no-such-directive"):
        server.start()
    server.stop()
    assert server.proc is None
