"""The store interface: a core every store implements and one mixin per capability,
recognised by type; a store of 0.x (an object with its methods, or a subclass of 0.10's
``Store``) refused with a ConfigurationError that says what to change."""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from retry_after_adapter import (
    ConfigurationError,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterRetry,
    deferral_of,
)
from retry_after_adapter.cooldown import (
    CAPABILITIES,
    Admission,
    Answer,
    Ask,
    Freshness,
    FreshnessLog,
    Learn,
    Lease,
    Store,
)
from retry_after_adapter.cooldown.base import ADMITTED
from retry_after_adapter.cooldown.completed import Completed, as_store
from retry_after_adapter.testing import QuotaServer


class DictStore(Store):
    """The core alone: a dict of cooldowns."""

    def __init__(self) -> None:
        self.until: dict[str, datetime] = {}
        self.lock = threading.Lock()
        self.admits = 0

    def get(self, scope: str) -> datetime | None:
        return self.until.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        with self.lock:
            kept = self.until[scope] = max(self.until.get(scope, until), until)
            return kept

    def admit(self, ask: Ask) -> Admission:
        self.admits += 1
        return super().admit(ask)


class FreshDictStore(DictStore, FreshnessLog):
    """The core and one mixin: freshness."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh: dict[str, Freshness] = {}

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        old = self.fresh.get(scope, Freshness())
        if outcome == "success":
            self.fresh[scope] = Freshness(at, old.last_error, old.last_error_at)
        else:
            self.fresh[scope] = Freshness(old.last_success, outcome, at)

    def freshness(self, scope: str) -> Freshness | None:
        return self.fresh.get(scope)

    def freshness_entries(self) -> dict[str, Freshness]:
        return dict(self.fresh)


def session_on(store: Any, **options: Any) -> tuple[requests.Session, RetryAfterAdapter]:
    session = requests.Session()
    retry = RetryAfterRetry(total=0, max_wait=1, raise_on_status=False)
    adapter = RetryAfterAdapter(retry, cooldown=store, learn_rate=False, **options)
    session.mount("http://", adapter)
    return session, adapter


def test_capabilities_are_read_from_the_type() -> None:
    assert MemoryCooldownStore().capabilities == frozenset(CAPABILITIES)
    assert DictStore().capabilities == frozenset()
    assert FreshDictStore().capabilities == {FreshnessLog}
    completed = as_store(FreshDictStore())
    assert isinstance(completed, Completed) and completed.capabilities == {FreshnessLog}


def test_a_core_store_shares_cooldowns_and_admits_every_attempt() -> None:
    store = DictStore()
    with QuotaServer(quota=1, window=3600, align="first") as server:
        (first, _), (second, _) = session_on(store), session_on(store)
        assert first.get(server.url + "/a", timeout=10).status_code == 200
        assert first.get(server.url + "/a", timeout=10).status_code == 429  # a cooldown stored
        held = second.get(server.url + "/b", timeout=10)
        assert held.local and deferral_of(held).reason == "cooldown"  # type: ignore[attr-defined, union-attr]
        assert server.stats().requests == 2
    assert store.admits >= 3  # every attempt asked the store's admit, the core's default
    answered = store.admit(Ask(scope=next(iter(store.until)), now=datetime.now(timezone.utc)))
    assert answered.not_before is not None


def test_a_setting_the_store_cannot_carry_names_the_mixin() -> None:
    with pytest.raises(ConfigurationError, match="QuotaLogs"):
        session_on(DictStore(), quota=Quota(5, per=1))[0].get("http://127.0.0.1:9/")
    with pytest.raises(ConfigurationError, match="Leases"):
        session_on(DictStore(), max_concurrency=2)[0].get("http://127.0.0.1:9/")


def test_one_mixin_adds_one_capability() -> None:
    with QuotaServer(quota=5, window=3600) as server:
        plain, plain_adapter = session_on(DictStore())
        fresh, fresh_adapter = session_on(FreshDictStore())
        for session in (plain, fresh):
            assert session.get(server.url + "/x", timeout=10).status_code == 200
        assert plain_adapter.freshness(server.url + "/x") is None  # no FreshnessLog
        seen = fresh_adapter.freshness(server.url + "/x")
        assert seen is not None and seen.last_success is not None


class StoreOf010(Store):
    """A subclass of 0.10's ``Store``: the 0.10 signatures (``settle`` defined,
    ``answer`` not), kept in a memory store of today."""

    def __init__(self) -> None:
        self.m = MemoryCooldownStore()
        self.calls: list[str] = []
        self.nows: list[datetime | None] = []

    def get(self, scope: str) -> datetime | None:
        return self.m.get(scope)

    def extend(self, scope: str, until: datetime) -> datetime:
        return self.m.extend(scope, until)

    def admit(  # type: ignore[override]
        self, scope: str, now: datetime | None, limit: int | None = None, per: float | None = None,
        lease: Any = None, margin: float = 0.0, batch: int = 1, hold: float = 0.0, learn: Any = None,
    ) -> Admission:
        self.calls.append("admit")
        self.nows.append(now)  # None: the store stamps the grant itself, as 0.6-0.10's did
        slot = None if lease is None else Lease(slots=lease[0], ttl=lease[1], token=lease[2])  # a store of 0.x is given a tuple
        return self.m.admit(Ask(scope=scope, now=now, limit=limit, per=per, lease=slot, margin=margin))

    def allow(self, *args: Any) -> None:
        self.m.allow(*args)

    def settle(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("settle")
        self.m.settle(*args, **kwargs)

    def release(self, scope: str, token: str) -> None:
        self.m.release(scope, token)


def test_a_store_written_for_0_10_is_refused_with_what_to_change() -> None:
    with pytest.raises(ConfigurationError, match=r"StoreOf010 was written for the Store of 0\.6-0\.10.*answer\(answer\)"):
        RetryAfterAdapter(cooldown=StoreOf010(), quota=Quota(2, per=60))
    with pytest.raises(ConfigurationError, match=r"0\.6-0\.10"):
        as_store(StoreOf010())


class StoreOf0x:
    """A store of 0.1-0.5: get and extend on a plain object (found by name until 0.14)."""

    def get(self, scope: str) -> datetime | None:
        return None

    def extend(self, scope: str, until: datetime) -> datetime:
        return until


def test_a_store_written_for_0x_is_refused_with_what_to_change() -> None:
    for bad in (StoreOf0x(), object(), "memory://"):
        with pytest.raises(ConfigurationError, match=r"must be a retry_after_adapter\.cooldown\.Store.*subclass Store"):
            RetryAfterAdapter(cooldown=bad)


def test_a_store_that_reads_the_values_the_0_14_way_is_told_what_changed() -> None:
    """A store written for 0.14 unpacks ``Ask`` by position: since the values became
    keyword-only dataclasses that raises inside its admit, which is a ConfigurationError
    naming the change at the first call, nothing sent (not a store failure every
    attempt meets, each deferred with nothing said)."""

    class Positional(DictStore):
        def admit(self, ask: Ask) -> Admission:
            _scope, _now, *_ = ask  # type: ignore[misc]  # 0.14: a NamedTuple
            return super().admit(ask)

    with QuotaServer(quota=5, window=3600, align="first") as server:
        session, _ = session_on(Positional())
        with pytest.raises(ConfigurationError, match="keyword-only dataclasses") as raised:
            session.get(server.url + "/a", timeout=10)
        assert "Positional.admit failed: TypeError" in str(raised.value)
        assert server.stats().requests == 0


def test_full_store_is_the_partwise_store_under_its_old_name() -> None:
    from retry_after_adapter import cooldown
    from retry_after_adapter.cooldown import PartwiseStore, base

    with pytest.warns(DeprecationWarning, match="PartwiseStore"):
        assert cooldown.FullStore is PartwiseStore
    with pytest.warns(DeprecationWarning, match="PartwiseStore"):
        assert base.FullStore is PartwiseStore
    with pytest.raises(AttributeError):
        cooldown.EmptyStore


def test_an_answer_carries_its_parts_to_a_full_store_in_one_call() -> None:
    store = MemoryCooldownStore()
    now = datetime.now(timezone.utc)
    granted = store.admit(Ask(scope="s", now=now, limit=1, per=1.0, lease=Lease(slots=1, ttl=30.0, token="slot"), opened=10.0))
    assert granted.not_before is None and granted.permit is not None
    from retry_after_adapter.cooldown import Permit

    store.answer(Answer(scope="s", now=now, token="slot", permit=Permit(1, 1.0, granted.permit, True)))
    later = now + timedelta(seconds=1)
    # The slot is back and the permit ended at the answer + per, exactly.
    assert store.admit(Ask(scope="s", now=later, limit=1, per=1.0, lease=Lease(slots=1, ttl=30.0, token="again"))).not_before is None


# -- the values: frozen, keyword-only, read by name --------------------------------------
VALUES = (Ask, Admission, Answer, Lease, Learn)


def test_the_values_are_frozen_and_built_by_keyword_only() -> None:
    now = datetime.now(timezone.utc)
    with pytest.raises(TypeError):
        Ask("s", now)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Admission(None, None)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Answer("s", now)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Lease(2, 30.0, "t")  # type: ignore[misc]
    ask = Ask(scope="s", now=now, lease=Lease(slots=2, ttl=30.0, token="t"), learn=Learn(ttl=30.0, token="t"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ask.limit = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        _scope, *_ = ask  # type: ignore[misc]  # no unpacking by position
    refused = Admission(cooldown=now, not_before=now, by_rate=True)
    assert refused == dataclasses.replace(ADMITTED, cooldown=now, not_before=now, by_rate=True)
    assert refused != Admission(cooldown=now, not_before=now)  # every field counts in equality
    for value in VALUES:
        assert dataclasses.is_dataclass(value) and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert all(field.kw_only for field in dataclasses.fields(value))
        assert value.__doc__ and all(f"``{field.name}``" in value.__doc__ for field in dataclasses.fields(value))


class RecordingStore(MemoryCooldownStore):
    """A memory store that keeps every Ask it was given and every Admission it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Ask, Admission]] = []

    def admit(self, ask: Ask) -> Admission:
        answer = super().admit(ask)
        self.seen.append((ask, answer))
        return answer


@pytest.mark.parametrize("settings", [{}, {"quota": Quota(1000, per=1.0), "max_concurrency": 4}])
def test_the_values_built_whole_on_the_hot_path_are_the_ones_their_init_builds(settings: dict[str, Any]) -> None:
    """An attempt's Ask, its Lease or Learn and a grant's Admission are built without
    their __init__ (``assembled``): each holds exactly the class's fields, and equals
    what the class builds from them."""
    store = RecordingStore()
    with QuotaServer(quota=1000, window=3600) as server:
        session = requests.Session()
        retry = RetryAfterRetry(total=0, max_wait=1, raise_on_status=False)
        session.mount("http://", RetryAfterAdapter(retry, cooldown=store, learn_rate=True, **settings))
        for _ in range(3):
            assert session.get(server.url + "/v", timeout=10).status_code == 200
    assert len(store.seen) >= 3
    for ask, answer in store.seen:
        parts = [ask, answer, *(part for part in (ask.lease, ask.learn) if part is not None)]
        assert ask.lease is not None or ask.learn is not None
        for value in parts:
            names = {field.name for field in dataclasses.fields(value)}
            assert set(vars(value)) <= names, set(vars(value)) - names
            assert value == type(value)(**{name: getattr(value, name) for name in names})
    assert any(answer.permit is not None for _, answer in store.seen) == bool(settings)
