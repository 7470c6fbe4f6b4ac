"""The contract's tests of the ``Weights`` capability (token-weighted admission), a
part of :class:`~retry_after_adapter.testing.conformance.StoreContract`: a token quota
weighs each cost and says when; an announced token allowance is spent by costs, and an
answer holds as of its cost counted; tokens are taken all or nothing with the rest,
exactly under eight racing threads; a late answer moves a token permit later; token
holds are listed."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ..cooldown.base import (
    Allowances,
    Announced,
    Answer,
    Ask,
    Hold,
    Listing,
    QuotaLogs,
    Store,
    Weigh,
    Weighed,
    Weights,
    token_scope,
)
from ..errors import ConfigurationError


def now_ms() -> datetime:
    """Now, truncated to whole milliseconds (what every store keeps exactly)."""
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class TokenContract:
    """The ``Weights`` tests (``s`` and ``carrying`` are the contract's)."""

    def s(self, name: str) -> str:  # pragma: no cover - the contract's
        raise NotImplementedError

    @staticmethod
    def carrying(store: Any, *capabilities: type) -> Store:  # pragma: no cover - the contract's
        raise NotImplementedError

    def test_a_token_quota_weighs_each_cost_then_says_when(self, store: Any) -> None:
        tokens = self.carrying(store, Weights)
        now, scope = now_ms(), self.s("tokens")
        first = tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(10, 25, 3.0)))
        assert first.not_before is None and first.weighed is not None
        assert now + timedelta(seconds=3) <= first.weighed <= now + timedelta(seconds=3, milliseconds=2)
        assert tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(10, 25, 3.0))).not_before is None
        refused = tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(10, 25, 3.0)))  # 30 > 25
        assert refused.not_before == first.weighed and refused.weighed is None
        assert tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(5, 25, 3.0))).not_before is None  # 25: fits
        assert tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(1, 25, 3.0))).not_before is not None
        assert tokens.admit(Ask(scope=scope, now=first.weighed, weigh=Weigh(10, 25, 3.0))).not_before is None
        with pytest.raises(ConfigurationError, match="exceeds the token quota"):
            tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(26, 25, 3.0)))

    def test_an_announced_token_allowance_is_spent_by_costs(self, store: Any) -> None:
        tokens = self.carrying(store, Weights, Allowances)
        now, scope = now_ms(), self.s("announced-tokens")
        reset = now + timedelta(seconds=30)
        tokens.answer(Answer(scope=token_scope(scope), now=now, announced=Announced(25, reset, None, 25)))
        assert [tokens.admit(Ask(
            scope=scope, now=now, weigh=Weigh(10)
        )).not_before for _ in range(2)] == [None, None]
        refused = tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(10)))
        assert refused.not_before is not None and refused.not_before >= reset
        assert tokens.admit(Ask(scope=scope, now=now)).not_before is None  # no cost declared: no tokens
        # An answer that says the server counted more lowers what is left: 5 fits no more.
        tokens.answer(Answer(scope=token_scope(scope), now=now, announced=Announced(2, reset, None, 25)))
        assert tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(5))).not_before is not None
        assert tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(2))).not_before is None

    def test_tokens_are_taken_all_or_nothing(self, store: Any) -> None:
        whole = self.carrying(store, Weights, QuotaLogs)
        now, scope = now_ms(), self.s("tokens-whole")
        assert whole.admit(Ask(scope=scope, now=now, limit=1, per=60.0)).not_before is None  # the one permit
        # The permit is not free: the tokens are not taken either.
        assert whole.admit(Ask(
            scope=scope, now=now, limit=1, per=60.0, weigh=Weigh(25, 25, 60.0)
        )).not_before is not None
        assert whole.admit(Ask(scope=scope, now=now, weigh=Weigh(25, 25, 60.0))).not_before is None
        # The tokens do not fit: the permit of another quota is not taken either.
        assert whole.admit(Ask(
            scope=scope, now=now, limit=1, per=30.0, weigh=Weigh(1, 25, 60.0)
        )).not_before is not None
        assert whole.admit(Ask(scope=scope, now=now, limit=1, per=30.0)).not_before is None

    def test_tokens_are_weighed_exactly_under_threads(self, store: Any) -> None:
        """Eight threads race, four attempts each, for a token quota of 25 and an
        announced token allowance of 25, every attempt costing 10: two of each."""
        tokens = self.carrying(store, Weights, Allowances)
        now, quota, announced = now_ms(), self.s("race-quota"), self.s("race-announced")
        reset = now + timedelta(seconds=60)
        tokens.answer(Answer(scope=token_scope(announced), now=now, announced=Announced(25, reset)))
        granted = {"quota": 0, "announced": 0}
        lock = threading.Lock()
        start = threading.Barrier(8)

        def race() -> None:
            start.wait()
            for _ in range(4):
                one = tokens.admit(Ask(scope=quota, now=now, weigh=Weigh(10, 25, 60.0))).not_before is None
                two = tokens.admit(Ask(scope=announced, now=now, weigh=Weigh(10))).not_before is None
                with lock:
                    granted["quota"] += one
                    granted["announced"] += two

        threads = [threading.Thread(target=race) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert granted == {"quota": 2, "announced": 2}

    def test_a_late_answer_moves_a_token_permit_later(self, store: Any) -> None:
        tokens = self.carrying(store, Weights)
        now, scope = now_ms(), self.s("tokens-late")
        granted = tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(25, 25, 1.0)))
        assert granted.weighed is not None
        answered = now + timedelta(seconds=5)  # long after its end: it reached the server late
        tokens.answer(Answer(scope=scope, now=answered, weighed=Weighed(25, 25, 1.0, granted.weighed)))
        held = tokens.admit(Ask(
            scope=scope, now=answered + timedelta(milliseconds=500), weigh=Weigh(1, 25, 1.0)
        ))
        assert held.not_before is not None and held.not_before >= answered + timedelta(seconds=1)
        later = answered + timedelta(seconds=1)
        assert tokens.admit(Ask(scope=scope, now=later, weigh=Weigh(1, 25, 1.0))).not_before is None

    def test_a_token_answer_holds_as_of_its_cost_counted(self, store: Any) -> None:
        """Five calls of 100 of an announced 1000; the first one's answer says 900 left
        until a later reset: the four others, still on their way, are taken off that
        (the server had not counted them yet), so five more fit, not nine."""
        tokens = self.carrying(store, Weights, Allowances)
        now, scope = now_ms(), self.s("tokens-inflight")
        reset = now + timedelta(seconds=5)
        tokens.answer(Answer(scope=token_scope(scope), now=now, announced=Announced(1000, reset, None, 1000)))
        sent = [tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(100))) for _ in range(5)]
        assert [each.not_before for each in sent] == [None] * 5
        assert sent[0].token_seq is not None
        later = reset + timedelta(seconds=3)  # the reset slid later: the server's next window
        announced = Announced(900, later, sent[0].token_seq, 1000)
        tokens.answer(Answer(scope=token_scope(scope), now=now, announced=announced))
        more = [tokens.admit(Ask(scope=scope, now=now, weigh=Weigh(100))).not_before for _ in range(6)]
        assert more == [None] * 5 + [later]

    def test_token_holds_are_listed(self, store: Any) -> None:
        listed: Any = self.carrying(store, Weights, Allowances, Listing)
        now, full, spent = now_ms(), self.s("tokens-full"), self.s("tokens-spent")
        granted = listed.admit(Ask(scope=full, now=now, weigh=Weigh(25, 25, 60.0)))
        reset = now + timedelta(seconds=30)
        listed.answer(Answer(scope=token_scope(spent), now=now, announced=Announced(0, reset, None, 25)))
        holds = listed.holds(now)
        assert Hold("tokens", granted.weighed, 25) in holds.get(full, []), f"holds() lists {holds!r}"
        assert Hold("allowance", reset) in holds.get(token_scope(spent), []), f"holds() lists {holds!r}"

