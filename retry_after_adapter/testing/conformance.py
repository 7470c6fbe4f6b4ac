"""The contract tests every cooldown store passes, for a store of your own.

The package's memory, SQLite and Redis stores run these same tests. Subclass
:class:`StoreContract` in a test module, give it a ``store`` fixture, and pytest runs
the contract against your store::

    import pytest
    from retry_after_adapter.testing.conformance import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path / "cooldowns.json")

        @pytest.fixture
        def other_store(self, store, tmp_path):  # optional: another handle, same data
            return MyStore(tmp_path / "cooldowns.json")

What is checked:

- **the core**, for every store (``get`` and ``extend``): an unknown scope is None; the
  later time wins and ``extend`` returns it; scopes are independent; times come back
  aware, in UTC, never earlier than asked (a store may round up, by less than a
  millisecond); past, far-future and 512-character scopes work; eight threads racing
  short cooldowns never replace a long one; and two adapters on two handles of the
  store share a cooldown: after one is answered 429, the other defers without sending
  (skipped, saying so, unless ``other_store`` gives a second handle: the memory store
  shares one object), also when it sent before (what it knows of the scope, a near
  copy, must not be trusted once the store changed; a ``ChangeFeed`` store is given
  :data:`FEED_SETTLES` seconds to deliver; without ``other_store``, on one handle);
- **the operator's view**, when the store has ``entries`` and ``delete``; and, when it
  is a :class:`~retry_after_adapter.cooldown.Listing`, ``holds()`` names what holds each
  scope back (a running cooldown, a quota's permits all taken, a held slot, an announced
  allowance spent), never a past cooldown or a lifted scope;
- **the core's admission**, when the store is a :class:`~retry_after_adapter.cooldown.Store`:
  ``admit`` answers the cooldown, an empty ``answer`` is nothing, naive times and bad
  scopes (empty, over 512 characters, not a str, a NUL, a lone surrogate) are refused
  with ``ConfigurationError``;
- **each capability the store carries** (its mixins; a test of one it does not carry is
  skipped, saying so): ``QuotaLogs`` (a quota's limit, then when; an open permit settled
  exactly by its answer), ``Leases`` (a slot held and given back by an answer), both
  (admitted atomically under eight racing threads, all or nothing: a free permit is not
  taken when the slot is refused), ``Allowances`` (an announced allowance spent, then
  held until its reset), ``Weights`` (a token quota weighs each cost, then says when;
  an announced token allowance is spent by costs; tokens are taken all or nothing with
  the rest, exactly under eight racing threads; a late answer moves a token permit
  later; a cost above the token quota is refused) and ``FreshnessLog`` (later wins);
- **reservations**, when the store carries ``Reservations``: a permit refused now is
  reserved for the earliest time one is free, in the order asked, within
  ``reserve_by`` (past it, the refusal names the reservation it would get and takes
  nothing), paced ``per / limit`` apart under ``PACE_UNDER`` and not past it; a
  reservation given back frees its place; holders go at their places (those reserved
  after them left out; one refused by a cooldown gives its place back); a higher
  ``priority`` is placed ahead of lower waiting ones, which then wait for it; eight
  threads racing
  reservations never put more than the limit in any window;
- **admission atomic in every order**, for each of ``QuotaLogs`` (a quota's one
  permit), ``Leases`` (the one slot), ``Allowances`` (an allowance's last request) and
  ``Weights`` (a token quota's tokens): two admissions, the first paused at each line of
  the store's own code in turn while the second runs (see ``_interleave``), are never
  both granted. A store that reads, lets go, and writes what it read (a READ COMMITTED
  transaction without a per-scope lock) fails on every run, naming the line;
- **a change feed that says it is fresh delivers** (``ChangeFeed``): a cooldown learned
  and a scope lifted through ``other_store`` (the store itself without one) reach the
  feed's ``changed`` within :data:`FEED_DELIVERS` seconds, unless ``fresh()`` stops
  saying True;
- **the bound a store declares**, when it is
  :class:`~retry_after_adapter.cooldown.Bounded` (the failure layer then calls it on
  the calling thread, trusting that bound): ``operation_timeout()`` is a finite number
  of seconds > 0 (or None), and on ``hung_store``, a handle of the store whose backend
  does not answer (a server that accepts and never replies, a file another connection
  holds locked), ``get``, ``extend``, ``admit``, ``answer`` and its feed's ``fresh()``
  each end within three times that bound and half a second, with an answer or a
  ``CooldownStoreError``. A ``Bounded`` store without a ``hung_store`` fixture fails:
  the bound is a promise the kit checks.

Each test uses scopes of its own (a random prefix), so a store that keeps data between
runs, or is shared with other tests, can run the contract.

Times are real (the contract sleeps nowhere but to poll); a test takes milliseconds,
the adapter's one a loopback round trip or two, the bound's about three of the
declared bound, each "in every order" one well under a second.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ..cooldown.base import (
    RECHECK,
    Admission,
    Allowances,
    Announced,
    Answer,
    Ask,
    Bounded,
    ChangeFeed,
    FreshnessLog,
    Lease,
    LeaseRenewal,
    Leases,
    Listing,
    Permit,
    QuotaLogs,
    Reservations,
    Store,
    Weigh,
    Weights,
)
from ..errors import ConfigurationError, CooldownStoreError
from ._contract_tokens import TokenContract, now_ms
from ._interleave import Overlap, first_overlap

__all__ = ["StoreContract"]

UTC = timezone.utc


class StoreContract(TokenContract):
    """The contract; subclass it as ``Test...`` and provide the ``store`` fixture (and,
    for a shared backend, ``other_store``: a second handle on the same data, as another
    process would open it)."""

    @pytest.fixture
    def store(self) -> Any:  # pragma: no cover - a subclass provides it
        raise NotImplementedError("give the StoreContract subclass a `store` fixture")

    @pytest.fixture
    def other_store(self, store: Any) -> Any:
        return store

    @pytest.fixture
    def hung_store(self) -> Any:
        """For a :class:`~retry_after_adapter.cooldown.Bounded` store: a handle of it
        whose backend does not answer, on which the declared bound is checked (None:
        none given)."""
        return None

    @pytest.fixture(autouse=True)
    def _names(self) -> None:
        # Scopes of this test only: a store that keeps data between runs, or is shared
        # with other tests, still starts each test from nothing.
        self.ns = f"contract-{uuid.uuid4().hex[:12]}:"

    def s(self, name: str) -> str:
        """The scope ``name`` of this test."""
        return self.ns + name

    # -- the core: get and extend ----------------------------------------------------
    def test_an_unknown_scope_is_none(self, store: Any) -> None:
        assert store.get(self.s("https://nobody.example:443")) is None

    def test_the_later_time_wins_and_extend_returns_it(self, store: Any) -> None:
        base = now_ms()
        early, late = base + timedelta(seconds=5), base + timedelta(seconds=30)
        later = base + timedelta(hours=2)
        assert store.extend(self.s("s"), late) == late
        assert store.extend(self.s("s"), early) == late  # a shorter cooldown never replaces a longer one
        assert store.get(self.s("s")) == late
        assert store.extend(self.s("s"), late) == late
        assert store.extend(self.s("s"), later) == later
        assert store.get(self.s("s")) == later

    def test_scopes_are_independent(self, store: Any) -> None:
        base = now_ms()
        store.extend(self.s("a"), base + timedelta(seconds=10))
        store.extend(self.s("b"), base + timedelta(seconds=20))
        assert store.get(self.s("a")) == base + timedelta(seconds=10)
        assert store.get(self.s("b")) == base + timedelta(seconds=20)
        assert store.get(self.s("c")) is None

    def test_an_aware_time_in_any_zone_comes_back_in_utc(self, store: Any) -> None:
        instant = now_ms() + timedelta(minutes=3)
        india = timezone(timedelta(hours=5, minutes=30))
        effective = store.extend(self.s("zone"), instant.astimezone(india))
        stored = store.get(self.s("zone"))
        for value in (effective, stored):
            assert value is not None and value.utcoffset() == timedelta(0)
            assert value == instant

    def test_a_sub_millisecond_time_is_rounded_up_never_shortened(self, store: Any) -> None:
        until = now_ms() + timedelta(seconds=10, microseconds=123_456)
        effective = store.extend(self.s("round"), until)
        assert until <= effective < until + timedelta(milliseconds=1)
        assert store.get(self.s("round")) == effective
        assert store.extend(self.s("round"), until) == effective  # asking again never lowers it

    def test_the_longest_scope_is_accepted(self, store: Any) -> None:
        scope = (self.ns + "s" * 512)[:512]
        until = now_ms() + timedelta(seconds=1)
        assert store.extend(scope, until) == until
        assert store.get(scope) == until

    def test_a_far_future_time_round_trips(self, store: Any) -> None:
        far = datetime.max.replace(tzinfo=UTC)
        assert store.extend(self.s("far"), far) == far
        assert store.get(self.s("far")) == far

    def test_a_past_time_is_accepted(self, store: Any) -> None:
        past = now_ms() - timedelta(minutes=5)
        assert store.extend(self.s("past"), past) == past
        # A store may drop an expired cooldown; it never reports a later time than written.
        assert store.get(self.s("past")) in (None, past)

    def test_a_long_cooldown_survives_threads_racing_short_ones(self, store: Any) -> None:
        base = now_ms()
        long = base + timedelta(hours=1)
        long_written = threading.Event()
        failures: list[str] = []

        def race(seed: int) -> None:
            rng = random.Random(seed)
            for i in range(60):
                if seed == 0 and i == 30:
                    if store.extend(self.s("quota"), long) != long:
                        failures.append("the long write did not take effect")
                    long_written.set()
                    continue
                after_long = long_written.is_set()
                until = base + timedelta(milliseconds=rng.randrange(1, 10_000))
                effective = store.extend(self.s("quota"), until)
                if effective < until or (after_long and effective != long):
                    failures.append(f"extend({until}) returned {effective}")
                got = store.get(self.s("quota"))
                if got is None or got < effective:
                    failures.append(f"get returned {got} after extend returned {effective}")

        threads = [threading.Thread(target=race, args=(seed,)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert long_written.is_set() and failures == []
        assert store.get(self.s("quota")) == long

    def test_two_adapters_on_two_handles_share_a_cooldown(self, store: Any, other_store: Any) -> None:
        from ..cooldown.base import InProcess

        if other_store is store and not isinstance(store, InProcess):
            pytest.skip("give the contract an `other_store` fixture: a second handle on the same data")

        from ..deferral import deferral_of
        from .server import QuotaServer

        with QuotaServer(quota=1, window=3600, align="first") as server:
            sessions = _workers_on(store, other_store)
            first, second = sessions
            assert first.get(server.url + "/a", timeout=10).status_code == 200
            throttled = first.get(server.url + "/a", timeout=10)  # the server's 429: a cooldown stored
            assert throttled.status_code == 429 and not getattr(throttled, "local", False)
            held = second.get(server.url + "/b", timeout=10)  # the other handle's worker
            deferral = deferral_of(held)
            assert getattr(held, "local", False) and deferral is not None and deferral.reason == "cooldown"
            assert server.stats().requests == 2  # nothing was sent into the cooldown
            for session in sessions:
                session.close()

    def test_a_worker_that_asked_before_is_held_by_a_cooldown_learned_elsewhere(
        self, store: Any, other_store: Any
    ) -> None:
        """As above, but the other handle's worker sent first: what it knows of the
        scope (a near copy, kept while the store's feed says nothing changed) must not
        let it send into the cooldown learned since. A store with a change feed is given
        :data:`FEED_SETTLES` seconds to deliver it. (Without ``other_store``, the two
        adapters share the one handle.)"""
        from ..deferral import deferral_of
        from .server import QuotaServer

        with QuotaServer(quota=2, window=3600, align="first") as server:
            sessions = _workers_on(store, other_store)
            first, second = sessions
            try:
                assert second.get(server.url + "/b", timeout=10).status_code == 200  # it knows the scope
                assert first.get(server.url + "/a", timeout=10).status_code == 200
                throttled = first.get(server.url + "/a", timeout=10)  # the server's 429: a cooldown stored
                assert throttled.status_code == 429 and not getattr(throttled, "local", False)
                if isinstance(other_store, ChangeFeed):
                    time.sleep(FEED_SETTLES)
                held = second.get(server.url + "/b", timeout=10)
                deferral = deferral_of(held)
                sent = server.stats().requests
                assert sent == 3 and getattr(held, "local", False), (
                    f"a worker on {type(other_store).__name__} that had sent before sent into a "
                    f"cooldown learned through another handle (the server saw {sent} requests, "
                    "not 3): what it knew of the scope was trusted after the store changed"
                )
                assert deferral is not None and deferral.reason == "cooldown"
            finally:
                for session in sessions:
                    session.close()

    # -- the operator's view -----------------------------------------------------------
    def test_entries_list_and_delete_lifts_one_scope(self, store: Any) -> None:
        from ..cooldown.base import Listing

        lists = isinstance(store, Listing)
        if not lists:
            pytest.skip("the store lists and deletes nothing (no Listing capability)")
        base = now_ms()
        store.extend(self.s("a"), base + timedelta(seconds=10))
        store.extend(self.s("b*[x]"), base + timedelta(seconds=20))  # glob characters are literal
        mine = {k: v for k, v in store.entries().items() if k.startswith(self.ns)}
        assert mine == {
            self.s("a"): base + timedelta(seconds=10),
            self.s("b*[x]"): base + timedelta(seconds=20),
        }
        assert store.delete(self.s("b*[x]")) is True
        assert store.delete(self.s("b*[x]")) is False
        assert store.get(self.s("b*[x]")) is None and store.get(self.s("a")) == base + timedelta(seconds=10)
        # Lifted, a scope starts again from nothing: later-wins applies to new cooldowns only.
        assert store.extend(self.s("b*[x]"), base + timedelta(seconds=1)) == base + timedelta(seconds=1)

    def test_holds_names_what_holds_each_scope_back(self, store: Any) -> None:
        """``Listing.holds``: a running cooldown is listed as a ``"cooldown"`` hold until
        its end, and so (for each capability the store carries) a quota whose permits
        are all taken (``"quota"``, its limit), a held slot (``"leases"``) and an
        announced allowance spent (``"allowance"``, until its reset); a past cooldown
        and a lifted scope are not (the CLI's ``status`` shows this list)."""
        listed: Any = self.carrying(store, Listing)
        now = now_ms()
        held, past = self.s("held"), self.s("past")
        listed.extend(held, now + timedelta(seconds=30))
        listed.extend(past, now - timedelta(seconds=30))
        expected: dict[str, tuple[str, datetime, int | None]] = {
            held: ("cooldown", now + timedelta(seconds=30), None),
        }
        if isinstance(store, QuotaLogs):
            quota = self.s("quota")
            for _ in range(2):
                assert listed.admit(Ask(scope=quota, now=now, limit=2, per=60.0)).not_before is None
            expected[quota] = ("quota", now + timedelta(seconds=60), 2)
        if isinstance(store, Leases):
            slots = self.s("slots")
            assert listed.admit(Ask(
                scope=slots, now=now, lease=Lease(slots=1, ttl=30.0, token="held")
            )).not_before is None
            expected[slots] = ("leases", now + timedelta(seconds=30), 1)
        if isinstance(store, Allowances):
            spent = self.s("spent")
            reset = now + timedelta(seconds=20)
            listed.answer(Answer(scope=spent, now=now, announced=Announced(remaining=0, until=reset)))
            expected[spent] = ("allowance", reset, None)
        holds = listed.holds(now)
        name = type(store).__name__
        for scope, (kind, until, number) in expected.items():
            found = [hold for hold in holds.get(scope, []) if hold.kind == kind]
            assert found, (
                f"{name}.holds() does not list the {kind!r} that holds {scope!r} back until "
                f"{until.isoformat()} (it listed {holds.get(scope, [])!r} for it)"
            )
            assert any(hold.until >= until for hold in found) and all(
                hold.until < until + timedelta(seconds=2) for hold in found
            ), f"{name}.holds() lists {scope!r}'s {kind!r} hold until {found[0].until}, not {until}"
            if number is not None:
                assert any(hold.number == number for hold in found), (
                    f"{name}.holds() lists {scope!r}'s {kind!r} hold with number "
                    f"{found[0].number}, not {number}"
                )
        assert past not in holds, f"{name}.holds() lists {past!r}, whose cooldown ended 30 s ago"
        assert listed.delete(held) is True
        assert held not in listed.holds(now), f"{name}.holds() still lists {held!r} after delete()"

    # -- the core's admission and answer ---------------------------------------------
    @staticmethod
    def carrying(store: Any, *capabilities: type) -> Store:
        """``store``, if it is a :class:`Store` with each of ``capabilities``; else the
        test is skipped, saying what is missing."""
        if not isinstance(store, Store):
            pytest.skip("not a retry_after_adapter.cooldown.Store: get and extend are its contract")
        missing = [c.__name__ for c in capabilities if not isinstance(store, c)]
        if missing:
            pytest.skip(f"the store does not carry {', '.join(missing)}")
        return store

    def test_admit_answers_the_cooldown(self, store: Any) -> None:
        core = self.carrying(store)
        now = now_ms()
        assert core.admit(Ask(scope=self.s("free"), now=now)).not_before is None
        core.extend(self.s("held"), now + timedelta(seconds=30))
        held = core.admit(Ask(scope=self.s("held"), now=now))
        assert held.not_before == now + timedelta(seconds=30) and held.cooldown == held.not_before
        assert core.admit(Ask(scope=self.s("held"), now=now + timedelta(seconds=31))).not_before is None
        core.answer(Answer(scope=self.s("held"), now=now))  # an answer with nothing in it is nothing

    def test_a_naive_time_is_refused(self, store: Any) -> None:
        core = self.carrying(store)
        with pytest.raises(ConfigurationError):
            core.extend(self.s("naive"), datetime.now() + timedelta(seconds=10))
        assert core.get(self.s("naive")) is None

    @pytest.mark.parametrize("scope", ["", "x" * 513, None, 42, ("a", "tuple"), "\ud800", "a\x00b"])
    def test_a_bad_scope_is_refused_every_time(self, store: Any, scope: Any) -> None:
        core = self.carrying(store)
        for _ in range(3):  # a refused admission must not leave the scope behind as known
            with pytest.raises(ConfigurationError):
                core.extend(scope, now_ms() + timedelta(seconds=1))

    # -- QuotaLogs and Leases ----------------------------------------------------------
    def test_a_refused_admission_with_a_naive_time_takes_nothing(self, store: Any) -> None:
        whole = self.carrying(store, QuotaLogs, Leases)
        with pytest.raises(ConfigurationError):
            whole.admit(Ask(
                scope=self.s("naive"), now=datetime.now(), limit=5, per=1.0,
                lease=Lease(slots=2, ttl=10.0, token="token"),
            ))
        answer = whole.admit(Ask(
            scope=self.s("naive"), now=now_ms(), limit=1, per=1.0,
            lease=Lease(slots=1, ttl=10.0, token="token"),
        ))
        assert answer.not_before is None  # the refused calls took neither the permit nor the slot
        for scope in ("", "x" * 513, None, "\udfff", "\x00"):
            with pytest.raises(ConfigurationError):
                bad = Ask(scope=scope, now=now_ms(), limit=5, per=1.0)  # type: ignore[arg-type]
                whole.admit(replace(bad, lease=Lease(slots=2, ttl=10.0, token="token")))

    def test_a_quota_admits_its_limit_then_says_when(self, store: Any) -> None:
        quota = self.carrying(store, QuotaLogs)
        now = now_ms()
        assert [quota.admit(Ask(
            scope=self.s("q"), now=now, limit=2, per=60.0
        )).not_before for _ in range(2)] == [None, None]
        refused = quota.admit(Ask(scope=self.s("q"), now=now, limit=2, per=60.0))
        assert refused.not_before is not None and refused.not_before >= now + timedelta(seconds=60)

    def test_an_open_permit_counts_until_its_answer_settles_it_exactly(self, store: Any) -> None:
        """A permit taken open counts ``opened`` seconds longer; its answer brings its
        end to the answer + per exactly, earlier too, and never before."""
        quota = self.carrying(store, QuotaLogs)
        now, scope = now_ms(), self.s("open")
        granted = quota.admit(Ask(scope=scope, now=now, limit=1, per=1.0, opened=10.0))
        assert granted.not_before is None and granted.permit is not None
        assert granted.permit >= now + timedelta(seconds=11)
        assert quota.admit(Ask(
            scope=scope, now=now + timedelta(seconds=2), limit=1, per=1.0
        )).not_before is not None
        answered = now + timedelta(seconds=2)
        quota.answer(Answer(scope=scope, now=answered, permit=Permit(1, 1.0, granted.permit, exact=True)))
        assert quota.admit(Ask(
            scope=scope, now=answered + timedelta(milliseconds=500), limit=1, per=1.0
        )).not_before is not None
        assert quota.admit(Ask(
            scope=scope, now=answered + timedelta(seconds=1), limit=1, per=1.0
        )).not_before is None

    def test_a_reservation_is_granted_in_order_for_when_a_permit_is_free(self, store: Any) -> None:
        """``Reservations``: a quota's permit refused now is reserved, in the same
        admission, for the earliest time one is free counting the reservations already
        made (each counting ``per + margin`` from its time), ``per / limit`` after the
        one before (paced: ``per`` is under ``PACE_UNDER``), while that is no later
        than ``reserve_by``; past it, the refusal says the reservation it would have
        got, and takes nothing."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("reserve")
        second = timedelta(seconds=1)
        by = now + 5 * second

        def ask(reserve_by: datetime | None = by) -> Admission:
            return quota.admit(Ask(scope=scope, now=now, limit=2, per=1.0, reserve_by=reserve_by))

        granted = [ask(), ask()]
        assert all(g.not_before is None and g.reserved is None for g in granted), granted
        reserved = [ask() for _ in range(4)]
        places = [now + second, now + 1.5 * second, now + 2 * second, now + 2.5 * second]
        assert [r.reserved for r in reserved] == places, reserved
        assert all(r.not_before is None and r.permit == r.reserved + second for r in reserved if r.reserved)
        refused = ask(now + 2500 * timedelta(milliseconds=1))
        assert refused.reserved is None and refused.not_before == now + 3 * second, refused
        assert ask(None).not_before == now + 3 * second  # the refusal took nothing
        later = ask()
        assert later.reserved == now + 3 * second and later.not_before is None, later

    def test_a_reservation_given_back_frees_its_place(self, store: Any) -> None:
        """``Reservations``: a reservation not used is given back by its exact settle
        answered ``per`` before now (it then ends now): the last one's place is the
        next reservation's."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("give-back")
        second = timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=1, per=1.0, opened=10.0, reserve_by=now + 5 * second)
        assert quota.admit(ask).reserved is None
        first = quota.admit(ask)
        second_one = quota.admit(ask)
        assert first.reserved == now + second and second_one.reserved == now + 2 * second, (first, second_one)
        assert second_one.permit is not None
        given_back = Permit(1, 1.0, second_one.permit, exact=True)
        quota.answer(Answer(scope=scope, now=now - second, permit=given_back))
        assert quota.admit(ask).reserved == now + 2 * second  # its place, taken again

    def test_a_reservation_asked_again_at_its_time_goes_unless_a_permit_ran_late(self, store: Any) -> None:
        """``Reservations``: the holder asks again at its reservation's time holding it
        (``Ask.held``): granted at once, its permit kept, when the permit it counted on
        was answered in time; while that permit is unanswered, told to ask again within
        ``RECHECK`` (its permit kept); once it is answered late, told to wait for that
        answer + per (its request may have arrived late)."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("held")
        second, ms = timedelta(seconds=1), timedelta(milliseconds=1)
        ask = Ask(scope=scope, now=now, limit=1, per=1.0, opened=10.0, reserve_by=now + 30 * second)
        first = quota.admit(ask)
        assert first.permit is not None and first.reserved is None
        held = quota.admit(ask)
        assert held.reserved == now + second and held.permit is not None, held
        quota.answer(Answer(scope=scope, now=now + 10 * ms, permit=Permit(1, 1.0, first.permit, exact=True)))
        at = held.reserved + 20 * ms
        again = quota.admit(replace(ask, now=at, held=held.permit))
        # It goes 20 ms after its place: its permit counts from now, as one granted now.
        assert again.not_before is None and again.reserved is None, again
        assert again.permit == held.permit + 20 * ms, again
        # The next one counts on ``again``, still unanswered at its time: asked again soon.
        late = quota.admit(replace(ask, now=at))
        assert late.reserved is not None and late.permit is not None, late
        then = late.reserved + 20 * ms
        retried = quota.admit(replace(ask, now=then, held=late.permit))
        assert retried.permit == late.permit and retried.reserved is not None, retried
        assert then < retried.reserved <= then + timedelta(seconds=RECHECK) + ms, (retried, then)
        # ``again`` is answered late: its request counts until that answer + per.
        answered = then + 100 * ms
        quota.answer(Answer(scope=scope, now=answered, permit=Permit(1, 1.0, again.permit, exact=True)))
        waits = quota.admit(replace(ask, now=answered, held=late.permit))
        assert waits.reserved is not None and waits.reserved >= answered + second - ms, (waits, answered)
        assert quota.admit(replace(ask, now=answered + second, held=late.permit)).reserved is None

    def test_a_reservation_taken_late_counts_from_when_it_goes(self, store: Any) -> None:
        """``Reservations``: a holder that goes long after its place (told to ask again,
        or asleep on a busy machine) counts a whole window from when it goes: with a
        quota of 1 per 20 s whose permits are not open, the next caller is refused until
        then, not from the reservation's place (its request arrives when it goes)."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("late")
        second = timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=1, per=20.0, margin=0.5, reserve_by=now + 60 * second)
        assert quota.admit(ask).permit is not None
        place = quota.admit(ask)
        assert place.reserved == now + 20.5 * second and place.permit is not None, place
        went = now + 38 * second
        goes = quota.admit(replace(ask, now=went, held=place.permit))
        assert goes.not_before is None and goes.reserved is None, goes
        assert goes.permit is not None and goes.permit >= went + 20.5 * second, goes
        after = quota.admit(replace(ask, now=now + 41.5 * second, reserve_by=None))
        assert after.not_before is not None and after.not_before >= went + 20 * second, after

    @pytest.mark.parametrize(("reserved_open", "held_open"), [(1.0, 10.0), (10.0, 1.0)])
    def test_a_late_holder_s_open_permit_is_expected_to_end_as_late_as_it_went(
        self, store: Any, reserved_open: float, held_open: float
    ) -> None:
        """``Reservations``: a holder going 20 ms after its place has its open permit
        expected to end per + margin after it went, however long each ask keeps an
        unanswered permit open (``Ask.opened``: a batch's 1 s, an attempt's 10 s, the
        holder's longer or shorter): refused meanwhile, a caller is told when that
        expected end comes, not seconds later (the difference of the two opens added
        to it held a binding quota's fleet back) nor earlier."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s(f"late-open-{reserved_open:g}")
        ms, second = timedelta(milliseconds=1), timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=1, per=1.0, margin=0.05, opened=reserved_open)
        ask = replace(ask, reserve_by=now + 5 * second)
        first = quota.admit(ask)
        assert first.permit is not None and first.reserved is None, first
        place = quota.admit(ask)
        assert place.reserved is not None and place.permit is not None, place
        quota.answer(Answer(scope=scope, now=now + 10 * ms, permit=Permit(1, 1.0, first.permit, exact=True)))
        went = place.reserved + 20 * ms
        goes = quota.admit(replace(ask, now=went, held=place.permit, opened=held_open))
        assert goes.not_before is None and goes.reserved is None, goes
        refused = quota.admit(replace(ask, now=went + 30 * ms, opened=held_open, reserve_by=None))
        # Not before per + margin after it went; not the 9 s the opens differ by.
        assert refused.not_before is not None, refused
        assert went + 1050 * ms <= refused.not_before <= went + 1060 * ms, (refused, went)

    def test_holders_of_permits_not_open_go_at_their_places(self, store: Any) -> None:
        """``Reservations``: with a quota whose permits are not open, holders go at their
        places (the reservations made after them count on them and are left out), and
        one asking before its place waits for it."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("places")
        second = timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=2, per=1.0, reserve_by=now + 5 * second)
        assert all(quota.admit(ask).reserved is None for _ in range(2))
        places = [quota.admit(ask) for _ in range(4)]
        assert [p.reserved for p in places] == [now + k * second / 2 for k in (2, 3, 4, 5)], places
        for place in places[:2]:
            assert place.reserved is not None
            goes = quota.admit(replace(ask, now=place.reserved, held=place.permit))
            assert goes.not_before is None and goes.reserved is None, (place, goes)
        early = quota.admit(replace(ask, now=now + 1.5 * second, held=places[2].permit))
        assert early.reserved is not None and early.reserved >= now + 2 * second, early

    def test_a_late_holder_overtaken_by_a_priority_counts_every_permit_sent(self, store: Any) -> None:
        """``Reservations``: a higher ``priority`` leaves the lower waiting ones out, so a
        lower holder with a higher one among the permits counts every permit sent (what
        counted on it too): with ``Quota(2, per=60)``, a holder due at 60 s but late, an
        open grant at 60.6 s that counted it, and a priority call at 60.7 s granted at
        once leaving it out, at most two of the three are let through."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("due")
        s = timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=2, per=60.0, reserve_by=now + 120 * s)
        assert quota.admit(ask).reserved is None
        assert quota.admit(replace(ask, now=now + 0.5 * s)).reserved is None
        held = quota.admit(replace(ask, now=now + s))
        assert held.reserved == now + 60 * s and held.permit is not None, held
        other = quota.admit(replace(ask, now=now + 60.6 * s, opened=10.0, reserve_by=None))
        urgent = quota.admit(replace(ask, now=now + 60.7 * s, priority=1))
        late = quota.admit(replace(ask, now=now + 60.8 * s, held=held.permit))
        went = [a for a in (other, urgent, late) if a.not_before is None and a.reserved is None]
        assert len(went) <= 2, (other, urgent, late)

    def test_a_holder_refused_by_a_cooldown_gives_its_place_back(self, store: Any) -> None:
        """``Reservations``: a holder asking at its place while a cooldown runs is
        refused until the cooldown ends, and its place is given back in the same
        operation (it is moot), so the next caller after the cooldown is not held back
        by it."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("cooled")
        second = timedelta(seconds=1)
        ask = Ask(scope=scope, now=now, limit=1, per=1.0, reserve_by=now + 5 * second)
        assert quota.admit(ask).reserved is None
        place = quota.admit(ask)
        assert place.reserved == now + second and place.permit is not None, place
        quota.extend(scope, now + 1.5 * second)
        refused = quota.admit(replace(ask, now=now + second, held=place.permit))
        assert refused.not_before == now + 1.5 * second and refused.permit is None, refused
        after = quota.admit(replace(ask, now=now + 1.5 * second, reserve_by=None))
        assert after.not_before is None and after.permit is not None, after

    def test_reservations_of_a_long_quota_are_not_paced(self, store: Any) -> None:
        """``Reservations``: a quota whose ``per`` is ``PACE_UNDER`` or longer reserves
        each waiter the earliest place a permit frees, all together when they free
        together (an hour's quota spread over its hour would hold them back)."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("long")
        ask = Ask(scope=scope, now=now, limit=3, per=60.0, reserve_by=now + timedelta(seconds=90))
        assert all(quota.admit(ask).reserved is None for _ in range(3))
        places = [quota.admit(ask).reserved for _ in range(3)]
        assert places == [now + timedelta(seconds=60)] * 3, places

    def test_a_priority_reservation_goes_ahead_of_lower_waiting_ones(self, store: Any) -> None:
        """``Reservations``: a reservation of a higher ``priority`` is placed ahead of the
        waiting ones of a lower priority (granted at once when that leaves a permit free
        now); at their time they count it and wait for the next place, and it leaves
        them out; the quota is never exceeded."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("priority")
        second, half = timedelta(seconds=1), timedelta(milliseconds=500)
        ask = Ask(scope=scope, now=now, limit=2, per=1.0, reserve_by=now + 9 * second)
        assert quota.admit(ask).reserved is None
        assert quota.admit(replace(ask, now=now + half)).reserved is None
        ordinary = [quota.admit(replace(ask, now=now + half)) for _ in range(2)]
        assert [o.reserved for o in ordinary] == [now + second, now + second + half], ordinary
        urgent = quota.admit(replace(ask, now=now + half, priority=1))
        assert urgent.reserved == now + second and urgent.permit is not None, urgent
        at = now + second
        bumped = quota.admit(replace(ask, now=at, held=ordinary[0].permit))
        assert bumped.reserved == now + second + half and bumped.not_before is None, bumped
        goes = quota.admit(replace(ask, now=at, held=urgent.permit, priority=1))
        assert goes.not_before is None and goes.reserved is None, goes
        then = now + second + half
        first = quota.admit(replace(ask, now=then, held=ordinary[0].permit))
        assert first.not_before is None and first.reserved is None, first
        second_one = quota.admit(replace(ask, now=then, held=ordinary[1].permit))
        assert second_one.reserved is not None and second_one.reserved >= now + 2 * second, second_one
        # A priority call when only an ordinary reservation whose place is still to come
        # fills the window (the one before it given back): at once; that one then waits.
        alone = replace(ask, scope=self.s("priority-now"), limit=1)
        assert quota.admit(alone).reserved is None
        first, place = quota.admit(alone), quota.admit(alone)
        assert first.reserved == now + second and place.reserved == now + 2 * second, (first, place)
        assert first.permit is not None and place.permit is not None
        given_back = Permit(1, 1.0, first.permit, exact=True)
        quota.answer(Answer(scope=alone.scope, now=now - half, permit=given_back))
        later = now + 1.2 * second
        at_once = quota.admit(replace(alone, now=later, priority=1))
        assert at_once.not_before is None and at_once.reserved is None, at_once
        waits = quota.admit(replace(alone, now=now + 2 * second, held=place.permit))
        assert waits.reserved is not None and waits.reserved >= later + second, waits

    def test_reservations_racing_never_exceed_the_quota(self, store: Any) -> None:
        """``Reservations``: eight threads each reserve six open permits of a quota of 3
        per second: in any second (from each grant's time, ``per + margin`` long) at
        most 3 are granted, and the reservations are packed (the last within 16
        seconds: 48 / 3)."""
        quota = self.carrying(store, QuotaLogs, Reservations)
        now, scope = now_ms(), self.s("reserve-race")
        times: list[datetime] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def race() -> None:
            start.wait()
            for _ in range(6):
                answer = quota.admit(Ask(
                    scope=scope, now=now, limit=3, per=1.0, margin=0.05, opened=10.0,
                    reserve_by=now + timedelta(seconds=60),
                ))
                assert answer.not_before is None, answer
                with lock:
                    times.append(answer.reserved or now)

        threads = [threading.Thread(target=race) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        times.sort()
        assert len(times) == 48
        window = timedelta(seconds=1.05)
        worst = max(sum(1 for t in times if start_at <= t < start_at + window) for start_at in times)
        assert worst <= 3, f"{type(store).__name__} granted {worst} permits within one window of a quota of 3"
        assert times[-1] <= now + timedelta(seconds=16 * 1.05 + 0.1), times[-1]

    def test_a_slot_is_held_all_or_nothing_and_given_back(self, store: Any) -> None:
        slots = self.carrying(store, Leases)
        now = now_ms()
        assert slots.admit(Ask(
            scope=self.s("c"), now=now, lease=Lease(slots=1, ttl=30.0, token="one")
        )).not_before is None
        assert slots.admit(Ask(
            scope=self.s("c"), now=now, lease=Lease(slots=1, ttl=30.0, token="two")
        )).not_before is not None
        slots.answer(Answer(scope=self.s("c"), token="one"))
        assert slots.admit(Ask(
            scope=self.s("c"), now=now, lease=Lease(slots=1, ttl=30.0, token="two")
        )).not_before is None
        slots.extend(self.s("c"), now + timedelta(seconds=30))  # a cooldown refuses the slot too
        refused = slots.admit(Ask(scope=self.s("c"), now=now, lease=Lease(slots=2, ttl=30.0, token="three")))
        assert refused.not_before is not None and refused.not_before >= now + timedelta(seconds=30)

    def test_renew_moves_a_held_lease_later_and_never_takes_a_lapsed_one_again(self, store: Any) -> None:
        """``LeaseRenewal.renew``: a lease still held is moved later (never earlier); one
        that lapsed or was given back is answered as not held and stays free."""
        slots = self.carrying(store, Leases, LeaseRenewal)
        now, scope = now_ms(), self.s("renew")
        second = timedelta(seconds=1)
        for token in ("held", "lapses", "given"):
            assert slots.admit(Ask(
                scope=scope, now=now, lease=Lease(slots=3, ttl=1.0, token=token)
            )).not_before is None
        slots.answer(Answer(scope=scope, token="given"))
        renewal = [(scope, "held", now + 5 * second), (scope, "given", now + 5 * second)]
        assert slots.renew(renewal, now + second / 2) == {"given"}  # type: ignore[attr-defined]
        assert slots.renew([(scope, "held", now + second)], now + second / 2) == set()  # type: ignore[attr-defined]
        later = now + 2 * second
        assert slots.admit(Ask(
            scope=scope, now=later, lease=Lease(slots=2, ttl=30.0, token="other")
        )).not_before is None
        refused = slots.admit(Ask(scope=scope, now=later, lease=Lease(slots=2, ttl=30.0, token="more")))
        assert refused.not_before == now + 5 * second, refused  # "held" until its renewed end
        assert slots.renew([(scope, "lapses", later + second)], later) == {"lapses"}  # type: ignore[attr-defined]
        assert slots.admit(Ask(
            scope=scope, now=later, lease=Lease(slots=3, ttl=30.0, token="more")
        )).not_before is None

    def test_renew_exact_sets_a_held_lease_s_end_earlier_too(self, store: Any) -> None:
        """``LeaseRenewal.renew(..., exact=True)``: a lease still held is made to end at
        the end given, earlier too (a slot kept for reuse counts only its short life);
        one that lapsed or was given back stays free."""
        slots = self.carrying(store, Leases, LeaseRenewal)
        now, scope = now_ms(), self.s("exact")
        second = timedelta(seconds=1)
        for token in ("kept", "given"):
            assert slots.admit(Ask(
                scope=scope, now=now, lease=Lease(slots=2, ttl=60.0, token=token)
            )).not_before is None
        slots.answer(Answer(scope=scope, token="given"))
        shorter = [(scope, "kept", now + second), (scope, "given", now + second)]
        assert slots.renew(shorter, now + second / 2, exact=True) == {"given"}  # type: ignore[attr-defined]
        refused = slots.admit(Ask(
            scope=scope, now=now + second / 2, lease=Lease(slots=1, ttl=30.0, token="other")
        ))
        assert refused.not_before == now + second, refused  # "kept" until its new, earlier end
        later = now + 2 * second  # "kept" lapsed at now + 1 s, not at now + 60 s
        assert slots.renew([(scope, "kept", later + second)], later, exact=True) == {"kept"}  # type: ignore[attr-defined]
        assert slots.admit(Ask(
            scope=scope, now=later, lease=Lease(slots=2, ttl=30.0, token="x")
        )).not_before is None
        assert slots.admit(Ask(
            scope=scope, now=later, lease=Lease(slots=2, ttl=30.0, token="y")
        )).not_before is None

    def test_renew_open_moves_open_permits_later_and_never_a_lapsed_one(self, store: Any) -> None:
        """``LeaseRenewal.renew_open``: up to ``count`` open permits stored to end at
        ``end`` move to ``until`` (they count until then; a settle of the new end
        finds them); none moves once its end passed."""
        quota = self.carrying(store, QuotaLogs, LeaseRenewal)
        now, scope = now_ms(), self.s("renew-open")
        second = timedelta(seconds=1)
        granted = [quota.admit(Ask(scope=scope, now=now, limit=3, per=1.0, opened=1.0)) for _ in range(2)]
        assert all(g.not_before is None and g.permit == granted[0].permit for g in granted), granted
        end = granted[0].permit
        assert end is not None
        until = end + 5 * second
        moved = quota.renew_open([(scope, 3, 1.0, end, until, 1)], now)  # type: ignore[attr-defined]
        assert moved == [1]
        # At end + 1 s: the permit not moved stopped counting, the moved one counts.
        later = end + second
        assert quota.admit(Ask(scope=scope, now=later, limit=3, per=1.0)).not_before is None
        assert quota.admit(Ask(scope=scope, now=later, limit=3, per=1.0)).not_before is None
        assert quota.admit(Ask(scope=scope, now=later, limit=3, per=1.0)).not_before is not None
        # Its answer settles it exactly, by its new end.
        quota.answer(Answer(scope=scope, now=later, permit=Permit(3, 1.0, until, exact=True)))
        assert quota.admit(Ask(scope=scope, now=later + second, limit=3, per=1.0)).not_before is None
        # Past its end, nothing moves.
        assert quota.renew_open([(scope, 3, 1.0, end, until, 1)], end + second) == [0]  # type: ignore[attr-defined]

    def test_admission_is_atomic_under_threads(self, store: Any) -> None:
        """Eight threads race for 5 permits of a quota and for 1 slot: exactly 5 and 1
        are granted (a read-then-write store grants more)."""
        whole = self.carrying(store, QuotaLogs, Leases)
        now = now_ms()
        granted = {"permits": 0, "slots": 0}
        lock = threading.Lock()
        start = threading.Barrier(8)

        def race(seed: int) -> None:
            start.wait()
            for i in range(4):
                permit = whole.admit(Ask(
                    scope=self.s("atomic-q"), now=now, limit=5, per=60.0
                )).not_before is None
                slot = whole.admit(Ask(
                    scope=self.s("atomic-c"), now=now, lease=Lease(slots=1, ttl=60.0, token=f"t{seed}-{i}")
                ))
                with lock:
                    granted["permits"] += permit
                    granted["slots"] += slot.not_before is None

        threads = [threading.Thread(target=race, args=(seed,)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert granted == {"permits": 5, "slots": 1}

    # Atomic in every order: two admissions that may not both be granted, the first
    # paused at each line of the store's code in turn while the second runs (see
    # ``_interleave``): deterministic, where the threads above only may race.
    def test_a_quota_permit_is_atomic_in_every_order(self, store: Any) -> None:
        quota = self.carrying(store, QuotaLogs)
        now = now_ms()

        def ask(n: int) -> Callable[[], Admission]:
            return lambda: quota.admit(Ask(scope=self.s(f"order-q{n}"), now=now, limit=1, per=60.0))

        self._never_both(quota, "the one permit of a quota (Ask.limit=1)", ask, ask)

    def test_a_slot_is_atomic_in_every_order(self, store: Any) -> None:
        slots = self.carrying(store, Leases)
        now = now_ms()

        def ask(token: str) -> Callable[[int], Callable[[], Admission]]:
            def one(n: int) -> Callable[[], Admission]:
                return lambda: slots.admit(Ask(
                    scope=self.s(f"order-c{n}"), now=now, lease=Lease(slots=1, ttl=60.0, token=token)
                ))

            return one

        self._never_both(slots, "the one concurrency slot (Ask.lease=(1, ...))", ask("first"), ask("second"))

    def test_an_announced_allowance_is_atomic_in_every_order(self, store: Any) -> None:
        announced = self.carrying(store, Allowances)
        now = now_ms()
        reset = now + timedelta(seconds=60)

        def first(n: int) -> Callable[[], Admission]:
            scope = self.s(f"order-a{n}")
            announced.answer(Answer(scope=scope, now=now, announced=Announced(remaining=1, until=reset)))
            return lambda: announced.admit(Ask(scope=scope, now=now))

        def second(n: int) -> Callable[[], Admission]:
            return lambda: announced.admit(Ask(scope=self.s(f"order-a{n}"), now=now))

        self._never_both(announced, "the one request an announced allowance has left", first, second)

    def test_a_token_quota_is_atomic_in_every_order(self, store: Any) -> None:
        tokens = self.carrying(store, Weights)
        now = now_ms()

        def ask(n: int) -> Callable[[], Admission]:
            weigh = Weigh(cost=10, limit=10, per=60.0)
            return lambda: tokens.admit(Ask(scope=self.s(f"order-t{n}"), now=now, weigh=weigh))

        self._never_both(tokens, "the ten tokens of a token quota of ten (Ask.weigh)", ask, ask)

    def _never_both(
        self,
        store: Store,
        what: str,
        first: Callable[[int], Callable[[], Admission]],
        second: Callable[[int], Callable[[], Admission]],
    ) -> None:
        """Two admissions of ``what`` are never both granted, in any order the kit
        makes of the first's lines and the second (see ``_interleave``)."""

        def wrong(overlap: Overlap) -> bool:
            errors = [e for e in (overlap.first_error, overlap.second_error) if e is not None]
            if any(not isinstance(e, CooldownStoreError) for e in errors):
                return True
            results = (overlap.first, overlap.second)
            return not errors and all(result.not_before is None for result in results)

        overlap, orders = first_overlap(store, first, second, wrong)
        if overlap is None and orders == 0:
            pytest.skip(f"no line of {type(store).__name__}'s own code ran in admit: no order to try")
        if overlap is None:
            return
        name = type(store).__name__
        for error in (overlap.first_error, overlap.second_error):
            if error is not None and not isinstance(error, CooldownStoreError):
                raise AssertionError(
                    f"{name}.admit raised {type(error).__name__} when two admissions of {what} "
                    f"overlapped (the first paused at {overlap.where}): {error}"
                ) from error
        pytest.fail(
            f"{name}.admit is not atomic: two admissions of {what} were both granted when the "
            f"first was paused at {overlap.where} while the second ran (order {orders} the kit "
            "tried): what one reads must stay locked until it writes (a read, then a write "
            "without a lock held across them, as in a READ COMMITTED transaction, lets every "
            "worker in between take it too)"
        )

    def test_admission_is_all_or_nothing(self, store: Any) -> None:
        """A quota permit that is free while the slot is not: nothing is taken."""
        whole = self.carrying(store, QuotaLogs, Leases)
        now = now_ms()
        scope = self.s("both")
        assert whole.admit(Ask(
            scope=scope, now=now, lease=Lease(slots=1, ttl=60.0, token="holder")
        )).not_before is None
        refused = whole.admit(Ask(
            scope=scope, now=now, limit=1, per=60.0, lease=Lease(slots=1, ttl=60.0, token="second")
        ))
        assert refused.not_before is not None  # the slot is held
        whole.answer(Answer(scope=scope, token="holder"))
        # The refused admission took no permit: the quota's one permit is still free.
        assert whole.admit(Ask(
            scope=scope, now=now, limit=1, per=60.0, lease=Lease(slots=1, ttl=60.0, token="second")
        )).not_before is None

    # -- Allowances, FreshnessLog ---------------------------------------------------------
    def test_an_announced_allowance_is_spent_then_holds_until_its_reset(self, store: Any) -> None:
        announced = self.carrying(store, Allowances)
        now, scope = now_ms(), self.s("announced")
        reset = now + timedelta(seconds=30)
        announced.answer(Answer(scope=scope, now=now, announced=Announced(1, reset, None, 10, 30.0)))
        assert announced.admit(Ask(scope=scope, now=now)).not_before is None  # the one left
        refused = announced.admit(Ask(scope=scope, now=now))
        assert refused.not_before is not None and refused.not_before >= reset
        assert announced.admit(Ask(scope=scope, now=reset + timedelta(seconds=1))).not_before is None

    def test_freshness_keeps_the_last_success_and_error(self, store: Any) -> None:
        log = self.carrying(store, FreshnessLog)
        assert isinstance(log, FreshnessLog)
        now, scope = now_ms(), self.s("fresh")
        assert log.freshness(scope) is None
        log.note(scope, "success", now)
        log.note(scope, "throttled", now + timedelta(seconds=1))
        log.note(scope, "success", now - timedelta(seconds=5))  # older: the later one stays
        fresh = log.freshness(scope)
        assert fresh is not None and fresh.last_success == now and fresh.last_error == "throttled"
        assert scope in log.freshness_entries()

    # -- ChangeFeed ------------------------------------------------------------------------
    def test_a_fresh_feed_delivers_every_change(self, store: Any, other_store: Any) -> None:
        """``ChangeFeed``: once its feed says it is fresh, a cooldown learned and a
        scope lifted through another handle (``other_store``; the store itself without
        one) are delivered (``changed`` called with the scope, or None) within
        :data:`FEED_DELIVERS` seconds, or the feed stops saying it is fresh: a process's
        near copy admits from memory while ``fresh()`` is True, into a cooldown it was
        never told of otherwise."""
        feeding: Any = self.carrying(store, ChangeFeed)
        heard: list[str | None] = []
        feed = feeding.feed(lambda scope, until: heard.append(scope))
        if feed is None:
            pytest.skip("the store's feed() gave no feed this time (None)")
        name = type(store).__name__
        writer = other_store if isinstance(other_store, Store) else feeding
        try:
            if not _eventually(feed.fresh, FEED_DELIVERS):
                pytest.skip(f"the feed never said it was fresh within {FEED_DELIVERS:g} s: it claims nothing")
            scope = self.s("fed")
            changes: list[tuple[str, Callable[[], object]]] = [
                ("a cooldown learned", lambda: writer.extend(scope, now_ms() + timedelta(seconds=30))),
            ]
            if isinstance(writer, Listing):
                changes.append(("a scope lifted", lambda: writer.delete(scope)))
            for change, write in changes:
                del heard[:]
                write()
                told = _eventually(lambda: scope in heard or None in heard or not feed.fresh(), FEED_DELIVERS)
                if not told:
                    pytest.fail(
                        f"{name}'s feed still says it is fresh (fresh() True) {FEED_DELIVERS:g} s after "
                        f"{change} ({scope!r}, through another handle), and never delivered it: a "
                        "worker's near copy would admit requests into a cooldown it was not told of"
                    )
        finally:
            feed.close()

    # -- Bounded ---------------------------------------------------------------------------
    def test_a_declared_bound_holds_when_the_backend_hangs(self, store: Any, hung_store: Any) -> None:
        """A store that declares a bound on its operations keeps it when its backend
        does not answer: each operation ends, with an answer or a CooldownStoreError,
        within three times the bound and half a second (the failure layer waits for it
        on the calling thread, trusting the bound)."""
        if not isinstance(store, Bounded):
            pytest.skip("the store declares no bound (not Bounded): the failure layer bounds its operations")
        if declared_bound_of(store) is None:
            pytest.skip("the store declares no bound this time (operation_timeout() is None)")
        if hung_store is None:
            pytest.fail(
                f"{type(store).__name__} declares a bound on its operations (Bounded): give the "
                "contract a `hung_store` fixture, a handle whose backend does not answer, to check it"
            )
        bound = declared_bound_of(hung_store)
        if bound is None:
            pytest.skip("the hung handle declares no bound this time (operation_timeout() is None)")
        allowed = 3 * bound + 0.5
        until = now_ms() + timedelta(seconds=30)
        scope = self.s("hung")
        taking = isinstance(hung_store, QuotaLogs)  # a permit: a write
        permit = Permit(limit=1, per=60.0, expires=until) if taking else None
        token = "contract" if isinstance(hung_store, Leases) else None
        operations: list[tuple[str, Callable[[], object]]] = [
            ("get", lambda: hung_store.get(scope)),
            ("extend", lambda: hung_store.extend(scope, until)),
            (
                "admit",
                lambda: hung_store.admit(
                    Ask(scope=scope, now=now_ms(), limit=1 if taking else None, per=60.0 if taking else None)
                ),
            ),
            (
                "answer",
                lambda: hung_store.answer(Answer(scope=scope, now=now_ms(), token=token, permit=permit)),
            ),
        ]
        feed = hung_store.feed(lambda scope, until: None) if isinstance(hung_store, ChangeFeed) else None
        if feed is not None:  # asked on the calling thread before each admission from the near copy
            operations.append(("feed().fresh", feed.fresh))
        try:
            for name, operation in operations:
                took, error = _within(operation, allowed)
                if took is None:
                    pytest.fail(
                        f"{type(hung_store).__name__}.{name}() declares a bound of {bound:g} s "
                        f"(operation_timeout()) but did not end within {allowed:g} s on a backend "
                        "that does not answer"
                    )
                if error is not None and not isinstance(error, CooldownStoreError):
                    pytest.fail(
                        f"{type(hung_store).__name__}.{name}() on a backend that does not answer raised "
                        f"{type(error).__name__}, not CooldownStoreError"
                    )
        finally:
            if feed is not None:
                feed.close()


#: Seconds a change feed has to deliver a change made elsewhere once it says it is fresh.
FEED_DELIVERS = 3.0
#: Seconds the adapter's test gives a change feed to deliver a cooldown (the package's
#: Redis feed: under 10 ms on loopback).
FEED_SETTLES = 0.5


def _workers_on(*handles: Any) -> list[Any]:
    """A requests Session per handle, each with its own adapter on it: one attempt per
    call, waits up to 1 s, no learned rate (a worker of its own on that handle)."""
    import requests

    from ..adapter import RetryAfterAdapter
    from ..retry import RetryAfterRetry

    sessions = []
    for handle in handles:
        session = requests.Session()
        retry = RetryAfterRetry(total=0, max_wait=1, raise_on_status=False)
        session.mount("http://", RetryAfterAdapter(retry, cooldown=handle, learn_rate=False))
        sessions.append(session)
    return sessions


def _eventually(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` is True within ``seconds`` (asked every 5 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def declared_bound_of(store: Any) -> float | None:
    """``store.operation_timeout()``, checked: a finite number of seconds > 0, or None."""
    value: float | None = store.operation_timeout()
    if value is not None:
        good = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        assert good and value > 0, (
            f"{type(store).__name__}.operation_timeout() must be a finite number of seconds > 0 "
            f"or None, not {value!r}"
        )
    return value


def _within(operation: Callable[[], object], allowed: float) -> tuple[float | None, BaseException | None]:
    """Run ``operation`` on a thread of its own and wait for it at most ``allowed``
    seconds: how long it took (None: it did not end, and is left behind) and what it
    raised."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            operation()
        except BaseException as exc:  # reported, whatever it is
            outcome.append(exc)
        else:
            outcome.append(None)

    started = time.monotonic()
    thread = threading.Thread(target=run, name="store-contract-bound", daemon=True)
    thread.start()
    thread.join(allowed)
    if not outcome:
        return None, None
    return time.monotonic() - started, outcome[0]
