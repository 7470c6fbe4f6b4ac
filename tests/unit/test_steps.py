"""The engine's loop, ``engine.loop.steps``, driven by scripted operations.

``steps`` does no I/O: it yields each wait, each transport operation and each store
operation as a typed value of ``engine.ops`` and goes on with what its driver answers.
Here the driver is a script: each expected operation is checked and answered in turn
(a response built in memory for a ``Send``, the time a store names for an ``Admit``,
``True`` for a ``Sleep`` after moving the FakeClock by its length), so every decision
of the loop is seen without a socket, a store or a real clock. A ``Judge`` of a store-less
call is answered by the engine's own ``verdict.judge``, which only reads the response
and the call; with a store, a plain 200 is answered ``FINAL`` (what ``judge`` says of it).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from urllib3 import HTTPResponse

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterRetry
from retry_after_adapter.deferral import Deferral
from retry_after_adapter.engine.call import Call
from retry_after_adapter.engine.loop import Outcome, steps
from retry_after_adapter.engine.ops import Admit, Judge, Keep, Op, ReadCooldown, Send, Sleep
from retry_after_adapter.engine.override import Override
from retry_after_adapter.engine.plan import Plan
from retry_after_adapter.engine.verdict import FINAL, judge

SCOPE = "https://api.example"
URL = SCOPE + "/v1/items"


@dataclass
class Attempts:
    """What ``steps`` reads of a call's attempts (``loop.Attempts``): a GET of ``URL``
    whose responses are urllib3 ones built in memory."""

    method: str = "GET"
    url: str = URL
    follows_redirects: bool = False
    streams: bool = False
    user_timeout: Any = 30.0
    done: list[Any] = field(default_factory=list)

    def raw(self, response: Any) -> Any:
        return response

    def transport_error(self, exc: Exception) -> Exception | None:
        return None

    def on_done(self, response: Any, release: Callable[[], None]) -> None:
        self.done.append(response)
        release()


def response(status: int, **headers: str) -> HTTPResponse:
    return HTTPResponse(body=b"", headers=headers, status=status, preload_content=True)


Answer = Callable[[Op], Any]


def play(gen: Generator[Op, Any, Outcome[Any]], script: list[tuple[type, Answer]]) -> tuple[list[Op], Outcome[Any]]:
    """Drive ``gen`` through ``script``: each operation it yields must be of the next
    scripted type and is answered with what the scripted function returns for it.
    Returns the operations seen and the outcome; the whole script must be used."""
    seen: list[Op] = []
    value: Any = None
    for n, (kind, answer) in enumerate(script):
        try:
            op = gen.send(value)
        except StopIteration:
            raise AssertionError(f"steps ended after {n} operations; the script had {len(script)}: {seen}")
        seen.append(op)
        assert isinstance(op, kind), f"operation {n}: expected {kind.__name__}, got {op!r} (after {seen[:-1]})"
        value = answer(op)
    try:
        op = gen.send(value)
    except StopIteration as stop:
        return seen, stop.value
    raise AssertionError(f"steps asked for more than the script: {op!r} after {seen}")


def given(value: Any) -> Answer:
    return lambda op: value


def slept(clock: FakeClock) -> Answer:
    """A Sleep carried out: the FakeClock moves by its length, the whole wait passed."""

    def answer(op: Op) -> bool:
        assert isinstance(op, Sleep)
        clock.advance(max(0.0, op.seconds))
        return True

    return answer


def judged(call: Call) -> Answer:
    """A Judge answered by the engine's own verdict (no store: it only reads the call)."""

    def answer(op: Op) -> Any:
        assert isinstance(op, Judge)
        return judge(call, op.method, op.url, op.raw, op.cause, body=op.body)

    return answer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def store_call(clock: FakeClock, override: Override | None = None, **policy: Any) -> Call:
    """A call through a plan with a (memory) store: its admissions are store operations
    the script answers; the store itself is never reached."""
    return Call(RetryAfterRetry(clock=clock, **policy), Plan(MemoryCooldownStore()), scope=SCOPE, override=override)


def test_a_200_the_first_time_is_one_send_and_one_judge(clock: FakeClock) -> None:
    call = Call(RetryAfterRetry(clock=clock))
    ok = response(200)
    seen, outcome = play(steps(call, Attempts()), [(Send, given(ok)), (Judge, judged(call))])
    assert outcome.response is ok and outcome.deferral is None and outcome.error is None
    send, judge_op = seen
    assert isinstance(send, Send) and send.timeout == 30.0  # no deadline: the caller's timeout
    assert isinstance(judge_op, Judge) and judge_op.raw is ok and judge_op.method == "GET"
    assert call.progress.attempts == 1


def test_a_200_through_a_store_is_admitted_in_one_store_operation(clock: FakeClock) -> None:
    call = store_call(clock)
    ok = response(200)
    seen, outcome = play(steps(call, Attempts()), [(Admit, given(None)), (Send, given(ok)), (Judge, given(FINAL))])
    assert outcome.response is ok and outcome.deferral is None
    assert [type(op) for op in seen] == [Admit, Send, Judge]


def test_a_429_whose_retry_after_fits_is_slept_out_then_sent_again(clock: FakeClock) -> None:
    call = Call(RetryAfterRetry(clock=clock, deadline=10.0))
    throttled, ok = response(429, **{"Retry-After": "2"}), response(200)
    start = clock.monotonic()
    seen, outcome = play(
        steps(call, Attempts()),
        [
            (Send, given(throttled)),
            (Judge, judged(call)),
            (Keep, given(b"")),  # the 429's body, kept so it stays readable
            (Sleep, slept(clock)),
            (Send, given(ok)),
            (Judge, judged(call)),
        ],
    )
    assert outcome.response is ok and outcome.deferral is None
    keep, sleep = seen[2], seen[3]
    assert isinstance(keep, Keep) and keep.response is throttled
    assert keep.seconds == pytest.approx(8.0)  # the read leaves time for the 2 s wait
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(2.0)
    assert clock.monotonic() - start == pytest.approx(2.0)
    second = seen[4]
    assert isinstance(second, Send) and second.timeout.total == pytest.approx(8.0)  # bounded by the deadline
    assert call.progress.attempts == 2


def test_a_429_whose_retry_after_does_not_fit_the_deadline_is_deferred_and_not_sent_again(
    clock: FakeClock,
) -> None:
    call = Call(RetryAfterRetry(clock=clock, deadline=5.0))
    throttled = response(429, **{"Retry-After": "30"})
    told_at = clock.now()
    seen, outcome = play(
        steps(call, Attempts()),
        [(Send, given(throttled)), (Judge, judged(call)), (Keep, given(b""))],
    )
    assert [type(op) for op in seen] == [Send, Judge, Keep]  # one attempt, no sleep
    deferral = outcome.deferral
    assert isinstance(deferral, Deferral)
    assert outcome.response is throttled
    assert deferral.eligible_at == told_at + timedelta(seconds=30)
    assert deferral.delay == pytest.approx(30.0)
    assert deferral.status == 429 and deferral.retry_after == "30" and deferral.attempts == 1


def test_a_quota_refusal_that_fits_is_waited_for_then_admitted(clock: FakeClock) -> None:
    call = store_call(clock, deadline=10.0)
    free_at = clock.now() + timedelta(seconds=3)
    ok = response(200)
    seen, outcome = play(
        steps(call, Attempts()),
        [
            (Admit, given(free_at)),  # the common case refused: the rounds look again
            (Admit, given(free_at)),
            (Sleep, slept(clock)),
            (Admit, given(None)),
            (Send, given(ok)),
            (Judge, given(FINAL)),
        ],
    )
    assert outcome.response is ok and outcome.deferral is None
    sleep = seen[2]
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(3.0)


def quota_deferral(clock: FakeClock, free_at: datetime) -> tuple[list[Op], Deferral]:
    """A call whose quota permit frees at ``free_at``, past its ``max_wait`` of 1 s."""
    call = store_call(clock, max_wait=1.0)
    seen, outcome = play(steps(call, Attempts()), [(Admit, given(free_at)), (Admit, given(free_at))])
    assert outcome.response is None and outcome.deferral is not None
    return seen, outcome.deferral


def test_a_quota_refusal_that_does_not_fit_is_deferred_to_the_stores_time_and_nothing_is_sent(
    clock: FakeClock,
) -> None:
    free_at = clock.now() + timedelta(seconds=30)
    seen, deferral = quota_deferral(clock, free_at)
    assert [type(op) for op in seen] == [Admit, Admit]  # no Send, no Sleep
    assert deferral.reason == "quota"
    assert deferral.eligible_at == free_at
    assert deferral.delay == pytest.approx(30.0)
    assert deferral.attempts == 0 and deferral.scope == SCOPE


def test_a_resumed_call_reads_the_cooldown_and_waits_for_the_later_time(clock: FakeClock) -> None:
    _, first = quota_deferral(clock, clock.now() + timedelta(seconds=2))
    stored = clock.now() + timedelta(seconds=5)  # a cooldown another worker learned since
    call = store_call(clock, Override(resume=first), deadline=20.0)
    ok = response(200)
    start = clock.monotonic()
    seen, outcome = play(
        steps(call, Attempts()),
        [
            (ReadCooldown, given(stored)),  # the resumed deferral's time is ahead: nothing taken
            (Sleep, slept(clock)),
            (Admit, given(None)),
            (Send, given(ok)),
            (Judge, given(FINAL)),
        ],
    )
    assert outcome.response is ok and outcome.deferral is None
    sleep = seen[1]
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(5.0)  # the later of the two
    assert clock.monotonic() - start == pytest.approx(5.0)


def test_a_resumed_call_whose_stored_cooldown_does_not_fit_is_deferred_to_it(clock: FakeClock) -> None:
    _, first = quota_deferral(clock, clock.now() + timedelta(seconds=2))
    stored = clock.now() + timedelta(seconds=40)
    call = store_call(clock, Override(resume=first), max_wait=1.0)
    _, outcome = play(steps(call, Attempts()), [(ReadCooldown, given(stored))])
    deferral = outcome.deferral
    assert deferral is not None and outcome.response is None
    assert deferral.reason == "cooldown"
    assert deferral.eligible_at == stored
    assert deferral.deferrals == 2  # it carries on from the first
