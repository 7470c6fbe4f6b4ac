"""The front ends' options are one frozen value, checked once: every front end takes
the same keywords, reads them back alike, and keeps them through a copy or a pickle."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from retry_after_adapter import (
    ConfigurationError,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
)
from retry_after_adapter.cooldown import Store
from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport
from retry_after_adapter.settings import Options, Settings

OPTIONS: dict[str, Any] = dict(
    scope="credential",
    raise_on_defer=True,
    store_failure="closed",
    quota=Quota(10, per=2),
    max_concurrency=3,
    lease_ttl=7.5,
    max_waiting=4,
    learn_rate=False,
)


def front_ends(**options: Any) -> list[Any]:
    retry = RetryAfterRetry(total=2)
    return [
        RetryAfterAdapter(retry, pool_maxsize=3, **options),
        RetryAfterPoolManager(retries=retry, maxsize=3, **options),
        RetryAfterTransport(retry, **options),
        AsyncRetryAfterTransport(retry, **options),
    ]


def test_the_options_are_the_settings_fields() -> None:
    assert set(Options.__annotations__) == {field.name for field in dataclasses.fields(Settings)}


def test_every_front_end_takes_the_same_options_and_reads_them_back_alike() -> None:
    store = MemoryCooldownStore()
    built = front_ends(cooldown=store, **OPTIONS)
    settings = [end.settings for end in built]
    assert all(s == settings[0] for s in settings)
    for end in built:
        assert end.quota == Quota(10, per=2) and end.cooldown is store
        assert end.max_waiting == 4 and end.lease_ttl == 7.5 and end.on_decision == ()
    assert built[0]._pool_maxsize == 3
    assert built[1].connection_pool_kw["maxsize"] == 3


def test_the_settings_are_frozen_and_normalised() -> None:
    adapter = RetryAfterAdapter()
    with pytest.raises(dataclasses.FrozenInstanceError):
        adapter.settings.quota = Quota(1, per=1)  # type: ignore[misc]
    assert adapter.settings.scope == "origin" and adapter.settings.on_decision == ()
    assert adapter.settings.cooldown is not None  # the process-wide default store
    with pytest.raises(AttributeError, match="no attribute 'quotas'"):
        adapter.quotas  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "cause"),
    [
        ({"lease_ttl": 0}, "lease_ttl"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"learn_rate": "yes"}, "learn_rate"),
        ({"store_failure": "maybe"}, "store_failure"),
        ({"quota": Quota(1, per=1), "cooldown": None}, "quota"),
        ({"max_concurrency": 2, "cooldown": None}, "max_concurrency"),
    ],
)
def test_every_front_end_refuses_a_bad_option_by_name(options: dict[str, Any], cause: str) -> None:
    for build in (RetryAfterAdapter, RetryAfterTransport, AsyncRetryAfterTransport):
        with pytest.raises(ConfigurationError, match=cause):
            build(**options)
    with pytest.raises(ConfigurationError, match=cause):
        RetryAfterPoolManager(**options)


def test_the_settings_survive_a_copy_and_a_pickle() -> None:
    adapter = RetryAfterAdapter(RetryAfterRetry(total=2), **OPTIONS)
    pool = RetryAfterPoolManager(retries=RetryAfterRetry(total=2), maxsize=3, **OPTIONS)
    for end in (adapter, pool):
        for other in (copy.copy(end), copy.deepcopy(end), pickle.loads(pickle.dumps(end))):
            assert other.settings == end.settings
            assert (other._plan.limit, other._plan.per, other._plan.fail_closed) == (10, 2, True)  # built again
    assert pickle.loads(pickle.dumps(pool)).connection_pool_kw["maxsize"] == 3


def test_an_option_set_after_construction_is_checked_and_takes_effect() -> None:
    seen: list[object] = []
    pool = RetryAfterPoolManager(retries=RetryAfterRetry(total=2))
    for end in (RetryAfterAdapter(), pool, RetryAfterTransport()):
        end.on_decision += (seen.append,)
        assert end.settings.on_decision == (seen.append,)
        end.quota = Quota(3, per=1)
        assert end._plan.limit == 3  # the plan is made again from the new settings
        with pytest.raises(ConfigurationError, match="lease_ttl"):
            end.lease_ttl = -1
        assert end.settings.lease_ttl == 60.0 and "lease_ttl" not in vars(end)
    assert pickle.loads(pickle.dumps(pool)).settings.quota == Quota(3, per=1)


def test_an_option_set_that_fails_changes_nothing() -> None:
    """A scope or a store capability is checked while the plan is made: a refusal there
    leaves the settings, the plan and the scope function as they were."""

    class CoreOnly(Store):  # a store with the core alone: no quota, no leases
        def get(self, scope: str) -> Any:
            return None

        def extend(self, scope: str, until: Any) -> Any:
            return until

    adapter = RetryAfterAdapter(cooldown=CoreOnly())
    before = (adapter.settings, adapter._plan, adapter._scope_fn)
    with pytest.raises(ConfigurationError):
        adapter.scope = "bogus"
    with pytest.raises(ConfigurationError, match="quota"):
        adapter.quota = Quota(3, per=1)
    assert (adapter.settings, adapter._plan, adapter._scope_fn) == before
    adapter.on_decision += (print,)  # still usable, and still copies
    assert copy.copy(adapter).settings.on_decision == (print,)


def test_setting_hooks_keeps_the_plan_and_what_it_learned() -> None:
    adapter = RetryAfterAdapter()
    plan, dialects = adapter._plan, adapter._plan.dialects
    adapter.on_decision += (print,)
    adapter.raise_on_defer = True
    assert adapter._plan is plan  # nothing the plan is made from changed
    adapter.max_waiting = 3
    assert adapter._plan is not plan and adapter._plan.max_waiting == 3
    assert adapter._plan.dialects is dialects  # Discord's routes, GitHub's streaks: kept


def test_options_set_from_many_threads_never_leave_the_plan_torn() -> None:
    """Settings, plan and scope function are published together: however sets from
    several threads interleave, the plan is always the one the settings make. (A
    ``+=`` is a read, then a set: two threads adding hooks at once may lose one, as
    with any attribute; set options before the front end is shared.)"""
    import sys
    import threading

    adapter = RetryAfterAdapter()
    torn: list[str] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def set_waiting(seed: int) -> None:
            for n in range(40):
                adapter.max_waiting = seed * 100 + n

        def set_quota(seed: int) -> None:
            for n in range(1, 40):
                adapter.quota = Quota(seed * 100 + n, per=1)

        def watch() -> None:
            for _ in range(400):
                settings, plan = adapter.settings, adapter._plan
                if (settings.max_waiting, settings.quota) != (
                    plan.max_waiting, None if plan.limit is None else Quota(plan.limit, per=1)
                ) and adapter.settings is settings:
                    torn.append(f"{settings.max_waiting}/{plan.max_waiting}")

        threads = [threading.Thread(target=f, args=(k,)) for k in (1, 2) for f in (set_waiting, set_quota)]
        threads.append(threading.Thread(target=watch))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        sys.setswitchinterval(switch)
    assert torn == []
    assert adapter._plan.max_waiting == adapter.settings.max_waiting
    assert adapter._plan.limit == adapter.settings.quota.limit  # type: ignore[union-attr]


def test_settings_assigned_whole_take_effect() -> None:
    adapter = RetryAfterAdapter()
    adapter.settings = Settings(quota=Quota(4, per=2))
    assert adapter.quota == Quota(4, per=2) and adapter._plan.limit == 4
    with pytest.raises(ConfigurationError):
        adapter.settings = {"quota": None}  # type: ignore[assignment]


def test_an_adapter_pickled_before_the_settings_value_unpickles() -> None:
    """0.9 pickled each option as its own attribute (``__attrs__``)."""
    adapter = RetryAfterAdapter(RetryAfterRetry(total=2), **OPTIONS)
    state = adapter.__getstate__()
    del state["settings"]
    state.update({name: getattr(adapter.settings, name) for name in OPTIONS})
    state["cooldown"] = adapter.settings.cooldown
    state["on_decision"] = ()
    revived = RetryAfterAdapter.__new__(RetryAfterAdapter)
    revived.__setstate__(state)
    assert revived.settings == adapter.settings and revived._plan.limit == 10


def test_a_misspelled_option_is_named_at_once() -> None:
    # Every front end refuses an unknown keyword the same way: its own error, naming
    # the keyword and the option it looks like.
    for front_end in (RetryAfterPoolManager, RetryAfterTransport, RetryAfterAdapter):
        name = front_end.__name__
        with pytest.raises(ConfigurationError, match=f"{name} got an unknown keyword 'quoat': did you mean 'quota'"):
            front_end(quoat=Quota(1, per=1))  # type: ignore[call-arg]
    takes = "unknown keyword 'colour' \\(it takes: cooldown, .*, pool_block\\)"
    with pytest.raises(ConfigurationError, match=takes):
        RetryAfterAdapter(colour="red")  # type: ignore[call-arg]
    # The library's own keywords are suggested too.
    with pytest.raises(ConfigurationError, match="'pool_conections': did you mean 'pool_connections'"):
        RetryAfterAdapter(pool_conections=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="'max_retry': did you mean 'max_retries'"):
        RetryAfterTransport(max_retry=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="RetryAfterTransport got an unknown keyword 'pool_maxsize'"):
        RetryAfterTransport(pool_maxsize=2)  # type: ignore[call-arg]
    # The libraries' own keywords pass: requests' pool sizes, urllib3's pool keywords.
    assert RetryAfterAdapter(pool_maxsize=2, pool_block=True)._pool_maxsize == 2  # type: ignore[call-arg]
    assert RetryAfterPoolManager(maxsize=3).connection_pool_kw["maxsize"] == 3
