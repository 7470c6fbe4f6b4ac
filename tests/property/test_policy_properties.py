"""Properties of the decision core (policy.decide / policy.admit) and of the stores' extend.

Every example is pure arithmetic (or one local SQLite write), so the examples are many
but the whole module runs in a few seconds. All times are seconds.

Limits are compared with the policy's documented tolerance ``EPSILON`` (1 ns): a wait
that exceeds a limit by no more than float rounding counts as fitting exactly.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retry_after_adapter.cooldown.memory import MemoryCooldownStore
from retry_after_adapter.policy import DEFER, EPSILON, RETRY, admit, decide

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

seconds = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
small = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
# Limits: None (no limit), or a value; integers too, so that exact equality is common.
limits = st.none() | seconds | st.integers(min_value=0, max_value=10_000).map(float)
delays = st.none() | seconds | st.integers(min_value=0, max_value=10_000).map(float)
whole = st.integers(min_value=0, max_value=100).map(float)


def planned(server_delay, backoff, cooldown_left, jitter):
    """The wait the contract defines: max(server, backoff, cooldown) + jitter."""
    return max(server_delay or 0.0, backoff, cooldown_left) + jitter


@FAST
@given(
    server_delay=delays,
    backoff=small | whole,
    cooldown_left=delays.map(lambda v: v or 0.0),
    jitter=small,
    elapsed=small | whole,
    deadline=limits,
    max_wait=limits,
    attempt_reserve=small | whole,
)
def test_decide_never_shortens_and_defers_exactly_when_the_wait_does_not_fit(
    server_delay, backoff, cooldown_left, jitter, elapsed, deadline, max_wait, attempt_reserve
):
    d = decide(
        server_delay=server_delay,
        backoff=backoff,
        cooldown_left=cooldown_left,
        jitter=jitter,
        elapsed=elapsed,
        deadline=deadline,
        max_wait=max_wait,
        attempt_reserve=attempt_reserve,
    )
    wait = planned(server_delay, backoff, cooldown_left, jitter)
    # The wait (planned, or until the eligible time of a deferral) is never shorter
    # than the server's delay, the local backoff or the cooldown left.
    assert d.wait == wait
    assert d.wait >= (server_delay or 0.0)
    assert d.wait >= backoff
    assert d.wait >= cooldown_left
    too_long = max_wait is not None and wait > max_wait + EPSILON
    past_deadline = deadline is not None and elapsed + wait + attempt_reserve > deadline + EPSILON
    if too_long:
        assert (d.action, d.reason) == (DEFER, "max_wait")
    elif past_deadline:
        assert (d.action, d.reason) == (DEFER, "deadline")
    else:
        assert (d.action, d.reason) == (RETRY, None)
    if d.action == RETRY:
        # No retry is planned whose wait ends past the deadline (reserve included).
        assert deadline is None or elapsed + d.wait + attempt_reserve <= deadline + EPSILON
        assert max_wait is None or d.wait <= max_wait + EPSILON


@FAST
@given(
    server_delay=delays,
    backoff=small,
    cooldown_left=small,
    jitter=small | whole,
    elapsed=small,
    deadline=limits,
    max_wait=limits,
)
def test_jitter_only_adds(server_delay, backoff, cooldown_left, jitter, elapsed, deadline, max_wait):
    common = dict(
        server_delay=server_delay,
        backoff=backoff,
        cooldown_left=cooldown_left,
        elapsed=elapsed,
        deadline=deadline,
        max_wait=max_wait,
    )
    without = decide(jitter=0.0, **common)
    with_jitter = decide(jitter=jitter, **common)
    assert with_jitter.wait == without.wait + jitter
    assert with_jitter.wait >= without.wait
    # Adding time can turn a retry into a deferral, never a deferral into a retry.
    if without.action == DEFER:
        assert with_jitter.action == DEFER


@FAST
@given(
    cooldown_left=delays.map(lambda v: v or 0.0),
    elapsed=small | whole,
    deadline=limits,
    max_wait=limits,
    attempt_reserve=small | whole,
)
def test_admit_waits_the_whole_cooldown_or_defers_exactly_when_it_does_not_fit(
    cooldown_left, elapsed, deadline, max_wait, attempt_reserve
):
    d = admit(
        cooldown_left=cooldown_left,
        elapsed=elapsed,
        deadline=deadline,
        max_wait=max_wait,
        attempt_reserve=attempt_reserve,
    )
    if deadline is not None and elapsed > deadline + EPSILON:
        # No attempt starts after the deadline.
        assert (d.action, d.reason) == (DEFER, "deadline")
        assert d.wait == cooldown_left
        return
    if cooldown_left <= 0:
        assert (d.action, d.wait) == (RETRY, 0.0)
        return
    assert d.wait == cooldown_left  # never less than the cooldown left
    does_not_fit = (max_wait is not None and cooldown_left > max_wait + EPSILON) or (
        deadline is not None and elapsed + cooldown_left + attempt_reserve > deadline + EPSILON
    )
    if does_not_fit:
        assert (d.action, d.reason) == (DEFER, "cooldown")
    else:
        assert d.action == RETRY
        assert deadline is None or elapsed + d.wait + attempt_reserve <= deadline + EPSILON


# -- stores: extend is monotone (later wins) -------------------------------------------

# Cooldowns that are still ahead: a store may forget one that ended (SQLite sweeps rows
# an hour after their time, Redis expires keys a minute after), which is the same as no
# cooldown, so "later wins" is only promised for times not yet reached.
BASE = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=30)
zones = st.sampled_from(
    [timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
)
instants = st.builds(
    lambda micros, zone: (BASE + timedelta(microseconds=micros)).astimezone(zone),
    st.integers(min_value=-(10**12), max_value=10**13),  # about -11.6 to +116 days
    zones,
)


def check_monotone(store, scope, untils, resolution):
    """Extend ``scope`` with each of ``untils``: every result is the running maximum
    (rounded up to ``resolution`` at most), and ``get`` ends at the overall maximum."""
    best = None
    previous = None
    for until in untils:
        got = store.extend(scope, until)
        best = until if best is None or until > best else best
        assert got.utcoffset() == timedelta(0)
        assert best <= got <= best + resolution
        assert previous is None or got >= previous
        previous = got
    stored = store.get(scope)
    assert stored == previous
    assert best <= stored <= best + resolution


@FAST
@given(untils=st.lists(instants, min_size=1, max_size=12))
def test_memory_store_extend_keeps_the_maximum(untils):
    check_monotone(MemoryCooldownStore(), "https://api.example:443", untils, timedelta(0))


@pytest.fixture(scope="module")
def sqlite_store() -> Iterator[object]:
    try:
        from retry_after_adapter.cooldown.sqlite import SQLiteCooldownStore
    except ImportError as exc:  # the store is optional while it is being written
        pytest.skip(f"SQLiteCooldownStore is not importable yet ({exc}); memory store tested")
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteCooldownStore(f"{folder}/cooldown.sqlite3")
        yield store
        store.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(untils=st.lists(instants, min_size=1, max_size=8))
def test_sqlite_store_extend_keeps_the_maximum(sqlite_store, untils):
    # SQLite keeps whole milliseconds and rounds up: never earlier, at most 1 ms later.
    check_monotone(sqlite_store, f"scope-{uuid.uuid4().hex}", untils, timedelta(milliseconds=1))


@pytest.fixture
def redis_store(redis_url) -> Iterator[object]:
    from retry_after_adapter.cooldown.redis import RedisCooldownStore

    store = RedisCooldownStore.from_url(redis_url)
    yield store
    store.close()


@pytest.mark.redis
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(untils=st.lists(instants, min_size=1, max_size=8))
def test_redis_store_extend_keeps_the_maximum(redis_store, untils):
    # Redis keeps whole milliseconds too, rounded up.
    check_monotone(redis_store, f"scope-{uuid.uuid4().hex}", untils, timedelta(milliseconds=1))
