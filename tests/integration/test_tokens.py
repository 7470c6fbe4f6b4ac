"""Token-weighted admission: a request's declared cost (``cost=``, ``budget(cost=...)``)
weighed against a configured ``Quota(..., unit="tokens")`` and against the token
allowance an LLM API announces, with real SDKs, real processes and real stores, against
loopback stand-ins that count tokens as the providers do (``QuotaServer(tokens=...)``:
a request costs its JSON body's ``max_tokens``). The fleet of SDK clients in four
processes and threads is in ``test_llm_sdks.py``."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    budget,
)
from retry_after_adapter.cost import max_tokens
from retry_after_adapter.scope import RequestInfo
from retry_after_adapter.testing.server import QuotaServer

from ..conftest import local_deferral

TOKENS = Quota(25, per=3, unit="tokens")


def session(adapter: RetryAfterAdapter) -> requests.Session:
    s = requests.Session()
    s.mount("http://", adapter)
    return s


def test_a_token_quota_admits_what_fits_then_defers_with_the_eligible_time() -> None:
    """Cost 10 against 25 tokens per 3 s: two calls go, the third does not fit and is
    deferred before sending (``max_wait=0``) to when the first permit stops counting; a
    call that declares no cost is not held back by the tokens at all."""
    with QuotaServer(100, 3, tokens=25) as server:
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=2, max_wait=0, raise_on_status=False), cooldown=MemoryCooldownStore(), quota=TOKENS
        )
        http = session(adapter)
        started = time.time()
        with budget(cost=10):
            assert [http.post(server.url, json={"max_tokens": 10}).status_code for _ in range(2)] == [200, 200]
            deferred = local_deferral(http.post(server.url, json={"max_tokens": 10}))
        assert deferred.reason == "quota"
        assert 2.9 <= deferred.eligible_at.timestamp() - started <= 3.0 + 0.05 + 1.0  # per + margin
        assert http.get(server.url).status_code == 200  # no cost declared: no tokens
        stats = server.stats()
    assert stats.requests == 3 and stats.throttled == 0


def test_every_front_end_reads_the_cost_of_its_own_request() -> None:
    """``cost=`` is given the front end's own request: ``max_tokens`` reads the JSON body
    of a requests PreparedRequest, an httpx Request and a urllib3 call's body."""
    body = json.dumps({"model": "m", "max_tokens": 7}).encode()
    prepared = requests.Request("POST", "http://h/", data=body).prepare()
    assert max_tokens(prepared) == 7
    assert max_tokens(httpx.Request("POST", "http://h/", content=body)) == 7
    assert max_tokens(RequestInfo("POST", "http://h/", {}, body)) == 7
    assert max_tokens(RequestInfo("POST", "http://h/", {}, b"not json")) is None
    assert max_tokens(RequestInfo("GET", "http://h/", {})) is None
    with QuotaServer(100, 3, tokens=25) as server:
        pool = RetryAfterPoolManager(
            retries=RetryAfterRetry(total=0, max_wait=0, raise_on_status=False),
            cooldown=MemoryCooldownStore(), quota=TOKENS, cost=max_tokens,
        )
        big = json.dumps({"max_tokens": 20}).encode()
        assert pool.request("POST", server.url, body=big).status == 200
        assert local_deferral(pool.request("POST", server.url, body=big)).reason == "quota"
        assert server.stats().requests == 1


@pytest.mark.parametrize(
    ("options", "cause"),
    [
        ({"quota": TOKENS, "cost": lambda request: 26}, r"26 tokens \(the cost= function <lambda>\) exceeds the token quota"),
        ({"quota": TOKENS, "cost": lambda request: "10"}, r"a cost of a str \(the cost= function <lambda>\)"),
        ({"quota": TOKENS, "cost": lambda request: 1 / 0}, "the cost= function <lambda> raised ZeroDivisionError"),
    ],
)
def test_a_bad_cost_is_the_packages_error_naming_its_cause_and_nothing_is_sent(
    options: dict[str, Any], cause: str
) -> None:
    with QuotaServer(100, 3, tokens=25) as server:
        http = session(RetryAfterAdapter(cooldown=MemoryCooldownStore(), **options))
        with pytest.raises(ConfigurationError, match=cause):
            http.post(server.url, json={"max_tokens": 10})
        assert server.stats().requests == 0


def test_bad_token_settings_are_refused_when_made() -> None:
    with pytest.raises(ConfigurationError, match="unit"):
        Quota(10, per=1, unit="bytes")
    with pytest.raises(ConfigurationError, match="one Quota of each unit"):
        RetryAfterAdapter(quota=(Quota(1, per=1), Quota(2, per=1)))
    with pytest.raises(ConfigurationError, match=r"a cost of -1 \(cost= \(a fixed cost\)\): a cost is an int from 0"):
        RetryAfterAdapter(cost=-1)
    with pytest.raises(ConfigurationError, match=r"cost of 30 tokens \(cost= \(a fixed cost\)\) exceeds the token quota of 25 per 3 s"):
        RetryAfterAdapter(cost=30, quota=TOKENS)  # a fixed cost that could never fit: refused when made
    with pytest.raises(ConfigurationError, match="cost"):
        with budget(cost=1.5):  # type: ignore[arg-type]
            pass
    both = RetryAfterAdapter(quota=[Quota(90_000, per=60, unit="tokens"), Quota(60, per=60)])
    assert both.quota == (Quota(60, per=60), Quota(90_000, per=60, unit="tokens"))  # requests first


def test_a_request_quota_and_a_token_quota_hold_together() -> None:
    """Both at once: 3 requests per 3 s and 25 tokens per 3 s; calls of cost 5 are held
    by the requests quota (3, not 5), calls of cost 20 by the tokens (1)."""
    with QuotaServer(100, 3, tokens=25) as server:
        adapter = RetryAfterAdapter(
            RetryAfterRetry(total=0, max_wait=0, raise_on_status=False),
            cooldown=MemoryCooldownStore(), quota=(Quota(3, per=3), TOKENS), cost=max_tokens,
        )
        http = session(adapter)
        cheap = [http.post(server.url + "/a", json={"max_tokens": 5}).status_code for _ in range(4)]
        assert cheap == [200, 200, 200, 429]
        assert server.stats().requests == 3


def test_the_failure_layer_weighs_locally_and_settles_a_late_token_permit_later() -> None:
    """While the store is down, an attempt's tokens are weighed by the local copy (fail
    open), whose admission numbers never reach the store; a late token permit's move
    that the store cannot take is kept for the writer thread, as a quota permit's is."""
    from datetime import datetime, timedelta, timezone

    from retry_after_adapter import CooldownStoreError
    from retry_after_adapter.cooldown import Ask, Weigh, Weighed
    from retry_after_adapter.cooldown.guard import StoreGuard

    class Switch(MemoryCooldownStore):
        down = False

        def admit(self, ask: Ask) -> Any:
            if self.down:
                raise CooldownStoreError("down")
            return super().admit(ask)

        def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
            if self.down:
                raise CooldownStoreError("down")
            super().settle_weighed(scope, weighed, now)

    inner = Switch()
    guard = StoreGuard(inner)
    now = datetime.now(timezone.utc)
    granted = guard.admit(Ask(scope="s", now=now, weigh=Weigh(25, 25, 1.0)))
    assert granted.not_before is None and granted.weighed is not None
    inner.down = True
    guard.settle_weighed("s", Weighed(25, 25, 1.0, granted.weighed), now + timedelta(seconds=5))
    assert [chore[0] for chore in guard.writeback._chores] == ["settle_weighed"]
    guard.local.allow("t", 5, now + timedelta(seconds=30), now)  # the local copy numbers admissions
    local = guard._local_admit(Ask(scope="t", now=now, weigh=Weigh(10, 25, 1.0)), None)
    assert local.not_before is None and local.weighed is not None and local.seq is None
    assert local.token_seq is None
    assert guard._local_admit(Ask(scope="t", now=now, weigh=Weigh(20, 25, 1.0)), None).not_before is not None


# -- costs no store can hold, and costs no announced allowance admits ---------------------
#: Costs no store can hold (a SQLite integer ends at 2**63 - 1, a Redis script's number is
#: exact to 2**53) or that are no cost at all: each is refused before any store sees it.
UNHOLDABLE = [2**63, 2**63 - 1, 2**53, 2**31, -1, 1.5, 2.0, True, "10"]


@pytest.mark.parametrize("value", UNHOLDABLE, ids=repr)
def test_a_cost_no_store_can_hold_is_refused_naming_it_and_where_it_came_from(value: Any) -> None:
    """The same check for the three places a cost comes from: a fixed ``cost=``,
    ``budget(cost=...)`` and a ``cost=`` function (named by its qualified name)."""
    shown = repr(value) if isinstance(value, (int, float)) else "a str"
    with pytest.raises(ConfigurationError, match=re.escape(f"a cost of {shown} (cost= (a fixed cost))")):
        RetryAfterAdapter(cost=value)
    with pytest.raises(ConfigurationError, match=re.escape(f"a cost of {shown} (budget(cost=...))")):
        with budget(cost=value):
            pass

    def priced(request: Any) -> Any:
        return value

    adapter = RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=MemoryCooldownStore(), cost=priced)
    with pytest.raises(ConfigurationError, match=re.escape(f"a cost of {shown} (the cost= function {priced.__qualname__})")):
        session(adapter).post("http://127.0.0.1:9/", json={})  # refused before a connection is tried
    assert RetryAfterAdapter(cost=2**31 - 1).cost == 2**31 - 1  # the largest cost there is


ANNOUNCING = ["openai", "anthropic"]


def _announced(kind: str, store: Any, **options: Any) -> tuple[QuotaServer, requests.Session]:
    """A loopback stand-in of the provider ``kind`` announcing 1000 tokens a minute (its
    token headers) in a fixed window (so what is spent stays spent until the reset) that
    starts at its first request (aligned to the clock's minute, a run in a minute's last
    2 s had the reset fit ``max_wait`` and a refusal the test expects waited and went),
    and a Session on ``store`` whose first call (cost 10) has the store record that
    allowance."""
    server = QuotaServer(100, 60, quota_headers=kind, tokens=1000, refill="window", align="first").start()
    retry = RetryAfterRetry(total=3, deadline=5, max_wait=2, raise_on_status=False)
    http = session(RetryAfterAdapter(retry, cooldown=store, **options))
    with budget(cost=10):
        assert http.post(server.url + "/v1/messages", json={"max_tokens": 10}).status_code == 200
    return server, http


@pytest.mark.parametrize("kind", ANNOUNCING)
def test_a_cost_of_2_to_the_63_is_a_configuration_error_at_once_on_every_store(kind: str, every_store: Any) -> None:
    """``cost=max_tokens`` and ``max_tokens: 2**63`` against an announced token
    allowance: a ConfigurationError naming the cost and the function, in well under a
    second, nothing sent and nothing asked of the store (before: SQLite overflowed in
    its transaction, each call spun 0.32 s and deferred ``quota`` for 0.1 s, forever;
    memory and Redis sent it and deferred the server's 429)."""
    server, http = _announced(kind, every_store, cost=max_tokens)
    try:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(ConfigurationError, match=r"a cost of 9223372036854775808 \(the cost= function max_tokens\)"):
                http.post(server.url + "/v1/messages", json={"max_tokens": 2**63})
            assert time.monotonic() - started < 1.0
        assert server.stats().requests == 1
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ANNOUNCING)
def test_a_cost_above_the_announced_token_limit_is_an_error_not_an_endless_deferral(
    kind: str, every_store: Any
) -> None:
    """Above the server's whole announced token limit (1000) no window admits a cost:
    every store answers so in the admission itself, and the call is a
    ConfigurationError naming the cost, where it came from and the limit, nothing sent,
    however long the call may wait; past the reset too (before: it waited for the reset
    and was sent, for the server to refuse). A cost within the limit still goes."""
    server, http = _announced(kind, every_store)
    try:
        started = time.monotonic()
        with budget(cost=5000, deadline=30, max_wait=30):
            with pytest.raises(ConfigurationError, match=r"5000 tokens \(budget\(cost=\.\.\.\)\) exceeds the server's announced token limit of 1000"):
                http.post(server.url + "/v1/messages", json={"max_tokens": 5000})
        assert time.monotonic() - started < 1.0
        with budget(cost=1000):  # the limit itself: no error, it waits for the reset
            assert local_deferral(http.post(server.url + "/v1/messages", json={"max_tokens": 1000})).reason == "quota"
        with budget(cost=990):  # what is left
            assert http.post(server.url + "/v1/messages", json={"max_tokens": 990}).status_code == 200
        assert server.stats().requests == 2
    finally:
        server.stop()


def test_every_store_refuses_a_cost_above_the_announced_token_limit_for_good(every_store: Any) -> None:
    """The store's answer itself (the one rule, ``weights.oversized``, in the memory
    store, SQLite's transaction and Redis's script): ``oversized`` is the limit; a cost
    equal to it is admitted; past the reset the answer is the same."""
    from datetime import datetime, timedelta, timezone

    from retry_after_adapter.cooldown import Ask, Weigh
    from retry_after_adapter.cooldown.base import token_scope

    now = datetime.now(timezone.utc).replace(microsecond=0)
    every_store.allow(token_scope("s"), 1000, now + timedelta(seconds=60), now, None, 1000, 60.0)
    refused = every_store.admit(Ask(scope="s", now=now, weigh=Weigh(1001)))
    assert refused.oversized == 1000 and refused.not_before == now + timedelta(seconds=60)
    assert every_store.admit(Ask(scope="s", now=now, weigh=Weigh(1000))).not_before is None
    later = now + timedelta(seconds=200)
    assert every_store.admit(Ask(scope="s", now=later, weigh=Weigh(1001))).oversized == 1000
    assert every_store.admit(Ask(scope="s", now=later, weigh=Weigh(10))).oversized == 0
