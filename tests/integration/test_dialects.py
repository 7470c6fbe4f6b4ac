"""Recorded exchanges replayed by a real loopback server, through a real
``requests.Session`` with ``RetryAfterAdapter`` mounted, on a FakeClock: what the
adapter does with each provider's dialect (the cooldown or allowance learned, nothing
sent early, the deferral's reason and eligible time)."""

from __future__ import annotations

import time
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
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(2.26)  # "2.25" at its latest
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


# -- OpenAI, Azure OpenAI, Anthropic ----------------------------------------------------------
def llm_session(clock: FakeClock, store: Any, **kw: Any) -> requests.Session:
    """A session that retries a POST (the providers' 429 says it was not processed)."""
    return session(clock, store, allowed_methods=None, **kw)


def sent_at(server: ThrottleServer) -> list[Any]:
    return [seen.at for seen in server.seen]


def test_openai_429_waits_retry_after_ms_exactly_and_holds_back_the_next_worker(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """retry-after: 2 and retry-after-ms: 1200 agree: 1.2 s, not 2 (the requests quota's
    reset of 1 s is shorter, so the milliseconds govern)."""
    store = MemoryCooldownStore()
    case = exchange("openai-429-requests")
    server.serve([reply(case), Reply(200)])
    first = send(llm_session(clock, store), server, case)  # max_wait 1: cannot wait 1.2 s
    assert first.deferral.reason == "max_wait" and first.deferral.eligible_at == at(1.2)
    assert first.deferral.retry_after == "2"
    deferral = local_deferral(send(llm_session(clock, store), server, case))  # the next worker
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(1.2)
    response = send(llm_session(clock, store, max_wait=5), server, case)  # waits, then sends
    assert response.status_code == 200
    assert 1.2 <= sum(clock.sleeps) <= 1.3
    assert sent_at(server) == [RECEIVED_AT, at(1.2)]  # nothing before the eligible time


def test_openai_429_retried_by_the_same_call_waits_1_2_s(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([reply(exchange("openai-429-requests")), Reply(200)])
    response = send(llm_session(clock, MemoryCooldownStore(), max_wait=5), server, exchange("openai-429-requests"))
    assert response.status_code == 200 and clock.sleeps == [pytest.approx(1.2)]
    assert sent_at(server) == [RECEIVED_AT, at(1.2)]


@pytest.mark.parametrize(
    ("fields", "waited"),
    [
        ({"retry-after": "1", "retry-after-ms": "2500"}, 2.5),  # disagree: the longest
        ({"retry-after": "3", "retry-after-ms": "1200"}, 3.0),
        ({"retry-after": "2", "retry-after-ms": "1200", "x-ms-retry-after-ms": "1700"}, 1.7),
        ({"retry-after": "2", "retry-after-ms": "900", "x-ms-retry-after-ms": "3000"}, 3.0),
        ({"retry-after-ms": "1200"}, 1.2),  # alone: the wait
        ({"retry-after": "2", "retry-after-ms": "abc"}, 2.0),  # unreadable beside Retry-After: ignored
        ({"retry-after": "2", "retry-after-ms": "-1200"}, 2.0),
    ],
)
def test_millisecond_fields_never_shorten_a_wait(
    server: ThrottleServer, clock: FakeClock, fields: dict[str, str], waited: float
) -> None:
    server.serve([Reply(429, fields), Reply(200)])
    response = send(llm_session(clock, MemoryCooldownStore(), max_wait=5), server, exchange("openai-429-requests"))
    assert response.status_code == 200
    assert sum(clock.sleeps) == pytest.approx(waited)
    assert sent_at(server) == [RECEIVED_AT, at(waited)]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"retry-after-ms": "-5"}, "invalid_retry_after"),  # alone, as a bad Retry-After
        ({"x-ms-retry-after-ms": "1e3"}, "invalid_retry_after"),
        ({"retry-after-ms": "999999999999999999"}, "retry_after_too_long"),  # 31 years: never obeyed
        ({"retry-after": "2", "retry-after-ms": "172800000"}, "retry_after_too_long"),  # the longest: 2 days
    ],
)
def test_hostile_millisecond_fields_are_rejected_like_a_retry_after(
    server: ThrottleServer, clock: FakeClock, fields: dict[str, str], reason: str
) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(429, fields)])
    response = send(llm_session(clock, store, max_wait=5), server, exchange("openai-429-requests"))
    assert response.status_code == 429 and response.stop_reason == reason
    assert clock.sleeps == [] and server.count() == 1 and store.entries() == {}


def test_azure_x_ms_retry_after_ms_alone_is_the_wait(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("azure-429-ms")
    server.serve([reply(case), Reply(200)])
    response = send(llm_session(clock, store, max_wait=5), server, case)
    assert response.status_code == 200 and clock.sleeps == [pytest.approx(1.5)]
    assert sent_at(server) == [RECEIVED_AT, at(1.5)]
    assert server.seen[0].path == case.path  # the query string went to the server, as sent


def test_azure_ms_wait_is_shared_with_the_next_worker(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("azure-429-ms")
    server.serve([reply(case)])
    response = send(llm_session(clock, store), server, case)  # max_wait 1 < 1.5: deferred
    assert response.deferral.reason == "max_wait" and response.deferral.eligible_at == at(1.5)
    deferral = local_deferral(send(llm_session(clock, store), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(1.5)
    assert server.count() == 1


def test_openai_requests_spent_on_a_200_hold_every_worker_until_the_buckets_next_request(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """Nothing left of 200, ``6m0s`` to the full refill (361 s at its latest): a request
    comes back every 1.805 s, so every worker waits for that one (and the margin), not
    six minutes; the one after is paced a step later."""
    store = MemoryCooldownStore()
    case = exchange("openai-200-exhausted")  # x-ratelimit-reset-requests: 6m0s
    server.serve([reply(case), Reply(200)])
    assert send(session(clock, store), server, case).status_code == 200
    for _ in range(2):
        deferral = local_deferral(send(session(clock, store, max_wait=0.5), server, case))
        assert deferral.reason == "cooldown" and deferral.eligible_at == at(1.855), deferral
    clock.advance(1.5)  # 0.355 s left: within max_wait, waited out, then sent
    assert send(session(clock, store), server, case).status_code == 200
    assert sent_at(server) == [RECEIVED_AT, at(1.855)] and clock.sleeps == [pytest.approx(0.355)]
    deferral = local_deferral(send(session(clock, store, max_wait=0.5), server, case))
    assert deferral.reason == "quota" and deferral.eligible_at == at(1.855 + 1.805), deferral


def test_openai_tokens_spent_hold_back_and_positive_tokens_do_not(server: ThrottleServer, clock: FakeClock) -> None:
    """No token left, 91 s to their full refill, 500 requests a minute: a request's
    share of the tokens is back in 91 / 500 s (and the margin)."""
    store = MemoryCooldownStore()
    server.serve([*[reply(exchange("openai-200-left"))] * 3, reply(exchange("openai-200-tokens-spent"))])
    s = session(clock, store)
    for _ in range(3):  # 499 requests and 29500 tokens left: nothing held back
        assert send(s, server, exchange("openai-200-left")).status_code == 200
    assert send(s, server, exchange("openai-200-tokens-spent")).status_code == 200
    held = session(clock, store, max_wait=0.1)
    deferral = local_deferral(send(held, server, exchange("openai-200-tokens-spent")))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(91 / 500 + 0.05), deferral
    assert server.count() == 4


def test_anthropic_requests_spent_hold_back_until_the_buckets_next_request(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """Nothing left of 50, the full refill at a whole second 30 s after the ``Date`` (up
    to 31 s): the next request in 31 / 50 s (and the margin), not 30 s."""
    store = MemoryCooldownStore()
    case = exchange("anthropic-200-exhausted")
    server.serve([reply(case), Reply(200)])
    assert send(session(clock, store), server, case).status_code == 200
    deferral = local_deferral(send(session(clock, store, max_wait=0.5), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(0.67), deferral
    response = send(session(clock, store), server, case)  # waits out the 0.67 s
    assert response.status_code == 200 and sent_at(server) == [RECEIVED_AT, at(0.67)]


def test_anthropic_output_tokens_spent_hold_back(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("anthropic-200-output-tokens-spent")
    server.serve([reply(case)])
    send(session(clock, store), server, case)
    held = session(clock, store, max_wait=0.1)
    assert local_deferral(send(held, server, case)).eligible_at == at(13 / 50 + 0.05)  # a request's share
    assert server.count() == 1


def test_anthropic_429_post_is_returned_and_its_wait_shared(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("anthropic-429")
    server.serve([reply(case), Reply(200)])
    first = send(session(clock, store), server, case)  # a POST: not replayed by default
    assert first.status_code == 429 and clock.sleeps == []
    deferral = local_deferral(send(session(clock, store), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(5)
    response = send(llm_session(clock, store, max_wait=10), server, case)  # waits the 5 s, then sends
    assert response.status_code == 200 and sent_at(server) == [RECEIVED_AT, at(5)]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "25h"},  # past max_retry_after
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "-6m0s"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6 minutes"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:30"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z"},
    ],
)
def test_hostile_resets_are_no_cooldown(server: ThrottleServer, clock: FakeClock, headers: dict[str, str]) -> None:
    store = MemoryCooldownStore()
    server.serve([Reply(200, headers)])
    for _ in range(2):
        assert send(session(clock, store), server, exchange("openai-200-left")).status_code == 200
    assert server.count() == 2 and clock.sleeps == []


# -- x-should-retry ---------------------------------------------------------------------------
def test_should_retry_false_returns_the_answer_as_final(server: ThrottleServer, clock: FakeClock) -> None:
    """A 500 is retried when the policy lists it; the server's ``false`` stops that."""
    case = exchange("openai-500-should-not-retry")
    server.serve([reply(case), Reply(200)])
    forcelist = {429, 500, 502, 503, 504}
    response = send(llm_session(clock, MemoryCooldownStore(), max_wait=5, status_forcelist=forcelist), server, case)
    assert response.status_code == 500 and response.stop_reason == "server_said_no"
    assert getattr(response, "deferral", None) is None
    assert response.json()["error"]["type"] == "server_error"  # the body intact
    assert clock.sleeps == [] and server.count() == 1


def test_should_retry_false_on_a_status_not_retried_anyway(server: ThrottleServer, clock: FakeClock) -> None:
    case = exchange("openai-500-should-not-retry")
    server.serve([reply(case), Reply(200)])
    response = send(llm_session(clock, MemoryCooldownStore()), server, case)  # 500 is not in the forcelist
    assert response.status_code == 500 and response.stop_reason is None and server.count() == 1


def test_should_retry_false_keeps_the_cooldown_for_every_worker(server: ThrottleServer, clock: FakeClock) -> None:
    store = MemoryCooldownStore()
    case = exchange("openai-429-requests")
    server.serve([Reply(429, {"retry-after": "30", "x-should-retry": "false"})])
    response = send(llm_session(clock, store, max_wait=60), server, case)
    assert response.status_code == 429 and response.stop_reason == "server_said_no"
    assert getattr(response, "deferral", None) is None and clock.sleeps == []
    deferral = local_deferral(send(llm_session(clock, store), server, case))
    assert deferral.reason == "cooldown" and deferral.eligible_at == at(30)
    assert server.count() == 1


def test_should_retry_true_changes_nothing(server: ThrottleServer, clock: FakeClock) -> None:
    server.serve([Reply(503, {"x-should-retry": "true"}), Reply(503, {"x-should-retry": "true"}), Reply(200)])
    case = exchange("openai-500-should-not-retry")
    response = send(session(clock, MemoryCooldownStore()), server, case)  # a POST: our policy does not replay it
    assert response.status_code == 503 and server.count() == 1
    response = session(clock, MemoryCooldownStore()).get(server.url + "/v1/models", timeout=5)
    assert response.status_code == 200 and server.count() == 3  # a GET 503 is retried as always


def test_an_exact_reset_later_than_one_learned_is_kept_not_the_earlier(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """OpenAI's resets are exact and move later with each request: two answers of one
    window, A (spent, reset in 3 s) then B 0.5 s later (spent, reset in 3.4 s), leave
    the shared cooldown at B's reset. (Whole-second resets rounded up keep the earliest
    of one window; these must not: the next request would go 0.9 s before B's.)"""
    import threading

    gates = {"/a": threading.Event(), "/b": threading.Event()}
    resets = {"/a": "3s", "/b": "3.4s"}

    def answer(seen: Seen) -> Reply:
        headers = {
            "x-ratelimit-limit-tokens": "10000",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": resets[seen.path],
        }
        return Reply(200, headers, gate=gates[seen.path])

    server.responder = answer
    store = MemoryCooldownStore()
    session = requests.Session()
    session.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(clock=clock, total=0), cooldown=store, learn_rate=False),
    )
    workers = [threading.Thread(target=session.get, args=(server.url + path,)) for path in ("/a", "/b")]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 5
        while server.count() < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert server.count() == 2, "both requests must be in flight"
        start = clock.now()
        gates["/a"].set()
        workers[0].join(5)
        clock.advance(0.5)
        gates["/b"].set()
        workers[1].join(5)
    finally:
        for gate in gates.values():
            gate.set()
    (until,) = store.entries().values()
    assert until >= start + timedelta(seconds=3.9), until - start


def test_an_unreadable_retry_after_beside_a_valid_retry_after_ms_waits_the_milliseconds(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """The millisecond field is what the server said: waited exactly (and shared), not
    thrown away with the unreadable Retry-After beside it."""
    server.serve([Reply(429, {"Retry-After": "soon", "retry-after-ms": "3000"}), Reply(200)])
    session = requests.Session()
    store = MemoryCooldownStore()
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(clock=clock, total=2, jitter=0), cooldown=store))
    response = session.get(server.url + "/v1/chat")
    assert response.status_code == 200 and server.count() == 2
    assert clock.sleeps == [3.0]
    first, second = server.seen
    assert (second.at - first.at).total_seconds() >= 3.0
