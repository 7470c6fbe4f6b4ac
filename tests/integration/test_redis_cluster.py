"""The Redis store on a real 3-node Redis Cluster (started by the fixture): every key of
a scope lives in its cooldown key's slot, so admission (cooldown + quota + announced
allowance) is one script on one node, and scopes spread over the nodes all work."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from retry_after_adapter import FakeClock, Quota, RedisCooldownStore, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.cooldown import Ask, Learn
from retry_after_adapter.cooldown.base import Weigh, token_scope

from ..conftest import local_deferral
from ..servers import Reply, ThrottleServer

pytestmark = pytest.mark.redis

UTC = timezone.utc
#: Ahead of the real clock: Redis expires keys by its own clock.
NOW = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
SCOPES = [f"https://api{n}.example.com:443" for n in range(24)] + ["h:3f2a9c", "odd{tag}scope", "brace}only"]


@pytest.fixture
def store(cluster_client: Any) -> RedisCooldownStore:
    return RedisCooldownStore(cluster_client, prefix="ra:")


def test_every_key_of_a_scope_is_in_the_slot_of_its_cooldown_key(
    store: RedisCooldownStore, cluster_client: Any
) -> None:
    for scope in SCOPES[:-1]:
        slot = cluster_client.keyslot(store.key(scope))
        for name in ("quota", "allowance", "lease", "fresh", "rate", "rate-log"):
            assert cluster_client.keyslot(store.companion(scope, name)) == slot, (scope, name)


def test_the_cluster_clients_timeouts_bound_each_store_operation(cluster_client: Any) -> None:
    """A cluster client keeps no pool of its own: its nodes' connections get its socket
    timeouts (2 s to connect, 2 s for a reply here), and each store operation is bounded
    by their sum, as with a plain client (not by the 0.25 s kept for a store that does
    not say: on a loaded machine every operation past it failed, and a quota was then
    counted in each process alone)."""
    store = RedisCooldownStore(cluster_client, prefix="ra:")
    assert store.timeout == 4.0
    from retry_after_adapter.cooldown.guard import guard_of

    assert guard_of(store).breaker.timeout == 4.0


def test_scopes_spread_over_the_nodes(store: RedisCooldownStore, cluster_client: Any) -> None:
    nodes = {cluster_client.get_node_from_key(store.key(scope)).port for scope in SCOPES}
    assert len(nodes) == 3  # the tests below touch every node


def test_cooldowns_permits_allowances_leases_and_freshness_on_the_cluster(store: RedisCooldownStore) -> None:
    for scope in SCOPES:
        assert store.extend(scope, NOW + timedelta(seconds=5)) == NOW + timedelta(seconds=5)
        assert store.admit(Ask(scope=scope, now=NOW)).not_before == NOW + timedelta(seconds=5)  # cooling: nothing taken
        later = NOW + timedelta(seconds=6)
        assert [store.admit(Ask(scope=scope, now=later, limit=2, per=10.0)).not_before for _ in range(3)] == [
            None,
            None,
            later + timedelta(seconds=10),
        ]
        store.allow(scope, 1, later + timedelta(seconds=30), later)
        assert store.admit(Ask(scope=scope, now=later)).not_before is None
        assert store.admit(Ask(scope=scope, now=later)).not_before == later + timedelta(seconds=30)
        # A slot is admitted like anything else: past the cooldown and the allowance.
        free = later + timedelta(seconds=31)
        assert store.lease(scope, 1, 30.0, free, "a") is None
        assert store.lease(scope, 1, 30.0, free, "b") == free + timedelta(seconds=30)
        store.release(scope, "a")
        assert store.lease(scope, 1, 30.0, free, "b") is None
        store.note(scope, "throttled", NOW)
        assert store.freshness(scope).last_error == "throttled"
    assert set(store.entries()) == set(SCOPES)  # SCAN over every node
    assert {s for s, f in store.freshness_entries().items() if f.last_error} >= set(SCOPES[:-1])


def test_the_adapter_shares_a_cooldown_and_a_quota_through_the_cluster(
    server: ThrottleServer, cluster_client: Any
) -> None:
    clock = FakeClock(start=NOW)
    store = RedisCooldownStore(cluster_client, prefix="ra:", timeout=2.0)

    def session(**kw: Any) -> requests.Session:
        s = requests.Session()
        policy = RetryAfterRetry(clock=clock, total=0, max_wait=0.0, raise_on_status=False)
        s.mount("http://", RetryAfterAdapter(policy, cooldown=store, **kw))
        return s

    server.serve([Reply(429, {"Retry-After": "30"}), Reply(200)])
    session().get(server.url)
    held = local_deferral(session().get(server.url))  # another worker: nothing sent
    assert held.reason == "cooldown" and held.eligible_at == NOW + timedelta(seconds=30)
    clock.advance(30)
    quota = Quota(2, per=60)
    assert [session(quota=quota).get(server.url).status_code for _ in range(2)] == [200, 200]
    assert local_deferral(session(quota=quota).get(server.url)).reason == "quota"
    assert server.count() == 3


def test_the_near_copy_follows_the_cluster_change_channel(store: RedisCooldownStore, cluster_client: Any) -> None:
    """Pub/sub across the cluster's nodes: a cooldown extended on whichever node holds
    the scope's key reaches this process's near copy, which then reads the scope again
    and holds it back by the time stored."""
    import time
    from datetime import datetime, timedelta, timezone

    from retry_after_adapter.cooldown.guard import guard_of

    guard = guard_of(store)
    near = guard.near
    assert near is not None
    now = datetime.now(timezone.utc)
    scopes = [f"https://api{i}.example.com:443" for i in range(6)]  # over several nodes
    deadline = time.monotonic() + 1.0
    while not near.cooldowns.fresh() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert near.cooldowns.fresh()
    for scope in scopes:
        assert guard.admit(Ask(scope=scope, now=now)).not_before is None  # read once: known
        assert near.cooldowns.knows(scope)
    other = RedisCooldownStore(cluster_client, prefix=store.prefix)  # another worker's writes
    until = now + timedelta(seconds=30)
    for scope in scopes:
        other.extend(scope, until)
    def pushed() -> int:
        return sum(1 for scope in scopes if not near.cooldowns.knows(scope))

    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and pushed() < len(scopes):
        time.sleep(0.005)
    assert pushed() == len(scopes)  # every node's publish arrived: each scope is read again
    for scope in scopes:
        answer = guard.admit(Ask(scope=scope, now=now))
        assert answer.not_before is not None  # held back, by the time stored (whole ms, up)
        assert timedelta(0) <= answer.not_before - until < timedelta(milliseconds=1)


def test_the_learned_rate_on_the_cluster(store: RedisCooldownStore) -> None:
    """A scope's learned rate, its permit log and its cold slots live in the slot of its
    cooldown key: learned and obeyed through the cluster for scopes on every node."""
    now = datetime(2027, 1, 15, 12, 0, tzinfo=timezone.utc)
    for scope in SCOPES[:-1]:
        assert store.admit(Ask(scope=scope, now=now, learn=Learn(ttl=60.0, token=scope + "-1"))).token == scope + "-1"
        assert store.admit(Ask(scope=scope, now=now, learn=Learn(ttl=60.0, token=scope + "-2"))).slot_busy
        store.rate_answer(scope, 0, None, now)
        store.rate_answer(scope, 0, now + timedelta(seconds=2), now)
        rate = store.rate_of(scope)
        assert rate is not None and (rate.limit, rate.cap, rate.quiet) == (1, 1, 1)
        later = now + timedelta(seconds=2)
        assert store.admit(Ask(scope=scope, now=later, learn=Learn(ttl=60.0, token=scope + "-3"))).not_before is None
        assert store.admit(Ask(scope=scope, now=later, learn=Learn(ttl=60.0, token=scope + "-4"))).not_before is not None


def test_token_weighed_admission_on_the_cluster(store: RedisCooldownStore, cluster_client: Any) -> None:
    """A token quota and an announced token allowance live in the slot of the scope's
    cooldown key, so an attempt's tokens are weighed in the same one script, on every
    node."""
    for scope in SCOPES[:-1]:
        slot = cluster_client.keyslot(store.key(scope))
        assert cluster_client.keyslot(store.token_key(scope, 25, 3.0)) == slot
        assert cluster_client.keyslot(store.companion(scope, "allowance:tokens")) == slot
        first = store.admit(Ask(scope=scope, now=NOW, weigh=Weigh(10, 25, 3.0)))
        assert first.not_before is None and first.weighed is not None
        assert store.admit(Ask(scope=scope, now=NOW, weigh=Weigh(10, 25, 3.0))).not_before is None
        assert store.admit(Ask(scope=scope, now=NOW, weigh=Weigh(10, 25, 3.0))).not_before == first.weighed
        store.allow(token_scope(scope), 25, NOW + timedelta(seconds=30), NOW, None, 25)
        assert store.admit(Ask(scope=scope, now=NOW, weigh=Weigh(20))).not_before is None
        assert store.admit(Ask(scope=scope, now=NOW, weigh=Weigh(10))).not_before == NOW + timedelta(seconds=30)


def test_renew_moves_leases_of_scopes_on_every_node_in_one_call(store: RedisCooldownStore) -> None:
    """``renew`` with leases of scopes hashed to different nodes (one pipeline: a
    script run per scope on its node): each held lease moves later, a given-back one
    is answered as not held."""
    free = NOW + timedelta(seconds=100)
    for scope in SCOPES:
        assert store.lease(scope, 1, 1.0, free, f"{scope}-held") is None
    store.release(SCOPES[0], f"{SCOPES[0]}-held")
    leases = [(scope, f"{scope}-held", free + timedelta(seconds=20)) for scope in SCOPES]
    assert store.renew(leases, free + timedelta(seconds=0.5)) == {f"{SCOPES[0]}-held"}
    later = free + timedelta(seconds=5)  # past the 1 s leases: only the renewed ones hold
    assert store.lease(SCOPES[0], 1, 1.0, later, "other") is None
    for scope in SCOPES[1:]:
        assert store.lease(scope, 1, 1.0, later, "other") == free + timedelta(seconds=20)
