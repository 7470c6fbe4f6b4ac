"""Recorded exchanges replayed by a real loopback server, through a real
``requests.Session`` with ``RetryAfterAdapter`` mounted, on a FakeClock: what the
adapter does with each provider's dialect (the cooldown or allowance learned, nothing
sent early, the deferral's reason and eligible time)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import requests

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry, budget

from ..conftest import local_deferral
from ..servers import Reply, Seen, ThrottleServer
from ..unit.dialect_corpus import EXCHANGES, RECEIVED_AT, Exchange, exchange

#: Every call runs on a FakeClock at the corpus's RECEIVED_AT (its Date headers say so).
pytestmark = pytest.mark.clock_start(RECEIVED_AT)


def session(clock: FakeClock, store: Any, **kw: Any) -> requests.Session:
    kw.setdefault("total", 2)
    kw.setdefault("max_wait", 1)
    s = requests.Session()
    s.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, **kw), cooldown=store))
    return s


def reply(case: Exchange) -> Reply:
    return Reply(case.status, dict(case.headers), case.body or b"{}")


def send(s: requests.Session, server: ThrottleServer, case: Exchange, path: str | None = None) -> Any:
    return s.request(case.method, server.url + (path or case.path), headers=case.request, timeout=5)


def at(seconds: float) -> Any:
    return RECEIVED_AT + timedelta(seconds=seconds)


# -- every recorded exchange: an exhausted quota holds the next worker back ------------------
QUOTA_CASES = [pytest.param(e, id=e.name) for e in EXCHANGES if e.status == 200 and e.expected is not None]


@pytest.mark.parametrize("case", QUOTA_CASES)
def test_a_recorded_200_holds_back_the_next_worker_exactly_when_nothing_is_left(
    server: ThrottleServer, clock: FakeClock, case: Exchange
) -> None:
    store = MemoryCooldownStore()
    server.serve([reply(case)])
    first = session(clock, store)
    assert send(first, server, case).status_code == 200
    assert case.expected is not None
    remaining, reset = case.expected[0], case.expected[1]
    # A route's bucket is known to the adapter that saw it (another adapter learns it
    # from its own first answer): the next call goes through the same adapter then.
    other = send(first if "X-RateLimit-Bucket" in case.headers else session(clock, store), server, case)
    if remaining == 0 and reset and reset > 1:  # past max_wait: deferred, nothing sent
        deferral = local_deferral(other)
        assert deferral.reason == "cooldown" and deferral.eligible_at == at(reset)
        assert server.count() == 1
    elif remaining == 0 and reset:  # within max_wait: waited out, then sent
        assert other.status_code == 200 and [s.at for s in server.seen] == [RECEIVED_AT, at(reset)]
    else:
        assert other.status_code == 200 and server.count() == 2


# -- Shopify: Retry-After: 2.0 -------------------------------------------------------------
def test_shopify_decimal_retry_after_is_waited_to_the_next_whole_second(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    server.serve([reply(exchange("shopify-429")), Reply(200)])
    response = send(session(clock, store, max_wait=5), server, exchange("shopify-429"))
    assert response.status_code == 200 and response.stop_reason is None
    assert [s.at for s in server.seen] == [RECEIVED_AT, at(2)]  # waited 2 s exactly, not less


def test_shopify_decimal_retry_after_defers_and_is_shared(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(429, {"Retry-After": "2.1"})])
    response = send(session(clock, store), server, exchange("shopify-429"))  # max_wait 1
    assert response.deferral.reason == "max_wait" and response.deferral.eligible_at == at(3)
    assert response.deferral.retry_after == "2.1"
    deferral = local_deferral(send(session(clock, store), server, exchange("shopify-429")))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(3)
    assert server.count() == 1


def test_an_exponent_still_stops(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([Reply(429, {"Retry-After": "2e0"})])
    response = send(session(clock, MemoryCooldownStore()), server, exchange("shopify-429"))
    assert response.stop_reason == "invalid_retry_after" and server.count() == 1


# -- GitHub --------------------------------------------------------------------------------------
def test_github_primary_403_cools_down_until_the_reset(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-primary-403")
    server.serve([reply(case)])
    assert send(session(clock, store), server, case).status_code == 403
    deferral = local_deferral(send(session(clock, store), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(1800)
    assert server.count() == 1


def test_github_secondary_with_retry_after_obeys_it(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-secondary-retry-after")
    server.serve([reply(case)])
    assert send(session(clock, store), server, case).status_code == 403
    deferral = local_deferral(send(session(clock, store), server, case))
    assert deferral.eligible_at == at(60) and server.count() == 1


def test_github_secondary_429_with_a_reset_waits_for_it(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-secondary-reset")
    server.serve([reply(case)])
    response = send(session(clock, store), server, case)
    assert response.deferral.reason == "max_wait" and response.deferral.eligible_at >= at(45)
    assert local_deferral(send(session(clock, store), server, case)).eligible_at == at(45)
    assert server.count() == 1


def test_github_secondary_403_without_a_wait_cools_a_minute_then_doubles(
    server: ThrottleServer, clock: FakeClock
) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-secondary-no-wait-403")
    server.serve([reply(case)])
    s = session(clock, store)
    first = send(s, server, case)
    assert first.status_code == 403 and first.json()["message"].startswith("You have exceeded")  # body intact
    deferral = local_deferral(send(session(clock, store), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(60)
    clock.advance(60)  # the minute is over; the next answer is a secondary limit again
    assert send(s, server, case).status_code == 403
    assert local_deferral(send(s, server, case)).eligible_at == at(60 + 120)
    clock.advance(120)
    send(s, server, case)
    assert local_deferral(send(s, server, case)).eligible_at == at(180 + 240)
    assert server.count() == 3  # nothing sent inside a cooldown


def test_github_secondary_429_without_a_wait_defers_a_minute(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-secondary-no-wait-429")
    server.serve([reply(case)])
    response = send(session(clock, store), server, case)
    assert response.deferral.reason == "max_wait" and response.deferral.eligible_at >= at(60)
    assert local_deferral(send(session(clock, store), server, case)).eligible_at == at(60)
    assert server.count() == 1


def test_github_permission_denied_403_is_not_a_cooldown(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("github-permission-denied-403")
    server.serve([reply(case)])
    first = send(session(clock, store), server, case)
    assert first.status_code == 403 and first.json()["message"] == "Resource not accessible by integration"
    second = send(session(clock, store), server, case)
    assert second.status_code == 403 and not getattr(second, "local", False)
    assert server.count() == 2 and store.entries() == {}


def test_github_secondary_403_streamed_is_left_unread(server: ThrottleServer, clock: FakeClock) -> None:
    """A caller that streams the body reads it itself: it is not peeked at, so such a
    403 is not told apart (documented)."""
    store = MemoryCooldownStore()
    case = exchange("github-secondary-no-wait-403")
    server.serve([reply(case)])
    s = session(clock, store)
    response = s.request(case.method, server.url + case.path, headers=case.request, stream=True, timeout=5)
    assert b"secondary rate limit" in response.content
    assert store.entries() == {}


# -- Discord -----------------------------------------------------------------------------------
AUTH = {"Authorization": "Bot t0k3n-discord"}
MESSAGES_1 = "/api/v10/channels/1001/messages"
MESSAGES_2 = "/api/v10/channels/2002/messages"
PINS_1 = "/api/v10/channels/1001/pins"


def discord_server(server: ThrottleServer, answers: dict[str, Reply]) -> None:
    """Answers by path (the default: a 200 with no headers)."""

    def respond(seen: Seen) -> Reply:
        return answers.get(seen.path, Reply(200))

    server.serve([])
    server.responder = respond


def test_discord_a_bucket_refines_its_routes_scope(server: ThrottleServer, clock: FakeClock) -> None:
    """An exhausted bucket holds back the routes that reported it, under the same major
    parameter, and nothing else of the origin."""
    store = MemoryCooldownStore()
    exhausted = exchange("discord-200-exhausted")
    discord_server(
        server,
        {MESSAGES_1: reply(exhausted), PINS_1: reply(exhausted), MESSAGES_2: reply(exhausted)},
    )
    s = session(clock, store)
    assert s.get(server.url + MESSAGES_1, headers=AUTH).status_code == 200  # learns the bucket
    deferral = local_deferral(s.get(server.url + MESSAGES_1, headers=AUTH))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(2.25)
    assert "|bucket:" in deferral.scope and "t0k3n" not in deferral.scope
    # Another route of the origin without a bucket learned: sent.
    assert s.get(server.url + "/api/v10/users/@me", headers=AUTH).status_code == 200
    # Another route that reports the same bucket under the same channel: sent once (the
    # route is not known yet), then it shares the bucket's cooldown.
    assert s.get(server.url + PINS_1, headers=AUTH).status_code == 200
    assert local_deferral(s.get(server.url + PINS_1, headers=AUTH)).scope == deferral.scope
    # The same bucket under another channel is another allowance.
    assert s.get(server.url + MESSAGES_2, headers=AUTH).status_code == 200
    other = local_deferral(s.get(server.url + MESSAGES_2, headers=AUTH))
    assert other.scope != deferral.scope
    assert [seen.path for seen in server.seen] == [MESSAGES_1, "/api/v10/users/@me", PINS_1, MESSAGES_2]


def test_discord_a_routes_429_cools_only_its_bucket(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    limited = exchange("discord-429-user")
    discord_server(server, {MESSAGES_1: reply(limited)})
    s = session(clock, store)
    response = s.post(server.url + MESSAGES_1, headers=AUTH, json={"content": "hi"})
    assert response.status_code == 429  # a POST is not replayed; the cooldown is shared
    deferral = local_deferral(s.post(server.url + MESSAGES_1, headers=AUTH))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(65)  # Retry-After 65 > 64.57
    assert s.get(server.url + "/api/v10/users/@me", headers=AUTH).status_code == 200  # not global
    assert server.count() == 2


def test_discord_a_global_429_holds_back_every_route(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    discord_server(server, {MESSAGES_1: reply(exchange("discord-200")), PINS_1: reply(exchange("discord-429-global"))})
    s = session(clock, store)
    assert s.get(server.url + MESSAGES_1, headers=AUTH).status_code == 200  # MESSAGES_1 is refined
    assert s.get(server.url + PINS_1, headers=AUTH).deferral.eligible_at >= at(65)  # the global 429
    for path in (MESSAGES_1, "/api/v10/users/@me"):  # a refined route and the rest of the origin
        deferral = local_deferral(s.get(server.url + path, headers=AUTH))
        assert deferral.reason == "cooldown" and deferral.eligible_at == at(65), path
    # Another worker on the same store, which never learned a bucket, holds back too.
    assert local_deferral(session(clock, store).get(server.url + MESSAGES_1, headers=AUTH)).eligible_at == at(65)
    assert server.count() == 2
    clock.advance(65)
    assert s.get(server.url + MESSAGES_1, headers=AUTH).status_code == 200


def test_discord_a_refined_route_waits_a_short_global_cooldown(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    globally = Reply(429, {"Retry-After": "1", "X-RateLimit-Global": "true"})
    discord_server(server, {MESSAGES_1: reply(exchange("discord-200")), PINS_1: globally})
    s = session(clock, store, max_wait=5)
    s.get(server.url + MESSAGES_1, headers=AUTH)
    with budget(max_wait=0.5):
        assert s.get(server.url + PINS_1, headers=AUTH).deferral.reason == "max_wait"
    response = s.get(server.url + MESSAGES_1, headers=AUTH)  # waits the global second, then sends
    assert response.status_code == 200 and server.seen[-1].at == at(1)


def test_no_bucket_keeps_the_origin_scope(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(200, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "5"})])
    s = session(clock, store)
    s.get(server.url + MESSAGES_1)
    deferral = local_deferral(s.get(server.url + "/anything/else"))
    assert "|bucket:" not in deferral.scope and deferral.eligible_at == at(5)


# -- Cloudflare, Envoy, IETF: what a 429 carrying them does -----------------------------------
@pytest.mark.parametrize("name", ["envoy-exhausted"])
def test_a_429_with_a_reset_in_seconds_waits_for_it(server: ThrottleServer, clock: FakeClock, name: str) -> None:
    store = MemoryCooldownStore()
    case = exchange(name)
    server.serve([reply(case), Reply(200)])
    response = send(session(clock, store, max_wait=2), server, case)
    assert response.status_code == 200
    assert [s.at for s in server.seen] == [RECEIVED_AT, at(1)]  # nothing before the reset


def test_cloudflare_field_names_in_any_case(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(200, raw_headers=[("RATELIMIT", '"default";r=0;t=30'), ("ratelimit-POLICY", '"burst";q=100;w=60')])])
    send(session(clock, store), server, exchange("cloudflare-left"))
    deferral = local_deferral(send(session(clock, store), server, exchange("cloudflare-left")))
    assert deferral.eligible_at == at(30) and server.count() == 1


def test_the_ietf_rename_and_the_drafts_are_never_mixed(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    server.serve([reply(exchange("ietf-mixed-generations-r-wins"))])
    s = session(clock, store)
    for _ in range(3):  # r=5 governs: the rename's a=0;w=3600 beside it is not read
        assert send(s, server, exchange("ietf-mixed-generations-r-wins")).status_code == 200
    assert server.count() == 3


def test_github_secondary_403_through_plain_urllib3(server: ThrottleServer, clock: FakeClock) -> None:
    """RetryAfterPoolManager tells the 403 apart too, and its body stays readable."""
    from retry_after_adapter import RetryAfterPoolManager

    store = MemoryCooldownStore()
    case = exchange("github-secondary-no-wait-403")
    server.serve([reply(case)])
    http = RetryAfterPoolManager(retries=RetryAfterRetry(clock=clock, total=2, max_wait=1), cooldown=store)
    first = http.request(case.method, server.url + case.path, headers=case.request)
    assert first.status == 403 and b"secondary rate limit" in first.data
    deferral = local_deferral(http.request(case.method, server.url + case.path, headers=case.request))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(60)
    assert server.count() == 1
