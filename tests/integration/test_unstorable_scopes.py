"""Scopes a store cannot hold (a lone surrogate, a NUL) are refused by name, at the first
call, on the memory, SQLite and Redis stores alike: a ``ConfigurationError`` naming the
scope function and its value, never a store failure skipped (the call sent) nor a
false deferral. (0.14.0 on SQLite: the store's UnicodeEncodeError was taken for a
refused value, the admission asked again until a ``quota`` deferral came, with no
quota configured.)

Real parts: a loopback HTTP server, a SQLite file, the tests' redis-server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    budget,
)
from retry_after_adapter.cooldown import check_scope
from retry_after_adapter.cooldown.guard import guard_of
from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport
from retry_after_adapter.scope import public_scope

from ..servers import Reply, ThrottleServer

BAD = {"lone-surrogate": ("tenant-\ud800", "a lone surrogate"), "nul": ("tenant\x00-1", "a NUL character")}


def tenant_scope_of_surrogates(request: Any) -> str:
    return BAD["lone-surrogate"][0]


def tenant_scope_of_nul(request: Any) -> str:
    return BAD["nul"][0]


FUNCTIONS = {"lone-surrogate": tenant_scope_of_surrogates, "nul": tenant_scope_of_nul}


def wrapped(bad: str, public: bool) -> Any:
    function = FUNCTIONS[bad]
    return public_scope(function) if public else function


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_public_scope_function_returning_what_no_store_holds_is_refused_by_name(
    every_store: Any, real_server: ThrottleServer, bad: str
) -> None:
    value, what = BAD[bad]
    real_server.serve([Reply(200)])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=3), cooldown=every_store, scope=wrapped(bad, True)))
    for _ in range(2):  # at the first call, and every call
        with budget(deadline=2), pytest.raises(ConfigurationError) as refused:
            s.get(real_server.url)
        message = str(refused.value)
        assert FUNCTIONS[bad].__qualname__ in message and repr(value) in message and what in message
    assert real_server.count() == 0  # nothing was sent
    if not isinstance(every_store, MemoryCooldownStore):
        assert not guard_of(every_store).down  # not a store failure


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_private_scope_function_s_value_is_hashed_whatever_it_holds_and_never_shown(
    every_store: Any, real_server: ThrottleServer, bad: str
) -> None:
    """A private (hashed) scope function may return a secret from elsewhere (a tenant's
    key looked up outside the request): a NUL or a lone surrogate in it is hashed as any
    text is (the hash is what is stored), the call goes, and the value appears nowhere;
    an empty result is refused without showing anything either."""
    secret = "sk-tenant-8f3a9c1d2e4b"
    real_server.serve([Reply(200), Reply(200)])
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=every_store,
                                         scope=lambda request: secret + BAD[bad][0]))
    assert s.get(real_server.url).status_code == 200
    assert real_server.count() == 1

    def empty_scope(request: Any) -> str:
        return ""

    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=every_store, scope=empty_scope))
    with pytest.raises(ConfigurationError, match="empty_scope returned an empty string"):
        s.get(real_server.url)
    assert real_server.count() == 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_the_httpx_transports_refuse_it_too(tmp_path: Any, real_server: ThrottleServer, flavour: str) -> None:
    from retry_after_adapter import SQLiteCooldownStore

    store = SQLiteCooldownStore(tmp_path / "s.db")
    real_server.serve([Reply(200)])
    scope = public_scope(tenant_scope_of_surrogates)
    with pytest.raises(ConfigurationError, match="tenant_scope_of_surrogates"):
        if flavour == "sync":
            transport = RetryAfterTransport(RetryAfterRetry(total=3), cooldown=store, scope=scope)
            with httpx.Client(transport=transport) as client:
                client.get(real_server.url)
        else:

            async def get() -> None:
                transport = AsyncRetryAfterTransport(RetryAfterRetry(total=3), cooldown=store, scope=scope)
                async with httpx.AsyncClient(transport=transport) as client:
                    await client.get(real_server.url)

            asyncio.run(get())
    assert real_server.count() == 0
    store.close()


def test_the_value_is_shown_as_an_origin_is_never_with_a_query_or_credentials(real_server: ThrottleServer) -> None:
    real_server.serve([Reply(200)])

    def by_url(request: Any) -> str:
        return "https://user:pw@api.example:443/v1?token=abc123\x00"

    def by_token(request: Any) -> str:
        return request.headers["Authorization"] + "\x00"

    for function, hidden in ((by_url, ("abc123", "pw@", "token=")), (by_token, ("sk-live-0123456789",))):
        s = requests.Session()
        s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), scope=public_scope(function)))
        with pytest.raises(ConfigurationError) as refused:
            s.get(real_server.url, headers={"Authorization": "Bearer sk-live-0123456789"})
        message = str(refused.value)
        assert function.__qualname__ in message and "a NUL character" in message
        for secret in hidden:
            assert secret not in message, message
    assert real_server.count() == 0


@pytest.mark.parametrize("value", [None, "", 42])
def test_a_scope_function_returning_no_string_is_named_too(real_server: ThrottleServer, value: Any) -> None:
    def odd_scope(request: Any) -> Any:
        return value

    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), scope=odd_scope))
    with pytest.raises(ConfigurationError, match=r"the scope function .*odd_scope returned"):
        s.get(real_server.url)


@pytest.mark.parametrize("host", ["a\x00b", "\ud800"], ids=["nul", "lone-surrogate"])
def test_a_url_whose_origin_no_store_holds_is_refused_not_deferred(every_store: Any, host: str) -> None:
    """The urllib3 pool manager takes such a host as it is: the store's refusal of the
    scope is the caller's error, not a refused value asked again until a false
    ``quota`` deferral (0.14.0 on SQLite)."""
    manager = RetryAfterPoolManager(retries=RetryAfterRetry(total=1), cooldown=every_store)
    with budget(deadline=2), pytest.raises(ConfigurationError, match="must not hold"):
        manager.request("GET", f"http://{host}:1/")
    if not isinstance(every_store, MemoryCooldownStore):
        assert not guard_of(every_store).down


def test_check_scope_refuses_what_no_store_holds_and_keeps_any_text() -> None:
    for bad in ("\ud800", "x\udfff", "\x00", "a\x00b"):
        with pytest.raises(ConfigurationError, match="must not hold"):
            check_scope(bad)
    for good in ("https://api.example:443", "tenant-é", "租户-42", "emoji-\U0001f600", "tab\tand\nnewline"):
        assert check_scope(good) == good
