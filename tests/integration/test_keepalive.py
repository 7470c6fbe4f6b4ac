"""Connections idle past the server's announced keep-alive timeout are not reused
(``retry_after_adapter._keepalive``): a server that closes an idle connection as a
request arrives on it loses that request (Node's http server closes one 6 s after its
last answer, having announced ``Keep-Alive: timeout=5``)."""

from __future__ import annotations

import time

import pytest
import requests
import urllib3
from requests.adapters import HTTPAdapter

from retry_after_adapter import MemoryCooldownStore, RetryAfterAdapter, RetryAfterPoolManager, RetryAfterRetry
from retry_after_adapter._keepalive import idle_limit

from ..servers import DROP_AFTER, KeepAliveServer


def url(httpd: KeepAliveServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/"


def test_the_announced_timeout_less_a_second_is_the_idle_limit() -> None:
    assert idle_limit("timeout=5") == 4.0
    assert idle_limit("timeout=5, max=100") == 4.0
    assert idle_limit("max=100, Timeout = 75") == 74.0
    assert idle_limit("timeout=1") == 0.0
    for bad in (None, "", "max=100", "timeout=", "timeout=-1", "timeout=1.5", "timeout=\u0665", "timeout=9" * 40):
        assert idle_limit(bad) is None


def test_stock_requests_loses_the_request_the_adapter_opens_a_new_connection(
    keepalive_server: KeepAliveServer,
) -> None:
    stock = requests.Session()
    stock.mount("http://", HTTPAdapter())
    assert stock.get(url(keepalive_server), timeout=5).status_code == 200
    time.sleep(DROP_AFTER + 0.05)
    with pytest.raises(requests.ConnectionError):
        stock.get(url(keepalive_server), timeout=5)  # sent on the idle connection: lost
    assert keepalive_server.dropped == 1

    retry = RetryAfterRetry(total=0)  # no retry: the first attempt must get through
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(retry, cooldown=MemoryCooldownStore()))
    assert session.get(url(keepalive_server), timeout=5).status_code == 200
    before = keepalive_server.connections
    time.sleep(DROP_AFTER + 0.05)  # idle past 2 - 1 s: not reused
    assert session.get(url(keepalive_server), timeout=5).status_code == 200
    assert keepalive_server.dropped == 1 and keepalive_server.connections == before + 1


def test_a_connection_is_reused_within_the_limit_and_without_the_field(
    keepalive_server: KeepAliveServer,
) -> None:
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=MemoryCooldownStore()))
    for _ in range(3):
        assert session.get(url(keepalive_server), timeout=5).status_code == 200
    assert keepalive_server.connections == 1  # within a second of each other: kept alive
    keepalive_server.announce = None
    assert session.get(url(keepalive_server), timeout=5).status_code == 200
    time.sleep(DROP_AFTER + 0.05)  # nothing announced: reused as urllib3 does
    with pytest.raises(requests.ConnectionError):
        session.get(url(keepalive_server), timeout=5)
    assert keepalive_server.connections == 1 and keepalive_server.dropped == 1


def test_the_pool_manager_does_the_same(keepalive_server: KeepAliveServer) -> None:
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=0), cooldown=MemoryCooldownStore())
    assert manager.request("GET", url(keepalive_server)).status == 200
    time.sleep(DROP_AFTER + 0.05)
    assert manager.request("GET", url(keepalive_server)).status == 200
    assert keepalive_server.dropped == 0 and keepalive_server.connections == 2
    # A plain PoolManager is left as it was.
    assert urllib3.PoolManager().connection_from_url(url(keepalive_server)).__class__ is urllib3.HTTPConnectionPool
